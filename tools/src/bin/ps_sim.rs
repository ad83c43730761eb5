//! Compare the parameter-server algorithms in the deterministic simulation.
//!
//! Each algorithm gets its best learning rate from the same geometric grid
//! (best = fewest server steps to the target loss), so no algorithm is judged
//! at a rate that only suits another.
//!
//! `cargo run --release --bin ps_sim -- --workers 8`

use clap::Parser;
use gradlane_tools::sim::{run_algorithm, Algorithm, LeastSquares, SimConfig, Trace};

#[derive(Parser, Debug)]
struct Args {
    /// Number of workers K.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Problem dimension.
    #[arg(long, default_value_t = 20)]
    dim: usize,
    /// Number of samples.
    #[arg(long, default_value_t = 400)]
    samples: usize,
    /// Condition number of the features.
    #[arg(long, default_value_t = 1000.0)]
    condition: f64,
    /// Minibatch size.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Momentum beta.
    #[arg(long, default_value_t = 0.9)]
    momentum: f64,
    /// Target: optimum + this fraction of the initial excess loss.
    #[arg(long, default_value_t = 0.001)]
    target: f64,
    /// Push budget.
    #[arg(long, default_value_t = 20_000)]
    max_pushes: u64,
    /// Straggler sample size.
    #[arg(long, default_value_t = 16)]
    sample: usize,
    /// Straggler rank threshold.
    #[arg(long, default_value_t = 0.8)]
    threshold: f64,
    /// Seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

fn main() {
    let a = Args::parse();
    let problem = LeastSquares::synthetic(a.seed, a.samples, a.dim, a.condition, 0.1)
        .expect("well-posed problem");
    let cfg = SimConfig {
        workers: a.workers,
        seed: a.seed ^ 0xA5A5,
        batch: a.batch,
        base_compute: 100,
        slowest: 4.0,
        jitter: 0.2,
        max_pushes: a.max_pushes,
        stop_loss: f64::NEG_INFINITY,
    };
    let f0 = problem.loss(&vec![0.0; a.dim]);
    let target = problem.optimum() + a.target * (f0 - problem.optimum());
    println!(
        "K={} dim={} n={} cond={} batch={} beta={} initial={:.4} optimum={:.5} target={:.5}",
        a.workers,
        a.dim,
        a.samples,
        a.condition,
        a.batch,
        a.momentum,
        f0,
        problem.optimum(),
        target
    );
    // Same grid as tests/ps_core.rs.
    let grid: Vec<f64> = (0..14).map(|i| 0.005 * 1.5f64.powi(i)).collect();
    let beta = a.momentum;
    type Make = Box<dyn Fn(f64) -> Algorithm>;
    let algs: Vec<(&str, Make)> = vec![
        (
            "ormo",
            Box::new(move |lr| Algorithm::OrderedMomentum {
                learning_rate: lr,
                momentum: beta,
            }),
        ),
        ("asgd", Box::new(|lr| Algorithm::Asgd { learning_rate: lr })),
        (
            "naive-momentum",
            Box::new(move |lr| Algorithm::NaiveMomentum {
                learning_rate: lr,
                momentum: beta,
            }),
        ),
        (
            "ssgd-momentum",
            Box::new(move |lr| Algorithm::SyncMomentum {
                learning_rate: lr,
                momentum: beta,
            }),
        ),
    ];
    let mut asgd_lr = 0.05;
    for (name, make) in &algs {
        let best = best_of(&grid, |lr| run_algorithm(make(lr), &problem, &cfg), target);
        match best {
            Some((lr, t)) => {
                if *name == "asgd" {
                    asgd_lr = lr;
                }
                let edge = if lr == grid[0] || lr == grid[grid.len() - 1] {
                    " (grid edge)"
                } else {
                    ""
                };
                println!(
                    "{name:>15}: best lr {lr:.4}{edge}  steps {:>6}  pushes {:>6}  time {:>8}  mean staleness {:.2}",
                    t.steps_to(target).unwrap_or(0),
                    t.pushes_to(target).unwrap_or(0),
                    t.time_to(target).unwrap_or(0),
                    t.mean_staleness()
                )
            }
            None => println!("{name:>15}: never reached the target"),
        }
    }
    // Staleness with and without the filter at ASGD's best rate; threshold 1
    // never drops, so it is plain ASGD.
    for threshold in [1.0, a.threshold] {
        let t = run_algorithm(
            Algorithm::Straggler {
                learning_rate: asgd_lr,
                sample_size: a.sample,
                rank_threshold: threshold,
                sample_policy: gradlane::ps::SamplePolicy::EvictLargest,
            },
            &problem,
            &cfg,
        )
        .expect("runs");
        println!(
            "straggler sample {} threshold {threshold:.2} lr {asgd_lr:.4}: pushes {} applied {} dropped {} \
             mean staleness {:.3}  to target: steps {:?} pushes {:?} time {:?}",
            a.sample,
            t.pushes,
            t.applied_staleness.len(),
            t.dropped,
            t.mean_staleness(),
            t.steps_to(target),
            t.pushes_to(target),
            t.time_to(target),
        );
    }
}

fn best_of(
    grid: &[f64],
    run: impl Fn(f64) -> Result<Trace, gradlane_tools::sim::SimError>,
    target: f64,
) -> Option<(f64, Trace)> {
    let mut best: Option<(f64, Trace, usize)> = None;
    for &lr in grid {
        let t = run(lr).expect("runs");
        if t.diverged {
            continue;
        }
        if let Some(s) = t.steps_to(target) {
            if best.as_ref().is_none_or(|b| s < b.2) {
                best = Some((lr, t, s));
            }
        }
    }
    best.map(|(lr, t, _)| (lr, t))
}
