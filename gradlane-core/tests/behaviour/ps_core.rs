//! Parameter-server core: OrMo equivalences, catch-up weights, the straggler
//! filter, and the simulated comparison.

use std::collections::VecDeque;

use gradlane_core::ps::ordered_momentum::bucket;
use gradlane_core::ps::{
    ConfigError, Disposition, OrderedMomentum, OrderedMomentumConfig, ParameterServer, PullError,
    PushError, SamplePolicy, StragglerConfig, StragglerFilter,
};
use gradlane_core::rng::SplitMix64;
use proptest::prelude::*;

/// OrMo with these settings, or why it refuses them.
fn try_ormo(
    workers: usize,
    momentum: f64,
    learning_rate: f64,
    w0: Vec<f32>,
) -> Result<OrderedMomentum, ConfigError> {
    OrderedMomentum::new(
        OrderedMomentumConfig {
            workers,
            momentum,
            learning_rate,
        },
        w0,
    )
}

fn ormo(workers: usize, momentum: f64, learning_rate: f64, w0: Vec<f32>) -> OrderedMomentum {
    try_ormo(workers, momentum, learning_rate, w0).unwrap()
}

fn uniform(rng: &mut SplitMix64) -> f64 {
    2.0 * rng.next_f64() - 1.0
}

/// In-order arrival: the tickets are pushed in the order they were handed
/// out (FIFO), so bucket i's K gradients all arrive before any of bucket
/// i+1's. Compared with synchronous SGD with momentum fed the mean of the same
/// K gradients per step.
///
/// Where the two meet: the first push of bucket i hands out an index of bucket
/// i+1, so from the second push on "a worker is computing bucket b+1" and the
/// server advances (seed step 104) — it applies the momentum half of SSGDm's
/// next step early. So once bucket i is complete OrMo holds exactly
/// `w = w_{i+1} - eta*beta*u_{i+1}`, `u = beta*u_{i+1}`, b = i+1: SSGDm's state
/// after step i+1 plus the gradient-free part of step i+2, which SSGDm applies
/// whatever the gradients are. Every SSGDm step is reproduced; none differs.
#[test]
fn in_order_equals_synchronous_momentum() {
    const K: usize = 4;
    const BUCKETS: usize = 60;
    const DIM: usize = 5;
    let (beta, eta) = (0.9f64, 0.01f64);
    let mut rng = SplitMix64::new(42);
    let w0: Vec<f64> = (0..DIM).map(|_| uniform(&mut rng)).collect();
    let grads: Vec<Vec<Vec<f64>>> = (0..BUCKETS)
        .map(|_| {
            (0..K)
                .map(|_| (0..DIM).map(|_| uniform(&mut rng)).collect())
                .collect()
        })
        .collect();

    // Reference: SSGD with momentum, written out here on purpose (f64).
    let mut ref_w = w0.clone();
    let mut ref_u = vec![0.0f64; DIM];
    let mut ref_after: Vec<(Vec<f64>, Vec<f64>)> = Vec::new();
    for bucket_grads in &grads {
        for j in 0..DIM {
            let mean = bucket_grads.iter().map(|g| g[j]).sum::<f64>() / K as f64;
            ref_u[j] = beta * ref_u[j] + mean;
            ref_w[j] -= eta * ref_u[j];
        }
        ref_after.push((ref_w.clone(), ref_u.clone()));
    }

    let mut s = ormo(K, beta, eta, w0.iter().map(|&v| v as f32).collect());
    let mut queue: VecDeque<u64> = VecDeque::new();
    for _ in 0..K {
        queue.push_back(s.pull().unwrap().unwrap().index);
    }
    assert!(queue.iter().all(|&i| i == 0));
    let mut max_err = 0.0f64;
    for (i, bucket_grads) in grads.iter().enumerate() {
        for g in bucket_grads {
            let index = queue.pop_front().unwrap();
            assert_eq!(bucket(index, K) as usize, i, "FIFO keeps buckets in order");
            let g32: Vec<f32> = g.iter().map(|&v| v as f32).collect();
            let out = s.push(&g32, index).unwrap();
            assert!(matches!(out.disposition, Disposition::Applied { .. }));
            queue.push_back(out.reply.unwrap().index);
        }
        // K > 1: an index of bucket i+1 is out, so b has moved to i+1.
        assert_eq!(s.latest_bucket() as usize, i + 1);
        let (rw, ru) = &ref_after[i];
        for j in 0..DIM {
            let ew = (f64::from(s.params()[j]) - (rw[j] - eta * beta * ru[j])).abs();
            let eu = (f64::from(s.momentum()[j]) - beta * ru[j]).abs();
            max_err = max_err.max(ew).max(eu);
        }
    }
    assert_eq!(s.iteration() as usize, K * BUCKETS);
    // The parameters genuinely moved (a stuck server would "match" nothing).
    let moved = ref_after
        .last()
        .unwrap()
        .0
        .iter()
        .zip(&w0)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(moved > 0.05, "moved {moved}");
    assert!(max_err < 1e-6, "max |OrMo - SSGDm| = {max_err}");
}

