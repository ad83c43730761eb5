//! Framing checked against a one-shot oracle, byte for byte, however the
//! reliable part is cut, with recycled buffers and from shared tensors.

use super::segment_plan::{piece_header, plan_segments, SegmentPlan};
use super::{
    shared_f32_bytes, EncodeError, EncodedRound, Encoder, EncoderConfig, MIN_DATAGRAM,
    ZERO_COPY_MIN,
};
use crate::classify::{Class, ClassifyConfig};
use crate::format::{put_f32s, ClassFormats, ValueFormat};
use crate::layout::{ChunkPlan, Layout};
use crate::rng::SplitMix64;
use crate::score::GradientError;
use crate::wire::{CLASS_SLOTS, DATA_HEADER_LEN, ROUND_END_LEN};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

/// The one-shot framer as it was before framing became incremental, kept
/// as the oracle the incremental one must match byte for byte.
fn oracle_frame<G: AsRef<[f32]>>(
    plan: &ChunkPlan,
    round: u32,
    grads: &[G],
    classes: &[Class],
    levels: u8,
    max_datagram: usize,
    mut buf: Vec<u8>,
) -> EncodedRound {
    // The planning is shared: what the oracle checks is the writing.
    let SegmentPlan {
        end,
        segments,
        packet_ends,
    } = plan_segments(
        plan,
        (0, round),
        classes,
        (levels, ClassFormats::F32),
        max_datagram,
    );

    // Write everything into one buffer.
    let total: usize = segments
        .iter()
        .flatten()
        .map(|p| DATA_HEADER_LEN + p.wire as usize)
        .sum::<usize>()
        + ROUND_END_LEN;
    // Every byte below `total` is written before it is read, but safe Rust
    // wants it initialised; on a recycled buffer this only touches the tail.
    buf.resize(total, 0);
    let mut pos = 0;
    let mut bounds: Vec<Vec<usize>> = vec![Vec::new(); CLASS_SLOTS];
    for (c, segs) in segments.iter().enumerate() {
        let mut next_end = packet_ends[c].iter().peekable();
        for (i, p) in segs.iter().enumerate() {
            let t = p.tensor as usize;
            let header = piece_header(plan, (0, round), (c as Class, ValueFormat::F32), p);
            header.write(&mut buf[pos..pos + DATA_HEADER_LEN]);
            pos += DATA_HEADER_LEN;
            let values = &grads[t].as_ref()[p.offset as usize / 4..(p.offset + p.len) as usize / 4];
            put_f32s(&mut buf[pos..pos + p.len as usize], values);
            pos += p.len as usize;
            if next_end.peek() == Some(&&(i + 1)) {
                next_end.next();
                bounds[c].push(pos);
            }
        }
        if c == 0 {
            end.write(&mut buf[pos..pos + ROUND_END_LEN]);
            pos += ROUND_END_LEN;
            bounds[0].push(pos);
        }
    }
    debug_assert_eq!(pos, total);

    let buf = Bytes::from(buf);
    let reliable = buf.slice(0..bounds[0][0]);
    let mut start = bounds[0][0];
    let mut lossy = Vec::with_capacity(levels as usize);
    for b in bounds.iter().take(levels as usize + 1).skip(1) {
        let mut datagrams = Vec::with_capacity(b.len());
        for &e in b {
            datagrams.push(buf.slice(start..e));
            start = e;
        }
        lossy.push(datagrams);
    }
    EncodedRound {
        round,
        reliable,
        lossy,
        end,
        classes: Vec::new(),
        wire_payload: [0; CLASS_SLOTS],
        root: BytesMut::new(),
    }
}

fn grads(layout: &Layout, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = SplitMix64::new(seed);
    (0..layout.len())
        .map(|t| {
            (0..layout.tensor_len(t))
                .map(|_| {
                    let s = rng.next_u64();
                    ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * (1 + (s & 7)) as f32
                })
                .collect()
        })
        .collect()
}

fn assert_same(a: &EncodedRound, b: &EncodedRound) {
    assert_eq!(a.reliable, b.reliable);
    assert_eq!(a.lossy, b.lossy);
    assert_eq!(a.end, b.end);
}

