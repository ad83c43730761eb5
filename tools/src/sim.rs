//! Deterministic event-driven simulation of a parameter server and K workers.
//!
//! No real time and no threads: a virtual clock in integer ticks and a heap of
//! "worker k finishes its gradient at time T" events. A worker pulls, computes
//! a minibatch gradient *on the parameters it pulled* (right away, so the
//! gradient is exactly as stale as the parameters), and pushes it when its
//! compute time has elapsed. Worker k takes `base * speed_k` ticks, with speeds
//! spread evenly from 1x to `slowest`x (or, with a straggler, the last worker
//! at its own factor and the others spread), times a seeded jitter. Everything
//! random comes from one [`SplitMix64`] stream consumed in event order, so a
//! run is a pure function of its inputs.
//!
//! The problem is [`LeastSquares`] on seeded synthetic data with column scales
//! spread over a chosen condition number, so momentum has something to win.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use thiserror::Error;

use gradlane::ps::baselines::{Asgd, NaiveMomentumAsgd, SyncMomentum};
use gradlane::ps::{
    ConfigError, Disposition, OrderedMomentum, OrderedMomentumConfig, ParameterServer, PullError,
    PushError, SamplePolicy, StragglerConfig, StragglerFilter,
};

use gradlane_core::rng::SplitMix64;

mod least_squares;
pub use least_squares::LeastSquares;

/// How the workers behave and when the run stops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Number of workers K.
    pub workers: usize,
    /// Seed for batches and jitter.
    pub seed: u64,
    /// Minibatch size.
    pub batch: usize,
    /// Compute time of the fastest worker, in ticks.
    pub base_compute: u64,
    /// Slowest worker's compute time relative to the fastest (e.g. 4.0);
    /// the workers' speeds are spread evenly from 1 to this.
    pub slowest: f64,
    /// A straggler: the last worker computes this many times slower than
    /// the fastest, and the spread from 1 to `slowest` covers the others.
    pub straggler: Option<f64>,
    /// Relative jitter on every compute time, in `[0, 1)`.
    pub jitter: f64,
    /// Stop after this many pushes.
    pub max_pushes: u64,
    /// Stop early once the loss is at or below this (`f64::NEG_INFINITY`: never).
    pub stop_loss: f64,
}

/// One change of the parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// Virtual time of the push that caused it.
    pub time: u64,
    /// Pushes received so far, this one included.
    pub pushes: u64,
    /// Full-data loss after the step.
    pub loss: f64,
}

/// What one worker's pushes came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerTrace {
    /// Pushes this worker made.
    pub pushes: u64,
    /// Of them, dropped by the server.
    pub dropped: u64,
    /// Of them, applied.
    pub applied: u64,
    /// Sum of the staleness of its applied pushes.
    pub applied_staleness_sum: u64,
}

impl WorkerTrace {
    /// Share of this worker's pushes the server dropped (0 when it made none).
    pub fn dropped_share(&self) -> f64 {
        if self.pushes == 0 {
            0.0
        } else {
            self.dropped as f64 / self.pushes as f64
        }
    }
}

/// What a run recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// Loss before any update.
    pub initial_loss: f64,
    /// One entry per server step (parameter change), in order.
    pub steps: Vec<Step>,
    /// Staleness of every applied gradient, in application order (for
    /// synchronous SGD, one 0 per step).
    pub applied_staleness: Vec<u64>,
    /// Pushes received.
    pub pushes: u64,
    /// Pushes the server dropped.
    pub dropped: u64,
    /// Per worker (index = worker number, the straggler last).
    pub per_worker: Vec<WorkerTrace>,
    /// The loss blew up (non-finite or 1e6 times the initial loss).
    pub diverged: bool,
}

impl Trace {
    /// Server steps until the loss first reached `target` (1-based), if ever.
    pub fn steps_to(&self, target: f64) -> Option<usize> {
        self.steps
            .iter()
            .position(|s| s.loss <= target)
            .map(|i| i + 1)
    }

    /// Pushes (gradients computed) until the loss first reached `target`.
    pub fn pushes_to(&self, target: f64) -> Option<u64> {
        self.steps
            .iter()
            .find(|s| s.loss <= target)
            .map(|s| s.pushes)
    }

    /// Virtual time until the loss first reached `target`.
    pub fn time_to(&self, target: f64) -> Option<u64> {
        self.steps.iter().find(|s| s.loss <= target).map(|s| s.time)
    }

    /// Mean staleness of applied gradients; 0 when none.
    pub fn mean_staleness(&self) -> f64 {
        if self.applied_staleness.is_empty() {
            0.0
        } else {
            self.applied_staleness.iter().sum::<u64>() as f64 / self.applied_staleness.len() as f64
        }
    }

