//! The backend conformance suite: one set of checks of the contract in
//! [`crate::contract::Backend`] that every backend must pass. Backends call
//! [`run_all`] from their own tests (against real servers for network ones).
//!
//! Uses a fresh, empty namespace under `conformance/` and removes what it
//! wrote. Each check is a named case; every case runs even when an earlier
//! one fails, and the failures are reported together, by name.

use crate::contract::{Backend, ErrorKind};

/// A named check of the contract.
pub type Case = (&'static str, fn(&dyn Backend));

/// Every case [`run_all`] runs, in order.
pub const CASES: &[Case] = &[
    ("put_get_stat", put_get_stat),
    ("no_overwrite", no_overwrite),
    ("ranges", ranges),
    ("missing", missing),
    ("listing_1200", |b| listing(b, 1200)),
    ("wide_directory", wide_directory),
    ("concurrent_writers", concurrent_writers),
    ("delete_idempotent", delete_idempotent),
    ("names", names),
    ("temporaries_never_listed", temporaries_never_listed),
    ("streamed_ranges", streamed_ranges),
    ("put_owned", put_owned),
    ("put_file", put_file),
];

/// Runs every case against `b`, then panics naming each that failed.
pub fn run_all(b: &dyn Backend) {
    let mut failed = Vec::new();
    for (name, case) in CASES {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(b)));
        match r {
            Ok(()) => eprintln!("conformance {name}: ok ({})", b.location()),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                eprintln!("conformance {name}: FAILED ({}): {msg}", b.location());
                failed.push(format!("{name}: {msg}"));
            }
        }
        // Each case starts from an empty namespace.
        if let Ok(left) = b.list("conformance/") {
            for o in left {
                let _ = b.delete(&o.name);
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} conformance cases failed on {}:\n{}",
        failed.len(),
        CASES.len(),
        b.location(),
        failed.join("\n")
    );
}

/// An upload in progress is never listed, nor the temporary it writes
/// through (`.tmp-*` on file systems): a reader that lists while another
/// client uploads must see no object or the whole object.
fn temporaries_never_listed(b: &dyn Backend) {
    use std::sync::mpsc;
    let size = 2 << 20;
    let (half_tx, half_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    /// Sends half its bytes, then waits until told to go on.
    struct Paused {
        left: u64,
        half: u64,
        told: Option<mpsc::Sender<()>>,
        go: mpsc::Receiver<()>,
    }
    impl std::io::Read for Paused {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.left <= self.half {
                if let Some(t) = self.told.take() {
                    let _ = t.send(());
                    // Bounded: the lister answers within a minute or the
                    // upload goes on anyway.
                    let _ = self.go.recv_timeout(std::time::Duration::from_secs(60));
                }
            }
            let n = (buf.len() as u64).min(self.left).min(64 << 10) as usize;
            buf[..n].fill(7);
            self.left -= n as u64;
            Ok(n)
        }
    }
    std::thread::scope(|s| {
        let up = s.spawn(move || {
            b.put_stream(
                "conformance/tmp/obj",
                size,
                &mut Paused {
                    left: size,
                    half: size / 2,
                    told: Some(half_tx),
                    go: go_rx,
                },
            )
        });
        let halfway = half_rx.recv_timeout(std::time::Duration::from_secs(60));
        let during = b.list("conformance/tmp/").expect("list during upload");
        let _ = go_tx.send(());
        up.join().expect("uploader").expect("put_stream");
        assert!(halfway.is_ok(), "the upload never reached half way");
        assert!(
            during.iter().all(|o| o.size == size),
            "listed mid-upload: {during:?}"
        );
        assert!(
            during.iter().all(|o| !o.name.contains(".tmp")),
            "a temporary was listed: {during:?}"
        );
    });
    let after = b.list("conformance/tmp/").expect("list after");
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].size, size);
}

/// Ranged reads of an object written by `put_stream` (multipart on S3,
/// chunked writes on SMB and SFTP) return exactly the bytes asked for,
/// across the boundaries where the stream was cut.
fn streamed_ranges(b: &dyn Backend) {
    let size: u64 = (5 << 20) + 12_345;
    let seed = 0x1234_5678_9abc_def1;
    let name = "conformance/streamed";
    b.put_stream(name, size, &mut Pattern::new(seed, size))
        .expect("put_stream");
    let mut all = Vec::with_capacity(size as usize);
    std::io::Read::read_to_end(&mut Pattern::new(seed, size), &mut all).expect("pattern");
    for r in [
        0..1,
        0..4096,
        (1 << 20) - 7..(1 << 20) + 9,
        (4 << 20) - 1..(5 << 20) + 1,
        size - 100..size,
        size..size,
    ] {
        let got = b.get(name, Some(r.clone())).expect("ranged get");
        assert_eq!(
            got,
            &all[r.start as usize..r.end as usize],
            "range {r:?} of a streamed object"
        );
    }
}

