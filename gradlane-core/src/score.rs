//! The smoothed contribution of each chunk (CN110958187B, step S2;
//! docs/DESIGN.md §2.3).
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
//!
//! A chunk holding an infinity or a NaN (what fp16 mixed precision produces
//! on overflow, for torch's `GradScaler` to find) has no meaningful mean: it
//! keeps its previous contribution (0 at its first round), so one bad step
//! does not poison its history, and is listed in
//! [`ContributionTracker::non_finite`], so that the encoder sends it exact.

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
    /// A chunk classed lossy by the caller holds a value that is not
    /// finite (see [`Encoder::start_classed`](crate::encode::Encoder::start_classed)).
    #[error("chunk {chunk} holds a value that is not finite and was classed lossy")]
    NonFiniteLossy {
        /// The chunk's id.
        chunk: u32,
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
    /// The chunks of the last round with a value that is not finite.
    non_finite: Vec<u32>,
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
            non_finite: Vec::new(),
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

    /// The chunks of the last round folded in that hold a value that is
    /// not finite (ids, increasing; usually none). Their contributions were
    /// left as they were.
    pub fn non_finite(&self) -> &[u32] {
        &self.non_finite
    }

    /// Folds one round of gradients in and returns the new contributions.
    ///
    /// Validates shapes first; on error nothing is changed.
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
        // Plain slices are shareable across the scoring threads whatever
        // `G` is.
        let views: Vec<&[f32]> = grads.iter().map(AsRef::as_ref).collect();
        chunk_means(plan, &views, &mut means);
        self.non_finite.clear();
        let first = self.rounds == 0;
        let a = self.alpha;
        for (id, (c, &m)) in self.values.iter_mut().zip(&means).enumerate() {
            if m.is_nan() {
                // Marked by `means_of`: a value not finite.
                self.non_finite.push(id as u32);
                if first {
                    *c = 0.0;
                }
            } else if first {
                *c = m;
            } else {
                *c = a * *c + (1.0 - a) * m;
            }
        }
        self.rounds += 1;
        Ok(&self.values)
    }
}

/// Rounds smaller than this are scored on the calling thread: a thread
/// costs tens of microseconds to start.
const PARALLEL_BYTES: u64 = 8 << 20;

/// Fills `means[j]` with chunk `j`'s mean `|g|`, or NaN where the chunk
/// holds a value that is not finite.
///
/// Scoring is the one pass over the whole round before a byte can be sent
/// (~10 ms for ResNet-50 on one core, bound by memory bandwidth), so large
/// rounds are cut into as many parts of about equal bytes as there are
/// cores, at most four.
fn chunk_means(plan: &ChunkPlan, grads: &[&[f32]], means: &mut [f32]) {
    let total: u64 = (0..plan.tensor_count())
        .map(|t| plan.tensor_bytes(t) as u64)
        .sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4);
    if threads < 2 || total < PARALLEL_BYTES {
        return means_of(plan, grads, 0, means);
    }
    // Cut the chunk ids where the running byte count passes each share.
    let share = total.div_ceil(threads as u64);
    let mut cuts = vec![0usize];
    let mut bytes = 0u64;
    for (id, c) in plan.chunks().iter().enumerate() {
        if bytes >= share * cuts.len() as u64 {
            cuts.push(id);
        }
        bytes += c.byte_len() as u64;
    }
    cuts.push(plan.len());
    std::thread::scope(|scope| {
        let mut rest = means;
        let mut parts = Vec::with_capacity(cuts.len() - 1);
        for w in cuts.windows(2) {
            let (part, tail) = rest.split_at_mut(w[1] - w[0]);
            rest = tail;
            let first = w[0];
            parts.push(scope.spawn(move || means_of(plan, grads, first, part)));
        }
        for p in parts {
            p.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        }
    })
}

/// Mean `|g|` of chunks `first..first + out.len()`.
fn means_of(plan: &ChunkPlan, grads: &[&[f32]], first: usize, out: &mut [f32]) {
    let chunks = &plan.chunks()[first..first + out.len()];
    for (mean, chunk) in out.iter_mut().zip(chunks) {
        let tensor = chunk.tensor as usize;
        let vals = &grads[tensor][chunk.start as usize..(chunk.start + chunk.len) as usize];
        let sum = abs_sum(vals);
        // A finite sum proves every value finite; only on overflow or NaN
        // do we pay for the scan.
        *mean = if !sum.is_finite() && vals.iter().any(|v| !v.is_finite()) {
            f32::NAN
        } else {
            sum / chunk.len as f32
        };
    }
}