    /// The workers' counts summed over `workers` (e.g. all but the
    /// straggler: `0..k-1`).
    pub fn workers_total(&self, workers: std::ops::Range<usize>) -> WorkerTrace {
        let mut t = WorkerTrace::default();
        for w in self.per_worker.get(workers).unwrap_or(&[]) {
            t.pushes += w.pushes;
            t.dropped += w.dropped;
            t.applied += w.applied;
            t.applied_staleness_sum += w.applied_staleness_sum;
        }
        t
    }

    /// Loss after the last step (initial loss if none).
    pub fn final_loss(&self) -> f64 {
        self.steps.last().map_or(self.initial_loss, |s| s.loss)
    }
}

/// Why a simulation could not run.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SimError {
    /// The server refused to build.
    #[error("config: {0}")]
    Config(#[from] ConfigError),
    /// The server refused a pull.
    #[error("pull: {0}")]
    Pull(#[from] PullError),
    /// The server refused a push (other than a non-finite gradient, which is
    /// recorded as divergence).
    #[error("push: {0}")]
    Push(#[from] PushError),
    /// Workers or batch size zero, jitter outside `[0, 1)`, or a speed
    /// factor below 1 or not finite.
    #[error("bad simulation config")]
    BadConfig,
}

/// Which server to simulate, with its hyper-parameters. K comes from
/// [`SimConfig::workers`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Algorithm {
    /// [`OrderedMomentum`].
    OrderedMomentum {
        /// eta.
        learning_rate: f64,
        /// beta.
        momentum: f64,
    },
    /// [`Asgd`].
    Asgd {
        /// eta.
        learning_rate: f64,
    },
    /// [`NaiveMomentumAsgd`].
    NaiveMomentum {
        /// eta.
        learning_rate: f64,
        /// beta.
        momentum: f64,
    },
    /// [`SyncMomentum`].
    SyncMomentum {
        /// eta.
        learning_rate: f64,
        /// beta.
        momentum: f64,
    },
    /// [`StragglerFilter`].
    Straggler {
        /// lambda.
        learning_rate: f64,
        /// Sample size.
        sample_size: usize,
        /// Rank threshold.
        rank_threshold: f64,
        /// Which value leaves the full sample.
        sample_policy: SamplePolicy,
    },
}

/// Build the server for `alg` from zero parameters and run it.
pub fn run_algorithm(
    alg: Algorithm,
    problem: &LeastSquares,
    cfg: &SimConfig,
) -> Result<Trace, SimError> {
    let w0 = vec![0.0f32; problem.dim()];
    match alg {
        Algorithm::OrderedMomentum {
            learning_rate,
            momentum,
        } => {
            let c = OrderedMomentumConfig {
                workers: cfg.workers,
                momentum,
                learning_rate,
            };
            run(&mut OrderedMomentum::new(c, w0)?, problem, cfg)
        }
        Algorithm::Asgd { learning_rate } => run(&mut Asgd::new(learning_rate, w0)?, problem, cfg),
        Algorithm::NaiveMomentum {
            learning_rate,
            momentum,
        } => run(
            &mut NaiveMomentumAsgd::new(learning_rate, momentum, w0)?,
            problem,
            cfg,
        ),
        Algorithm::SyncMomentum {
            learning_rate,
            momentum,
        } => run(
            &mut SyncMomentum::new(cfg.workers, learning_rate, momentum, w0)?,
            problem,
            cfg,
        ),
        Algorithm::Straggler {
            learning_rate,
            sample_size,
            rank_threshold,
            sample_policy,
        } => {
            let c = StragglerConfig {
                learning_rate,
                sample_size,
                rank_threshold,
                sample_policy,
            };
            run(&mut StragglerFilter::new(c, w0)?, problem, cfg)
        }
    }
}

/// A worker's gradient in flight.
struct Job {
    index: u64,
    grad: Vec<f32>,
}

/// Drive `server` with `cfg.workers` simulated workers on `problem`.
pub fn run<S: ParameterServer + ?Sized>(
    server: &mut S,
    problem: &LeastSquares,
    cfg: &SimConfig,
) -> Result<Trace, SimError> {
    let factor_ok = |f: f64| f.is_finite() && f >= 1.0;
    if cfg.workers == 0
        || cfg.batch == 0
        || !(0.0..1.0).contains(&cfg.jitter)
        || !factor_ok(cfg.slowest)
        || !cfg.straggler.is_none_or(factor_ok)
    {
        return Err(SimError::BadConfig);
    }
    let mut rng = SplitMix64::new(cfg.seed);
    let k = cfg.workers;
    let speeds = speeds(k, cfg.slowest, cfg.straggler);
    let mut trace = Trace {
        initial_loss: problem.loss(server.params()),
        per_worker: vec![WorkerTrace::default(); k],
        ..Trace::default()
    };
    let blowup = 1e6 * trace.initial_loss.max(1e-12);

    // Start a job for `worker` at `now` on the ticket's parameters.
    let mut jobs: Vec<Option<Job>> = (0..k).map(|_| None).collect();
    let mut heap: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut batch = vec![0usize; cfg.batch];
    let mut start = |worker: usize,
                     index: u64,
                     params: &[f32],
                     now: u64,
                     rng: &mut SplitMix64,
                     jobs: &mut Vec<Option<Job>>,
                     heap: &mut BinaryHeap<Reverse<(u64, u64, usize)>>| {
        for b in batch.iter_mut() {
            *b = rng.below(problem.samples());
        }
        let mut grad = Vec::with_capacity(problem.dim());
        problem.gradient(params, &batch, &mut grad);
        let factor = speeds[worker] * (1.0 + cfg.jitter * (2.0 * rng.next_f64() - 1.0));
        let dt = ((cfg.base_compute as f64 * factor).round() as u64).max(1);
        jobs[worker] = Some(Job { index, grad });
        heap.push(Reverse((now + dt, seq, worker)));
        seq += 1;
    };

    // Everyone pulls at time 0; with a synchronous server everyone fits.
    let mut idle: Vec<usize> = Vec::new();
    for worker in 0..k {
        match server.pull()? {
            Some(t) => start(worker, t.index, t.params, 0, &mut rng, &mut jobs, &mut heap),
            None => idle.push(worker),
        }
    }

    while let Some(Reverse((now, _, worker))) = heap.pop() {
        if trace.pushes >= cfg.max_pushes {
            break;
        }
        let Some(job) = jobs[worker].take() else {
            continue;
        };
        let outcome = match server.push(&job.grad, job.index) {
            Ok(o) => o,
            Err(PushError::NonFinite { .. }) => {
                trace.diverged = true;
                break;
            }
            Err(e) => return Err(e.into()),
        };
        trace.pushes += 1;
        let mine = &mut trace.per_worker[worker];
        mine.pushes += 1;
        let changed = match outcome.disposition {
            Disposition::Applied { staleness } => {
                trace.applied_staleness.push(staleness);
                mine.applied += 1;
                mine.applied_staleness_sum += staleness;
                true
            }
            Disposition::Dropped { .. } => {
                trace.dropped += 1;
                mine.dropped += 1;
                false
            }
            Disposition::Buffered => false,
        };
        match outcome.reply {
            Some(t) => start(
                worker, t.index, t.params, now, &mut rng, &mut jobs, &mut heap,
            ),
            None => idle.push(worker),
        }
        // A completed synchronous round frees tickets for the waiting workers.
        if changed && !idle.is_empty() {
            let waiting = std::mem::take(&mut idle);
            for w in waiting {
                match server.pull()? {
                    Some(t) => start(w, t.index, t.params, now, &mut rng, &mut jobs, &mut heap),
                    None => idle.push(w),
                }
            }
        }
        if changed {
            let loss = problem.loss(server.params());
            trace.steps.push(Step {
                time: now,
                pushes: trace.pushes,
                loss,
            });
            if !loss.is_finite() || loss > blowup {
                trace.diverged = true;
                break;
            }
            if loss <= cfg.stop_loss {
                break;
            }
        }
    }
    Ok(trace)
}

/// Compute-time factors of `k` workers: evenly from 1 to `slowest`, or
/// with a straggler, the last one at `straggler` and the others spread.
pub fn speeds(k: usize, slowest: f64, straggler: Option<f64>) -> Vec<f64> {
    let spread = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|i| {
                if n > 1 {
                    1.0 + (slowest - 1.0) * i as f64 / (n - 1) as f64
                } else {
                    1.0
                }
            })
            .collect()
    };
    match straggler {
        Some(s) if k > 0 => {
            let mut v = spread(k - 1);
            v.push(s);
            v
        }
        _ => spread(k),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_spread_and_straggle() {
        assert_eq!(speeds(3, 2.0, None), vec![1.0, 1.5, 2.0]);
        assert_eq!(speeds(4, 1.5, Some(4.0)), vec![1.0, 1.25, 1.5, 4.0]);
        assert_eq!(speeds(1, 4.0, Some(4.0)), vec![4.0]);
        assert_eq!(speeds(1, 4.0, None), vec![1.0]);
    }

    #[test]
    fn splitmix_is_deterministic() {
        let a: Vec<u64> = {
            let mut r = SplitMix64::new(9);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let mut r = SplitMix64::new(9);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert_ne!(a[0], a[1]);
    }
}
