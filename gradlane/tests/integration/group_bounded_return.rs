//! The bounded return of the differentiated allreduce: with a deadline the
//! return's least important chunks travel lossy and may be cut; a chunk
//! any rank missed is zero at every rank, its owner adds it into its next
//! call, and every rank ends every call with the same bits.

use crate::common::{bucket, differentiated, group_with, register_all, same_bits};
use crate::group_differentiated::{
    error_feedback_within, expected, gradient, lossy, register_with, stalling, with_return_missed,
    Owed,
};
use gradlane::{BucketOptions, ClassFormats, LossRecovery, ReduceOp, StepDeadline, ValueFormat};
use std::time::Duration;

/// A stalled peer (rank 2, whose packets all take 100 ms to leave) under a
/// 20 ms deadline: its return's lossy chunks reach the others after the
/// return's deadline. Every rank zero-fills the same chunks, the stalled
/// owner adds their sums into its next call, and each call's result is,
/// bit for bit, the parts that arrived (each rank's gradient plus what it
/// lost the call before: error feedback) plus what was carried, less what
/// was missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_return_chunk_a_rank_missed_is_zero_everywhere_and_its_owner_carries_it() {
    let world = 3;
    let mut groups = group_with("bounded-return-stall", world, stalling(2)).await;
    let budget = Duration::from_millis(20);
    let id = register_with(&mut groups, error_feedback_within(budget)).await;
    let n = bucket().total_values() as usize;
    let mut carry = vec![0.0f32; n];
    let mut owed = Owed::new(world, n);
    let mut missed_calls = 0;
    for step in 0..4 {
        let fresh: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 60 + step, n)).collect();
        let inputs = owed.sent(&fresh);
        let carried = carry.clone();
        let (got, reports) = differentiated(&mut groups, id, &fresh, ReduceOp::Sum).await;
        owed.settle(&inputs, &reports);
        let sums = expected(&inputs, &reports, ReduceOp::Sum, false);
        let want = with_return_missed(sums.clone(), &mut carry, &reports);
        for (r, g) in got.iter().enumerate() {
            same_bits(g, &want, &format!("step {step} rank {r}"));
            assert_eq!(
                reports[r].return_budget,
                Some(budget),
                "step {step} rank {r}"
            );
        }
        let missed = &reports[0].return_missed;
        if !missed.is_empty() {
            missed_calls += 1;
            // What was missed is zero everywhere, and kept whole: the
            // owner's sum of it, what it had carried included.
            for range in missed {
                assert!(got
                    .iter()
                    .all(|g| g[range.clone()].iter().all(|&v| v == 0.0)));
                let kept: Vec<f32> = range.clone().map(|i| sums[i] + carried[i]).collect();
                same_bits(&carry[range.clone()], &kept, &format!("step {step} carry"));
            }
        }
        // Every return had a lossy part: sent, or dropped unsent at the
        // deadline.
        for rep in &reports {
            let lossy: u64 = rep
                .return_sent
                .iter()
                .flatten()
                .map(|s| s.lossy_bytes.iter().sum::<u64>() + s.lossy_dropped.iter().sum::<u64>())
                .sum();
            assert!(lossy > 0, "step {step}: a return with no lossy part");
        }
    }
    assert!(
        missed_calls > 0,
        "the stalled owner's return never missed its deadline"
    );
}

