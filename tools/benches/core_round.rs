//! Encode and reassemble a ResNet-50 round, beside a plain copy of the same
//! bytes measured in the same run: the core should keep up with at least a
//! quarter of a memory copy on one core.
//!
//! `cargo bench --bench core_round`

#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gradlane::presets;
use gradlane_core::encode::{EncodedRound, Encoder, EncoderConfig};
use gradlane_core::reassembly::{Channel, Reassembler, ReassemblyConfig, StreamDecoder};
use std::time::{Duration, Instant};

fn bench(c: &mut Criterion) {
    let layout = presets::resnet50();
    let grads = presets::gradients(&layout, 1);
    let mut g = c.benchmark_group("resnet50_round");
    g.throughput(Throughput::Bytes(layout.total_bytes()));
    g.sample_size(20);

    let mut dst: Vec<Vec<f32>> = grads.iter().map(|t| vec![0.0; t.len()]).collect();
    g.bench_function("copy", |b| {
        b.iter(|| {
            for (d, s) in dst.iter_mut().zip(&grads) {
                d.copy_from_slice(s);
            }
        })
    });

    // Steady state of a training loop: each side hands its buffers back
    // after a round (Encoder::recycle, Reassembler::recycle).
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let mut round = 0;
    g.bench_function("encode", |b| {
        b.iter(|| {
            round += 1;
            let out = enc.encode(round, &grads, 1414).unwrap();
            enc.recycle(out);
        })
    });

    // What a transport waits for before the first byte: scoring, classing
    // and fixing every packet (Encoder::start), no framing.
    g.bench_function("plan", |b| {
        b.iter(|| {
            round += 1;
            enc.start(round, &grads, 1414).unwrap()
        })
    });

    let encoded = enc.encode(0, &grads, 1414).unwrap();
    let mut spare: Option<Vec<Vec<f32>>> = None;
    g.bench_function("reassemble", |b| {
        b.iter_custom(|iters| {
            time_reassembly(iters, &layout, &encoded, &mut spare, |rx| {
                rx.push(&encoded.reliable, Channel::Reliable).unwrap();
            })
        })
    });
    // The same, with the reliable part arriving as quinn hands a stream
    // over: one piece per STREAM frame, about a packet each.
    g.bench_function("reassemble, stream in packet pieces", |b| {
        b.iter_custom(|iters| {
            time_reassembly(iters, &layout, &encoded, &mut spare, |rx| {
                let mut decoder = StreamDecoder::new();
                for piece in encoded.reliable.chunks(STREAM_PIECE) {
                    decoder.feed(rx, piece).unwrap();
                }
            })
        })
    });
    g.finish();
}

/// Time of `iters` receptions of round 0: the reliable part as
/// `reliable` feeds it, then every datagram, then delivery. A fresh
/// receiver per iteration because the packets all belong to round 0;
/// making it is not what is measured. Each hands its tensors to the next.
fn time_reassembly(
    iters: u64,
    layout: &gradlane::Layout,
    encoded: &EncodedRound,
    spare: &mut Option<Vec<Vec<f32>>>,
    reliable: impl Fn(&mut Reassembler),
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let mut rx = Reassembler::new(layout.clone(), ReassemblyConfig::default()).unwrap();
        if let Some(t) = spare.take() {
            rx.recycle(t).unwrap();
        }
        let t0 = Instant::now();
        reliable(&mut rx);
        for d in encoded.lossy.iter().flatten() {
            rx.push(d, Channel::Lossy).unwrap();
        }
        let round = rx.deliver(0).unwrap();
        total += t0.elapsed();
        *spare = Some(round.tensors);
    }
    total
}

/// Stream bytes per STREAM frame in a full loopback packet (1452 bytes of
/// UDP payload less QUIC's packet and frame overhead).
const STREAM_PIECE: usize = 1410;

criterion_group!(benches, bench);
criterion_main!(benches);
