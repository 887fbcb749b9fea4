//! Index files: any bytes decode or fail cleanly, without allocating what
//! a crafted count claims; what decodes round-trips.
#![no_main]
use capsule_format::index::{decode_index, encode_index};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(idx) = decode_index(data) {
        assert_eq!(decode_index(&encode_index(&idx)).unwrap(), idx);
    }
});
