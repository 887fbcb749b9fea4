//! Test support shared by the integration tests and benchmarks: the
//! environment every test runs capsule in ([`mod@env`]), a client for
//! Toxiproxy (latency and faults in front of real servers) and a TCP echo
//! server that gives the ground truth of what a proxy adds to a round
//! trip. Dev-dependency only: nothing here ships in capsule.

pub mod echo;
pub mod env;
pub mod toxiproxy;

pub use env::{server_vars, Server, TestEnv, PASSWORD};

/// A variable the server script (`scripts/servers.sh`) set, or `None`
/// when the servers were not started: the caller then skips its test.
/// With `CAPSULE_REQUIRE_SERVERS=1` (set by the test command) their
/// absence is a failure instead.
pub fn server_env(key: &str) -> Option<String> {
    match std::env::var(key) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            assert!(
                std::env::var("CAPSULE_REQUIRE_SERVERS").as_deref() != Ok("1"),
                "{key} is not set; start the servers with scripts/servers.sh"
            );
            eprintln!("skipped: {key} not set (run scripts/test.sh to start the servers)");
            None
        }
    }
}

/// `n` bytes of incompressible noise (xorshift), the same for a seed.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}