/// Out-of-order arrival, K = 2, beta = 0.5, eta = 1, w0 = [0, 0].
///
/// Workers A and B both start with index 0 (bucket 0). A is fast and pushes
/// indices 0, 1, 2 before B pushes its index-0 gradient.
///
/// Coefficients: u += beta^d g / 2; w -= (1 - 0.5^(d+1)) / 0.5 * g / 2.
/// For d = 0 that is w -= g/2; for d = 2 it is w -= 1.75 * g/2.
///
/// 1. A pushes j=0, g=[2,0]. Nobody computes bucket 1 yet: no advance. d=0.
///    u = [1, 0], w = [-1, 0]. t=1; A gets index 1 (bucket 1).
/// 2. A pushes j=1, g=[4,-2]. Index 1 (bucket 1 = b+1) is being computed:
///    advance w -= 0.5*u -> [-1.5, 0], u *= 0.5 -> [0.5, 0], b=1. d=0:
///    u = [0.5+2, 0-1] = [2.5, -1], w = [-1.5-2, 0+1] = [-3.5, 1]. A gets 2.
/// 3. A pushes j=2 (bucket 1), g=[2,2]. Outstanding: 0 (B) and 2, both at
///    most bucket 1 = b: no advance. d=0: u = [3.5, 0], w = [-4.5, 0].
///    A gets index 3 (bucket 2).
/// 4. B pushes j=0, g=[6,4]. Index 3 (bucket 2 = b+1) is being computed:
///    advance w -= 0.5*[3.5, 0] -> [-6.25, 0], u -> [1.75, 0], b=2.
///    d = 2 - 0 = 2: u += 0.25*[3, 2] -> [2.5, 0.5];
///    w -= 1.75*[3, 2] -> [-11.5, -3.5]. B gets index 4; staleness 3.
///
/// Cross-check: SSGD-momentum on buckets {A0, B0} (mean [4,2]) and {A1, A2}
/// (mean [3,0]): u1=[4,2], w1=[-4,-2]; u2=[5,1], w2=[-9,-3]; the momentum
/// half of step 3 gives w=[-9-2.5, -3-0.5]=[-11.5,-3.5], u=[2.5,0.5]. Same.
#[test]
fn out_of_order_catch_up_weights() {
    let mut s = ormo(2, 0.5, 1.0, vec![0.0, 0.0]);
    let a0 = s.pull().unwrap().unwrap().index;
    let b0 = s.pull().unwrap().unwrap().index;
    assert_eq!((a0, b0), (0, 0));

    let out = s.push(&[2.0, 0.0], a0).unwrap();
    let a1 = out.reply.unwrap().index;
    assert_eq!(a1, 1);
    assert_eq!(s.params(), &[-1.0, 0.0]);
    assert_eq!(s.momentum(), &[1.0, 0.0]);
    assert_eq!(s.latest_bucket(), 0);

    let a2 = s.push(&[4.0, -2.0], a1).unwrap().reply.unwrap().index;
    assert_eq!(a2, 2);
    assert_eq!(s.latest_bucket(), 1);
    assert_eq!(s.params(), &[-3.5, 1.0]);
    assert_eq!(s.momentum(), &[2.5, -1.0]);

    let a3 = s.push(&[2.0, 2.0], a2).unwrap().reply.unwrap().index;
    assert_eq!(a3, 3);
    assert_eq!(s.latest_bucket(), 1);
    assert_eq!(s.params(), &[-4.5, 0.0]);
    assert_eq!(s.momentum(), &[3.5, 0.0]);

    let out = s.push(&[6.0, 4.0], b0).unwrap();
    assert_eq!(out.disposition, Disposition::Applied { staleness: 3 });
    assert_eq!(out.reply.unwrap().index, 4);
    assert_eq!(s.latest_bucket(), 2);
    assert_eq!(s.params(), &[-11.5, -3.5]);
    assert_eq!(s.momentum(), &[2.5, 0.5]);
    assert_eq!(s.iteration(), 4);
}