/// One-shot and incremental framing, whatever the piece size and with
/// recycled buffers, give exactly the bytes of the original framer.
#[test]
fn incremental_framing_matches_the_one_shot_oracle() {
    let layout = crate::presets::resnet18();
    for (levels, max_datagram) in [(3u8, 1414usize), (1, 1162), (7, MIN_DATAGRAM + 60)] {
        let config = EncoderConfig {
            classify: ClassifyConfig {
                levels,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut one_shot = Encoder::new(&layout, config).unwrap();
        let mut pieces = Encoder::new(&layout, config).unwrap();
        for (round, piece) in [(0u32, 1usize), (1, 4096), (2, 1 << 20), (3, usize::MAX)] {
            let g = grads(&layout, 10 + round as u64);
            let a = one_shot.encode(round, &g, max_datagram).unwrap();
            let want = oracle_frame(
                one_shot.plan(),
                round,
                &g,
                &a.classes,
                levels,
                max_datagram,
                Vec::new(),
            );
            assert_same(&a, &want);

            let mut framer = pieces.start(round, &g, max_datagram).unwrap();
            assert_eq!(framer.end(), &want.end);
            assert_eq!(framer.classes(), &a.classes[..]);
            assert_eq!(framer.reliable_len(), want.reliable.len());
            let mut reliable = Vec::new();
            while let Some(b) = framer.next_reliable(&g, piece).unwrap() {
                // Whole segments only, at least `piece` bytes unless last.
                assert!(b.len() >= piece.min(want.reliable.len() - reliable.len()));
                reliable.extend_from_slice(&b);
            }
            assert!(framer.reliable_done());
            assert_eq!(reliable, want.reliable);
            let b = framer.finish(&g).unwrap();
            assert!(b.reliable.is_empty());
            assert_eq!(b.lossy, want.lossy);
            assert_eq!(b.classes, a.classes);
            one_shot.recycle(a);
            pieces.recycle(b);
        }
    }
}

/// Framing from shared tensors gives the bytes of the copying framer;
/// long segments are views of the tensors' own memory.
#[test]
fn shared_framing_matches_copying_and_shares_long_segments() {
    let layout = crate::presets::resnet18();
    let mut copying = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let mut sharing = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    for (round, piece) in [(0u32, 1usize), (1, 64 << 10), (2, usize::MAX)] {
        let g = grads(&layout, 20 + round as u64);
        let want = copying.encode(round, &g, 1414).unwrap();
        let shared: Vec<Arc<Vec<f32>>> = g.iter().cloned().map(Arc::new).collect();
        let views: Vec<Bytes> = shared.iter().cloned().map(shared_f32_bytes).collect();
        let mut framer = sharing.start(round, &g, 1414).unwrap();
        let (mut reliable, mut viewed) = (Vec::new(), 0);
        while let Some(pieces) = framer.next_reliable_shared(&views, piece).unwrap() {
            let len: usize = pieces.iter().map(Bytes::len).sum();
            assert!(len >= piece.min(want.reliable.len() - reliable.len()));
            for p in &pieces {
                let inside = shared.iter().any(|t| {
                    let range = t.as_ptr_range();
                    let start = p.as_ptr() as *const f32;
                    range.contains(&start) && p.len() >= ZERO_COPY_MIN
                });
                if inside {
                    viewed += p.len();
                }
                reliable.extend_from_slice(p);
            }
        }
        assert_eq!(reliable, want.reliable);
        assert!(
            viewed > want.reliable.len() / 10,
            "round {round}: only {viewed} of {} bytes shared",
            want.reliable.len()
        );
        let b = framer.finish(&g).unwrap();
        assert_eq!(b.lossy, want.lossy);
        copying.recycle(want);
        sharing.recycle(b);
    }
    // Tensors of other sizes are refused, not sliced out of bounds.
    let g = grads(&layout, 1);
    let mut framer = sharing.start(9, &g, 1414).unwrap();
    let mut views: Vec<Bytes> = g
        .iter()
        .cloned()
        .map(Arc::new)
        .map(shared_f32_bytes)
        .collect();
    views[3] = views[3].slice(4..);
    assert!(matches!(
        framer.next_reliable_shared(&views, 1),
        Err(EncodeError::Gradient(GradientError::TensorLength {
            tensor: 3,
            ..
        }))
    ));
    assert!(matches!(
        framer.next_reliable_shared(&views[1..], 1),
        Err(EncodeError::Gradient(GradientError::TensorCount { .. }))
    ));
}

/// The lossy part framed for a stream from shared tensors: each level's
/// pieces are its datagrams' bytes end to end, long segments are views,
/// and what the reliable pieces left is in `reliable`.
#[test]
fn shared_lossy_framing_matches_the_datagrams_end_to_end() {
    let layout = crate::presets::resnet18();
    let mut copying = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let mut sharing = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    // Datagrams large enough that some lossy segments are shared.
    let max = 64 << 10;
    for (round, taken) in [(0u32, usize::MAX), (1, 0)] {
        let g = grads(&layout, 40 + round as u64);
        let want = copying.encode(round, &g, max).unwrap();
        let shared: Vec<Arc<Vec<f32>>> = g.iter().cloned().map(Arc::new).collect();
        let views: Vec<Bytes> = shared.iter().cloned().map(shared_f32_bytes).collect();
        let mut framer = sharing.start(round, &g, max).unwrap();
        // Round 0 takes the whole reliable part first, round 1 none.
        let mut reliable = Vec::new();
        if taken > 0 {
            while let Some(pieces) = framer.next_reliable_shared(&views, taken).unwrap() {
                pieces.iter().for_each(|p| reliable.extend_from_slice(p));
            }
        }
        let b = framer.finish_shared(&views).unwrap();
        reliable.extend_from_slice(&b.reliable);
        assert_eq!(reliable, want.reliable);
        assert_eq!(b.lossy.len(), want.lossy.len());
        let mut viewed = 0;
        for (pieces, datagrams) in b.lossy.iter().zip(&want.lossy) {
            let got: Vec<u8> = pieces.iter().flat_map(|p| p.to_vec()).collect();
            let whole: Vec<u8> = datagrams.iter().flat_map(|d| d.to_vec()).collect();
            assert_eq!(got, whole);
            // Every piece but a lone header ends a segment: the
            // pieces up to it decode whole.
            let (mut from, mut upto) = (0, 0);
            for (i, p) in pieces.iter().enumerate() {
                upto += p.len();
                if p.len() == DATA_HEADER_LEN {
                    assert!(pieces.get(i + 1).is_some_and(|v| v.len() >= ZERO_COPY_MIN));
                    continue;
                }
                assert!(crate::wire::decode_all(&got[from..upto]).all(|s| s.is_ok()));
                from = upto;
            }
            viewed += pieces
                .iter()
                .filter(|p| {
                    shared
                        .iter()
                        .any(|t| t.as_ptr_range().contains(&(p.as_ptr() as *const f32)))
                })
                .map(|p| p.len())
                .sum::<usize>();
        }
        assert!(viewed > 0, "round {round}: no lossy segment shared");
        assert_eq!(b.end, want.end);
        copying.recycle(want);
        sharing.recycle(b);
    }
    // Tensors of other sizes are refused.
    let g = grads(&layout, 1);
    let framer = sharing.start(9, &g, max).unwrap();
    let views: Vec<Bytes> = g
        .iter()
        .cloned()
        .map(Arc::new)
        .map(shared_f32_bytes)
        .collect();
    assert!(matches!(
        framer.finish_shared(&views[1..]),
        Err(EncodeError::Gradient(GradientError::TensorCount { .. }))
    ));
}

#[test]
fn a_recycled_buffer_is_reused_once_its_packets_are_gone() {
    let layout = crate::presets::tiny();
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let g = grads(&layout, 1);
    let a = enc.encode(0, &g, 1414).unwrap();
    let ptr = a.reliable.as_ptr();
    enc.recycle(a);
    let b = enc.encode(1, &g, 1414).unwrap();
    assert_eq!(b.reliable.as_ptr(), ptr, "the buffer was reclaimed");
    // A packet still held (by a transport) keeps the buffer from being
    // reclaimed; the next round takes fresh memory and is still right.
    let held = b.reliable.clone();
    enc.recycle(b);
    let c = enc.encode(2, &g, 1414).unwrap();
    assert_ne!(c.reliable.as_ptr(), held.as_ptr());
    assert_eq!(c.reliable[8..12], 2u32.to_le_bytes());
    assert_eq!(held[8..12], 1u32.to_le_bytes());
}

#[test]
fn framing_other_shapes_is_an_error() {
    let layout = crate::presets::tiny();
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let g = grads(&layout, 1);
    let mut framer = enc.start(0, &g, 1414).unwrap();
    let short: Vec<Vec<f32>> = g.iter().skip(1).cloned().collect();
    assert!(matches!(
        framer.next_reliable(&short, 1),
        Err(EncodeError::Gradient(_))
    ));
    assert!(matches!(
        framer.finish(&short),
        Err(EncodeError::Gradient(_))
    ));
}
