//! Any bytes into the segment decoders: errors, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for segment in gradlane_core::wire::decode_all(data) {
        if segment.is_err() {
            break;
        }
    }
    let _ = gradlane_core::wire::decode_head(data);
    let _ = gradlane_core::wire::segment_len(data);
});