#[test]
fn ormo_rejects_bad_input_without_changing_state() {
    let mut s = ormo(2, 0.9, 0.1, vec![1.0, 2.0]);
    let i = s.pull().unwrap().unwrap().index;
    s.pull().unwrap();
    assert_eq!(
        s.pull().unwrap_err(),
        PullError::TicketsExhausted { workers: 2 }
    );
    assert_eq!(
        s.push(&[1.0], i).unwrap_err(),
        PushError::WrongLength {
            expected: 2,
            got: 1
        }
    );
    assert_eq!(
        s.push(&[1.0, f32::NAN], i).unwrap_err(),
        PushError::NonFinite { position: 1 }
    );
    assert_eq!(
        s.push(&[f32::INFINITY, 0.0], i).unwrap_err(),
        PushError::NonFinite { position: 0 }
    );
    assert_eq!(
        s.push(&[1.0, 1.0], 7).unwrap_err(),
        PushError::UnknownIndex(7)
    );
    assert_eq!(s.params(), &[1.0, 2.0]);
    assert_eq!(s.iteration(), 0);
    // Both index-0 tickets used up: a third push with index 0 is unknown.
    s.push(&[1.0, 1.0], 0).unwrap();
    s.push(&[1.0, 1.0], 0).unwrap();
    assert_eq!(
        s.push(&[1.0, 1.0], 0).unwrap_err(),
        PushError::UnknownIndex(0)
    );

    let bad = |workers, momentum, learning_rate, w0| {
        try_ormo(workers, momentum, learning_rate, w0).unwrap_err()
    };
    assert_eq!(bad(0, 0.9, 0.1, vec![0.0]), ConfigError::NoWorkers);
    assert_eq!(bad(1, 1.0, 0.1, vec![0.0]), ConfigError::Momentum(1.0));
    assert_eq!(
        bad(1, 0.9, -0.1, vec![0.0]),
        ConfigError::LearningRate(-0.1)
    );
    assert_eq!(bad(1, 0.9, 0.1, vec![]), ConfigError::EmptyParams);
    assert_eq!(
        bad(1, 0.9, 0.1, vec![0.0, f32::NAN]),
        ConfigError::NonFiniteParams { position: 1 }
    );
}

