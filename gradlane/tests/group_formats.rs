//! Value formats in a group of ranks over real QUIC: bf16 and f16 buffers
//! reduced in f32 and rounded once, the same bits on every rank with and
//! without loss; max and min; the bytes each rank sends, as the formats
//! imply; compression feedback making up what rounding took.

// A binary of its own: these tests read the bytes on the wire or wait
// out failure timeouts, and other subjects' tests beside them on the
// same cores change what they measure.
#[allow(dead_code)]
#[path = "integration/common.rs"]
mod common;

use common::{
    allreduce_all, bucket, bytes_not_lost, differentiated, group_with, register_all, same_bits,
};
use futures_util::future::join_all;
use gradlane::{
    bf16, f16, BucketId, BucketOptions, ClassFormats, Config, Element, Group, GroupError, Layout,
    LossRecovery, ReduceOp, TensorSpec, ValueFormat,
};
use gradlane_core::rng::SplitMix64;

/// Values whose magnitudes differ by chunk, so that ranks class
/// differently, with many that bf16 cannot hold exactly.
fn gradient(rank: usize, step: usize, n: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(104_729 * rank as u64 + step as u64);
    let mut scale = 1.0f32;
    (0..n)
        .map(|i| {
            if i % 288 == 0 {
                scale = (rng.next_f64() as f32 * 6.0).exp() * 1e-3;
            }
            (rng.next_f64() as f32 - 0.5) * scale
        })
        .collect()
}

fn to<T: Element>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

/// The f32 reduction of `inputs` (as their type holds them) in rank
/// order, rounded once to the type.
fn reference<T: Element>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let n = inputs[0].len();
    (0..n)
        .map(|i| {
            let mut acc = inputs[0][i].to_f32();
            for input in &inputs[1..] {
                let v = input[i].to_f32();
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Mean => acc + v,
                    ReduceOp::Max => {
                        if v.is_nan() || v > acc {
                            v
                        } else {
                            acc
                        }
                    }
                    ReduceOp::Min => {
                        if v.is_nan() || v < acc {
                            v
                        } else {
                            acc
                        }
                    }
                };
            }
            if op == ReduceOp::Mean {
                acc /= inputs.len() as f32;
            }
            T::from_f32(acc)
        })
        .collect()
}

/// Every rank's allreduce of its input: the buffers after it.
async fn allreduced<T: Element>(
    groups: &mut [Group],
    inputs: &[Vec<T>],
    op: ReduceOp,
) -> Vec<Vec<T>> {
    let mut bufs = inputs.to_vec();
    allreduce_all(groups, &mut bufs, op).await;
    bufs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_bit_buffers_reduce_in_f32_and_round_once() {
    let world = 3;
    let mut groups = group_with("formats-exact", world, |_, c| c).await;
    let n = 1001;
    let f32s: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 1, n)).collect();
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        let inputs: Vec<Vec<bf16>> = f32s.iter().map(|v| to(v)).collect();
        let got = allreduced(&mut groups, &inputs, op).await;
        let want = reference(&inputs, op);
        for (r, g) in got.iter().enumerate() {
            same_bits(g, &want, &format!("bf16 {op:?} rank {r}"));
        }
        let inputs: Vec<Vec<f16>> = f32s.iter().map(|v| to(v)).collect();
        let got = allreduced(&mut groups, &inputs, op).await;
        let want = reference(&inputs, op);
        for (r, g) in got.iter().enumerate() {
            same_bits(g, &want, &format!("f16 {op:?} rank {r}"));
        }
        let got = allreduced(&mut groups, &f32s, op).await;
        let want = reference(&f32s, op);
        for (r, g) in got.iter().enumerate() {
            same_bits(g, &want, &format!("f32 {op:?} rank {r}"));
        }
    }
    // Reduce-scatter: rank r gets part r of the reduction.
    let k = 333;
    let inputs: Vec<Vec<bf16>> = f32s.iter().map(|v| to(&v[..k * world])).collect();
    let want = reference(&inputs, ReduceOp::Mean);
    let mut outputs = vec![vec![bf16::ZERO; k]; world];
    let calls = groups
        .iter_mut()
        .zip(inputs.iter())
        .zip(outputs.iter_mut())
        .map(|((g, i), o)| g.reduce_scatter(i, o, ReduceOp::Mean));
    for r in join_all(calls).await {
        r.unwrap();
    }
    for (r, o) in outputs.iter().enumerate() {
        same_bits(
            o,
            &want[r * k..(r + 1) * k],
            &format!("reduce_scatter rank {r}"),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_and_min_carry_nan_and_infinities_like_torch() {
    let world = 3;
    let mut groups = group_with("formats-maxmin", world, |_, c| c).await;
    let mut inputs: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 2, 10)).collect();
    inputs[1][3] = f32::NAN;
    inputs[2][4] = f32::INFINITY;
    inputs[0][5] = f32::NEG_INFINITY;
    let max = allreduced(&mut groups, &inputs, ReduceOp::Max).await;
    let min = allreduced(&mut groups, &inputs, ReduceOp::Min).await;
    for r in 0..world {
        assert!(max[r][3].is_nan() && min[r][3].is_nan());
        assert_eq!(max[r][4], f32::INFINITY);
        assert_eq!(min[r][5], f32::NEG_INFINITY);
        same_bits(&max[r], &max[0], "max");
    }
}

