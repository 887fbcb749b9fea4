//! The snapshot filters `snapshots`, `forget`, `copy`, `find` and `tag`
//! share: by host, by tag, by path, as restic users know them.

use capsule_format::snapshot::Snapshot;
use capsule_format::ObjectId;
use clap::Args;

/// Which snapshots a command considers.
#[derive(Args, Debug, Default, Clone)]
pub struct FilterArgs {
    /// Only snapshots of this host (repeatable: any of them).
    #[arg(long, value_name = "HOST")]
    pub host: Vec<String>,
    /// Only snapshots with these tags: "a,b" needs both; repeat the flag
    /// for either ("--tag a --tag b,c": a, or both b and c).
    #[arg(long, value_name = "TAG[,TAG…]")]
    pub tag: Vec<String>,
    /// Only snapshots that include this source path (repeatable: all of
    /// them).
    #[arg(long = "path", value_name = "PATH")]
    pub paths: Vec<String>,
}

impl FilterArgs {
    /// Whether snapshot `s` passes every filter given.
    pub fn matches(&self, s: &Snapshot) -> bool {
        let host = self.host.is_empty() || self.host.contains(&s.hostname);
        let tag = self.tag.is_empty()
            || self.tag.iter().any(|group| {
                group
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .all(|t| s.tags.iter().any(|have| have == t))
            });
        let paths = self.paths.iter().all(|p| {
            let p = p.trim_end_matches('/');
            let p = if p.is_empty() { "/" } else { p };
            s.paths.iter().any(|sp| sp == p)
        });
        host && tag && paths
    }

    /// `snaps` with only those that pass.
    pub fn apply(&self, snaps: Vec<(ObjectId, Snapshot)>) -> Vec<(ObjectId, Snapshot)> {
        snaps.into_iter().filter(|(_, s)| self.matches(s)).collect()
    }

    /// Whether any filter was given.
    pub fn is_empty(&self) -> bool {
        self.host.is_empty() && self.tag.is_empty() && self.paths.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(host: &str, tags: &[&str], paths: &[&str]) -> Snapshot {
        Snapshot {
            hostname: host.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            paths: paths.iter().map(|t| t.to_string()).collect(),
            ..serde_json::from_value(serde_json::json!({
                "version": 1, "time": "2026-01-01T00:00:00Z", "time_unix": 0,
                "duration_secs": 0.0, "hostname": "", "username": "", "paths": [],
                "tree": "", "parent": null,
                "summary": {"files":0,"dirs":0,"others":0,"bytes":0,"files_read":0,
                    "bytes_read":0,"blobs_added":0,"bytes_added":0,"errors":0},
                "program": ""
            }))
            .unwrap()
        }
    }

    #[test]
    fn tags_in_one_flag_are_all_needed_and_flags_are_either() {
        let f = FilterArgs {
            tag: vec!["a".into(), "b,c".into()],
            ..Default::default()
        };
        assert!(f.matches(&snap("h", &["a"], &["/x"])));
        assert!(f.matches(&snap("h", &["c", "b"], &["/x"])));
        assert!(!f.matches(&snap("h", &["b"], &["/x"])));
        assert!(!f.matches(&snap("h", &[], &["/x"])));
    }

    #[test]
    fn hosts_are_either_and_paths_are_all() {
        let f = FilterArgs {
            host: vec!["a".into(), "b".into()],
            paths: vec!["/x/".into(), "/y".into()],
            ..Default::default()
        };
        assert!(f.matches(&snap("b", &[], &["/x", "/y", "/z"])));
        assert!(!f.matches(&snap("c", &[], &["/x", "/y"])));
        assert!(!f.matches(&snap("a", &[], &["/x"])));
        assert!(FilterArgs::default().matches(&snap("q", &[], &[])));
    }
}