proptest! {
    /// Any interleaving of K workers: no push is refused, K tickets stay out,
    /// b tracks the newest ticket's bucket, and w, u equal OrMo's closed form:
    /// each received gradient g_j (bucket c_j) carries weight
    /// eta/K (1 - beta^(b - c_j + 1)) / (1 - beta) in w0 - w and
    /// beta^(b - c_j) / K in u — as if it had arrived with its own bucket.
    #[test]
    fn ormo_closed_form_under_any_interleaving(
        k in 1usize..6,
        beta in 0.0f64..0.95,
        picks in proptest::collection::vec((0usize..64, -1.0f32..1.0, -1.0f32..1.0), 1..120),
    ) {
        let eta = 0.05;
        let mut s = ormo(k, beta, eta, vec![0.5, -0.5]);
        let mut held: Vec<u64> = (0..k).map(|_| s.pull().unwrap().unwrap().index).collect();
        let mut received: Vec<(u64, [f32; 2])> = Vec::new();
        for (pick, g0, g1) in picks {
            let slot = pick % k;
            let index = held[slot];
            let out = s.push(&[g0, g1], index).unwrap();
            held[slot] = out.reply.unwrap().index;
            received.push((bucket(index, k), [g0, g1]));
            prop_assert_eq!(s.outstanding(), k);
            let newest = *held.iter().max().unwrap();
            let b = s.latest_bucket();
            prop_assert!(b <= bucket(newest, k) && bucket(newest, k) <= b + 1);
        }
        let b = s.latest_bucket();
        for dim in 0..2 {
            let mut w = [0.5f64, -0.5][dim];
            let mut u = 0.0f64;
            for (c, g) in &received {
                let d = (b - c) as i32;
                let g = f64::from(g[dim]) / k as f64;
                w -= eta * (1.0 - beta.powi(d + 1)) / (1.0 - beta) * g;
                u += beta.powi(d) * g;
            }
            prop_assert!((f64::from(s.params()[dim]) - w).abs() < 1e-4);
            prop_assert!((f64::from(s.momentum()[dim]) - u).abs() < 1e-4);
        }
    }
}

fn filter(sample_size: usize, rank_threshold: f64) -> StragglerFilter {
    filter_with(SamplePolicy::EvictLargest, sample_size, rank_threshold)
}

fn filter_with(
    sample_policy: SamplePolicy,
    sample_size: usize,
    rank_threshold: f64,
) -> StragglerFilter {
    StragglerFilter::new(
        StragglerConfig {
            learning_rate: 0.5,
            sample_size,
            rank_threshold,
            sample_policy,
        },
        vec![0.0, 0.0],
    )
    .unwrap()
}

const POLICIES: [SamplePolicy; 2] = [SamplePolicy::EvictLargest, SamplePolicy::SlidingWindow];

#[test]
fn the_sliding_window_is_the_default_policy() {
    assert_eq!(SamplePolicy::default(), SamplePolicy::SlidingWindow);
}

/// The seed's rule as written (evict the largest), step by step.
#[test]
fn straggler_staleness_drop_and_fixed_sample() {
    let mut f = filter(4, 0.5);
    let slow = f.pull().unwrap().unwrap().index; // a learner that saw C = 0
    assert_eq!(slow, 0);
    // Warm-up: four fresh pushes fill the sample with s = 1 and are applied.
    for c in 0..4u64 {
        let out = f.push(&[1.0, 0.0], c).unwrap();
        assert_eq!(out.disposition, Disposition::Applied { staleness: 0 });
        assert_eq!(out.reply.unwrap().index, c + 1);
    }
    assert_eq!(f.clock(), 4);
    assert_eq!(f.sample(), vec![1, 1, 1, 1]);
    assert_eq!(f.params(), &[-2.0, 0.0]);

    // The learner that saw C = 0 pushes now: s = 4 - 0 + 1 = 5, rank 4/4 = 1
    // > 0.5: slow, dropped. Parameters untouched, clock unchanged, and it
    // still gets fresh parameters with C = 4. Sample: drop a 1, insert 5.
    let out = f.push(&[100.0, 100.0], slow).unwrap();
    assert_eq!(out.disposition, Disposition::Dropped { staleness: 4 });
    let reply = out.reply.unwrap();
    assert_eq!(reply.index, 4);
    assert_eq!(reply.params, &[-2.0, 0.0]);
    assert_eq!(f.clock(), 4);
    assert_eq!(f.sample(), vec![1, 1, 1, 5]);

    // s = 2 (saw C = 3): below it only the three 1s -> rank 0.75 > 0.5: drop.
    // The 5 is the largest and goes; sample [1, 1, 1, 2].
    let out = f.push(&[9.0, 9.0], 3).unwrap();
    assert_eq!(out.disposition, Disposition::Dropped { staleness: 1 });
    assert_eq!(f.sample(), vec![1, 1, 1, 2]);

    // Fresh s = 1: rank 0: applied, the 2 makes way.
    let out = f.push(&[0.0, 2.0], 4).unwrap();
    assert_eq!(out.disposition, Disposition::Applied { staleness: 0 });
    assert_eq!(f.params(), &[-2.0, -1.0]);
    assert_eq!(f.clock(), 5);
    assert_eq!(f.sample(), vec![1, 1, 1, 1]);

    // s = 2 (saw C = 4, now 5) against [1, 1, 1, 1]: rank 1 -> dropped.
    assert!(matches!(
        f.push(&[1.0, 1.0], 4).unwrap().disposition,
        Disposition::Dropped { staleness: 1 }
    ));
    let stats = f.stats();
    assert_eq!((stats.accepted, stats.dropped), (5, 3));
    assert_eq!(stats.applied_staleness_sum, 0);
    assert_eq!(f.sample().len(), 4);

    let mut lenient = filter(2, 0.5);
    lenient.push(&[0.0, 0.0], 0).unwrap(); // s = 1
    lenient.push(&[0.0, 0.0], 0).unwrap(); // s = 2 (C = 1, saw 0); sample [1, 2]
    assert_eq!(lenient.sample(), vec![1, 2]);
    // s = 2 again (C = 2, saw 1): one of two values below -> rank 0.5, not > 0.5.
    let out = lenient.push(&[1.0, 0.0], 1).unwrap();
    assert_eq!(out.disposition, Disposition::Applied { staleness: 1 });
    assert_eq!(lenient.stats().applied_staleness_sum, 2);
    assert_eq!(lenient.stats().applied_staleness_max, 1);

    // A clock the server never reached is refused.
    assert_eq!(
        lenient.push(&[0.0, 0.0], 99).unwrap_err(),
        PushError::UnknownIndex(99)
    );
}

