//! Any bytes into the segment decoders: errors, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for segment in gradlane::wire::decode_all(data) {
        if segment.is_err() {
            break;
        }
    }
    let _ = gradlane::wire::decode_head(data);
    let _ = gradlane::wire::segment_len(data);
});
