//! The parameter-server algorithms in the event simulation.

use gradlane::ps::SamplePolicy;
use gradlane_tools::sim::{run_algorithm, Algorithm, LeastSquares, SimConfig, Trace};

/// Ill-conditioned least squares (condition 1000) so momentum matters;
/// 8 workers from 1x to 4x compute time with 20% jitter.
fn setup() -> (LeastSquares, SimConfig, f64) {
    let problem = LeastSquares::synthetic(7, 400, 20, 1000.0, 0.1).unwrap();
    let f0 = problem.loss(&[0.0; 20]);
    // 0.1% of the initial excess loss above the optimum.
    let target = problem.optimum() + 1e-3 * (f0 - problem.optimum());
    let cfg = SimConfig {
        workers: 8,
        seed: 7 ^ 0xA5A5,
        batch: 64,
        base_compute: 100,
        slowest: 4.0,
        straggler: None,
        jitter: 0.2,
        max_pushes: 4000,
        stop_loss: target,
    };
    (problem, cfg, target)
}

fn grid() -> Vec<f64> {
    (0..14).map(|i| 0.005 * 1.5f64.powi(i)).collect()
}

/// The same learning-rate grid for every algorithm; each is judged at its
/// own best rate. Returns (grid position, steps to target, trace).
fn best(
    make: impl Fn(f64) -> Algorithm,
    problem: &LeastSquares,
    cfg: &SimConfig,
    target: f64,
) -> (usize, usize, Trace) {
    let grid = grid();
    let mut best: Option<(usize, usize, Trace)> = None;
    for (i, &lr) in grid.iter().enumerate() {
        let t = run_algorithm(make(lr), problem, cfg).unwrap();
        if t.diverged {
            continue;
        }
        if let Some(s) = t.steps_to(target) {
            if best.as_ref().is_none_or(|b| s < b.1) {
                best = Some((i, s, t));
            }
        }
    }
    let best = best.expect("reaches the target at some rate");
    // An optimum on the grid's edge would mean the grid cut it short.
    assert!(
        best.0 > 0 && best.0 < grid.len() - 1,
        "best at edge {}",
        best.0
    );
    best
}

#[test]
fn ormo_reaches_target_in_fewer_steps_than_asynchronous_baselines() {
    let (problem, cfg, target) = setup();
    let beta = 0.9;
    let (_, ormo, ormo_t) = best(
        |lr| Algorithm::OrderedMomentum {
            learning_rate: lr,
            momentum: beta,
        },
        &problem,
        &cfg,
        target,
    );
    let (_, asgd, _) = best(
        |lr| Algorithm::Asgd { learning_rate: lr },
        &problem,
        &cfg,
        target,
    );
    let (_, naive, _) = best(
        |lr| Algorithm::NaiveMomentum {
            learning_rate: lr,
            momentum: beta,
        },
        &problem,
        &cfg,
        target,
    );
    println!("steps to target: ormo {ormo}, asgd {asgd}, naive momentum {naive}");
    assert!(ormo < asgd, "ormo {ormo} vs asgd {asgd}");
    assert!(ormo < naive, "ormo {ormo} vs naive {naive}");
    // The workers really were asynchronous: K-1 updates land in between on
    // average (K tickets always out).
    assert!(ormo_t.mean_staleness() > 5.0);
}

#[test]
fn straggler_filter_lowers_staleness_of_applied_updates() {
    let (problem, mut cfg, target) = setup();
    cfg.stop_loss = f64::NEG_INFINITY;
    cfg.max_pushes = 6000;
    let lr = 0.3;
    let filtered = |threshold| {
        run_algorithm(
            Algorithm::Straggler {
                learning_rate: lr,
                sample_size: 16,
                rank_threshold: threshold,
                sample_policy: SamplePolicy::EvictLargest,
            },
            &problem,
            &cfg,
        )
        .unwrap()
    };
    let open = filtered(1.0);
    let strict = filtered(0.8);
    let asgd = run_algorithm(Algorithm::Asgd { learning_rate: lr }, &problem, &cfg).unwrap();
    // A threshold of 1 never drops: the filter is then exactly ASGD.
    assert_eq!(open.dropped, 0);
    assert_eq!(open, asgd);
    println!(
        "mean staleness: open {:.3}, filtered {:.3} (dropped {} of {})",
        open.mean_staleness(),
        strict.mean_staleness(),
        strict.dropped,
        strict.pushes
    );
    assert!(strict.dropped > 0);
    assert!(strict.mean_staleness() < open.mean_staleness());
    // Dropping stale work still converges, on fewer (fresher) steps but
    // more pushes: the dropped gradients were computed for nothing.
    let (open_steps, strict_steps) = (open.steps_to(target), strict.steps_to(target));
    let (open_pushes, strict_pushes) = (open.pushes_to(target), strict.pushes_to(target));
    println!("to target: open {open_steps:?} steps / {open_pushes:?} pushes, filtered {strict_steps:?} steps / {strict_pushes:?} pushes");
    assert!(strict_steps.is_some(), "{}", strict.final_loss());
}