/// Who pushes in the deterministic schedule below, and how stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pusher {
    /// One of the fast workers, this many updates behind (0 or 1).
    Fast(u64),
    /// The straggler, always `k` updates behind.
    Straggler,
}

/// Seven fast workers take turns, each 0 or 1 update behind (alternating),
/// and after every 21 of their pushes the straggler pushes once, `k`
/// updates behind: about the share of pushes a 4x slower machine sends
/// among eight. Returns each push's pusher and whether it was dropped.
fn run_schedule(f: &mut StragglerFilter, k: u64, pushes: usize) -> Vec<(Pusher, bool)> {
    (0..pushes)
        .map(|n| {
            let who = if n % 22 == 21 {
                Pusher::Straggler
            } else {
                Pusher::Fast((n % 22 % 2) as u64)
            };
            let lag = match who {
                Pusher::Fast(lag) => lag,
                Pusher::Straggler => k,
            };
            let index = f.clock().saturating_sub(lag);
            let out = f.push(&[0.1, -0.1], index).unwrap();
            (who, matches!(out.disposition, Disposition::Dropped { .. }))
        })
        .collect()
}

#[test]
fn sliding_window_drops_the_straggler_and_nobody_else() {
    let n = 16;
    for threshold in [0.8, 0.9, 0.95] {
        for k in [2, 5, 40] {
            let mut f = filter_with(SamplePolicy::SlidingWindow, n, threshold);
            let seen = run_schedule(&mut f, k, 22 * 20);
            // Until the sample is full nothing is judged.
            assert!(seen[..n].iter().all(|&(_, dropped)| !dropped));
            for (i, &(who, dropped)) in seen.iter().enumerate().skip(n) {
                match who {
                    Pusher::Straggler => {
                        assert!(dropped, "t {threshold} k {k}: straggler push {i} taken")
                    }
                    Pusher::Fast(_) => {
                        assert!(!dropped, "t {threshold} k {k}: fast push {i} dropped")
                    }
                }
            }
            // The straggler pushed 20 times; the sample was full for all.
            let st = f.stats();
            assert_eq!((st.accepted, st.dropped), (22 * 20 - 20, 20));
            // Only the fast workers' staleness was applied: at most 1.
            assert_eq!(st.applied_staleness_max, 1);
            // The sample holds the last n values in order of arrival.
            assert_eq!(f.sample().len(), n);
        }
    }
}

