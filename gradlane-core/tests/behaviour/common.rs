//! Helpers shared by the core's integration tests.

use gradlane_core::rng::SplitMix64;

/// Splits a buffer of back-to-back segments into one slice per segment.
pub fn split_segments(mut buf: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let (_, used) = gradlane_core::wire::decode(buf).expect("valid segment");
        out.push(&buf[..used]);
        buf = &buf[used..];
    }
    out
}

/// A seeded Fisher-Yates shuffle.
pub fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut rng = SplitMix64::new(seed);
    for i in (1..v.len()).rev() {
        let j = rng.below(i + 1);
        v.swap(i, j);
    }
}