/// An owned put stores what a borrowed one would, refuses to overwrite,
/// and whatever buffer it gives back still holds the object's bytes.
fn put_owned(b: &dyn Backend) {
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let (r, back) = b.put_owned("conformance/owned", data.clone());
    r.expect("put_owned");
    if let Some(back) = back {
        assert_eq!(back, data, "the buffer given back was changed");
    }
    assert_eq!(b.get("conformance/owned", None).expect("get"), data);
    let (r, _) = b.put_owned("conformance/owned", vec![1, 2, 3]);
    let e = r.expect_err("overwrite must fail");
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}");
    assert_eq!(b.get("conformance/owned", None).expect("get"), data);
}

/// A put from a file stores its first `size` bytes, however far its cursor
/// is, and can be made again with the same file (what a retry does).
fn put_file(b: &dyn Backend) {
    use std::io::{Seek, SeekFrom, Write};
    let data: Vec<u8> = (0..5_000_000u32).map(|i| (i % 253) as u8).collect();
    let mut f = tempfile::tempfile().expect("temporary file");
    f.write_all(&data).expect("write temporary file");
    f.write_all(b"not part of the object").expect("write tail");
    f.seek(SeekFrom::Start(12345)).expect("seek");
    let size = data.len() as u64;
    b.put_file("conformance/filed", &f, size).expect("put_file");
    assert_eq!(b.get("conformance/filed", None).expect("get"), data);
    let e = b
        .put_file("conformance/filed", &f, size)
        .expect_err("overwrite must fail");
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}");
    b.put_file("conformance/filed-again", &f, size)
        .expect("a second put of the same file");
    assert_eq!(b.get("conformance/filed-again", None).expect("get"), data);
}

fn put_get_stat(b: &dyn Backend) {
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    b.put("conformance/a/one", &data).expect("put");
    assert_eq!(b.get("conformance/a/one", None).expect("get"), data);
    assert_eq!(b.stat("conformance/a/one").expect("stat").size, 100_000);
    b.put("conformance/empty", b"").expect("put empty");
    assert_eq!(b.get("conformance/empty", None).expect("get empty"), b"");
}

fn no_overwrite(b: &dyn Backend) {
    b.put("conformance/once", b"first").expect("put");
    let e = b
        .put("conformance/once", b"second")
        .expect_err("overwrite must fail");
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}");
    assert_eq!(b.get("conformance/once", None).expect("get"), b"first");
}

fn ranges(b: &dyn Backend) {
    b.put("conformance/r", b"0123456789").expect("put");
    assert_eq!(b.get("conformance/r", Some(2..5)).expect("range"), b"234");
    assert_eq!(
        b.get("conformance/r", Some(10..10)).expect("empty range"),
        b""
    );
    let e = b.get("conformance/r", Some(5..11)).expect_err("past end");
    assert_eq!(e.kind, ErrorKind::InvalidRange, "{e}");
}

fn missing(b: &dyn Backend) {
    for e in [
        b.get("conformance/nope", None).expect_err("get missing"),
        b.stat("conformance/nope").expect_err("stat missing"),
    ] {
        assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
    }
    assert!(b
        .list("conformance/nothing-here/")
        .expect("list")
        .is_empty());
}

fn listing(b: &dyn Backend, n: usize) {
    // Eight writers, as the engine's uploaders would be: over a network
    // with a 2 ms round trip, one at a time would take seconds.
    std::thread::scope(|s| {
        for t in 0..8 {
            s.spawn(move || {
                for i in (t..n).step_by(8) {
                    b.put(&format!("conformance/many/{:02x}/{i:06}", i % 7), b"x")
                        .expect("put many");
                }
            });
        }
    });
    let mut names: Vec<String> = b
        .list("conformance/many/")
        .expect("list")
        .into_iter()
        .map(|o| o.name)
        .collect();
    names.sort();
    assert_eq!(names.len(), n);
    assert!(names.iter().all(|s| s.starts_with("conformance/many/")));
}

