//! The training settings each algorithm's server is built with: the
//! momentum methods' learning rate, the straggler filter's choice, and the
//! check that finds settings a server would refuse before anything starts.
//! Shared by the server role and by the comparison's checks.

use gradlane::ps::baselines::{Asgd, SyncMomentum};
use gradlane::ps::{OrderedMomentum, OrderedMomentumConfig, StragglerConfig, StragglerFilter};
use gradlane_tools::cli::Policy;

use crate::args::{Algo, Training};
use crate::error::TrainError;

pub(crate) fn momentum_lr(t: &Training) -> f64 {
    t.lr * t.workers as f64 * (1.0 - t.momentum)
}

/// The straggler filter's settings for one server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FilterChoice {
    pub(crate) sample: usize,
    pub(crate) threshold: f64,
    pub(crate) policy: Policy,
}

impl FilterChoice {
    pub(crate) fn config(&self, learning_rate: f64) -> StragglerConfig {
        StragglerConfig {
            learning_rate,
            sample_size: self.sample,
            rank_threshold: self.threshold,
            sample_policy: self.policy.into(),
        }
    }
}

/// Builds `algo`'s server the way `serve` does, on one parameter, to find
/// settings it would refuse before any process starts.
pub(crate) fn check_settings(
    algo: Algo,
    t: &Training,
    filter: FilterChoice,
) -> Result<(), TrainError> {
    let what = |s: &str| format!("{} {s}", algo.name());
    let w0 = vec![0.0f32];
    let checked = match algo {
        Algo::Ormo => OrderedMomentum::new(
            OrderedMomentumConfig {
                workers: t.workers,
                momentum: t.momentum,
                learning_rate: momentum_lr(t),
            },
            w0,
        )
        .map(drop),
        Algo::Asgd => Asgd::new(t.lr, w0).map(drop),
        Algo::Ssgd => SyncMomentum::new(t.workers, momentum_lr(t), t.momentum, w0).map(drop),
        Algo::Filter => StragglerFilter::new(filter.config(t.lr), w0).map(drop),
    };
    checked.map_err(|source| TrainError::Config {
        what: what("settings (--lr, --momentum, --workers, --sample, --thresholds)"),
        source,
    })?;
    if t.batch == 0 {
        return Err(TrainError::Invalid("--batch must be at least 1".into()));
    }
    Ok(())
}
