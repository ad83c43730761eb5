//! Rounds in every value format: what arrives is what the format makes of
//! each value, however the packets are cut, lost or reframed; values that
//! are not finite come out where they went in; the bytes on the wire are
//! what the formats imply.

use crate::common;

use gradlane_core::classify::ClassifyConfig;
use gradlane_core::encode::{EncodedRound, Encoder, EncoderConfig};
use gradlane_core::format::{log8_round_trip, ClassFormats, ValueFormat, LOG8_BASE};
use gradlane_core::layout::{ChunkOptions, Layout, TensorSpec};
use gradlane_core::presets;
use gradlane_core::reassembly::{Channel, Reassembler, ReassemblyConfig, StreamDecoder};
use gradlane_core::wire::{self, Segment, DATA_HEADER_LEN, ROUND_END_LEN};
use proptest::prelude::*;

fn layout() -> Layout {
    Layout::new(vec![
        TensorSpec::conv2d("conv", [16, 8, 3, 3]),
        TensorSpec::dense("fc", [40, 100]),
        TensorSpec::dense("bias", [40]),
    ])
    .unwrap()
}

fn encoder(layout: &Layout, formats: ClassFormats) -> Encoder {
    let config = EncoderConfig {
        formats,
        classify: ClassifyConfig {
            loss_tolerance: 0.4,
            ..Default::default()
        },
        ..Default::default()
    };
    Encoder::new(layout, config).unwrap()
}

fn receiver(layout: &Layout) -> Reassembler {
    Reassembler::new(layout.clone(), ReassemblyConfig::default()).unwrap()
}

/// Every format pair the encoder takes.
fn pairs() -> Vec<ClassFormats> {
    let mut out = Vec::new();
    for important in [ValueFormat::F32, ValueFormat::Bf16, ValueFormat::F16] {
        for lossy in ValueFormat::ALL {
            out.push(ClassFormats { important, lossy });
        }
    }
    out
}

/// What a receiver should hold of each value of `grads` after a round
/// classed `classes` in `formats`: each chunk as its class's format makes
/// it (Log8 chunk by chunk), or zero where `lost` says.
fn expected(
    layout: &Layout,
    grads: &[Vec<f32>],
    classes: &[u8],
    formats: ClassFormats,
) -> Vec<Vec<f32>> {
    let plan = layout.plan(ChunkOptions::default()).unwrap();
    let mut out: Vec<Vec<f32>> = grads.to_vec();
    for (id, c) in plan.chunks().iter().enumerate() {
        let t = c.tensor as usize;
        let range = c.start as usize..(c.start + c.len) as usize;
        let format = formats.of(classes[id]);
        match format {
            ValueFormat::Log8 => {
                log8_round_trip(&grads[t][range.clone()], &mut out[t][range]).unwrap()
            }
            f => out[t][range].iter_mut().for_each(|v| *v = f.round(*v)),
        }
    }
    out
}

fn bits(tensors: &[Vec<f32>]) -> Vec<Vec<u32>> {
    tensors
        .iter()
        .map(|t| t.iter().map(|v| v.to_bits()).collect())
        .collect()
}

fn push_all(rx: &mut Reassembler, round: &EncodedRound) {
    for seg in common::split_segments(&round.reliable) {
        rx.push(seg, Channel::Reliable).unwrap();
    }
    for d in round.lossy.iter().flatten() {
        rx.push(d, Channel::Lossy).unwrap();
    }
}

#[test]
fn every_format_pair_delivers_what_the_formats_make_of_each_value() {
    let layout = layout();
    let grads = presets::gradients(&layout, 3);
    for formats in pairs() {
        for datagram in [1200usize, 300, 64] {
            let mut enc = encoder(&layout, formats);
            let round = enc.encode(0, &grads, datagram).unwrap();
            for d in round.lossy.iter().flatten() {
                assert!(
                    d.len() <= datagram,
                    "{formats:?}: a datagram of {}",
                    d.len()
                );
            }
            let mut rx = receiver(&layout);
            push_all(&mut rx, &round);
            let got = rx.deliver(0).unwrap();
            let want = expected(&layout, &grads, &round.classes, formats);
            assert_eq!(bits(&got.tensors), bits(&want), "{formats:?} at {datagram}");
            assert!(got.missing_chunks.is_empty());
            let lossy = got.stats.lossy();
            assert_eq!(lossy.received_bytes, lossy.sent_bytes);
        }
    }
}

