//! The differentiated allreduce over real QUIC with seeded loss: equal to
//! the exact allreduce without loss, the same bits on every rank under
//! loss, the important part of every input summed exactly, and each
//! recovery option against a result computed independently here.

use crate::common;

use common::{
    allreduce_all, bucket, bytes_not_lost, differentiated, group_with, inside, register_all,
    same_bits,
};
use gradlane::{
    AdaptiveDeadline, AllreduceReport, BucketId, BucketOptions, Faults, Group, LossRecovery,
    ReduceOp, RoundStats, SendReport, StepDeadline,
};
use gradlane_core::rng::SplitMix64;
use std::ops::Range;
use std::time::Duration;

/// A rank's gradient: magnitudes that differ by chunk, so that the
/// important chunks differ between ranks.
pub(crate) fn gradient(rank: usize, step: usize, n: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(7919 * rank as u64 + step as u64);
    let mut scale = 1.0f32;
    (0..n)
        .map(|i| {
            if i % 288 == 0 {
                scale = (rng.next_f64() as f32 * 8.0).exp();
            }
            (rng.next_f64() as f32 - 0.5) * scale
        })
        .collect()
}

/// [`common::lossy`] with this file's seeds.
pub(crate) fn lossy(p: f64) -> impl Fn(usize, gradlane::Config) -> gradlane::Config {
    common::lossy(p, 4242)
}

async fn register(groups: &mut [Group], recovery: LossRecovery) -> BucketId {
    register_with(groups, BucketOptions::new(recovery)).await
}

/// What each rank received of each peer's part, paired with what that
/// peer reports it sent it (a rank receives nothing from itself).
pub(crate) fn received_with_sent(
    reports: &[AllreduceReport],
) -> impl Iterator<Item = (&RoundStats, &SendReport)> {
    reports.iter().enumerate().flat_map(move |(r, rep)| {
        rep.received
            .iter()
            .enumerate()
            .filter_map(move |(q, stats)| {
                let stats = stats.as_ref()?;
                Some((stats, reports[q].sent[r].as_ref().expect("a send report")))
            })
    })
}

/// Asserts every rank received the whole important part of every peer's
/// part, none of it zero-filled.
#[track_caller]
pub(crate) fn important_parts_arrived(reports: &[AllreduceReport]) {
    for (s, sent) in received_with_sent(reports) {
        assert_eq!(s.classes[0].received_bytes, sent.important_bytes);
        assert_eq!(s.classes[0].zero_filled_bytes, 0);
    }
}

/// What each rank owes under error feedback: the values of its parts that
/// were lost in the call before, which it adds into its next gradient.
pub(crate) struct Owed(Vec<Vec<f32>>);

impl Owed {
    /// Nothing owed yet, by `world` ranks of `n` values.
    pub(crate) fn new(world: usize, n: usize) -> Self {
        Owed(vec![vec![0.0; n]; world])
    }

    /// What each rank really sends: its gradient plus what it owes.
    pub(crate) fn sent(&self, fresh: &[Vec<f32>]) -> Vec<Vec<f32>> {
        fresh
            .iter()
            .zip(&self.0)
            .map(|(g, o)| g.iter().zip(o).map(|(a, b)| a + b).collect())
            .collect()
    }

    /// After a call that sent `sent`: each rank owes the values it lost.
    pub(crate) fn settle(&mut self, sent: &[Vec<f32>], reports: &[AllreduceReport]) {
        for (r, rep) in reports.iter().enumerate() {
            self.0[r].fill(0.0);
            for range in &rep.lost {
                self.0[r][range.clone()].copy_from_slice(&sent[r][range.clone()]);
            }
        }
    }
}

