//! The smoothed contribution of each chunk (seed 002, S2).
//!
//! For chunk `j` at round `t` with `n` values `g_i`:
//!
//! ```text
//! c[j,t] = alpha * c[j,t-1] + (1 - alpha) * (sum_i |g_i|) / n
//! ```
//!
//! At a chunk's first round the previous value is its own mean `|g|`, so
//! `c[j,0]` is the mean itself. The smoothing keeps a chunk that is briefly
//! quiet from being demoted at once; alpha defaults to 0.3 as in the authors'
//! public code.

use crate::layout::ChunkPlan;
use thiserror::Error;

/// Default smoothing factor.
pub const DEFAULT_ALPHA: f32 = 0.3;

/// Why a round's gradients were refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GradientError {
    /// The number of tensors differs from the layout's.
    #[error("expected {expected} tensors, got {got}")]
    TensorCount {
        /// The layout's tensor count.
        expected: usize,
        /// What was passed.
        got: usize,
    },
    /// A tensor has the wrong number of values.
    #[error("tensor {tensor} has {got} values, expected {expected}")]
    TensorLength {
        /// Tensor id.
        tensor: usize,
        /// The layout's value count.
        expected: usize,
        /// What was passed.
        got: usize,
    },
    /// A value is NaN or infinite.
    #[error("tensor {tensor} value {index} is not finite")]
    NonFinite {
        /// Tensor id.
        tensor: usize,
        /// Index of the value in the tensor.
        index: usize,
    },
}

/// Checks that `grads` matches the plan's tensors in count and length.
pub fn check_shapes<G: AsRef<[f32]>>(plan: &ChunkPlan, grads: &[G]) -> Result<(), GradientError> {
    if grads.len() != plan.tensor_count() {
        return Err(GradientError::TensorCount {
            expected: plan.tensor_count(),
            got: grads.len(),
        });
    }
    for (tensor, g) in grads.iter().enumerate() {
        let expected = plan.tensor_bytes(tensor) as usize / 4;
        let got = g.as_ref().len();
        if got != expected {
            return Err(GradientError::TensorLength {
                tensor,
                expected,
                got,
            });
        }
    }
    Ok(())
}

/// Sum of `|v|`, written with eight independent lanes so that it vectorizes
/// (a single f32 accumulator forces a serial dependency chain).
pub fn abs_sum(values: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut blocks = values.chunks_exact(8);
    for b in &mut blocks {
        for i in 0..8 {
            lanes[i] += b[i].abs();
        }
    }
    let tail: f32 = blocks.remainder().iter().map(|v| v.abs()).sum();
    lanes.iter().sum::<f32>() + tail
}

/// The contribution of every chunk, kept across rounds.
#[derive(Debug, Clone)]
pub struct ContributionTracker {
    alpha: f32,
    values: Vec<f32>,
    rounds: u64,
}

impl ContributionTracker {
    /// A tracker for `chunks` chunks with smoothing factor `alpha` in `[0, 1]`
    /// (clamped).
    pub fn new(chunks: usize, alpha: f32) -> Self {
        let alpha = if alpha.is_nan() {
            DEFAULT_ALPHA
        } else {
            alpha.clamp(0.0, 1.0)
        };
        Self {
            alpha,
            values: vec![0.0; chunks],
            rounds: 0,
        }
    }

    /// The smoothing factor in use.
    pub fn alpha(&self) -> f32 {
        self.alpha
    }

    /// Rounds folded in so far.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// The current contributions, by chunk id.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Folds one round of gradients in and returns the new contributions.
    ///
    /// Validates shapes and finiteness first; on error nothing is changed.
    pub fn update<G: AsRef<[f32]>>(
        &mut self,
        plan: &ChunkPlan,
        grads: &[G],
    ) -> Result<&[f32], GradientError> {
        check_shapes(plan, grads)?;
        if plan.len() != self.values.len() {
            // A tracker belongs to one plan; resize rather than index out of bounds.
            self.values = vec![0.0; plan.len()];
            self.rounds = 0;
        }
        let mut means = vec![0f32; plan.len()];
        for (id, chunk) in plan.chunks().iter().enumerate() {
            let tensor = chunk.tensor as usize;
            let vals =
                &grads[tensor].as_ref()[chunk.start as usize..(chunk.start + chunk.len) as usize];
            let sum = abs_sum(vals);
            if !sum.is_finite() {
                // A finite sum proves every value finite; only on overflow or
                // NaN do we pay for the scan that names the culprit.
                if let Some(i) = vals.iter().position(|v| !v.is_finite()) {
                    return Err(GradientError::NonFinite {
                        tensor,
                        index: chunk.start as usize + i,
                    });
                }
            }
            means[id] = sum / chunk.len as f32;
        }
        if self.rounds == 0 {
            self.values = means;
        } else {
            let a = self.alpha;
            for (c, m) in self.values.iter_mut().zip(&means) {
                *c = a * *c + (1.0 - a) * m;
            }
        }
        self.rounds += 1;
        Ok(&self.values)
    }
}
