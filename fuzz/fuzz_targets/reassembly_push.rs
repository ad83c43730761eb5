//! The receiver state machine fed what a sender frames, in every value
//! format, however the transport cuts, drops, repeats, reorders or
//! reframes it, and now and then bytes no sender wrote.
//!
//! The input's first bytes pick the rounds: a pair of class formats (every
//! important format with every lossy one), a chunk plan, the datagram
//! limit, the share and levels of lossy chunks, values that are not finite
//! or overflow a 16-bit format, one round or two. The encoder frames them;
//! the rest of the input is a program of transport events: a piece of a
//! round's reliable stream into its `StreamDecoder` (any length, so pieces
//! cut headers and values anywhere), the next datagram pushed, dropped,
//! reframed for a smaller limit, an earlier one pushed again, a round
//! delivered; and, marking the run as not honest, a datagram with a byte
//! changed, or raw input as a packet or a stream piece.
//!
//! Nothing may panic. In an honest run, beyond that: every push and piece
//! is taken, every round completes once its stream is in, and a delivered
//! round holds, value by value, what its class's format makes of the
//! gradient (a lossy value may be zero instead: its datagram was dropped),
//! bit for bit, NaN as NaN.
#![no_main]

mod shared;

use gradlane_core::classify::{ClassifyConfig, Ranking, IMPORTANT};
use gradlane_core::encode::{EncodedRound, Encoder, EncoderConfig, MIN_DATAGRAM};
use gradlane_core::format::{log8_round_trip, ClassFormats, ValueFormat};
use gradlane_core::layout::{ChunkOptions, ChunkPlan, ConvChunking};
use gradlane_core::presets;
use gradlane_core::reassembly::{Channel, Reassembler, ReassemblyConfig, Round, StreamDecoder};
use libfuzzer_sys::fuzz_target;
use shared::layout;

/// Reads the input front to back; past its end every byte is 0.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Every pair of formats the encoder takes.
fn format_pairs() -> Vec<ClassFormats> {
    let mut pairs = Vec::new();
    for important in [ValueFormat::F32, ValueFormat::Bf16, ValueFormat::F16] {
        for lossy in ValueFormat::ALL {
            pairs.push(ClassFormats { important, lossy });
        }
    }
    pairs
}

/// Values a gradient may hold that the formats treat specially: not
/// finite (the encoder sends their chunks important), beyond f16's range,
/// subnormal, signed zero, the extremes of f32.
const SPECIAL: [f32; 10] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    70000.0,
    -65520.0,
    1e-40,
    -0.0,
    f32::MAX,
    f32::MIN_POSITIVE,
    3e-8,
];

/// One framed round and how far the transport has got with it.
struct Sent {
    round: EncodedRound,
    grads: Vec<Vec<f32>>,
    /// Every lossy datagram, level by level.
    datagrams: Vec<Vec<u8>>,
    next_datagram: usize,
    stream_at: usize,
    decoder: StreamDecoder,
    delivered: bool,
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let pairs = format_pairs();
    let formats = pairs[input.byte() as usize % pairs.len()];
    let shape = input.byte();
    let chunking = ChunkOptions {
        block_values: [3, 16, 64, 1024][shape as usize % 4],
        conv: match shape & 4 {
            0 => ConvChunking::PerKernel,
            _ => ConvChunking::PerSlice,
        },
    };
    let two_rounds = shape & 8 != 0;
    let late_buffer_bytes = [0, 100, 64 << 20][(shape >> 4) as usize % 3];
    let max_datagram = MIN_DATAGRAM + input.byte() as usize * 6;
    let split = input.byte();
    let classify = ClassifyConfig {
        loss_tolerance: f64::from(split % 11) / 10.0,
        levels: 1 + (split / 11) % 7,
        ranking: match split & 0x80 {
            0 => Ranking::PerTensor,
            _ => Ranking::Global,
        },
        ..ClassifyConfig::default()
    };
    let layout = layout();
    let total = layout.total_values() as usize;
    let mut encoder = Encoder::new(
        &layout,
        EncoderConfig {
            chunking,
            classify,
            formats,
            ..EncoderConfig::default()
        },
    )
    .expect("a valid encoder configuration");
    let seed = u64::from(input.byte());
    let mut sent = Vec::new();
    for r in 0..if two_rounds { 2 } else { 1 } {
        let mut grads = presets::gradients(&layout, seed + r);
        for _ in 0..input.byte() % 4 {
            let at = input.u16() as usize % total;
            let value = SPECIAL[input.byte() as usize % SPECIAL.len()];
            let (mut t, mut i) = (0, at);
            while i >= grads[t].len() {
                i -= grads[t].len();
                t += 1;
            }
            grads[t][i] = value;
        }
        let round = encoder
            .encode(r as u32, &grads, max_datagram)
            .expect("valid gradients and datagram limit encode");
        let datagrams = round.lossy.iter().flatten().map(|d| d.to_vec()).collect();
        sent.push(Sent {
            round,
            grads,
            datagrams,
            next_datagram: 0,
            stream_at: 0,
            decoder: StreamDecoder::new(),
            delivered: false,
        });
    }
    let mut rx = Reassembler::new(
        layout.clone(),
        ReassemblyConfig {
            chunking,
            late_buffer_bytes,
            ..ReassemblyConfig::default()
        },
    )
    .expect("the encoder's layout and chunking");