/// Under 10% loss on every link a bounded return in `bf16` and `log8`
/// loses some of its lossy chunks at some ranks: every rank still ends
/// every call with the same bits (an owner holds what the others decode
/// of its shard), the chunks missed are zero, and every rank names the
/// same ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_loss_a_bounded_return_in_bf16_and_log8_keeps_every_rank_s_bits() {
    let world = 4;
    let mut groups = group_with("bounded-return-loss", world, lossy(0.1)).await;
    let options = BucketOptions {
        recovery: LossRecovery::ErrorFeedback,
        formats: Some(ClassFormats {
            important: ValueFormat::Bf16,
            lossy: ValueFormat::Log8,
        }),
        deadline: StepDeadline::Fixed(Duration::from_millis(30)),
        ..BucketOptions::default()
    };
    let id = register_with(&mut groups, options).await;
    let n = bucket().total_values() as usize;
    let mut missed_any = false;
    for step in 0..4 {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 80 + step, n)).collect();
        let (got, reports) = differentiated(&mut groups, id, &inputs, ReduceOp::Mean).await;
        let mut missed = reports[0].return_missed.clone();
        missed.sort_by_key(|r| r.start);
        for (r, rep) in reports.iter().enumerate() {
            same_bits(&got[r], &got[0], &format!("step {step} rank {r}"));
            let mut theirs = rep.return_missed.clone();
            theirs.sort_by_key(|r| r.start);
            assert_eq!(theirs, missed, "step {step} rank {r}");
        }
        for range in &missed {
            assert!(got[0][range.clone()].iter().all(|&v| v == 0.0));
        }
        missed_any |= !missed.is_empty();
    }
    assert!(
        missed_any,
        "at 10% loss no return chunk was missed in 4 calls"
    );
}

/// The differentiated allgather: every rank's tensor to every rank, its
/// least important chunks lossy. Without loss every rank ends with every
/// rank's tensor exactly; under 10% loss every rank still ends with the
/// same bits: each rank's tensor where no rank missed a chunk, zero where
/// one did, in the sender's own copy too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_differentiated_allgather_keeps_every_rank_s_bits_and_zeroes_what_any_missed() {
    let world = 3;
    let per_rank = 3000;
    let layout = gradlane::Layout::new(
        (0..world)
            .map(|r| gradlane::TensorSpec::dense(format!("rank{r}"), [per_rank]))
            .collect(),
    )
    .unwrap();
    for (p, tag) in [(0.0, "gather-clean"), (0.1, "gather-loss")] {
        let mut groups = group_with(tag, world, lossy(p)).await;
        let options = BucketOptions {
            gather: true,
            ..BucketOptions::default()
        };
        let id = register_all(&mut groups, &layout, options).await;
        // An allreduce of an allgather bucket is refused, before any
        // traffic.
        let mut wrong = vec![0.0f32; world * per_rank];
        let e = groups[0]
            .allreduce_differentiated(id, &mut wrong, ReduceOp::Sum)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("allgather"), "{e}");
        let mut missed_any = false;
        for step in 0..3 {
            let mine: Vec<Vec<f32>> = (0..world)
                .map(|r| gradient(r, 90 + step, per_rank))
                .collect();
            let mut bufs: Vec<Vec<f32>> = (0..world)
                .map(|r| {
                    let mut b = vec![0.0f32; world * per_rank];
                    b[r * per_rank..(r + 1) * per_rank].copy_from_slice(&mine[r]);
                    b
                })
                .collect();
            let calls = groups
                .iter_mut()
                .zip(bufs.iter_mut())
                .map(|(g, b)| g.allgather_differentiated(id, b));
            let reports: Vec<_> = futures_util::future::join_all(calls)
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            let mut want: Vec<f32> = mine.concat();
            let mut missed = reports[0].return_missed.clone();
            missed.sort_by_key(|r| r.start);
            for range in &missed {
                want[range.clone()].fill(0.0);
            }
            for (r, b) in bufs.iter().enumerate() {
                same_bits(b, &want, &format!("loss {p} step {step} rank {r}"));
                let mut theirs = reports[r].return_missed.clone();
                theirs.sort_by_key(|r| r.start);
                assert_eq!(theirs, missed, "loss {p} step {step} rank {r}");
            }
            if p == 0.0 {
                assert!(
                    missed.is_empty(),
                    "step {step}: missed {missed:?} without loss"
                );
            }
            missed_any |= !missed.is_empty();
        }
        if p > 0.0 {
            assert!(
                missed_any,
                "at {p} loss no chunk of the allgather was missed"
            );
        }
    }
}