/// The expected result of a first round (no late data yet) from the
/// inputs and what each owner reported missing: per value, the sum in rank
/// order of the parts that arrived (an owner's own part always does),
/// rescaled to all ranks if asked.
pub(crate) fn expected(
    inputs: &[Vec<f32>],
    reports: &[AllreduceReport],
    op: ReduceOp,
    rescale: bool,
) -> Vec<f32> {
    let world = inputs.len();
    let n = inputs[0].len();
    // Each value's owner's report says which ranks' parts of it were lost.
    let missing = |r: usize, i: usize| reports.iter().any(|rep| inside(&rep.missing[r], i));
    (0..n)
        .map(|i| {
            let mut sum = 0f32;
            let mut k = 0u32;
            for (r, input) in inputs.iter().enumerate() {
                if !missing(r, i) {
                    sum += input[i];
                    k += 1;
                }
            }
            match (rescale, op) {
                (true, ReduceOp::Sum) if k as usize != world => sum * (world as f32 / k as f32),
                (true, ReduceOp::Mean) => sum * (1.0 / k as f32),
                (false, ReduceOp::Mean) => sum / world as f32,
                _ => sum,
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_loss_it_equals_the_exact_allreduce_and_sends_two_n_minus_one_over_n() {
    let world = 3;
    // Ethernet-sized packets: MTU discovery's probes up to 64 KB, sent
    // while the first collectives run, would count in the bytes.
    let ethernet = |_, c| gradlane::Config {
        packets: gradlane::Packets::Ethernet,
        ..c
    };
    let mut groups = group_with("diff-exact", world, ethernet).await;
    let id = register(&mut groups, LossRecovery::ZeroFill).await;
    let n = bucket().total_values() as usize;
    for (step, op) in [ReduceOp::Sum, ReduceOp::Mean].into_iter().enumerate() {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, step, n)).collect();
        let mut exact = inputs.clone();
        allreduce_all(&mut groups, &mut exact, op).await;
        let before: Vec<u64> = groups.iter().map(bytes_not_lost).collect();
        let (got, reports) = differentiated(&mut groups, id, &inputs, op).await;
        for r in 0..world {
            same_bits(&got[r], &exact[r], &format!("{op:?} rank {r}"));
            assert!(reports[r].lost.is_empty() && reports[r].missing.iter().all(Vec::is_empty));
            // Each rank sends about 2 (N-1)/N of the bucket.
            let sent = (bytes_not_lost(&groups[r]) - before[r]) as f64;
            let bound = 2.0 * (world - 1) as f64 / world as f64 * (n * 4) as f64;
            assert!(sent <= 1.1 * bound, "rank {r} sent {sent}, bound {bound}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_loss_every_rank_ends_with_the_same_bits_and_the_important_part_exact() {
    let world = 4;
    for (i, p) in [0.01, 0.05, 0.2].into_iter().enumerate() {
        let mut groups = group_with(&format!("diff-loss{i}"), world, lossy(p)).await;
        let id = register(&mut groups, LossRecovery::ZeroFill).await;
        let n = bucket().total_values() as usize;
        let mut lost = 0;
        for step in 0..3 {
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, step, n)).collect();
            let (got, reports) = differentiated(&mut groups, id, &inputs, ReduceOp::Sum).await;
            for r in 1..world {
                same_bits(&got[r], &got[0], &format!("loss {p} step {step} rank {r}"));
            }
            if step == 0 {
                // No late data yet: the result is exactly the parts that
                // arrived, and the important part of every input did.
                let want = expected(&inputs, &reports, ReduceOp::Sum, false);
                same_bits(&got[0], &want, &format!("loss {p} first round"));
            }
            lost += reports.iter().map(|rep| rep.lost.len()).sum::<usize>();
            important_parts_arrived(&reports);
            // Per lossy class, what was sent arrived or was zero-filled.
            for (s, sent) in received_with_sent(&reports) {
                for c in 1..=s.levels as usize {
                    let k = &s.classes[c];
                    assert_eq!(k.sent_bytes, sent.lossy_bytes[c - 1], "class {c}");
                    assert_eq!(
                        k.sent_bytes,
                        k.received_bytes + k.zero_filled_bytes,
                        "class {c}"
                    );
                }
            }
        }
        if p >= 0.05 {
            assert!(lost > 0, "at {p} loss some lossy chunks were lost");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescaling_divides_each_chunk_by_the_ranks_whose_part_arrived() {
    let world = 3;
    let mut groups = group_with("diff-rescale", world, lossy(0.1)).await;
    let id = register(&mut groups, LossRecovery::Rescale).await;
    let n = bucket().total_values() as usize;
    for op in [ReduceOp::Sum, ReduceOp::Mean] {
        // A fresh bucket per op: its first round has no late data.
        let id = match op {
            ReduceOp::Sum => id,
            _ => register(&mut groups, LossRecovery::Rescale).await,
        };
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 9, n)).collect();
        let (got, reports) = differentiated(&mut groups, id, &inputs, op).await;
        assert!(
            reports.iter().any(|r| !r.lost.is_empty()),
            "some chunk was lost"
        );
        let want = expected(&inputs, &reports, op, true);
        for (r, g) in got.iter().enumerate() {
            same_bits(g, &want, &format!("{op:?} rank {r}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_feedback_adds_what_was_lost_into_the_next_round() {
    let world = 3;
    let mut groups = group_with("diff-feedback", world, lossy(0.1)).await;
    let id = register(&mut groups, LossRecovery::ErrorFeedback).await;
    let n = bucket().total_values() as usize;
    let mut owed = Owed::new(world, n);
    let mut any_lost = false;
    for step in 0..3 {
        let fresh: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 20 + step, n)).collect();
        let sent = owed.sent(&fresh);
        let (got, reports) = differentiated(&mut groups, id, &fresh, ReduceOp::Sum).await;
        // Late data is dropped, not merged: every round is exactly the
        // parts that arrived of what was sent.
        let want = expected(&sent, &reports, ReduceOp::Sum, false);
        for (r, g) in got.iter().enumerate() {
            same_bits(g, &want, &format!("step {step} rank {r}"));
        }
        any_lost |= reports.iter().any(|rep| !rep.lost.is_empty());
        owed.settle(&sent, &reports);
    }
    assert!(any_lost, "at 10% loss some chunk was lost");
}

/// A stalled peer (rank 2, whose packets all take 100 ms to leave) under a
/// 20 ms deadline: its lossy part is cut at the owners, counted in their
/// `missing` and its `lost`, and added into its next gradient; every rank
/// ends every step with the same bits, those of the parts that arrived
/// (less the return chunks some rank missed, which their owners carry:
/// group_bounded_return.rs). Without a deadline the same groups wait for
/// it and lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_peer_s_lossy_part_is_cut_at_the_deadline_and_folded_into_the_next_step() {
    let world = 3;
    let stalled = 2;
    let mut groups = group_with("diff-deadline", world, stalling(stalled)).await;
    let budget = Duration::from_millis(20);
    let id = register_with(&mut groups, error_feedback_within(budget)).await;
    let n = bucket().total_values() as usize;
    let mut owed = Owed::new(world, n);
    let mut carry = vec![0.0f32; n];
    for step in 0..3 {
        let fresh: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 40 + step, n)).collect();
        let sent = owed.sent(&fresh);
        let (got, reports) = differentiated(&mut groups, id, &fresh, ReduceOp::Sum).await;
        let want = with_return_missed(
            expected(&sent, &reports, ReduceOp::Sum, false),
            &mut carry,
            &reports,
        );
        for (r, g) in got.iter().enumerate() {
            same_bits(g, &want, &format!("step {step} rank {r}"));
            assert_eq!(reports[r].budget, Some(budget), "step {step} rank {r}");
        }
        if step == 0 {
            // The stalled rank's important part takes several of its
            // 100 ms round trips: its lossy part misses the deadline.
            assert!(
                !reports[stalled].lost.is_empty(),
                "the stalled rank lost nothing"
            );
            for owner in (0..world).filter(|&o| o != stalled) {
                assert!(
                    !reports[owner].missing[stalled].is_empty(),
                    "owner {owner} missed nothing of the stalled rank"
                );
            }
        }
        // What each owner counted missing is what its sender lost.
        for (r, rep) in reports.iter().enumerate() {
            let mut told: Vec<Range<usize>> = reports
                .iter()
                .flat_map(|owner| owner.missing[r].iter().cloned())
                .collect();
            told.sort_by_key(|c| c.start);
            let mut lost = rep.lost.clone();
            lost.sort_by_key(|c| c.start);
            assert_eq!(lost, told, "step {step} rank {r}");
        }
        owed.settle(&sent, &reports);
    }
    let no_deadline = BucketOptions::new(LossRecovery::ErrorFeedback);
    let id = register_with(&mut groups, no_deadline).await;
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| gradient(r, 50, n)).collect();
    let (got, reports) = differentiated(&mut groups, id, &inputs, ReduceOp::Sum).await;
    for (r, rep) in reports.iter().enumerate() {
        assert!(
            rep.lost.is_empty(),
            "rank {r} lost {:?} without a deadline",
            rep.lost
        );
        assert_eq!(rep.budget, None);
        same_bits(&got[r], &got[0], &format!("no deadline, rank {r}"));
    }
}

/// A bucket's deadline that cannot be followed is refused when the bucket
/// is registered, on every rank, before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_that_cannot_be_followed_is_refused_at_registration() {
    let mut groups = group_with("diff-bad-deadline", 2, |_, c| c).await;
    let bad = BucketOptions {
        deadline: StepDeadline::Adaptive(AdaptiveDeadline {
            factor: 0.5,
            ..AdaptiveDeadline::default()
        }),
        ..BucketOptions::default()
    };
    let layout = bucket();
    for g in &mut groups {
        let e = g.register_bucket_with(&layout, bad).await.unwrap_err();
        assert!(e.to_string().contains("factor"), "{e}");
    }
}

/// `sums`, the owners' sums of a call with a bounded return, as every rank
/// ends with them: `carry` (what the owners kept from the call before)
/// added in, then the chunks some rank missed zero, and kept in `carry`
/// for the next call. Every rank reports the same missed chunks.
pub(crate) fn with_return_missed(
    mut sums: Vec<f32>,
    carry: &mut [f32],
    reports: &[AllreduceReport],
) -> Vec<f32> {
    for (s, c) in sums.iter_mut().zip(carry.iter_mut()) {
        *s += *c;
        *c = 0.0;
    }
    let mut missed = reports[0].return_missed.clone();
    missed.sort_by_key(|r| r.start);
    for (r, rep) in reports.iter().enumerate() {
        let mut theirs = rep.return_missed.clone();
        theirs.sort_by_key(|r| r.start);
        assert_eq!(theirs, missed, "rank {r}'s missed return chunks");
    }
    for range in missed {
        carry[range.clone()].copy_from_slice(&sums[range.clone()]);
        sums[range].fill(0.0);
    }
    sums
}

/// Links on which rank `stalled`'s packets all take 100 ms to leave.
pub(crate) fn stalling(stalled: usize) -> impl Fn(usize, gradlane::Config) -> gradlane::Config {
    move |rank, mut c| {
        c.packets = gradlane::Packets::Ethernet;
        c.faults = (rank == stalled).then(|| Faults {
            delay: Duration::from_millis(100),
            ..Faults::default()
        });
        c
    }
}

/// Error feedback under a fixed deadline of `budget` a step.
pub(crate) fn error_feedback_within(budget: Duration) -> BucketOptions {
    BucketOptions {
        recovery: LossRecovery::ErrorFeedback,
        deadline: StepDeadline::Fixed(budget),
        ..BucketOptions::default()
    }
}

/// [`bucket`] registered on every rank with `options`.
pub(crate) async fn register_with(groups: &mut [Group], options: BucketOptions) -> BucketId {
    register_all(groups, &bucket(), options).await
}
