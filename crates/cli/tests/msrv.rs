//! The workspace's `rust-version` is true: no dependency needs a newer
//! compiler than it states, and the compiler building these tests is at
//! least that new. (The minimum was once stated as 1.80 while a pinned
//! dependency needed 1.91.)

// The command-line suite runs on Linux, against real servers, btrfs,
// fanotify and network namespaces; the macOS build checks the libraries.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

fn version(v: &str) -> (u64, u64, u64) {
    let mut it = v
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>().unwrap());
    (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    )
}

#[test]
fn rust_version_covers_every_dependency() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Only this platform's dependencies: the build fetched those, and the
    // others (Android, Windows) need not be downloaded to be judged.
    let rustc = Command::new("rustc").arg("-vV").output().unwrap();
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host");
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .args(["--filter-platform", &host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ours = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "capsule")
        .and_then(|p| p["rust_version"].as_str())
        .expect("capsule states a rust-version")
        .to_string();
    let mut too_new: Vec<String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| {
            let rv = p["rust_version"].as_str()?;
            (version(rv) > version(&ours))
                .then(|| format!("{} {} needs {rv}", p["name"], p["version"]))
        })
        .collect();
    too_new.sort();
    assert!(
        too_new.is_empty(),
        "rust-version {ours} is too low: {too_new:?}"
    );
    let rustc = Command::new("rustc").arg("--version").output().unwrap();
    let rustc = String::from_utf8_lossy(&rustc.stdout).to_string();
    let have = rustc.split_whitespace().nth(1).unwrap_or("0");
    assert!(
        version(have) >= version(&ours),
        "{rustc} is older than rust-version {ours}"
    );
}
