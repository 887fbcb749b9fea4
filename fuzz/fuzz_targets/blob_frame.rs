//! Blob frames (stored or zstd): a crafted frame never yields more than the
//! length the index promises (no decompression bomb), and never panics.
#![no_main]
use capsule_format::compress::unframe;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let expected = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize % (8 << 20);
    if let Ok(plain) = unframe(&data[4..], expected) {
        assert_eq!(plain.len(), expected);
    }
});
