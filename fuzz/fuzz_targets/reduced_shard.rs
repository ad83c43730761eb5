//! Any bytes into an owner's reduced shard, for a shard and formats the
//! input's first bytes pick: a typed error, or a shard whose decoding
//! writes every value of the shard and nothing outside it, never a
//! panic. Sums encoded by the owner read back with their formats.
#![no_main]

use gradlane_core::format::{ClassFormats, ValueFormat};
use gradlane_core::group::{encode_reduced_shard, ReducedShard};
use libfuzzer_sys::fuzz_target;
use std::ops::Range;

/// A shard of up to 8 chunks of 0 to 15 values each, its formats, this
/// rank and the group's size, from the first 4 bytes; the rest is the
/// message.
fn pick(data: &[u8]) -> Option<(Vec<Range<usize>>, ClassFormats, usize, usize, &[u8])> {
    let (&[shape, lens, fmt, ranks], message) = data.split_first_chunk::<4>()?;
    let mut chunks = Vec::new();
    let mut at = 0;
    for i in 0..(shape % 8 + 1) as usize {
        let len = ((shape as usize ^ (lens as usize) << i) % 16) as usize;
        chunks.push(at..at + len);
        at += len;
    }
    let important = [ValueFormat::F32, ValueFormat::Bf16, ValueFormat::F16][(fmt % 3) as usize];
    let lossy = ValueFormat::ALL[((fmt >> 2) % 4) as usize];
    let world = (ranks % 4 + 1) as usize;
    let me = (ranks >> 2) as usize % world;
    Some((chunks, ClassFormats { important, lossy }, me, world, message))
}

fuzz_target!(|data: &[u8]| {
    let Some((chunks, formats, me, world, message)) = pick(data) else {
        return;
    };
    let len = chunks.last().map_or(0, |c| c.end);
    if let Ok(shard) = ReducedShard::parse((me, world), message, &chunks, formats) {
        // Guards on either side catch a write outside the shard.
        let mut out = vec![f32::from_bits(0x7fc0_dead); len + 2];
        shard.decode_into(&mut out[1..len + 1]).expect("the shard fits");
        assert_eq!(out[0].to_bits(), 0x7fc0_dead);
        assert_eq!(out[len + 1].to_bits(), 0x7fc0_dead);
        assert!(shard.lost_ranges().all(|r| r.end <= len));
    }
    // The message's bytes as the owner's sum: what it encodes parses.
    let sum: Vec<f32> = (0..len)
        .map(|i| {
            let b = message.get(i % message.len().max(1)).copied().unwrap_or(1);
            (b as f32 - 128.0) / 16.0
        })
        .collect();
    let lossy: Vec<bool> = (0..chunks.len()).map(|c| c % 2 == 1).collect();
    let missing: Vec<Vec<u32>> = (0..world)
        .map(|r| (0..chunks.len() as u32).filter(|c| (c + r as u32) % 3 == 0).collect())
        .collect();
    let missing: Vec<&[u32]> = missing.iter().map(Vec::as_slice).collect();
    let encoded = encode_reduced_shard(&missing, &sum, &chunks, formats, Some(&lossy));
    let shard = ReducedShard::parse((me, world), &encoded, &chunks, formats).expect("own bytes");
    assert_eq!(shard.missing(), missing[me]);
    let mut out = vec![0.0; len];
    shard.decode_into(&mut out).expect("fits");
});
