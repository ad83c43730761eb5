//! Throughput of the value formats on a ResNet-50-sized heavy-tailed
//! gradient, cut in chunks of 256 values as the lossy levels are: each
//! element format written and read, log8 encoded (scale and codes),
//! decoded and round-tripped (what compression feedback computes), beside
//! a plain copy. Throughput is in bytes of f32 input.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use gradlane_tools::gradients as support;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gradlane::ValueFormat;
use gradlane_core::format::{
    log8_decode, log8_encode, log8_round_trip, log8_scale, read_elements, write_elements,
};
use support::{gradient, Dist, RESNET50};

const CHUNK: usize = 256;

fn bench(c: &mut Criterion) {
    let values = gradient(RESNET50, 7, Dist::StudentT3);
    let bytes = (values.len() * 4) as u64;
    let mut copy = vec![0f32; values.len()];
    let mut wire = vec![0u8; values.len() * 4];
    let mut back = vec![0f32; values.len()];
    let mut g = c.benchmark_group("formats");
    g.throughput(Throughput::Bytes(bytes));
    g.sample_size(10);
    g.bench_function("copy", |b| {
        b.iter(|| copy.copy_from_slice(black_box(&values)))
    });
    for format in [ValueFormat::Bf16, ValueFormat::F16] {
        let n = values.len() * 2;
        g.bench_function(format!("{format}/write"), |b| {
            b.iter(|| write_elements(format, black_box(&values), &mut wire[..n]))
        });
        g.bench_function(format!("{format}/read"), |b| {
            b.iter(|| read_elements(format, black_box(&wire[..n]), &mut back))
        });
    }
    let codes = &mut wire[..values.len()];
    g.bench_function("log8/encode", |b| {
        b.iter(|| {
            for (v, c) in black_box(&values)
                .chunks(CHUNK)
                .zip(codes.chunks_mut(CHUNK))
            {
                let scale = log8_scale(v).expect("finite");
                log8_encode(v, scale, c);
            }
        })
    });
    g.bench_function("log8/decode", |b| {
        b.iter(|| {
            for (c, o) in codes.chunks(CHUNK).zip(back.chunks_mut(CHUNK)) {
                log8_decode(black_box(c), 0.5, o);
            }
        })
    });
    g.bench_function("log8/round_trip", |b| {
        b.iter(|| {
            for (v, o) in black_box(&values).chunks(CHUNK).zip(back.chunks_mut(CHUNK)) {
                log8_round_trip(v, o).expect("finite");
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
