//! The receiver rebuilds rounds exactly from whatever subset of packets arrives.

use crate::common;

use gradlane_core::classify::ClassifyConfig;
use gradlane_core::encode::{EncodedRound, Encoder, EncoderConfig};
use gradlane_core::layout::{ChunkOptions, Layout, TensorSpec};
use gradlane_core::presets;
use gradlane_core::reassembly::{
    Channel, Reassembler, ReassemblyConfig, ReassemblyError, StreamDecoder,
};
use gradlane_core::rng::SplitMix64;
use gradlane_core::wire::{self, Segment, WireError};
use proptest::prelude::*;

fn encode(layout: &Layout, round: u32, grads: &[Vec<f32>], datagram: usize) -> EncodedRound {
    let mut enc = Encoder::new(layout, EncoderConfig::default()).unwrap();
    enc.encode(round, grads, datagram).unwrap()
}

fn receiver(layout: &Layout) -> Reassembler {
    Reassembler::new(layout.clone(), ReassemblyConfig::default()).unwrap()
}

/// Pushes the reliable segments one by one, the datagrams for which `keep`
/// says yes, and returns which datagrams were dropped.
fn push_round(
    rx: &mut Reassembler,
    enc: &EncodedRound,
    mut keep: impl FnMut(usize) -> bool,
) -> Vec<bytes::Bytes> {
    let mut dropped = Vec::new();
    for seg in common::split_segments(&enc.reliable) {
        rx.push(seg, Channel::Reliable).unwrap();
    }
    for (i, d) in enc.lossy.iter().flatten().enumerate() {
        if keep(i) {
            rx.push(d, Channel::Lossy).unwrap();
        } else {
            dropped.push(d.clone());
        }
    }
    dropped
}

/// Marks the values each datagram in `dropped` carried.
fn dropped_mask(layout: &Layout, dropped: &[bytes::Bytes]) -> Vec<Vec<bool>> {
    let mut mask: Vec<Vec<bool>> = (0..layout.len())
        .map(|t| vec![false; layout.tensor_len(t)])
        .collect();
    for d in dropped {
        for seg in wire::decode_all(d) {
            if let Segment::Data(h, _) = seg.unwrap() {
                let off = h.byte_offset as usize / 4;
                mask[h.tensor as usize][off..off + h.payload_len as usize / 4].fill(true);
            }
        }
    }
    mask
}

