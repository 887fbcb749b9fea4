//! Conditions a profile's backups wait for: enough battery, a network that
//! is not metered. Each is read from the OS when a run is due, through a
//! provider a test can replace (`CAPSULE_POWER_SUPPLY_DIR`,
//! `CAPSULE_METERED_COMMAND`); one that cannot be read does not hold a
//! backup back.

use std::path::PathBuf;

use crate::config::Conditions;

/// Where Linux lists power supplies.
const POWER_SUPPLY: &str = "/sys/class/power_supply";

/// The battery: (on battery, lowest charge in percent), if there is one.
fn battery() -> Option<(bool, u32)> {
    let dir = std::env::var_os("CAPSULE_POWER_SUPPLY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(POWER_SUPPLY));
    let read = |p: PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let (mut mains, mut discharging, mut level) = (false, false, None::<u32>);
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        match read(p.join("type")).as_deref() {
            Some("Mains") | Some("USB") => mains |= read(p.join("online")).as_deref() == Some("1"),
            Some("Battery") => {
                discharging |= read(p.join("status")).as_deref() == Some("Discharging");
                if let Some(c) = read(p.join("capacity")).and_then(|c| c.parse().ok()) {
                    level = Some(level.map_or(c, |l: u32| l.min(c)));
                }
            }
            _ => {}
        }
    }
    Some((discharging && !mains, level?))
}

/// Whether NetworkManager says the connection is metered (its `Metered`
/// property: 1 yes, 3 guessed yes). `None` when it cannot be asked.
fn metered() -> Option<bool> {
    let out = match std::env::var("CAPSULE_METERED_COMMAND") {
        Ok(cmd) => std::process::Command::new("sh").arg("-c").arg(cmd).output(),
        Err(_) => std::process::Command::new("busctl")
            .args([
                "--system",
                "get-property",
                "org.freedesktop.NetworkManager",
                "/org/freedesktop/NetworkManager",
                "org.freedesktop.NetworkManager",
                "Metered",
            ])
            .output(),
    }
    .ok()
    .filter(|o| o.status.success())?;
    // "u 1"
    let v: u32 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .last()?
        .parse()
        .ok()?;
    Some(v == 1 || v == 3)
}

/// What a backup waits for now, if anything ("battery at 12%, below 20%",
/// "a metered network").
pub fn waiting_for(c: &Conditions) -> Option<String> {
    if let Some(min) = c.min_battery {
        if let Some((true, level)) = battery() {
            if level < min {
                return Some(format!("battery: on battery at {level}%, below {min}%"));
            }
        }
    }
    if c.skip_metered == Some(true) && metered() == Some(true) {
        return Some("network: the connection is metered".into());
    }
    None
}
