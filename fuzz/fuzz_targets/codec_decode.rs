//! Any bytes into the codec's frame decoders: errors, never a panic, and
//! never a write outside the dense output.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = gradlane_core::codec::decode(data);
    let _ = gradlane_core::codec::validate(data);
    let mut dense = vec![0f32; 4096];
    let _ = gradlane_core::codec::decode_into_dense(data, &mut dense);
    let _ = gradlane_core::codec::decode_add_into(data, &mut dense);
});
