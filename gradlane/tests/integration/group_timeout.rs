//! The group's collective timeout: a rank whose links are alive but that
//! stays away from a collective. With `Fail` the others' collective ends
//! at the timeout with an error naming it, the group is unusable after,
//! and the rank that stayed away learns it at its next collective; with
//! `Continue` the others go on without it and it is out.

use crate::common::{allreduce_all, group_configured};
use futures_util::future::join_all;
use gradlane::{Group, GroupConfig, GroupError, OnRankFailure, ReduceOp};
use std::time::{Duration, Instant};

const WORLD: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(1);
/// What the timeout's error may take beyond the timeout on two shared
/// cores: a bound that catches a collective that never ends.
const MARGIN: Duration = Duration::from_secs(3);

/// WORLD ranks under `policy` and the collective timeout `timeout`.
async fn group_of(tag: &str, policy: OnRankFailure, timeout: Option<Duration>) -> Vec<Group> {
    group_configured(tag, WORLD, |_, c| GroupConfig {
        on_rank_failure: policy,
        collective_timeout: timeout,
        ..c
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_a_rank_stays_away_from_fails_at_the_timeout_naming_it() {
    let mut groups = group_of("timeout-fail", OnRankFailure::Fail, Some(TIMEOUT)).await;
    let mut away = groups.pop().unwrap();
    let started = Instant::now();
    let results = join_all(groups.iter_mut().map(|g| g.barrier())).await;
    let waited = started.elapsed();
    for r in results {
        match r {
            Err(GroupError::Timeout {
                op,
                missing,
                waited,
                ..
            }) => {
                assert_eq!(op, "barrier");
                assert_eq!(missing, vec![2]);
                assert_eq!(waited, TIMEOUT);
            }
            other => panic!("expected a timeout naming rank 2, got {other:?}"),
        }
    }
    assert!(waited >= TIMEOUT, "ended before the timeout: {waited:?}");
    assert!(
        waited <= TIMEOUT + MARGIN,
        "ended {waited:?} after it began"
    );

    // Unusable after: the next collective is the same error at once.
    let mut buf = vec![1.0f32; 16];
    match groups[0].allreduce(&mut buf, ReduceOp::Sum).await {
        Err(GroupError::Timeout { op, missing, .. }) => {
            assert_eq!((op, missing), ("barrier", vec![2]));
        }
        other => panic!("expected the earlier timeout again, got {other:?}"),
    }

    // The rank that stayed away may pass its barrier (the others' halves
    // were sent before they gave up), then finds its links closed, with
    // the reason.
    let late = async {
        away.barrier().await?;
        away.allreduce(&mut buf, ReduceOp::Sum).await
    };
    let late = tokio::time::timeout(TIMEOUT + MARGIN, late)
        .await
        .expect("the late rank's collectives ended");
    match late {
        Err(e @ GroupError::Rank { .. }) => {
            assert!(e.to_string().contains("past its timeout (1s)"), "{e}");
        }
        other => panic!("expected the late rank's links to be closed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_timeout_a_late_rank_is_waited_for() {
    let mut groups = group_of("timeout-none", OnRankFailure::Fail, None).await;
    let mut late = groups.pop().unwrap();
    let early = join_all(groups.iter_mut().map(|g| g.barrier()));
    let comes_later = async {
        tokio::time::sleep(TIMEOUT * 2).await;
        late.barrier().await
    };
    let (early, late) = tokio::join!(early, comes_later);
    for r in early {
        r.unwrap();
    }
    late.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_continue_a_rank_silent_past_the_timeout_is_removed() {
    let mut groups = group_of("timeout-continue", OnRankFailure::Continue, Some(TIMEOUT)).await;
    let mut away = groups.pop().unwrap();
    let mut bufs = [vec![1.0f32; 64], vec![2.0f32; 64]];
    allreduce_all(&mut groups, &mut bufs, ReduceOp::Sum).await;
    for (g, b) in groups.iter().zip(&bufs) {
        assert_eq!(g.members(), &[0, 1]);
        assert_eq!(g.epoch(), 1);
        assert!(
            b.iter().all(|&v| v == 3.0),
            "the sum of the two that stayed"
        );
    }
    let mut buf = vec![3.0f32; 64];
    let late = tokio::time::timeout(TIMEOUT + MARGIN, away.allreduce(&mut buf, ReduceOp::Sum))
        .await
        .expect("the removed rank's allreduce ended");
    match late {
        Err(GroupError::Removed { .. } | GroupError::NoQuorum { .. }) => {}
        other => panic!("expected the silent rank to be out of the group, got {other:?}"),
    }
}

/// The monitored barrier has its own bound: with `Continue` the rank
/// that stays away from it is removed, and the barrier passes among the
/// others, who go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_continue_a_monitored_barrier_removes_the_rank_that_stays_away() {
    let mut groups = group_of("monitored-continue", OnRankFailure::Continue, None).await;
    let mut away = groups.pop().unwrap();
    let started = Instant::now();
    let barriers = groups.iter_mut().map(|g| g.monitored_barrier(TIMEOUT));
    let results = tokio::time::timeout(3 * TIMEOUT + MARGIN, join_all(barriers))
        .await
        .expect("the monitored barrier ended");
    for r in results {
        r.unwrap();
    }
    assert!(started.elapsed() >= TIMEOUT, "passed before the bound");
    for g in &groups {
        assert_eq!(g.members(), &[0, 1]);
    }
    let mut bufs = [vec![1.0f32; 8], vec![2.0f32; 8]];
    allreduce_all(&mut groups, &mut bufs, ReduceOp::Sum).await;
    assert!(bufs.iter().flatten().all(|&v| v == 3.0));
    let late = tokio::time::timeout(TIMEOUT + MARGIN, away.monitored_barrier(TIMEOUT))
        .await
        .expect("the removed rank's barrier ended");
    assert!(
        matches!(
            late,
            Err(GroupError::Removed { .. } | GroupError::NoQuorum { .. })
        ),
        "expected the rank that stayed away to be out, got {late:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collective_cancelled_halfway_leaves_the_group_refusing_calls() {
    let mut groups = group_of("timeout-cancelled", OnRankFailure::Fail, None).await;
    let mut buf = vec![1.0f32; 1 << 16];
    // The others never come: the caller's own timeout drops the future.
    let cut = tokio::time::timeout(
        Duration::from_millis(200),
        groups[0].allreduce(&mut buf, ReduceOp::Sum),
    )
    .await;
    assert!(cut.is_err(), "the allreduce cannot end without the others");
    match groups[0].barrier().await {
        Err(GroupError::Interrupted { op }) => assert_eq!(op, "allreduce"),
        other => panic!("expected the cancelled allreduce named, got {other:?}"),
    }
}