/// The same schedule under the seed's rule: the sample sinks to s = 1 and
/// every fast push with one update in between is dropped with the
/// straggler's. These counts are the behaviour before the policy existed.
#[test]
fn evict_largest_drops_fast_workers_on_the_same_schedule() {
    let mut f = filter_with(SamplePolicy::EvictLargest, 16, 0.9);
    let seen = run_schedule(&mut f, 5, 22 * 20);
    let dropped =
        |pick: fn(Pusher) -> bool| seen.iter().filter(|&&(who, d)| pick(who) && d).count();
    assert_eq!(dropped(|w| w == Pusher::Straggler), 20);
    // Of the 200 fast pushes one update behind, 8 came before the sample
    // was full.
    assert_eq!(dropped(|w| w == Pusher::Fast(1)), 187);
    assert_eq!(dropped(|w| w == Pusher::Fast(0)), 0);
    let mut last = vec![1; 15];
    last.push(6); // the straggler's own s, just inserted
    assert_eq!(f.sample(), last);
}

#[test]
fn rank_edge_cases_under_both_policies() {
    for policy in POLICIES {
        // The sample starts empty: whatever the staleness, nothing is
        // judged until it holds `sample_size` values.
        let mut f = filter_with(policy, 3, 0.0);
        for lag in [0, 0, 0] {
            let index = f.clock() - lag;
            let d = f.push(&[0.0, 0.0], index).unwrap().disposition;
            assert!(matches!(d, Disposition::Applied { .. }), "{policy:?}");
        }
        let mut f = filter_with(policy, 3, 0.0);
        f.push(&[0.0, 0.0], 0).unwrap(); // s = 1
        f.push(&[0.0, 0.0], 0).unwrap(); // s = 2
        f.push(&[0.0, 0.0], 0).unwrap(); // s = 3
        assert_eq!(f.sample(), vec![1, 2, 3], "{policy:?}");
        assert_eq!(f.stats().dropped, 0);

        // Ties are not slower: against [1, 2], s = 2 has one value below
        // (rank 0.5), and 0.5 is not above a threshold of 0.5.
        let mut f = filter_with(policy, 2, 0.5);
        f.push(&[0.0, 0.0], 0).unwrap(); // s = 1
        f.push(&[0.0, 0.0], 0).unwrap(); // s = 2
        let index = f.clock() - 1;
        let d = f.push(&[0.0, 0.0], index).unwrap().disposition; // s = 2
        assert_eq!(d, Disposition::Applied { staleness: 1 }, "{policy:?}");

        // Threshold 0: anything with a value strictly below it is dropped;
        // the freshest value never is.
        let mut f = filter_with(policy, 2, 0.0);
        f.push(&[0.0, 0.0], 0).unwrap(); // s = 1
        f.push(&[0.0, 0.0], 1).unwrap(); // s = 1; sample [1, 1]
        let d = f.push(&[0.0, 0.0], 1).unwrap().disposition; // s = 2
        assert_eq!(d, Disposition::Dropped { staleness: 1 }, "{policy:?}");
        let d = f.push(&[0.0, 0.0], 2).unwrap().disposition; // s = 1
        assert_eq!(d, Disposition::Applied { staleness: 0 }, "{policy:?}");

        // Threshold 1: nothing is ever dropped, however stale.
        let mut f = filter_with(policy, 2, 1.0);
        for n in 0..40u64 {
            let index = if n % 2 == 0 { 0 } else { f.clock() };
            let d = f.push(&[0.0, 0.0], index).unwrap().disposition;
            assert!(matches!(d, Disposition::Applied { .. }), "{policy:?}");
        }
    }
}

