//! Which chunks travel reliably and which travel lossy, in which level
//! (CN110958187B, steps S31–S34; docs/DESIGN.md §2.4).
//!
//! Chunks are ranked by contribution, descending (ties by chunk id so the
//! result is deterministic). The bottom `loss_tolerance` share travels
//! lossy: the top `ceil((1 - loss_tolerance) * N)` are important; the rest
//! are split into `levels` equal rank bands, level 1 holding the highest
//! lossy contributions. Ranking is per tensor by default so that every
//! tensor keeps its most important part exact; a global ranking is an
//! option.

use crate::layout::ChunkPlan;
use crate::rng::SplitMix64;
use thiserror::Error;

/// The class of a chunk: `0` is important, `1..=7` are lossy levels.
pub type Class = u8;

/// The important class.
pub const IMPORTANT: Class = 0;

/// The most lossy levels a configuration may ask for.
pub const MAX_LEVELS: u8 = 7;

/// Where chunks are ranked against each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ranking {
    /// Within each tensor (the default).
    #[default]
    PerTensor,
    /// Across the whole round.
    Global,
}

/// Adaptive ratio: the important share `r = 1 - loss_tolerance` follows
/// the training loss the caller reports, `r_t = max(r_0 * L_t / L_0,
/// ratio_min)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveRatio {
    /// The floor of the important share.
    pub ratio_min: f64,
}

/// Classification settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassifyConfig {
    /// Share of each ranked group's chunks (a tensor's, or the round's with
    /// [`Ranking::Global`]), the least important, that travel lossy, in
    /// `[0, 1]` (default 0.2). 0 sends everything exactly.
    pub loss_tolerance: f64,
    /// Number of lossy levels, `1..=7` (default 3).
    pub levels: u8,
    /// Per tensor or global ranking.
    pub ranking: Ranking,
    /// Adapt the ratio to the reported loss.
    pub adaptive: Option<AdaptiveRatio>,
    /// Send the first round entirely reliably (the authors' warm-up).
    pub first_round_all_important: bool,
    /// Rank at random with this seed instead of by contribution (ablation).
    pub random_ranking: Option<u64>,
}

impl Default for ClassifyConfig {
    fn default() -> Self {
        Self {
            loss_tolerance: 0.2,
            levels: 3,
            ranking: Ranking::PerTensor,
            adaptive: None,
            first_round_all_important: false,
            random_ranking: None,
        }
    }
}

/// Why a classification setting was refused.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ClassifyError {
    /// The loss tolerance is outside `[0, 1]`.
    #[error("loss_tolerance {0} is not in [0, 1]")]
    LossTolerance(f64),
    /// The level count is outside `1..=7`.
    #[error("levels {0} is not in 1..=7")]
    Levels(u8),
    /// The adaptive floor is outside `[0, 1]`.
    #[error("adaptive ratio_min {0} is not in [0, 1]")]
    RatioMin(f64),
    /// A reported loss is not a positive finite number.
    #[error("loss {0} is not a positive finite number")]
    Loss(f64),
    /// The contributions do not match the plan.
    #[error("{got} contributions for a plan of {expected} chunks")]
    Contributions {
        /// Chunks in the plan.
        expected: usize,
        /// Contributions passed.
        got: usize,
    },
}

impl ClassifyConfig {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), ClassifyError> {
        if !(0.0..=1.0).contains(&self.loss_tolerance) {
            return Err(ClassifyError::LossTolerance(self.loss_tolerance));
        }
        if !(1..=MAX_LEVELS).contains(&self.levels) {
            return Err(ClassifyError::Levels(self.levels));
        }
        if let Some(a) = self.adaptive {
            if !(0.0..=1.0).contains(&a.ratio_min) {
                return Err(ClassifyError::RatioMin(a.ratio_min));
            }
        }
        Ok(())
    }
}

/// How many of `n` chunks stay exact at `loss_tolerance`:
/// `ceil((1 - loss_tolerance) * n)`.
///
/// Computed so that float noise cannot add a chunk: at 0.2, 10 chunks keep
/// 8 exact, not 9.
pub fn important_count(loss_tolerance: f64, n: usize) -> usize {
    let x = (1.0 - loss_tolerance) * n as f64;
    let r = x.round();
    let k = if (x - r).abs() < 1e-9 { r } else { x.ceil() };
    (k.max(0.0) as usize).min(n)
}

/// The lossy level of the chunk at position `pos` among `m` lossy chunks split
/// into `levels` equal bands: band `i` holds positions
/// `[i*m/levels, (i+1)*m/levels)`.
pub fn level_of(pos: usize, m: usize, levels: u8) -> Class {
    // The largest i with i*m/levels <= pos.
    let l = levels as usize;
    let mut i = (pos * l) / m.max(1);
    while i + 1 < l && (i + 1) * m / l <= pos {
        i += 1;
    }
    while i > 0 && i * m / l > pos {
        i -= 1;
    }
    (i + 1) as Class
}

/// Classifies chunks round after round; holds the adaptive-ratio and
/// random-ranking state.
#[derive(Debug, Clone)]
pub struct Classifier {
    config: ClassifyConfig,
    first_loss: Option<f64>,
    /// The loss tolerance the next round uses: the configured one, moved
    /// by the reported loss with an adaptive ratio.
    loss_tolerance: f64,
    rng: SplitMix64,
    rounds: u64,
    order: Vec<u32>,
    keys: Vec<u64>,
}

