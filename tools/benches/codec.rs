//! Encode/decode throughput of the codec on a ResNet-50-sized heavy-tailed
//! gradient at 1% and 0.1% density, beside a plain copy of the same bytes.
//! Throughput is in bytes of dense f32 input. Sizes and errors are printed by
//! `cargo run --release --example codec_table`.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use gradlane_tools::gradients as support;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gradlane::codec::{self, Selection, DEFAULT_BASE};
use support::{gradient, Dist, RESNET50};

fn bench(c: &mut Criterion) {
    let values = gradient(RESNET50, 42, Dist::StudentT3);
    let bytes = (values.len() * 4) as u64;
    let mut dst = vec![0f32; values.len()];
    for density in [0.01, 0.001] {
        let k = (values.len() as f64 * density).round() as usize;
        let frame =
            codec::encode_dense(&values, Selection::TopK(k), DEFAULT_BASE).expect("finite input");
        // A threshold just below the k-th magnitude keeps the same set.
        let cut = codec::top_k(&values, k)
            .ok()
            .and_then(|g| g.values().iter().map(|v| v.abs()).reduce(f32::min))
            .unwrap_or(0.0);
        let thr = f32::from_bits(cut.to_bits().saturating_sub(1));
        let mut g = c.benchmark_group(format!("codec/top{}", density * 100.0));
        g.throughput(Throughput::Bytes(bytes));
        g.sample_size(10);
        g.bench_function("copy", |b| {
            b.iter(|| dst.copy_from_slice(black_box(&values)))
        });
        g.bench_function("encode_topk", |b| {
            b.iter(|| codec::encode_dense(black_box(&values), Selection::TopK(k), DEFAULT_BASE))
        });
        g.bench_function("encode_threshold", |b| {
            b.iter(|| {
                codec::encode_dense(black_box(&values), Selection::Threshold(thr), DEFAULT_BASE)
            })
        });
        g.bench_function("decode_dense", |b| {
            b.iter(|| codec::decode_into_dense(black_box(&frame), &mut dst))
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