/// [`common::lossy`] with this file's seeds.
fn lossy(p: f64) -> impl Fn(usize, Config) -> Config {
    common::lossy(p, 77)
}

/// [`bucket`] registered on every rank with `options`.
async fn register(groups: &mut [Group], options: BucketOptions) -> BucketId {
    register_all(groups, &bucket(), options).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bf16_bucket_is_the_rounded_sum_on_every_rank_with_and_without_loss() {
    let world = 3;
    let n = bucket().total_values() as usize;
    for p in [0.0, 0.2] {
        let mut groups = group_with(&format!("formats-diff-{p}"), world, lossy(p)).await;
        let options = BucketOptions {
            dtype: ValueFormat::Bf16,
            ..BucketOptions::default()
        };
        let id = register(&mut groups, options).await;
        for step in 0..2 {
            let inputs: Vec<Vec<bf16>> =
                (0..world).map(|r| to(&gradient(r, 10 + step, n))).collect();
            let (got, reports) = differentiated(&mut groups, id, &inputs, ReduceOp::Sum).await;
            let want = reference(&inputs, ReduceOp::Sum);
            for (r, g) in got.iter().enumerate() {
                same_bits(
                    g,
                    &got[0],
                    &format!("loss {p} step {step}: rank {r} against rank 0"),
                );
            }
            // Where every part arrived (and nothing came late) the sum is
            // the f32 sum rounded once.
            let lost: Vec<_> = reports.iter().flat_map(|r| r.lost.clone()).collect();
            let late: u64 = reports
                .iter()
                .flat_map(|r| r.received.iter().flatten())
                .map(|s| s.lossy().late_merged_bytes)
                .sum();
            if p == 0.0 {
                assert!(lost.is_empty() && late == 0);
                same_bits(&got[0], &want, &format!("lossless step {step}"));
            } else if late == 0 {
                for i in 0..n {
                    if !lost.iter().any(|r| r.contains(&i)) {
                        assert_eq!(got[0][i].to_bits(), want[i].to_bits(), "value {i}");
                    }
                }
            }
            if p > 0.0 && step == 1 {
                assert!(!lost.is_empty(), "at 20% loss some chunk was lost");
            }
        }
        // A buffer of another type than the bucket's is refused.
        let mut wrong = vec![0f32; n];
        assert!(matches!(
            groups[0]
                .allreduce_differentiated(id, &mut wrong, ReduceOp::Sum)
                .await,
            Err(GroupError::Unsupported(_))
        ));
        for g in groups {
            g.close().await;
        }
    }
}

/// bf16 important + log8 lossy: every rank the same bits at 20% loss, and
/// lossless the values each format allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_formats_keep_replicas_identical_under_loss() {
    let world = 4;
    let n = bucket().total_values() as usize;
    let mut groups = group_with("formats-packed", world, lossy(0.2)).await;
    for lossy_return in [false, true] {
        let options = BucketOptions {
            formats: Some(ClassFormats {
                important: ValueFormat::Bf16,
                lossy: ValueFormat::Log8,
            }),
            lossy_return,
            recovery: LossRecovery::Rescale,
            ..BucketOptions::default()
        };
        let id = register(&mut groups, options).await;
        for step in 0..3 {
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 30 + step, n)).collect();
            let (got, _) = differentiated(&mut groups, id, &inputs, ReduceOp::Mean).await;
            for (r, g) in got.iter().enumerate() {
                same_bits(
                    g,
                    &got[0],
                    &format!("return {lossy_return} step {step} rank {r}"),
                );
            }
            assert!(got[0].iter().all(|v| v.is_finite()));
        }
    }
}

