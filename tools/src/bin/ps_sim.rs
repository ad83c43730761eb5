//! Compare the parameter-server algorithms in the deterministic simulation.
//!
//! Each algorithm gets its best learning rate from the same geometric grid,
//! so no algorithm is judged at a rate that only suits another. The first
//! table ranks rates by server steps to the target loss; the straggler
//! table ranks them by virtual time to the target, the time a user waits.
//!
//! ```text
//! cargo run --release --bin ps_sim -- --workers 8
//! cargo run --release --bin ps_sim -- --workers 8 --slowest 1.5 --straggler 4
//! ```

use clap::Parser;
use gradlane_tools::cli::{Policy, Spread};
use gradlane_tools::sim::{run_algorithm, Algorithm, LeastSquares, SimConfig, Trace};

/// Simulate the parameter-server algorithms on ill-conditioned least squares.
#[derive(Parser, Debug)]
#[command(name = "ps_sim")]
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
    #[command(flatten)]
    spread: Spread,
    /// Relative jitter on every compute time, in [0, 1).
    #[arg(long, default_value_t = 0.2)]
    jitter: f64,
    /// Straggler filter: sample size.
    #[arg(long, default_value_t = 16)]
    sample: usize,
    /// Straggler filter: rank thresholds to compare (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "0.8,0.9,0.95")]
    thresholds: Vec<f64>,
    /// Straggler filter: sample policies to compare (comma separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "sliding-window,evict-largest"
    )]
    policies: Vec<Policy>,
    /// Seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ps_sim: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    if a.workers == 0 {
        return Err("--workers must be at least 1".into());
    }
    if let Some(t) = a.thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
        return Err(format!("--thresholds: {t} is not in [0, 1]").into());
    }
    let problem = LeastSquares::synthetic(a.seed, a.samples, a.dim, a.condition, 0.1)
        .ok_or("no well-posed problem for these sizes")?;
    let cfg = SimConfig {
        workers: a.workers,
        seed: a.seed ^ 0xA5A5,
        batch: a.batch,
        base_compute: 100,
        slowest: a.spread.slowest,
        straggler: a.spread.straggler,
        jitter: a.jitter,
        max_pushes: a.max_pushes,
        stop_loss: f64::NEG_INFINITY,
    };
    let speeds = a.spread.speeds(a.workers);
    let f0 = problem.loss(&vec![0.0; a.dim]);
    let target = problem.optimum() + a.target * (f0 - problem.optimum());
    println!(
        "K={} speeds {:?} jitter {} dim={} n={} cond={} batch={} beta={} initial={:.4} optimum={:.5} target={:.5}",
        a.workers,
        speeds
            .iter()
            .map(|s| format!("{s:.3}"))
            .collect::<Vec<_>>(),
        a.jitter,
        a.dim,
        a.samples,
        a.condition,
        a.batch,
        a.momentum,
        f0,
        problem.optimum(),
        target
    );
    // Same grid as gradlane-core/tests/behaviour/ps_core.rs.
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
    for (name, make) in &algs {
        let best = best_of(
            &grid,
            |lr| run_algorithm(make(lr), &problem, &cfg),
            |t| t.steps_to(target).map(|s| s as u64),
        )?;
        match best {
            Some((lr, t)) => {
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

    // The straggler filter against its references, each at the rate that
    // reaches the target soonest in virtual time, each run stopping at the
    // target so the drop counts are those of the way there.
    let to_target = SimConfig {
        stop_loss: target,
        ..cfg
    };
    let k = a.workers;
    println!();
    println!(
        "Straggler filter, sample {}; \"slowest\" is worker {} at {:.2}x; rates ranked by time to the target.",
        a.sample,
        k - 1,
        speeds[k - 1]
    );
    println!();
    println!("| method | lr | time to target | steps | pushes | mean staleness | slowest worker's pushes dropped | others' pushes dropped |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows: Vec<(String, Make)> = vec![
        (
            "ASGD, no filter".into(),
            Box::new(|lr| Algorithm::Asgd { learning_rate: lr }),
        ),
        (
            "OrMo, no filter".into(),
            Box::new(move |lr| Algorithm::OrderedMomentum {
                learning_rate: lr,
                momentum: beta,
            }),
        ),
    ];
    for &policy in &a.policies {
        for &threshold in &a.thresholds {
            let sample = a.sample;
            rows.push((
                format!("ASGD + filter, {}, threshold {threshold}", policy.words()),
                Box::new(move |lr| Algorithm::Straggler {
                    learning_rate: lr,
                    sample_size: sample,
                    rank_threshold: threshold,
                    sample_policy: policy.into(),
                }),
            ));
        }
    }
    for (name, make) in &rows {
        let best = best_of(
            &grid,
            |lr| run_algorithm(make(lr), &problem, &to_target),
            |t| t.time_to(target),
        )?;
        let Some((lr, t)) = best else {
            println!("| {name} | - | never | - | - | - | - | - |");
            continue;
        };
        let slow = t.workers_total(k - 1..k);
        let others = t.workers_total(0..k - 1);
        println!(
            "| {name} | {lr:.4} | {} | {} | {} | {:.2} | {:.1}% ({} of {}) | {:.1}% ({} of {}) |",
            t.time_to(target).unwrap_or(0),
            t.steps_to(target).unwrap_or(0),
            t.pushes_to(target).unwrap_or(0),
            t.mean_staleness(),
            100.0 * slow.dropped_share(),
            slow.dropped,
            slow.pushes,
            100.0 * others.dropped_share(),
            others.dropped,
            others.pushes,
        );
    }
    Ok(())
}

/// The rate on `grid` whose run scores lowest (`None`: never reached
/// the target), skipping runs that diverged.
fn best_of(
    grid: &[f64],
    run: impl Fn(f64) -> Result<Trace, gradlane_tools::sim::SimError>,
    score: impl Fn(&Trace) -> Option<u64>,
) -> Result<Option<(f64, Trace)>, gradlane_tools::sim::SimError> {
    let mut best: Option<(f64, Trace, u64)> = None;
    for &lr in grid {
        let t = run(lr)?;
        if t.diverged {
            continue;
        }
        if let Some(s) = score(&t) {
            if best.as_ref().is_none_or(|b| s < b.2) {
                best = Some((lr, t, s));
            }
        }
    }
    Ok(best.map(|(lr, t, _)| (lr, t)))
}
