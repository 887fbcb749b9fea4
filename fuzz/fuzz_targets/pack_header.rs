//! Pack trailers and headers: any bytes parse or fail cleanly; a header
//! that decodes re-encodes to the same entries.
#![no_main]
use capsule_format::pack::{decode_header, encode_header, parse_trailer, PACK_TRAILER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() >= PACK_TRAILER_LEN {
        let _ = parse_trailer(&data[data.len() - PACK_TRAILER_LEN..], data.len() as u64);
    }
    if let Ok(entries) = decode_header(data) {
        assert_eq!(decode_header(&encode_header(&entries)).unwrap(), entries);
    }
});