/// The bytes a rank sends in one step, from quinn's UDP counters less
/// what was resent, against
/// an exact f32 allreduce of the same buffer: bf16 important + log8 lossy
/// at loss tolerance 0.2 send (0.8 x 2 + 0.2 x 1) / 4 of the f32 bytes in
/// the first half and 2 / 4 (bf16) or 1.8 / 4 (log8 return) in the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_sends_the_bytes_its_formats_imply() {
    let world = 4;
    let layout = Layout::new(vec![
        TensorSpec::conv2d("conv", [256, 128, 3, 3]),
        TensorSpec::dense("fc", [1000, 512]),
    ])
    .unwrap();
    let n = layout.total_values() as usize;
    let mut groups = group_with("formats-bytes", world, |_, c| c).await;
    let sent = |groups: &[Group]| -> Vec<u64> { groups.iter().map(bytes_not_lost).collect() };
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 40, n)).collect();

    let before = sent(&groups);
    allreduced(&mut groups, &inputs, ReduceOp::Mean).await;
    let exact: Vec<u64> = sent(&groups)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();

    for (lossy_return, implied) in [(false, (0.45 + 0.5) / 2.0), (true, 0.45)] {
        let options = BucketOptions {
            formats: Some(ClassFormats {
                important: ValueFormat::Bf16,
                lossy: ValueFormat::Log8,
            }),
            lossy_return,
            ..BucketOptions::default()
        };
        let id = register_all(&mut groups, &layout, options).await;
        // A first step scores every chunk; the second is the one measured.
        differentiated(&mut groups, id, &inputs, ReduceOp::Mean).await;
        let before = sent(&groups);
        differentiated(&mut groups, id, &inputs, ReduceOp::Mean).await;
        for (r, (after, b)) in sent(&groups).iter().zip(&before).enumerate() {
            let ratio = (after - b) as f64 / exact[r] as f64;
            assert!(
                ratio <= implied * 1.1 && ratio >= implied / 1.1,
                "rank {r}, lossy return {lossy_return}: {ratio:.3} of the f32 bytes, \
                 the formats imply {implied:.3}"
            );
        }
    }
}

/// Log8 rounds every lossy value; with compression feedback what it took
/// comes back in the next steps, so over many steps of the same gradient
/// the running total stays within one step's rounding of the true one,
/// where without feedback the bias adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_feedback_makes_up_what_rounding_took() {
    let world = 3;
    let n = bucket().total_values() as usize;
    let mut groups = group_with("formats-feedback", world, |_, c| c).await;
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 50, n)).collect();
    let exact = reference(&inputs, ReduceOp::Sum);
    let steps = 8;
    let mut error = Vec::new();
    for feedback in [false, true] {
        let options = BucketOptions {
            formats: Some(ClassFormats {
                important: ValueFormat::F32,
                lossy: ValueFormat::Log8,
            }),
            compression_feedback: Some(feedback),
            ..BucketOptions::default()
        };
        let id = register(&mut groups, options).await;
        let mut total = vec![0f64; n];
        for _ in 0..steps {
            let (got, _) = differentiated(&mut groups, id, &inputs, ReduceOp::Sum).await;
            for (t, v) in total.iter_mut().zip(&got[0]) {
                *t += *v as f64;
            }
        }
        let err: f64 = total
            .iter()
            .zip(&exact)
            .map(|(t, e)| (t - steps as f64 * *e as f64).abs())
            .sum();
        error.push(err);
    }
    assert!(
        error[1] * 3.0 < error[0],
        "with feedback {:.3e}, without {:.3e}",
        error[1],
        error[0]
    );
}

/// fp16 mixed precision overflows into infinities and NaN for GradScaler
/// to find: they come out of the sum where they went in, on every rank,
/// even in chunks that would have been lossy log8 under 20% loss, and the
/// chunks' other values stay finite (no poisoned scale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_not_finite_come_out_where_they_went_in_on_every_rank() {
    let world = 3;
    let n = bucket().total_values() as usize;
    let mut groups = group_with("formats-nonfinite", world, lossy(0.2)).await;
    let options = BucketOptions {
        formats: Some(ClassFormats {
            important: ValueFormat::Bf16,
            lossy: ValueFormat::Log8,
        }),
        lossy_return: true,
        ..BucketOptions::default()
    };
    let id = register(&mut groups, options).await;
    let calm: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 60, n)).collect();
    differentiated(&mut groups, id, &calm, ReduceOp::Mean).await;
    // The smallest values' chunks: the ones classed lossy. The gradient's
    // scale changes every 288 values; find the quietest block.
    let quiet = (0..n / 288)
        .min_by(|&a, &b| {
            let m = |k: usize| {
                calm[0][k * 288..(k + 1) * 288]
                    .iter()
                    .map(|v| v.abs())
                    .sum::<f32>()
            };
            m(a).total_cmp(&m(b))
        })
        .unwrap();
    let (at_inf, at_nan) = (quiet * 288 + 5, quiet * 288 + 40);
    let mut inputs: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 61, n)).collect();
    inputs[1][at_inf] = f32::INFINITY;
    inputs[2][at_nan] = f32::NAN;
    let (got, _) = differentiated(&mut groups, id, &inputs, ReduceOp::Mean).await;
    for (r, g) in got.iter().enumerate() {
        same_bits(g, &got[0], &format!("rank {r}"));
        assert_eq!(g[at_inf], f32::INFINITY, "rank {r}");
        assert!(g[at_nan].is_nan(), "rank {r}");
        let chunk = quiet * 288..(quiet + 1) * 288;
        let poisoned = g[chunk]
            .iter()
            .enumerate()
            .filter(|&(i, v)| {
                i + quiet * 288 != at_inf && i + quiet * 288 != at_nan && !v.is_finite()
            })
            .count();
        assert_eq!(
            poisoned, 0,
            "rank {r}: other values of the chunk not finite"
        );
    }
}