#[test]
fn the_sliding_window_forgets_the_oldest_value() {
    let mut f = filter_with(SamplePolicy::SlidingWindow, 3, 0.5);
    f.push(&[0.0, 0.0], 0).unwrap(); // s = 1
    f.push(&[0.0, 0.0], 0).unwrap(); // s = 2
    f.push(&[0.0, 0.0], 0).unwrap(); // s = 3; sample [1, 2, 3]
                                     // s = 1 ranks 0 and is applied; the oldest value (the first 1) goes,
                                     // where the seed's rule would have removed the 3.
    let index = f.clock();
    f.push(&[0.0, 0.0], index).unwrap();
    assert_eq!(f.sample(), vec![1, 2, 3]);
    let index = f.clock();
    f.push(&[0.0, 0.0], index).unwrap(); // evicts the 2
    assert_eq!(f.sample(), vec![1, 1, 3]);
    // s = 4 (three behind): all three below, rank 1 > 0.5: dropped; the 3
    // goes.
    let index = f.clock() - 3;
    let d = f.push(&[0.0, 0.0], index).unwrap().disposition;
    assert_eq!(d, Disposition::Dropped { staleness: 3 });
    assert_eq!(f.sample(), vec![1, 1, 4]);

    // Once the window is full of one value, that value is never dropped,
    // even at threshold 0: only the two pushes judged while the warm-up's
    // 1 and 2 were still in the window are. The seed's rule keeps those
    // small values for good and drops every push after the warm-up.
    let mut f = filter_with(SamplePolicy::SlidingWindow, 4, 0.0);
    for _ in 0..40 {
        let index = f.clock().saturating_sub(2);
        f.push(&[0.0, 0.0], index).unwrap();
    }
    assert_eq!(f.sample(), vec![3; 4]);
    assert_eq!(f.stats().dropped, 2);
    let mut f = filter_with(SamplePolicy::EvictLargest, 4, 0.0);
    for _ in 0..40 {
        let index = f.clock().saturating_sub(2);
        f.push(&[0.0, 0.0], index).unwrap();
    }
    assert_eq!(f.sample(), vec![1, 2, 3, 3]);
    assert_eq!(f.stats().dropped, 40 - 4);
}

proptest! {
    /// Whatever the staleness sequence and the policy, the sample grows to
    /// its size and then never changes size; every push is either accepted
    /// or dropped; the clock counts accepted pushes; a threshold of 1
    /// never drops.
    #[test]
    fn straggler_sample_size_is_fixed(
        size in 1usize..12,
        threshold in 0.0f64..=1.0,
        lags in proptest::collection::vec(0u64..20, 1..200),
        sliding in proptest::bool::ANY,
    ) {
        let policy = POLICIES[usize::from(sliding)];
        let mut f = filter_with(policy, size, threshold);
        let mut open = filter_with(policy, size, 1.0);
        for (n, lag) in lags.iter().enumerate() {
            let index = f.clock().saturating_sub(*lag);
            f.push(&[0.1, -0.1], index).unwrap();
            prop_assert_eq!(f.sample().len(), (n + 1).min(size));
            let st = f.stats();
            prop_assert_eq!(st.accepted + st.dropped, n as u64 + 1);
            prop_assert_eq!(f.clock(), st.accepted);
            let index = open.clock().saturating_sub(*lag);
            open.push(&[0.1, -0.1], index).unwrap();
            prop_assert_eq!(open.stats().dropped, 0);
        }
    }

    /// Under the sliding window the sample is exactly the staleness of the
    /// last `size` pushes, dropped ones included.
    #[test]
    fn sliding_window_sample_is_the_last_values(
        size in 1usize..12,
        threshold in 0.0f64..=1.0,
        lags in proptest::collection::vec(0u64..20, 1..200),
    ) {
        let mut f = filter_with(SamplePolicy::SlidingWindow, size, threshold);
        let mut history = Vec::new();
        for lag in &lags {
            let index = f.clock().saturating_sub(*lag);
            history.push(f.clock() - index + 1);
            f.push(&[0.1, -0.1], index).unwrap();
            let mut last: Vec<u64> = history.iter().rev().take(size).copied().collect();
            last.sort_unstable();
            prop_assert_eq!(f.sample(), last);
        }
    }
}

