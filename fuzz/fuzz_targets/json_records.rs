//! Snapshots, key files and the config (JSON inside or beside envelopes):
//! any bytes parse or fail cleanly.
#![no_main]
use capsule_format::snapshot::{from_json, KeyFile, RepoConfig, Snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = from_json::<Snapshot>(data);
    let _ = from_json::<KeyFile>(data);
    let _ = from_json::<RepoConfig>(data);
});