#[test]
fn all_packets_rebuild_bit_exact_tensors() {
    let layout = presets::resnet18();
    let grads = gradlane_core::presets::gradients(&layout, 1);
    let enc = encode(&layout, 0, &grads, 1414);
    let mut rx = receiver(&layout);
    push_round(&mut rx, &enc, |_| true);
    assert_eq!(rx.next_complete(), Some(0));
    let round = rx.deliver(0).unwrap();
    assert_eq!(round.index, 0);
    for (t, (got, want)) in round.tensors.iter().zip(&grads).enumerate() {
        assert!(
            got.iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "tensor {t} differs"
        );
    }
    let s = &round.stats;
    assert_eq!(s.classes[0].received_chunks, enc.end.chunks[0] as u64);
    assert_eq!(s.lossy().zero_filled_bytes, 0);
    assert_eq!(s.lossy().received_bytes, s.lossy().sent_bytes);
    let total: u64 = s.classes.iter().map(|c| c.received_bytes).sum();
    assert_eq!(total, layout.total_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn dropped_datagrams_zero_exactly_their_bytes(
        seed in any::<u64>(),
        loss_permille in 0u64..1000,
        datagram in 200usize..2000,
        shuffle in any::<bool>(),
    ) {
        let layout = presets::tiny();
        let grads = gradlane_core::presets::gradients(&layout, seed);
        let enc = encode(&layout, 5, &grads, datagram);
        let mut rx = receiver(&layout);
        // Packets in a seeded random order, important ones included; the
        // round end last, as the reliable stream guarantees.
        let mut packets: Vec<(bytes::Bytes, Channel)> = Vec::new();
        let segs = common::split_segments(&enc.reliable);
        let (end, important) = segs.split_last().unwrap();
        for s in important {
            packets.push((bytes::Bytes::copy_from_slice(s), Channel::Reliable));
        }
        let mut rng = SplitMix64::new(seed);
        let mut dropped = Vec::new();
        for d in enc.lossy.iter().flatten() {
            let s = rng.next_u64();
            if s % 1000 < loss_permille {
                dropped.push(d.clone());
            } else {
                packets.push((d.clone(), Channel::Lossy));
            }
        }
        if shuffle {
            common::shuffle(&mut packets, seed);
        }
        for (p, ch) in &packets {
            rx.push(p, *ch).unwrap();
        }
        rx.push(end, Channel::Reliable).unwrap();
        let round = rx.deliver(5).unwrap();
        let mask = dropped_mask(&layout, &dropped);
        for t in 0..layout.len() {
            for (i, (got, want)) in round.tensors[t].iter().zip(&grads[t]).enumerate() {
                if mask[t][i] {
                    prop_assert_eq!(*got, 0.0, "tensor {} value {} should be zero", t, i);
                } else {
                    prop_assert_eq!(got.to_bits(), want.to_bits(), "tensor {} value {}", t, i);
                }
            }
        }
        let dropped_bytes: u64 = mask.iter().flatten().filter(|&&m| m).count() as u64 * 4;
        prop_assert_eq!(round.stats.lossy().zero_filled_bytes, dropped_bytes);
        prop_assert_eq!(round.stats.classes[0].zero_filled_bytes, 0);
    }
}

#[test]
fn late_packets_are_added_into_the_next_round() {
    let layout = presets::tiny();
    let g0 = gradlane_core::presets::gradients(&layout, 10);
    let g1 = gradlane_core::presets::gradients(&layout, 11);
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let e0 = enc.encode(0, &g0, 1200).unwrap();
    let e1 = enc.encode(1, &g1, 1200).unwrap();
    let mut rx = receiver(&layout);

    // Round 0 without its first three datagrams; deliver it.
    let late = push_round(&mut rx, &e0, |i| i >= 3);
    let r0 = rx.deliver(0).unwrap();
    let mask = dropped_mask(&layout, &late);
    // They arrive now, after delivery: kept for round 1.
    for d in &late {
        let out = rx.push(d, Channel::Lossy).unwrap();
        assert_eq!(out.late as usize, wire::decode_all(d).count());
    }
    // A second copy of a late datagram is a duplicate, not added twice.
    let again = rx.push(&late[0], Channel::Lossy).unwrap();
    assert_eq!(
        (again.late, again.duplicates as usize),
        (0, wire::decode_all(&late[0]).count())
    );

    push_round(&mut rx, &e1, |_| true);
    let r1 = rx.deliver(1).unwrap();
    let late_bytes = mask.iter().flatten().filter(|&&m| m).count() as u64 * 4;
    assert!(late_bytes > 0);
    assert_eq!(r1.stats.lossy().late_merged_bytes, late_bytes);
    assert_eq!(r1.stats.late_from, vec![(0, late_bytes)]);
    for t in 0..layout.len() {
        for i in 0..layout.tensor_len(t) {
            if mask[t][i] {
                assert_eq!(r0.tensors[t][i], 0.0);
                assert_eq!(
                    r1.tensors[t][i],
                    g1[t][i] + g0[t][i],
                    "tensor {t} value {i}"
                );
            } else {
                assert_eq!(r1.tensors[t][i].to_bits(), g1[t][i].to_bits());
            }
        }
    }
}

#[test]
fn duplicates_in_an_open_round_are_ignored() {
    let layout = presets::tiny();
    let grads = gradlane_core::presets::gradients(&layout, 2);
    let enc = encode(&layout, 0, &grads, 1200);
    let mut rx = receiver(&layout);
    let first = &enc.lossy[0][0];
    let n = wire::decode_all(first).count() as u32;
    assert_eq!(rx.push(first, Channel::Lossy).unwrap().accepted, n);
    assert_eq!(rx.push(first, Channel::Lossy).unwrap().duplicates, n);
    push_round(&mut rx, &enc, |i| i != 0);
    let round = rx.deliver(0).unwrap();
    assert_eq!(round.stats.counters.duplicates, n as u64);
    assert!(exact(&round.tensors, &grads));
}

#[test]
fn the_late_buffer_is_bounded_and_counts_what_it_drops() {
    let layout = presets::tiny();
    let grads = gradlane_core::presets::gradients(&layout, 3);
    let enc = encode(&layout, 0, &grads, 1200);
    let cap = 4096;
    let mut rx = Reassembler::new(
        layout.clone(),
        ReassemblyConfig {
            late_buffer_bytes: cap,
            ..Default::default()
        },
    )
    .unwrap();
    let late = push_round(&mut rx, &enc, |_| false);
    rx.deliver(0).unwrap();
    let mut late_payload = 0u64;
    for d in &late {
        rx.push(d, Channel::Lossy).unwrap();
        late_payload += d.len() as u64 - 40 * wire::decode_all(d).count() as u64;
        assert!(rx.late_buffered_bytes() <= cap);
    }
    let c = rx.counters();
    assert!(c.late_dropped_full > 0);
    // Every late byte is either buffered or counted as dropped.
    assert_eq!(
        c.late_dropped_bytes + rx.late_buffered_bytes() as u64,
        late_payload
    );
    assert!(
        rx.late_buffered_bytes() > cap / 2,
        "the buffer is used up to its cap"
    );
}

#[test]
fn a_round_end_ahead_of_its_important_chunks_waits_for_them() {
    let layout = presets::tiny();
    let grads = gradlane_core::presets::gradients(&layout, 4);
    let enc = encode(&layout, 0, &grads, 1200);
    let segs = common::split_segments(&enc.reliable);
    let (end_seg, data) = segs.split_last().unwrap();
    assert_eq!(end_seg.len(), wire::ROUND_END_LEN);
    assert!(data.len() >= 2, "the test needs several important segments");

    // Lanes: the end may overtake the last important segment. The round
    // completes exactly when that segment comes, and is then whole.
    let mut rx = receiver(&layout);
    for s in &data[1..] {
        assert_eq!(rx.push(s, Channel::Reliable).unwrap().completed, None);
    }
    assert_eq!(rx.push(end_seg, Channel::Reliable).unwrap().completed, None);
    assert!(!rx.is_complete(0));
    assert_eq!(rx.deliver(0).unwrap_err(), ReassemblyError::NotComplete(0));
    assert_eq!(
        rx.push(data[0], Channel::Reliable).unwrap().completed,
        Some(0)
    );
    assert!(rx.is_complete(0));
    let lanes = rx.deliver(0).unwrap();
    let mut in_order = receiver(&layout);
    for s in &segs {
        in_order.push(s, Channel::Reliable).unwrap();
    }
    let whole = in_order.deliver(0).unwrap();
    assert_eq!(lanes.tensors, whole.tensors);
    assert_eq!(lanes.stats.classes[0], whole.stats.classes[0]);

    // Important data the end does not announce, after it, is an error: a
    // different round's end says fewer chunks than are then held.
    let mut rx = receiver(&layout);
    let mut short = enc.end;
    short.chunks[0] -= 1;
    rx.push(&short.to_bytes(), Channel::Reliable).unwrap();
    let pushed: Vec<_> = data.iter().map(|s| rx.push(s, Channel::Reliable)).collect();
    assert!(
        pushed
            .iter()
            .any(|r| matches!(r, Err(ReassemblyError::ImportantMismatch(0)))),
        "{pushed:?}"
    );
    assert!(!rx.is_complete(0));

    // A forged digest is caught when the counts match, whichever came
    // first.
    let mut forged = enc.end;
    forged.important_digest ^= 1;
    let mut rx = receiver(&layout);
    for s in data {
        rx.push(s, Channel::Reliable).unwrap();
    }
    assert_eq!(
        rx.push(&forged.to_bytes(), Channel::Reliable).unwrap_err(),
        ReassemblyError::ImportantMismatch(0)
    );
    let mut rx = receiver(&layout);
    rx.push(&forged.to_bytes(), Channel::Reliable).unwrap();
    for s in &data[1..] {
        rx.push(s, Channel::Reliable).unwrap();
    }
    assert_eq!(
        rx.push(data[0], Channel::Reliable).unwrap_err(),
        ReassemblyError::ImportantMismatch(0)
    );
    assert!(!rx.is_complete(0));
}

#[test]
fn malformed_and_misrouted_packets_are_counted_and_change_nothing() {
    let layout = presets::tiny();
    let grads = gradlane_core::presets::gradients(&layout, 5);
    let enc = encode(&layout, 0, &grads, 1200);
    let mut rx = receiver(&layout);
    // A good segment followed by garbage: the whole packet is refused.
    let mut bad = enc.lossy[0][0].to_vec();
    bad.extend_from_slice(&[0x47, 0x4C, 2, 1, 0, 0, 0, 0]);
    assert!(matches!(
        rx.push(&bad, Channel::Lossy),
        Err(ReassemblyError::Wire(WireError::Truncated { .. }))
    ));
    assert_eq!(rx.open_rounds().count(), 0, "nothing applied");
    // Important data and round ends must come on the reliable channel.
    let segs = common::split_segments(&enc.reliable);
    assert!(matches!(
        rx.push(segs[0], Channel::Lossy),
        Err(ReassemblyError::WrongChannel(_))
    ));
    assert!(matches!(
        rx.push(segs.last().unwrap(), Channel::Lossy),
        Err(ReassemblyError::WrongChannel(_))
    ));
    // A segment for another layout.
    let other = Layout::new(vec![TensorSpec::dense("x", [50_000])]).unwrap();
    let mut e2 = Encoder::new(&other, EncoderConfig::default()).unwrap();
    let foreign = e2.encode(0, &[vec![1.0; 50_000]], 1200).unwrap();
    assert!(matches!(
        rx.push(&foreign.lossy[0][0], Channel::Lossy),
        Err(ReassemblyError::Wire(_))
    ));
    assert_eq!(rx.counters().malformed, 4);
    assert!(rx.push(&[], Channel::Lossy).is_err());
    // The receiver still works.
    push_round(&mut rx, &enc, |_| true);
    let round = rx.deliver(0).unwrap();
    assert!(exact(&round.tensors, &grads));
}

#[test]
fn open_rounds_are_bounded() {
    let layout = Layout::new(vec![TensorSpec::dense("w", [4096])]).unwrap();
    let grads = vec![vec![1.0f32; 4096]];
    let mut rx = receiver(&layout);
    let mut enc = Encoder::new(
        &layout,
        EncoderConfig {
            classify: ClassifyConfig {
                loss_tolerance: 1.0,
                ..Default::default()
            },
            chunking: ChunkOptions::default(),
            ..Default::default()
        },
    )
    .unwrap();
    let mut dropped = 0;
    for r in 0..10 {
        let e = enc.encode(r, &grads, 1200).unwrap();
        dropped += rx.push(&e.lossy[0][0], Channel::Lossy).unwrap().dropped;
    }
    assert_eq!(rx.open_rounds().count(), 3);
    assert_eq!(dropped, 7);
    assert_eq!(rx.counters().too_many_open, 7);
}

#[test]
fn delivery_is_in_order_and_skipped_rounds_are_counted() {
    let layout = presets::tiny();
    let grads = gradlane_core::presets::gradients(&layout, 6);
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let e0 = enc.encode(0, &grads, 1200).unwrap();
    let e1 = enc.encode(1, &grads, 1200).unwrap();
    let mut rx = receiver(&layout);
    rx.push(&e0.lossy[0][0], Channel::Lossy).unwrap();
    push_round(&mut rx, &e1, |_| true);
    let r1 = rx.deliver(1).unwrap();
    assert_eq!(r1.stats.counters.abandoned_rounds, 1);
    assert_eq!(
        rx.deliver(0).unwrap_err(),
        ReassemblyError::AlreadyDelivered { round: 0, last: 1 }
    );
    // The skipped round's stream arriving after all (a sender that gave it
    // up while its streams ran on): its end is ignored, its data dropped
    // as too old, nothing merged into a later round.
    let too_old = rx.counters().too_old;
    for seg in common::split_segments(&e0.reliable) {
        rx.push(seg, Channel::Reliable).unwrap();
    }
    assert_eq!(rx.counters().stale_ends, 1);
    assert!(rx.counters().too_old > too_old);
    assert_eq!(rx.late_buffered_bytes(), 0);
    // A second end of the delivered round is a broken peer.
    let end1 = common::split_segments(&e1.reliable)
        .into_iter()
        .find(|seg| matches!(wire::decode_all(seg).next(), Some(Ok(Segment::RoundEnd(_)))))
        .unwrap();
    assert_eq!(
        rx.push(end1, Channel::Reliable).unwrap_err(),
        ReassemblyError::EndAfterDelivery(1)
    );
}

/// Feeds `stream` to a decoder in pieces cut at `cuts` (sorted positions).
fn feed_in_pieces(
    rx: &mut Reassembler,
    stream: &[u8],
    cuts: &[usize],
) -> Result<Option<u32>, ReassemblyError> {
    let mut decoder = StreamDecoder::new();
    let mut ended = None;
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&stream.len())) {
        let to = to.clamp(from, stream.len());
        let out = decoder.feed(rx, &stream[from..to])?;
        ended = ended.or(out.completed);
        from = to;
    }
    assert!(
        decoder.at_boundary(),
        "a whole stream ends between segments"
    );
    Ok(ended)
}

