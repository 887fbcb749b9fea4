//! A test hook that stops a process at a named point.

/// Test hook: with `CAPSULE_TEST_PAUSE=<point>:<file>` (several pairs
/// separated by `;`), the process creates `<file>.waiting` at that point
/// and waits (at most ten minutes) until `<file>` exists, so a test can act
/// at an exact moment (stop the process, run a prune, move the clock). Not
/// for production use.
pub(crate) fn test_pause(point: &str) {
    let Some(v) = std::env::var_os("CAPSULE_TEST_PAUSE") else {
        return;
    };
    let v = v.to_string_lossy();
    let Some(file) = v
        .split(';')
        .filter_map(|pair| pair.split_once(':'))
        .find(|(p, _)| *p == point)
        .map(|(_, f)| f)
    else {
        return;
    };
    let _ = std::fs::write(format!("{file}.waiting"), b"");
    for _ in 0..6000 {
        if std::path::Path::new(file).exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