#[test]
fn synchronous_baseline_steps_once_per_k_pushes() {
    let (problem, mut cfg, _) = setup();
    cfg.stop_loss = f64::NEG_INFINITY;
    cfg.max_pushes = 800;
    let t = run_algorithm(
        Algorithm::SyncMomentum {
            learning_rate: 0.5,
            momentum: 0.9,
        },
        &problem,
        &cfg,
    )
    .unwrap();
    assert_eq!(t.pushes, 800);
    assert_eq!(t.steps.len(), 100);
    assert!(t.applied_staleness.iter().all(|&s| s == 0));
    assert!(t.final_loss() < 0.1 * t.initial_loss);
}

/// The seed's rule in the simulation `ps_sim` ran before the sample policy
/// existed (8 workers at 1x-4x, threshold 0.8, ASGD's best rate): the same
/// counts to the push.
#[test]
fn evict_largest_reproduces_the_numbers_before_the_policy() {
    let (problem, mut cfg, target) = setup();
    cfg.stop_loss = f64::NEG_INFINITY;
    cfg.max_pushes = 20_000;
    let t = run_algorithm(
        Algorithm::Straggler {
            learning_rate: grid()[10],
            sample_size: 16,
            rank_threshold: 0.8,
            sample_policy: SamplePolicy::EvictLargest,
        },
        &problem,
        &cfg,
    )
    .unwrap();
    assert_eq!((t.pushes, t.dropped), (20_000, 14_840));
    assert_eq!(t.applied_staleness.len(), 5160);
    assert_eq!(t.steps_to(target), Some(982));
    assert_eq!(t.pushes_to(target), Some(3706));
    assert_eq!(t.time_to(target), Some(95_481));
    // Not only the slowest worker loses its work: once the sample holds
    // only s = 1, the fastest worker is the only one whose pushes have
    // nothing in between, and it trains alone.
    let shares: Vec<f64> = t.per_worker.iter().map(|w| w.dropped_share()).collect();
    assert_eq!(t.per_worker[0].dropped, 0);
    assert!(shares[1..].iter().all(|&s| s > 0.99), "{shares:?}");
}

/// One 4x straggler among `k` workers; the others spread from 1x to 1.5x.
/// Runs stop at the target.
fn straggler_setup(k: usize) -> (LeastSquares, SimConfig, f64) {
    let (problem, cfg, target) = setup();
    let cfg = SimConfig {
        workers: k,
        slowest: 1.5,
        straggler: Some(4.0),
        max_pushes: 20_000,
        ..cfg
    };
    (problem, cfg, target)
}

/// The rate on the grid that reaches the target soonest in virtual time.
fn fastest(
    make: impl Fn(f64) -> Algorithm,
    problem: &LeastSquares,
    cfg: &SimConfig,
    target: f64,
) -> Trace {
    grid()
        .into_iter()
        .map(|lr| run_algorithm(make(lr), problem, cfg).unwrap())
        .filter(|t| !t.diverged && t.time_to(target).is_some())
        .min_by_key(|t| t.time_to(target))
        .expect("some rate reaches the target")
}

/// The goal, in the simulation: one 4x straggler among 8 workers,
/// threshold 0.9. The sliding window drops at least 80% of the
/// straggler's pushes and at most 5% of the others', and reaches the
/// target no later than ASGD without a filter (each at its best rate).
#[test]
fn sliding_window_cuts_off_one_straggler_among_eight() {
    let (problem, cfg, target) = straggler_setup(8);
    let filtered = fastest(
        |lr| Algorithm::Straggler {
            learning_rate: lr,
            sample_size: 16,
            rank_threshold: 0.9,
            sample_policy: SamplePolicy::SlidingWindow,
        },
        &problem,
        &cfg,
        target,
    );
    let asgd = fastest(
        |lr| Algorithm::Asgd { learning_rate: lr },
        &problem,
        &cfg,
        target,
    );
    let slow = filtered.workers_total(7..8);
    let others = filtered.workers_total(0..7);
    println!(
        "straggler {}/{} dropped, others {}/{}; time to target {:?} vs ASGD {:?}",
        slow.dropped,
        slow.pushes,
        others.dropped,
        others.pushes,
        filtered.time_to(target),
        asgd.time_to(target)
    );
    assert!(slow.dropped_share() >= 0.8, "{slow:?}");
    assert!(others.dropped_share() <= 0.05, "{others:?}");
    assert!(filtered.time_to(target) <= asgd.time_to(target));
    // The straggler's pushes were the stale ones: what was applied is
    // fresher than under ASGD.
    assert!(filtered.mean_staleness() < asgd.mean_staleness());

    // The seed's rule on the same workers drops most of everyone's work.
    let literal = run_algorithm(
        Algorithm::Straggler {
            learning_rate: 0.2883,
            sample_size: 16,
            rank_threshold: 0.9,
            sample_policy: SamplePolicy::EvictLargest,
        },
        &problem,
        &cfg,
    )
    .unwrap();
    assert!(literal.workers_total(0..7).dropped_share() > 0.5);
}
