//! Trees: any bytes decode or fail cleanly; what decodes re-encodes to a
//! tree that decodes the same.
#![no_main]
use capsule_format::tree::{decode_tree, encode_tree};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(nodes) = decode_tree(data) {
        let again = decode_tree(&encode_tree(&nodes)).expect("re-encoded tree decodes");
        assert_eq!(again, nodes);
    }
});
