//! Where each setting comes from (flag, environment, profile, default),
//! as `capsule config show` tells it; secrets are masked.

use crate::config::Profile;
use crate::settings::Settings;

/// How a secret is shown.
const MASK: &str = "********";

/// Every setting a command would use: (name, value with secrets masked,
/// where it comes from).
pub fn explain(s: &Settings, p: Option<&Profile>) -> Vec<(&'static str, String, &'static str)> {
    let g = &s.flags;
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let mut rows = Vec::new();
    // `g` holds the merged value (flag, else environment, else profile:
    // see `apply_profile`); where it came from is told by comparing.
    let origin = |merged: &Option<String>, var: &str, profile: Option<String>| -> &'static str {
        let from_env = env(var).map(|v| v.to_string_lossy().into_owned());
        match merged {
            None => "default",
            Some(m) if from_env.as_ref() == Some(m) => "environment",
            Some(m) if profile.as_ref() == Some(m) => "profile",
            Some(_) => "flag",
        }
    };
    let repo = g.repo.clone();
    rows.push((
        "repository",
        repo.clone()
            .unwrap_or_else(|| "(the default repository in your data directory)".into()),
        origin(&repo, "CAPSULE_REPO", p.and_then(|p| p.repository.clone())),
    ));
    let pw_file = g.password_file.as_ref().map(|f| f.display().to_string());
    let pw_file_from = origin(
        &pw_file,
        "CAPSULE_PASSWORD_FILE",
        p.and_then(|p| p.password_file.as_ref())
            .map(|f| f.display().to_string()),
    );
    let password = if let Some(f) = pw_file.filter(|_| pw_file_from != "profile") {
        (format!("file {f}"), pw_file_from)
    } else if env("CAPSULE_PASSWORD").is_some() {
        (MASK.to_string(), "environment")
    } else if let Some(p) = p {
        match (&p.password_file, &p.password_command, &p.password) {
            (Some(f), _, _) => (format!("file {}", f.display()), "profile"),
            (_, Some(c), _) => (format!("command {c:?}"), "profile"),
            (_, _, Some(_)) => (MASK.to_string(), "profile"),
            _ => ("(asked on a terminal)".to_string(), "default"),
        }
    } else {
        ("(asked on a terminal)".to_string(), "default")
    };
    rows.push(("password", password.0, password.1));
    let conn = g.connections.map(|n| n.to_string());
    rows.push((
        "connections",
        conn.clone().unwrap_or_else(|| "8".into()),
        origin(
            &conn,
            "CAPSULE_CONNECTIONS",
            p.and_then(|p| p.connections).map(|n| n.to_string()),
        ),
    ));
    let cache = g.cache_dir.as_ref().map(|d| d.display().to_string());
    rows.push((
        "cache-dir",
        cache
            .clone()
            .unwrap_or_else(|| "(per repository in your cache directory)".into()),
        origin(
            &cache,
            "CAPSULE_CACHE_DIR",
            p.and_then(|p| p.cache_dir.as_ref())
                .map(|d| d.display().to_string()),
        ),
    ));
    if let Some(p) = p {
        let list = |v: &[std::path::PathBuf]| {
            v.iter()
                .map(|x| x.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        if !p.sources.is_empty() {
            rows.push(("sources", list(&p.sources), "profile"));
        }
        if !p.excludes.is_empty() {
            rows.push(("excludes", p.excludes.join(" "), "profile"));
        }
        if !p.iexcludes.is_empty() {
            rows.push(("iexcludes", p.iexcludes.join(" "), "profile"));
        }
        if p.exclude_caches == Some(true) {
            rows.push(("exclude-caches", "yes".into(), "profile"));
        }
        if !p.exclude_if_present.is_empty() {
            rows.push((
                "exclude-if-present",
                p.exclude_if_present.join(" "),
                "profile",
            ));
        }
        if let Some(n) = &p.exclude_larger_than {
            rows.push(("exclude-larger-than", n.clone(), "profile"));
        }
        for (key, files) in [
            ("exclude-file", &p.exclude_file),
            ("iexclude-file", &p.iexclude_file),
            ("files-from", &p.files_from),
            ("files-from-verbatim", &p.files_from_verbatim),
            ("files-from-raw", &p.files_from_raw),
        ] {
            if !files.is_empty() {
                rows.push((key, list(files), "profile"));
            }
        }
        if let Some(c) = &p.credentials {
            let mut parts = Vec::new();
            if let Some(f) = &c.password_file {
                parts.push(format!("password-file {}", f.display()));
            }
            if let Some(cmd) = &c.password_command {
                parts.push(format!("password-command {cmd:?}"));
            }
            if c.password.is_some() {
                parts.push(format!("password {MASK}"));
            }
            if let Some(k) = &c.sftp_key {
                parts.push(format!("sftp-key {}", k.display()));
            }
            if let Some(k) = &c.known_hosts {
                parts.push(format!("known-hosts {}", k.display()));
            }
            if let Some(a) = &c.aws_profile {
                parts.push(format!("aws-profile {a}"));
            }
            rows.push(("credentials", parts.join(", "), "profile"));
        }
        if let Some(r) = &p.retention {
            rows.push(("retention", toml_inline(r), "profile"));
        }
        if let Some(q) = &p.quota {
            rows.push(("quota", q.clone(), "profile"));
        }
        if let Some(w) = &p.when_full {
            rows.push(("when-full", w.clone(), "profile"));
        }
        if let Some(s) = &p.schedule {
            rows.push(("schedule", toml_inline(s), "profile"));
        }
        if let Some(h) = &p.hooks {
            rows.push(("hooks", toml_inline(h), "profile"));
        }
    }
    rows
}

/// A table as one inline TOML line.
fn toml_inline<T: serde::Serialize>(v: &T) -> String {
    toml::Value::try_from(v)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