/// The bytes each class puts on the wire: what its format implies, plus
/// headers and, for Log8, a scale per chunk section.
#[test]
fn wire_bytes_are_what_the_formats_imply() {
    let layout = presets::resnet18();
    let grads = presets::gradients(&layout, 1);
    let payload = |round: &EncodedRound| -> (usize, usize) {
        let mut reliable = round.reliable.len() - ROUND_END_LEN;
        reliable -= common::split_segments(&round.reliable)
            .len()
            .saturating_sub(1)
            * DATA_HEADER_LEN;
        let lossy: usize = round
            .lossy
            .iter()
            .flatten()
            .flat_map(|d| wire::decode_all(d))
            .map(|s| match s.unwrap() {
                Segment::Data(_, p) => p.len(),
                Segment::RoundEnd(_) => unreachable!(),
            })
            .sum();
        (reliable, lossy)
    };
    let mut f32s = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let base = f32s.encode(0, &grads, 1414).unwrap();
    let (important_f32, lossy_f32) = payload(&base);
    let formats = ClassFormats {
        important: ValueFormat::Bf16,
        lossy: ValueFormat::Log8,
    };
    let mut packed = Encoder::new(
        &layout,
        EncoderConfig {
            formats,
            ..Default::default()
        },
    )
    .unwrap();
    let round = packed.encode(0, &grads, 1414).unwrap();
    assert_eq!(round.classes, base.classes);
    let (important, lossy) = payload(&round);
    assert_eq!(important * 2, important_f32);
    // One byte a value and a 4-byte scale per section (about per chunk).
    let values = lossy_f32 / 4;
    assert!(
        lossy >= values && lossy <= values + values / 40,
        "{lossy} for {values} values"
    );
    // The whole round: about (0.8 x 2 + 0.2 x 1) / 4 of the f32 payload.
    let ratio = (important + lossy) as f64 / (important_f32 + lossy_f32) as f64;
    assert!((0.44..0.46).contains(&ratio), "{ratio}");
}