    // Whether anything no sender wrote was fed: then only the absence of
    // panics is checked.
    let mut forged = false;
    // A datagram of round 0 pushed after round 0 was delivered is merged
    // into round 1 (the delayed update), which the check of round 1 does
    // not model.
    let mut late_into_next = false;
    while !input.is_empty() {
        let op = input.byte();
        let r = usize::from(op >> 7) % sent.len();
        match op % 8 {
            0 => {
                let s = &mut sent[r];
                let len = 1 + input.byte() as usize * 3;
                let end = (s.stream_at + len).min(s.round.reliable.len());
                let piece = &s.round.reliable[s.stream_at..end];
                s.stream_at = end;
                let fed = s.decoder.feed(&mut rx, piece);
                assert!(
                    forged || fed.is_ok(),
                    "round {r}: a stream piece refused: {fed:?}"
                );
            }
            1 | 2 => {
                let s = &mut sent[r];
                if let Some(d) = s.datagrams.get(s.next_datagram) {
                    s.next_datagram += 1;
                    if op % 8 == 1 {
                        late_into_next |= r == 0 && s.delivered;
                        let pushed = rx.push(d, Channel::Lossy);
                        assert!(
                            forged || pushed.is_ok(),
                            "round {r}: datagram refused: {pushed:?}"
                        );
                    }
                }
            }
            3 => {
                let s = &sent[r];
                if !s.datagrams.is_empty() {
                    let d = &s.datagrams[input.byte() as usize % s.datagrams.len()];
                    late_into_next |= r == 0 && s.delivered;
                    let pushed = rx.push(d, Channel::Lossy);
                    assert!(
                        forged || pushed.is_ok(),
                        "round {r}: datagram refused: {pushed:?}"
                    );
                }
            }
            4 => {
                let max = MIN_DATAGRAM + input.byte() as usize * 4;
                let s = &mut sent[r];
                if let Some(d) = s.datagrams.get(s.next_datagram) {
                    s.next_datagram += 1;
                    let pieces = encoder
                        .reframe(d, max)
                        .unwrap_or_else(|e| panic!("reframing a datagram to {max}: {e}"));
                    for p in &pieces {
                        assert!(
                            p.len() <= max.max(d.len()),
                            "reframed to {} > {max}",
                            p.len()
                        );
                        late_into_next |= r == 0 && s.delivered;
                        let pushed = rx.push(p, Channel::Lossy);
                        assert!(
                            forged || pushed.is_ok(),
                            "round {r}: reframed refused: {pushed:?}"
                        );
                    }
                }
            }
            5 => deliver_in_order(&mut rx, &mut sent, formats, forged, late_into_next),
            6 => {
                let s = &sent[r];
                if !s.datagrams.is_empty() {
                    let mut d = s.datagrams[input.byte() as usize % s.datagrams.len()].to_vec();
                    let at = input.u16() as usize % d.len();
                    d[at] ^= input.byte() | 1;
                    forged = true;
                    let channel = match input.byte() & 1 {
                        0 => Channel::Lossy,
                        _ => Channel::Reliable,
                    };
                    let _ = rx.push(&d, channel);
                }
            }
            _ => {
                let how = input.byte();
                let len = input.byte() as usize;
                let bytes = input.bytes(len);
                forged = true;
                match how % 3 {
                    0 => drop(rx.push(bytes, Channel::Lossy)),
                    1 => drop(rx.push(bytes, Channel::Reliable)),
                    // Into a round's own stream: once it refuses a
                    // piece, every later piece is refused too.
                    _ => drop(sent[r].decoder.feed(&mut rx, bytes)),
                }
            }
        }
    }
    // The rest of every stream: an honest run's rounds all complete.
    for s in sent.iter_mut() {
        let rest = &s.round.reliable[s.stream_at..];
        s.stream_at = s.round.reliable.len();
        let fed = s.decoder.feed(&mut rx, rest);
        assert!(
            forged || fed.is_ok(),
            "the rest of a stream refused: {fed:?}"
        );
        assert!(
            forged || s.decoder.at_boundary(),
            "a stream ended inside a segment"
        );
    }
    deliver_in_order(&mut rx, &mut sent, formats, forged, late_into_next);
    if !forged {
        assert!(
            sent.iter().all(|s| s.delivered),
            "an honest round did not complete: open {:?}",
            rx.open_rounds().collect::<Vec<_>>()
        );
    }
    // Whatever state the receiver is in, asking for any round is safe.
    for round in 0..4 {
        let _ = rx.deliver(round);
    }
});