/// One directory holding more entries than one listing answer carries
/// (SMB's 64 KiB QUERY_DIRECTORY buffer holds about 290 names this long):
/// a listing that takes one round trip for small directories must notice
/// when it got only the first part.
fn wide_directory(b: &dyn Backend) {
    let n = 700;
    let name = |i: usize| format!("conformance/wide/{i:064x}");
    std::thread::scope(|s| {
        for t in 0..8 {
            s.spawn(move || {
                for i in (t..n).step_by(8) {
                    b.put(&name(i), b"x").expect("put wide");
                }
            });
        }
    });
    let mut names: Vec<String> = b
        .list("conformance/wide/")
        .expect("list")
        .into_iter()
        .map(|o| o.name)
        .collect();
    names.sort();
    let want: Vec<String> = (0..n).map(name).collect();
    assert_eq!(names, want);
}

fn concurrent_writers(b: &dyn Backend) {
    // Eight writers race for the same name: exactly one wins, the object is
    // whole, and the losers see AlreadyExists.
    let wins = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let wins = &wins;
            s.spawn(move || {
                let body = vec![t; 50_000];
                match b.put("conformance/race", &body) {
                    Ok(()) => {
                        wins.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(e) => assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}"),
                }
            });
        }
    });
    assert_eq!(wins.into_inner(), 1);
    let got = b.get("conformance/race", None).expect("get race");
    assert_eq!(got.len(), 50_000);
    assert!(got.iter().all(|&x| x == got[0]), "object mixes writers");
}

fn delete_idempotent(b: &dyn Backend) {
    b.put("conformance/del", b"x").expect("put");
    b.delete("conformance/del").expect("delete");
    b.delete("conformance/del").expect("delete again");
    assert_eq!(
        b.stat("conformance/del").expect_err("gone").kind,
        ErrorKind::NotFound
    );
}

/// A deterministic byte stream (xorshift), so a large object needs no
/// memory or disk on the test side.
struct Pattern {
    state: u64,
    left: u64,
}

impl Pattern {
    /// `size` bytes of the stream that `seed` names; the same seed gives the
    /// same bytes, so an object can be checked without being held.
    fn new(seed: u64, size: u64) -> Self {
        Pattern {
            state: seed,
            left: size,
        }
    }
}

impl std::io::Read for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize;
        for chunk in buf[..n].chunks_mut(8) {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            chunk.copy_from_slice(&self.state.to_le_bytes()[..chunk.len()]);
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Hashes what is written to it.
struct HashSink(blake3::Hasher, u64);

impl std::io::Write for HashSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        self.1 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Streams an object of `size` bytes in and out again (the contract's
/// `put_stream`/`get_stream`, meant for sizes beyond 4 GiB), checks it byte
/// for byte by hash, checks a range from its far end, and removes it.
pub fn large_object(b: &dyn Backend, size: u64) {
    let name = "conformance/large";
    let seed = 0x9E37_79B9_7F4A_7C15;
    let mut expect = HashSink(blake3::Hasher::new(), 0);
    std::io::copy(&mut Pattern::new(seed, size), &mut expect).expect("hash pattern");
    b.put_stream(name, size, &mut Pattern::new(seed, size))
        .expect("put_stream");
    assert_eq!(b.stat(name).expect("stat large").size, size);
    let mut got = HashSink(blake3::Hasher::new(), 0);
    assert_eq!(
        b.get_stream(name, None, &mut got).expect("get_stream"),
        size
    );
    assert_eq!(got.1, size);
    assert_eq!(
        got.0.finalize(),
        expect.0.finalize(),
        "large object differs"
    );
    // The last 10 bytes, read by range, match the pattern's tail.
    let mut tail = Vec::new();
    std::io::copy(&mut Pattern::new(seed, size), &mut TailSink(&mut tail, 10)).expect("tail");
    assert_eq!(
        b.get(name, Some(size - 10..size)).expect("tail range"),
        tail
    );
    // A short source is refused and leaves nothing behind.
    let e = b
        .put_stream("conformance/short", 1000, &mut &[0u8; 10][..])
        .expect_err("short source");
    assert_ne!(e.kind, ErrorKind::AlreadyExists, "{e}");
    assert_eq!(
        b.stat("conformance/short")
            .expect_err("no partial object")
            .kind,
        ErrorKind::NotFound
    );
    b.delete(name).expect("delete large");
}

/// Keeps the last `n` bytes written.
struct TailSink<'a>(&'a mut Vec<u8>, usize);

impl std::io::Write for TailSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        if self.0.len() > self.1 {
            let cut = self.0.len() - self.1;
            self.0.drain(..cut);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn names(b: &dyn Backend) {
    for bad in ["", "../x", "a//b", "A", "a/./b", "conformance/ü"] {
        assert_eq!(
            b.put(bad, b"x").expect_err(bad).kind,
            ErrorKind::InvalidName,
            "{bad}"
        );
    }
}
