//! Sampling-based straggler filter (CN108446770B; docs/DESIGN.md §5.2).
//!
//! Asynchronous SGD with a logical clock C that counts accepted updates. A
//! learner's ticket index is the clock it last saw (it takes the server clock
//! whenever it receives parameters, seed claim 5). On a push the staleness is
//! `s = C - c_learner + 1` (claim 4). The server keeps a fixed-size sample of
//! recent staleness values (claim 1a), ranks `s` in it, and drops the update
//! if the rank passes the threshold; either way it then removes the largest
//! value from the sample and inserts `s` (claim 1b), and the learner receives
//! fresh parameters (it "pulls new parameters" in step 4 whether or not its
//! update was taken).
//!
//! # Reading of the patent where it is silent
//! * **Initial sample.** The patent only says staleness samples are collected
//!   before judging (claim 3). Here the sample starts empty; until it holds
//!   `sample_size` values every update is accepted and its `s` appended. Only a
//!   full sample judges, and from then on its size never changes.
//! * **Rank and threshold.** Rank is the fraction of sample values strictly
//!   smaller than `s` (0 = no one was fresher, 1 = staler than all of them);
//!   the learner is slow iff `rank > rank_threshold`. Ties count as not
//!   slower, so a sample full of equal values never drops that value, and
//!   `rank_threshold = 1.0` never drops anything (plain ASGD).
//! * **Order.** docs/DESIGN.md §5.2 ranks `s` against the sample *before* replacing the
//!   largest value; claim 1b lists the replacement first. Ranking first keeps
//!   `s` from being compared with itself.
//! * **Update rule.** Claim 7's formula is lost in the text; docs/DESIGN.md's
//!   `w -= lambda * g` is used.
//! * **Ticket tracking.** The patent keeps the clock on the learner; the server
//!   only refuses a clock it has not reached, so it cannot tell a replayed
//!   push from a new one (the runtime owns learner identity).
//!
//! # Consequence of "remove the largest"
//! Because every judgement evicts the sample's maximum, large values never
//! stay long and the sample drifts to the smallest staleness seen (s = 1,
//! fresh). From then on any `s > 1` ranks at least `(n-1)/n` and is dropped
//! for every threshold below that: the filter becomes "accept (almost) only
//! updates with nothing in between". In the 8-worker simulation that drops about three quarters of
//! the pushes. This is the patent as written; a sliding window (evict the
//! oldest) would behave differently and is not what the patent says.

use std::collections::BTreeMap;

use super::{
    check_gradient, check_initial, check_rate, ConfigError, Disposition, ParameterServer,
    PullError, PushError, PushOutcome, Ticket,
};

/// Hyper-parameters of [`StragglerFilter`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StragglerConfig {
    /// Learning rate lambda.
    pub learning_rate: f64,
    /// Number of staleness values kept in the sample.
    pub sample_size: usize,
    /// Drop an update when the fraction of sample values below its staleness
    /// exceeds this, in `[0, 1]`.
    pub rank_threshold: f64,
}

/// Counters of what the filter did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StragglerStats {
    /// Updates applied.
    pub accepted: u64,
    /// Updates dropped as too stale.
    pub dropped: u64,
    /// Sum over applied updates of `C - c_learner` (the patent's `s` minus 1,
    /// i.e. how many updates landed in between).
    pub applied_staleness_sum: u64,
    /// Largest `C - c_learner` among applied updates.
    pub applied_staleness_max: u64,
}

impl StragglerStats {
    /// Mean `C - c_learner` of applied updates; 0 when none was applied.
    pub fn mean_applied_staleness(&self) -> f64 {
        if self.accepted == 0 {
            0.0
        } else {
            self.applied_staleness_sum as f64 / self.accepted as f64
        }
    }
}

/// The filter's state: parameters, clock C, staleness sample, counters.
#[derive(Debug, Clone)]
pub struct StragglerFilter {
    cfg: StragglerConfig,
    w: Vec<f32>,
    clock: u64,
    /// Multiset of sampled `s` values: ordered so "largest" and "rank" are cheap.
    sample: BTreeMap<u64, usize>,
    sample_len: usize,
    stats: StragglerStats,
}

impl StragglerFilter {
    /// A filter starting from `w0` with C = 0 and an empty sample.
    pub fn new(cfg: StragglerConfig, w0: Vec<f32>) -> Result<Self, ConfigError> {
        check_initial(&w0)?;
        check_rate(cfg.learning_rate)?;
        if cfg.sample_size == 0 {
            return Err(ConfigError::EmptySample);
        }
        if !(0.0..=1.0).contains(&cfg.rank_threshold) {
            return Err(ConfigError::Threshold(cfg.rank_threshold));
        }
        Ok(Self {
            cfg,
            w: w0,
            clock: 0,
            sample: BTreeMap::new(),
            sample_len: 0,
            stats: StragglerStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &StragglerConfig {
        &self.cfg
    }

    /// Logical clock C.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Counters.
    pub fn stats(&self) -> StragglerStats {
        self.stats
    }

    /// The staleness sample in ascending order (seed `s` values).
    pub fn sample(&self) -> Vec<u64> {
        self.sample
            .iter()
            .flat_map(|(&s, &n)| std::iter::repeat_n(s, n))
            .collect()
    }

    /// Fraction of sample values strictly below `s`.
    fn rank(&self, s: u64) -> f64 {
        let below: usize = self.sample.range(..s).map(|(_, &n)| n).sum();
        below as f64 / self.sample_len as f64
    }

    fn insert(&mut self, s: u64) {
        *self.sample.entry(s).or_insert(0) += 1;
        self.sample_len += 1;
    }

    fn remove_largest(&mut self) {
        if let Some(mut e) = self.sample.last_entry() {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
            self.sample_len -= 1;
        }
    }

    /// Judge `s` and update the sample; true if the update is to be dropped.
    fn judge(&mut self, s: u64) -> bool {
        if self.sample_len < self.cfg.sample_size {
            self.insert(s);
            return false;
        }
        let slow = self.rank(s) > self.cfg.rank_threshold;
        self.remove_largest();
        self.insert(s);
        slow
    }
}

impl ParameterServer for StragglerFilter {
    fn params(&self) -> &[f32] {
        &self.w
    }

    fn steps(&self) -> u64 {
        self.clock
    }

    /// Parameters with the current clock; any number of learners may hold one.
    fn pull(&mut self) -> Result<Option<Ticket<'_>>, PullError> {
        Ok(Some(Ticket {
            index: self.clock,
            params: &self.w,
        }))
    }

    fn push(&mut self, grad: &[f32], index: u64) -> Result<PushOutcome<'_>, PushError> {
        check_gradient(grad, self.w.len())?;
        if index > self.clock {
            return Err(PushError::UnknownIndex(index));
        }
        let behind = self.clock - index;
        let s = behind + 1;
        let disposition = if self.judge(s) {
            self.stats.dropped += 1;
            Disposition::Dropped { staleness: behind }
        } else {
            let lr = self.cfg.learning_rate as f32;
            for (w, g) in self.w.iter_mut().zip(grad) {
                *w -= lr * g;
            }
            self.clock += 1;
            self.stats.accepted += 1;
            self.stats.applied_staleness_sum += behind;
            self.stats.applied_staleness_max = self.stats.applied_staleness_max.max(behind);
            Disposition::Applied { staleness: behind }
        };
        Ok(PushOutcome {
            disposition,
            reply: Some(Ticket {
                index: self.clock,
                params: &self.w,
            }),
        })
    }
}