#[test]
fn values_not_finite_come_out_where_they_went_in() {
    let layout = layout();
    let mut grads = presets::gradients(&layout, 9);
    // In chunks that would otherwise be lossy: the smallest ones.
    let plan = layout.plan(ChunkOptions::default()).unwrap();
    let mut probe = encoder(&layout, ClassFormats::F32);
    let classes = probe.encode(0, &grads, 1200).unwrap().classes;
    let lossy: Vec<usize> = (0..plan.len()).filter(|&i| classes[i] != 0).collect();
    assert!(lossy.len() >= 3);
    let spots = [
        (lossy[0], f32::INFINITY),
        (lossy[1], f32::NEG_INFINITY),
        (lossy[2], f32::NAN),
    ];
    for &(id, v) in &spots {
        let c = plan.chunks()[id];
        grads[c.tensor as usize][c.start as usize + 1] = v;
    }
    for formats in pairs() {
        let mut enc = encoder(&layout, formats);
        enc.encode(0, &presets::gradients(&layout, 9), 1200)
            .unwrap();
        let round = enc.encode(1, &grads, 1200).unwrap();
        let mut rx = receiver(&layout);
        // Every datagram lost: what is not finite travels exact anyway.
        for seg in common::split_segments(&round.reliable) {
            rx.push(seg, Channel::Reliable).unwrap();
        }
        let got = rx.deliver(1).unwrap();
        for &(id, v) in &spots {
            assert_eq!(
                round.classes[id], 0,
                "{formats:?}: chunk {id} not important"
            );
            let c = plan.chunks()[id];
            let t = &got.tensors[c.tensor as usize];
            let d = t[c.start as usize + 1];
            assert!(
                d.to_bits() == v.to_bits() || (v.is_nan() && d.is_nan()),
                "{formats:?}: {v} came out {d}"
            );
            // The rest of the chunk is the important format's, not poisoned.
            let other = t[c.start as usize];
            let want = formats
                .important
                .round(grads[c.tensor as usize][c.start as usize]);
            assert_eq!(other.to_bits(), want.to_bits());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The reliable stream cut at any byte, the datagrams reframed for a
    /// smaller limit and some lost: what arrives is exactly what whole
    /// packets would have delivered, for every format.
    #[test]
    fn cut_reframed_and_lost_packets_deliver_the_same(
        pair in 0usize..12,
        cuts in prop::collection::vec(1usize..700, 1..40),
        smaller in 60usize..1200,
        seed in any::<u64>(),
    ) {
        let layout = layout();
        let formats = pairs()[pair];
        let grads = presets::gradients(&layout, seed);
        let mut enc = encoder(&layout, formats);
        let round = enc.encode(0, &grads, 1200).unwrap();

        // Reference: whole packets, the datagrams kept by the seed.
        let keep = |i: usize| (seed >> (i % 64)) % 3 != 0;
        let mut whole = receiver(&layout);
        for seg in common::split_segments(&round.reliable) {
            whole.push(seg, Channel::Reliable).unwrap();
        }
        for (i, d) in round.lossy.iter().flatten().enumerate() {
            if keep(i) {
                whole.push(d, Channel::Lossy).unwrap();
            }
        }
        let want = whole.deliver(0).unwrap();

        // The stream in arbitrary pieces, the kept datagrams reframed.
        let mut cut = receiver(&layout);
        let mut decoder = StreamDecoder::new();
        let mut rest = &round.reliable[..];
        let mut i = 0;
        while !rest.is_empty() {
            let n = cuts[i % cuts.len()].min(rest.len());
            decoder.feed(&mut cut, &rest[..n]).unwrap();
            rest = &rest[n..];
            i += 1;
        }
        prop_assert!(decoder.at_boundary());
        for (i, d) in round.lossy.iter().flatten().enumerate() {
            if keep(i) {
                for piece in enc.reframe(d, smaller).unwrap() {
                    prop_assert!(piece.len() <= smaller);
                    cut.push(&piece, Channel::Lossy).unwrap();
                }
            }
        }
        let got = cut.deliver(0).unwrap();
        prop_assert_eq!(bits(&got.tensors), bits(&want.tensors));
        prop_assert_eq!(got.missing_chunks, want.missing_chunks);
    }
}

/// Lossy data on streams (the adaptive carrier while nothing is lost):
/// a level's pieces from shared f32 tensors decode as its datagrams do.
#[test]
fn shared_framing_converts_every_format() {
    use std::sync::Arc;
    let layout = layout();
    let grads = presets::gradients(&layout, 4);
    for formats in pairs() {
        let mut a = encoder(&layout, formats);
        let mut b = encoder(&layout, formats);
        let want = a.encode(0, &grads, 1200).unwrap();
        let views: Vec<bytes::Bytes> = grads
            .iter()
            .cloned()
            .map(Arc::new)
            .map(gradlane_core::encode::shared_f32_bytes)
            .collect();
        let framer = b.start(0, &grads, 1200).unwrap();
        let got = framer.finish_shared(&views).unwrap();
        assert_eq!(got.reliable, want.reliable, "{formats:?}");
        for (pieces, datagrams) in got.lossy.iter().zip(&want.lossy) {
            let got: Vec<u8> = pieces.iter().flat_map(|p| p.to_vec()).collect();
            let whole: Vec<u8> = datagrams.iter().flat_map(|d| d.to_vec()).collect();
            assert_eq!(got, whole, "{formats:?}");
        }
    }
}

#[test]
fn log8_base_is_the_documented_one() {
    // DESIGN.md states the bound at b = 1.1: +4.88% / -4.65%.
    assert_eq!(LOG8_BASE, 1.1);
    assert!((LOG8_BASE.sqrt() - 1.0 - 0.0488).abs() < 1e-4);
    assert!((1.0 - 1.0 / LOG8_BASE.sqrt() - 0.0465).abs() < 1e-4);
}
