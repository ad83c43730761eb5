//! What the ranks reduce: the model cut into buckets, each rank's seeded
//! gradient of a round, and the rows a sparse allgather gathers: seeded and
//! free of the network, apart from the collectives that move them.

use gradlane::{Layout, SparseRows, TensorSpec};
use gradlane_core::rng::SplitMix64;

/// The model's tensors cut into buckets of about `bytes` (consecutive
/// tensors; a tensor larger than that is a bucket of its own).
pub(crate) fn cut_buckets(layout: &Layout, bytes: usize) -> Vec<Layout> {
    let mut buckets = Vec::new();
    let mut current: Vec<TensorSpec> = Vec::new();
    let mut size = 0;
    for (t, spec) in layout.tensors().iter().enumerate() {
        current.push(spec.clone());
        size += layout.tensor_len(t) * 4;
        if size >= bytes {
            buckets.extend(Layout::new(std::mem::take(&mut current)));
            size = 0;
        }
    }
    if !current.is_empty() {
        buckets.extend(Layout::new(current));
    }
    buckets
}

/// A rank's gradient of `n` values for round `round`.
pub(crate) fn gradient(rank: usize, round: usize, n: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(((rank as u64) << 32) | round as u64);
    let mut scale = 1.0f32;
    (0..n)
        .map(|i| {
            if i % 256 == 0 {
                scale = (rng.next_f64() as f32 * 6.0).exp() * 1e-3;
            }
            (rng.next_f64() as f32 - 0.5) * scale
        })
        .collect()
}

/// 1% of the gradient's rows of 256 values: the same count on every rank,
/// or counts from 50% to 150% of it.
pub(crate) fn sparse(rank: usize, round: usize, grad: &[f32], unequal: bool) -> SparseRows {
    let width = 256;
    let height = (grad.len() / width) as u64;
    let base = (height as usize / 100).max(1);
    let count = match unequal {
        true => base / 2 + base * rank / 2,
        false => base,
    };
    let mut rng = SplitMix64::new(((rank as u64) << 32) | round as u64 | 1 << 20);
    let rows: Vec<u64> = (0..count).map(|_| rng.next_u64() % height).collect();
    let values = rows
        .iter()
        .flat_map(|&r| {
            grad[r as usize * width..(r as usize + 1) * width]
                .iter()
                .copied()
        })
        .collect();
    SparseRows {
        height,
        width,
        rows,
        values,
    }
}
