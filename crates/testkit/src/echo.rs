//! A TCP echo server on loopback, and a ping that measures round trips to
//! it. Put a proxy in front of it and the ping measures what that proxy
//! really adds, on this machine and under its present load: the ground
//! truth a latency measurement through the same proxy is compared with.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// An echo server on `127.0.0.1`; it stops when dropped (its thread ends
/// with the last connection, or at process exit).
#[derive(Debug)]
pub struct Echo {
    /// `127.0.0.1:port`.
    pub addr: String,
}

impl Echo {
    /// Starts the server on a free port.
    pub fn start() -> std::io::Result<Echo> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?.to_string();
        std::thread::Builder::new()
            .name("echo".into())
            .spawn(move || {
                for conn in l.incoming() {
                    let Ok(mut c) = conn else { continue };
                    let _ = c.set_nodelay(true);
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 4096];
                        // Bounded: the peer closing ends the loop, and a
                        // silent peer times out.
                        let _ = c.set_read_timeout(Some(Duration::from_secs(60)));
                        while let Ok(n) = c.read(&mut buf) {
                            if n == 0 || c.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
            })?;
        Ok(Echo { addr })
    }
}

/// Round trips of a small message to an echo at `addr` (direct or through
/// a proxy): `samples` of them on one connection, in milliseconds, sorted.
pub fn ping(addr: &str, samples: usize) -> std::io::Result<Vec<f64>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let msg = [0x5au8; 64];
    let mut back = [0u8; 64];
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        s.write_all(&msg)?;
        s.read_exact(&mut back)?;
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}