/// Delivers the sent rounds in order while the next is complete, checking
/// each in an honest run. In order, as a transport does: a round delivered
/// before an earlier one has arrived makes that one stale, its segments
/// late.
fn deliver_in_order(
    rx: &mut Reassembler,
    sent: &mut [Sent],
    formats: ClassFormats,
    forged: bool,
    late_into_next: bool,
) {
    for (r, s) in sent.iter_mut().enumerate() {
        if s.delivered {
            continue;
        }
        let r = r as u32;
        if !rx.is_complete(r) {
            // Not ready: refused, and nothing changes.
            assert!(rx.deliver(r).is_err(), "round {r} delivered incomplete");
            return;
        }
        let round = rx
            .deliver(r)
            .unwrap_or_else(|e| panic!("complete round {r} not delivered: {e}"));
        s.delivered = true;
        // Round 1 holds round 0's late datagrams: the check does not model
        // the delayed update.
        let merged_late = r == 1 && late_into_next;
        if !(forged || merged_late) {
            check_round(&round, s, formats, rx.plan());
        }
    }
}

/// Every value of a delivered round is what its class's format makes of
/// the gradient's, or zero where a lossy datagram did not arrive.
fn check_round(got: &Round, s: &Sent, formats: ClassFormats, plan: &ChunkPlan) {
    for (id, c) in plan.chunks().iter().enumerate() {
        let class = s.round.classes[id];
        let t = c.tensor as usize;
        let range = c.start as usize..(c.start + c.len) as usize;
        let sent_values = &s.grads[t][range.clone()];
        let mut want = sent_values.to_vec();
        match formats.of(class) {
            ValueFormat::Log8 => log8_round_trip(sent_values, &mut want).unwrap_or_else(|e| {
                panic!("chunk {id} went lossy in log8 with a value not finite: {e}")
            }),
            f => want.iter_mut().for_each(|v| *v = f.round(*v)),
        }
        for (i, (&g, &w)) in got.tensors[t][range].iter().zip(&want).enumerate() {
            let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
            let zero_filled = class != IMPORTANT && g.to_bits() == 0;
            assert!(
                same || zero_filled,
                "round {}, chunk {id} (class {class}, {:?}), value {i}: got {g}, sent {} as {w}",
                got.index,
                formats.of(class),
                sent_values[i]
            );
        }
    }
}