impl Classifier {
    /// A classifier with validated settings.
    pub fn new(config: ClassifyConfig) -> Result<Self, ClassifyError> {
        config.validate()?;
        Ok(Self {
            loss_tolerance: config.loss_tolerance,
            rng: SplitMix64::new(config.random_ranking.unwrap_or(0)),
            config,
            first_loss: None,
            rounds: 0,
            order: Vec::new(),
            keys: Vec::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &ClassifyConfig {
        &self.config
    }

    /// The loss tolerance the next round will use (the configured one
    /// unless an adaptive ratio moved it).
    pub fn loss_tolerance(&self) -> f64 {
        self.loss_tolerance
    }

    /// Reports the training loss; with adaptive ratio on, sets the
    /// important share `r = max(r_0 * L / L_0, ratio_min)`, `r_0` being
    /// `1 - loss_tolerance` and `L_0` the first loss reported. The share is
    /// capped at 1.
    pub fn report_loss(&mut self, loss: f64) -> Result<(), ClassifyError> {
        if !(loss.is_finite() && loss > 0.0) {
            return Err(ClassifyError::Loss(loss));
        }
        let Some(a) = self.config.adaptive else {
            return Ok(());
        };
        let l0 = *self.first_loss.get_or_insert(loss);
        // The ratio is the important share, the tolerance's complement.
        let first = 1.0 - self.config.loss_tolerance;
        let important = (first * loss / l0).max(a.ratio_min).min(1.0);
        self.loss_tolerance = 1.0 - important;
        Ok(())
    }

    /// Assigns a class to every chunk of the plan from its contribution.
    /// `out[j]` is chunk `j`'s class.
    pub fn classify(
        &mut self,
        plan: &ChunkPlan,
        contributions: &[f32],
        out: &mut Vec<Class>,
    ) -> Result<(), ClassifyError> {
        if contributions.len() != plan.len() {
            return Err(ClassifyError::Contributions {
                expected: plan.len(),
                got: contributions.len(),
            });
        }
        out.clear();
        out.resize(plan.len(), IMPORTANT);
        let first = self.rounds == 0;
        self.rounds += 1;
        if first && self.config.first_round_all_important {
            return Ok(());
        }
        match self.config.ranking {
            Ranking::PerTensor => {
                for t in 0..plan.tensor_count() {
                    self.classify_range(plan.tensor_chunks(t), contributions, out);
                }
            }
            Ranking::Global => self.classify_range(0..plan.len(), contributions, out),
        }
        Ok(())
    }

    fn classify_range(
        &mut self,
        range: std::ops::Range<usize>,
        contributions: &[f32],
        out: &mut [Class],
    ) {
        let n = range.len();
        let k = important_count(self.loss_tolerance, n);
        if k == n {
            return; // already all important
        }
        // Sort keys: contributions are non-negative, so their bit patterns
        // order like the values; invert for descending and put the id in the
        // low half for a deterministic tie order. One u64 sort is several
        // times faster than a comparator on floats.
        self.keys.clear();
        for id in range.clone() {
            let c = contributions[id];
            let rank_key = match self.config.random_ranking {
                Some(_) => (self.rng.next_u64() >> 32) as u32,
                None => !c.max(0.0).to_bits(),
            };
            self.keys.push(((rank_key as u64) << 32) | id as u64);
        }
        self.keys.sort_unstable();
        self.order.clear();
        self.order.extend(self.keys.iter().map(|k| *k as u32));
        let m = n - k;
        for (pos, &id) in self.order[k..].iter().enumerate() {
            out[id as usize] = level_of(pos, m, self.config.levels);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn important_count_is_exact_ceil() {
        // (loss_tolerance, chunks, exact ones): 1 - 0.2 of 10 is 8, not 9.
        let cases = [(0.2, 10, 8), (0.2, 11, 9), (1.0, 11, 0), (0.0, 11, 11)];
        for (tolerance, n, exact) in cases.into_iter().chain([(0.7, 10, 3), (0.3, 10, 7)]) {
            assert_eq!(important_count(tolerance, n), exact, "{tolerance} of {n}");
        }
    }

    #[test]
    fn the_loss_tolerance_is_the_lossy_share_of_each_tensor() {
        let layout = crate::layout::Layout::new(vec![
            crate::layout::TensorSpec::dense("a", [40]),
            crate::layout::TensorSpec::dense("b", [40]),
        ])
        .unwrap();
        let chunking = crate::layout::ChunkOptions {
            block_values: 4,
            ..Default::default()
        };
        let plan = layout.plan(chunking).unwrap();
        let config = ClassifyConfig {
            loss_tolerance: 0.3,
            ..Default::default()
        };
        let mut c = Classifier::new(config).unwrap();
        assert_eq!(c.loss_tolerance(), 0.3);
        let contributions: Vec<f32> = (0..plan.len()).map(|i| i as f32).collect();
        let mut classes = Vec::new();
        c.classify(&plan, &contributions, &mut classes).unwrap();
        // 10 chunks a tensor: the 3 smallest of each are lossy.
        let lossy: Vec<usize> = (0..plan.len())
            .filter(|&i| classes[i] != IMPORTANT)
            .collect();
        assert_eq!(lossy, [0, 1, 2, 10, 11, 12]);
        let bad = ClassifyConfig {
            loss_tolerance: 1.5,
            ..Default::default()
        };
        assert_eq!(
            Classifier::new(bad).unwrap_err(),
            ClassifyError::LossTolerance(1.5)
        );
    }

    #[test]
    fn levels_are_equal_bands() {
        let m = 10;
        let levels: Vec<_> = (0..m).map(|p| level_of(p, m, 3)).collect();
        assert_eq!(levels, [1, 1, 1, 2, 2, 2, 3, 3, 3, 3]);
        assert_eq!(
            (0..2).map(|p| level_of(p, 2, 3)).collect::<Vec<_>>(),
            [2, 3]
        );
    }
}
