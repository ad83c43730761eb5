//! Helpers shared by the integration tests.
#![allow(dead_code)]

use gradlane::classify::splitmix64;
use gradlane::layout::Layout;

/// Deterministic gradients with no zero value, so a zero in a rebuilt tensor
/// can only mean "not received". Magnitudes vary per chunk-sized block so
/// that contributions differ.
pub fn grads(layout: &Layout, seed: u64) -> Vec<Vec<f32>> {
    let mut s = seed;
    (0..layout.len())
        .map(|t| {
            (0..layout.tensor_len(t))
                .map(|i| {
                    s = splitmix64(s);
                    let scale = 1.0 + ((i / 97) % 13) as f32;
                    let u = ((s >> 40) as f32 + 1.0) / (1u64 << 24) as f32; // (0, 1]
                    let sign = if s & 1 == 0 { 1.0 } else { -1.0 };
                    sign * scale * u
                })
                .collect()
        })
        .collect()
}

/// Splits a buffer of back-to-back segments into one slice per segment.
pub fn split_segments(mut buf: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let (_, used) = gradlane::wire::decode(buf).expect("valid segment");
        out.push(&buf[..used]);
        buf = &buf[used..];
    }
    out
}

/// A seeded Fisher-Yates shuffle.
pub fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut s = seed;
    for i in (1..v.len()).rev() {
        s = splitmix64(s);
        let j = (s % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}