/// Round delivered from the whole segments, and from the same stream cut
/// into pieces: the same tensors, bit for bit, and the same stats.
fn assert_pieces_rebuild_the_round(layout: &Layout, cuts: &[usize]) {
    let grads = gradlane_core::presets::gradients(layout, 5);
    let enc = encode(layout, 0, &grads, 1200);
    let mut whole = receiver(layout);
    push_round(&mut whole, &enc, |_| true);
    let want = whole.deliver(0).unwrap();
    let mut cut = receiver(layout);
    assert_eq!(
        feed_in_pieces(&mut cut, &enc.reliable, cuts).unwrap(),
        Some(0)
    );
    for d in enc.lossy.iter().flatten() {
        cut.push(d, Channel::Lossy).unwrap();
    }
    let got = cut.deliver(0).unwrap();
    assert_eq!(got.stats, want.stats);
    for (g, w) in got.tensors.iter().zip(&want.tensors) {
        assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn stream_pieces_of_every_small_size_rebuild_the_round() {
    // Pieces of 1..=45 bytes cut every header, value and round end at every
    // position; 1452 is a QUIC packet's worth, 3 keeps cutting values.
    let layout = presets::tiny();
    let len = {
        let enc = encode(
            &layout,
            0,
            &gradlane_core::presets::gradients(&layout, 5),
            1200,
        );
        enc.reliable.len()
    };
    for step in (1..=45).chain([151, 152, 153, 1452, 4096]) {
        let cuts: Vec<usize> = (1..len.div_ceil(step)).map(|i| i * step).collect();
        assert_pieces_rebuild_the_round(&layout, &cuts);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(30))]

    #[test]
    fn stream_pieces_cut_anywhere_rebuild_the_round(
        mut cuts in proptest::collection::vec(0usize..400_000, 0..300),
    ) {
        let layout = presets::tiny();
        cuts.sort_unstable();
        assert_pieces_rebuild_the_round(&layout, &cuts);
    }
}

#[test]
fn a_broken_stream_is_a_typed_error_and_stays_broken() {
    let layout = presets::tiny();
    let enc = encode(
        &layout,
        0,
        &gradlane_core::presets::gradients(&layout, 5),
        1200,
    );
    let mut bad = enc.reliable.to_vec();
    bad[0] ^= 0xff; // magic
    let mut rx = receiver(&layout);
    let mut decoder = StreamDecoder::new();
    // The prefix is cut: nothing is known until it is whole.
    decoder.feed(&mut rx, &bad[..3]).unwrap();
    assert!(!decoder.at_boundary());
    assert!(matches!(
        decoder.feed(&mut rx, &bad[3..100]),
        Err(ReassemblyError::Wire(WireError::BadMagic(_)))
    ));
    assert_eq!(rx.counters().malformed, 1);
    assert!(matches!(
        decoder.feed(&mut rx, &bad[100..]),
        Err(ReassemblyError::StreamBroken)
    ));
    // A stream cut inside a segment does not end at a boundary.
    let mut rx = receiver(&layout);
    let mut decoder = StreamDecoder::new();
    decoder.feed(&mut rx, &enc.reliable[..50]).unwrap();
    assert!(!decoder.at_boundary());
}

#[test]
fn recycled_tensors_are_zero_where_nothing_arrived() {
    // Tensors handed back are not cleared when a round opens; delivery must
    // zero exactly what never arrived, never leak an older round's values.
    let layout = presets::tiny();
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let mut rx = receiver(&layout);
    let g0: Vec<Vec<f32>> = gradlane_core::presets::gradients(&layout, 1);
    let e0 = enc.encode(0, &g0, 1200).unwrap();
    push_round(&mut rx, &e0, |_| true);
    let r0 = rx.deliver(0).unwrap();
    rx.recycle(r0.tensors).unwrap();
    let g1 = gradlane_core::presets::gradients(&layout, 2);
    let e1 = enc.encode(1, &g1, 1200).unwrap();
    let dropped = push_round(&mut rx, &e1, |i| i % 3 == 0);
    assert!(!dropped.is_empty());
    let mask = dropped_mask(&layout, &dropped);
    let r1 = rx.deliver(1).unwrap();
    for t in 0..layout.len() {
        for (i, v) in r1.tensors[t].iter().enumerate() {
            let want = if mask[t][i] { 0.0 } else { g1[t][i] };
            assert_eq!(v.to_bits(), want.to_bits(), "tensor {t} value {i}");
        }
    }
}

/// A sender cuts datagrams into smaller ones when the path's limit shrinks
/// after framing: the round is not complete until every piece is in, even
/// though more datagrams than the round end announces have arrived.
#[test]
fn lossy_progress_counts_bytes_so_reframed_datagrams_are_waited_for() {
    let layout = presets::tiny();
    let grads = gradlane_core::presets::gradients(&layout, 3);
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let round = enc.encode(0, &grads, 1200).unwrap();
    let framed: usize = round.lossy.iter().map(Vec::len).sum();
    let pieces: Vec<bytes::Bytes> = round
        .lossy
        .iter()
        .flatten()
        .flat_map(|d| enc.reframe(d, 400).unwrap())
        .collect();
    assert!(
        pieces.len() > framed,
        "the test needs datagrams that are cut"
    );
    let mut rx = receiver(&layout);
    for seg in common::split_segments(&round.reliable) {
        rx.push(seg, Channel::Reliable).unwrap();
    }
    for (i, p) in pieces.iter().enumerate() {
        let (got, sent) = rx.lossy_progress(0).unwrap();
        let sent = sent.unwrap();
        assert!(got < sent, "complete after {i} of {} pieces", pieces.len());
        rx.push(p, Channel::Lossy).unwrap();
    }
    let (got, sent) = rx.lossy_progress(0).unwrap();
    assert_eq!(Some(got), sent);
    // A duplicate adds nothing.
    rx.push(&pieces[0], Channel::Lossy).unwrap();
    assert_eq!(rx.lossy_progress(0).unwrap(), (got, sent));
    let delivered = rx.deliver(0).unwrap();
    assert_eq!(delivered.stats.lossy().zero_filled_bytes, 0);
}

/// Whether a rebuilt round holds exactly the gradients sent.
fn exact(tensors: &[Vec<f32>], grads: &[Vec<f32>]) -> bool {
    tensors.iter().flatten().eq(grads.iter().flatten())
}