#[test]
fn baselines_follow_the_pull_push_shape() {
    use gradlane_core::ps::baselines::{Asgd, NaiveMomentumAsgd, SyncMomentum};

    // Synchronous: K tickets per round, extra pulls wait, the K-th push steps.
    let mut s = SyncMomentum::new(2, 1.0, 0.5, vec![0.0]).unwrap();
    let a = s.pull().unwrap().unwrap().index;
    let b = s.pull().unwrap().unwrap().index;
    assert_eq!((a, b), (0, 0));
    assert!(s.pull().unwrap().is_none());
    let out = s.push(&[2.0], a).unwrap();
    assert_eq!(out.disposition, Disposition::Buffered);
    assert!(out.reply.is_none());
    assert_eq!(s.params(), &[0.0]);
    assert_eq!(s.push(&[1.0], 1).unwrap_err(), PushError::UnknownIndex(1));
    let out = s.push(&[4.0], b).unwrap();
    assert_eq!(out.disposition, Disposition::Applied { staleness: 0 });
    assert_eq!(out.reply.unwrap().index, 1);
    assert_eq!(s.params(), &[-3.0]); // u = 3, w = -3
    assert_eq!(s.pull().unwrap().unwrap().index, 1);
    assert!(s.pull().unwrap().is_none());
    s.push(&[0.0], 1).unwrap();
    s.push(&[0.0], 1).unwrap();
    assert_eq!(s.params(), &[-4.5]); // u = 1.5, w = -4.5

    // Naive momentum: u = beta u + g in arrival order, stale or not.
    let mut n = NaiveMomentumAsgd::new(1.0, 0.5, vec![0.0]).unwrap();
    n.push(&[2.0], 0).unwrap();
    let out = n.push(&[2.0], 0).unwrap();
    assert_eq!(out.disposition, Disposition::Applied { staleness: 1 });
    assert_eq!(n.params(), &[-5.0]); // u: 2, then 3; w: -2, then -5

    let mut g = Asgd::new(0.5, vec![1.0]).unwrap();
    g.push(&[2.0], 0).unwrap();
    assert_eq!(g.params(), &[0.0]);
    assert_eq!(g.push(&[2.0], 5).unwrap_err(), PushError::UnknownIndex(5));
    assert_eq!(
        g.push(&[f32::NAN], 0).unwrap_err(),
        PushError::NonFinite { position: 0 }
    );
}

#[test]
fn a_leaving_worker_shrinks_the_synchronous_round() {
    use gradlane_core::ps::baselines::SyncMomentum;
    use gradlane_core::ps::ReleaseError;
    let mut s = SyncMomentum::new(3, 0.1, 0.5, vec![0.0]).unwrap();
    for _ in 0..3 {
        assert_eq!(s.pull().unwrap().unwrap().index, 0);
    }
    // Two push, the third dies holding its ticket: the round completes with
    // the mean of the two it has.
    assert_eq!(
        s.push(&[1.0], 0).unwrap().disposition,
        Disposition::Buffered
    );
    assert_eq!(
        s.push(&[3.0], 0).unwrap().disposition,
        Disposition::Buffered
    );
    assert_eq!(s.steps(), 0);
    s.leave(Some(0)).unwrap();
    assert_eq!(s.steps(), 1);
    assert_eq!(s.workers(), 2);
    // u = 0.5 * 0 + mean(1, 3) = 2; w = 0 - 0.1 * 2.
    assert!((s.params()[0] + 0.2).abs() < 1e-6);
    // The next round waits for the two that are left, and no more.
    assert!(s.pull().unwrap().is_some());
    assert!(s.pull().unwrap().is_some());
    assert!(s.pull().unwrap().is_none());
    // A ticket of a finished round cannot be given back.
    assert_eq!(s.leave(Some(0)), Err(ReleaseError::UnknownIndex(0)));
    // A worker that leaves between rounds (holding nothing) still shrinks it.
    s.leave(None).unwrap();
    assert_eq!(s.workers(), 1);
}

#[test]
fn a_leaving_worker_frees_its_ormo_slot() {
    let mut s = ormo(2, 0.5, 0.1, vec![0.0]);
    let a = s.pull().unwrap().unwrap().index;
    let _b = s.pull().unwrap().unwrap().index;
    assert!(s.pull().is_err());
    s.leave(Some(a)).unwrap();
    assert_eq!(s.outstanding(), 1);
    assert!(s.pull().unwrap().is_some());
    // Leaving without a ticket changes nothing.
    s.leave(None).unwrap();
    assert_eq!(s.outstanding(), 2);
}
