//! How a bucket of the differentiated allreduce is reduced: what becomes
//! of lost chunks, its values' formats and its deadline.

use gradlane_core::format::{ClassFormats, ValueFormat};
use gradlane_core::protocol::StepDeadline;

/// What a differentiated allreduce does with a lossy chunk that did not
/// arrive at its shard's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossRecovery {
    /// Counted as zero (the published design). The sum of a chunk is short
    /// by what was lost; chunks that come late are added into the next
    /// round's sum. Costs nothing.
    #[default]
    ZeroFill,
    /// Each chunk's sum is taken over the ranks whose part of it arrived
    /// and scaled to all ranks (a mean divides by their number, not N):
    /// unbiased if losses are independent of the values, at the price of
    /// more variance where few parts arrived. Late chunks are added into
    /// the next round as with zero fill.
    Rescale,
    /// A rank keeps the values of its own chunks that did not arrive (the
    /// owner tells it) and adds them into its next gradient of the same
    /// bucket, so nothing is lost, only delayed by a step. Late chunks are
    /// dropped at the owner instead of merged (they would count twice).
    /// Costs a copy of the bucket per rank.
    ErrorFeedback,
    /// Counted as zero, and late chunks are dropped at the owner instead of
    /// merged: for values whose producer keeps its own error feedback
    /// (PowerSGD's factors, whose residual `M - P Q^T` absorbs what was
    /// lost), where a stale chunk added into the next call would be noise.
    /// Costs nothing.
    Drop,
}

impl LossRecovery {
    /// Whether an owner adds chunks that come late into the next call's
    /// sum.
    pub fn merges_late(self) -> bool {
        matches!(self, Self::ZeroFill | Self::Rescale)
    }
}

/// How a bucket is reduced: what becomes of lost chunks, and what its
/// values look like on the wire. Every rank registers a bucket with the
/// same options.
///
/// **Tune** `formats` and `lossy_return` where the network binds;
/// `compression_feedback` is on by default where it matters (a `log8`
/// lossy format) and best left so. **Leave** `dtype` to say what the
/// buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BucketOptions {
    /// What becomes of a lossy chunk that did not arrive (default zero
    /// fill).
    pub recovery: LossRecovery,
    /// The type of the bucket's buffer: `F32` (default), `Bf16` or `F16`.
    /// A 16-bit buffer travels as itself, so exactly; only a `Log8` lossy
    /// format rounds it.
    pub dtype: ValueFormat,
    /// The value formats of the rounds (default: the links'
    /// [`Config::formats`](crate::Config::formats)). `bf16` important and
    /// `log8` lossy send about 0.45 of the `f32` bytes at loss tolerance
    /// 0.2.
    pub formats: Option<ClassFormats>,
    /// The owner returns the least important chunks of the sum (the
    /// links' loss tolerance of each tensor's chunks, ranked by the sum's
    /// mean magnitude, as a sender ranks its own) in the lossy format,
    /// quantized once at the owner and sent reliably, so every rank still
    /// ends with the same bits; the rest in the important part's format.
    /// The return then costs what the first half does. Default off.
    pub lossy_return: bool,
    /// Each rank keeps what rounding took from its own values (the
    /// formats' error, not lost chunks) and adds it into its next gradient
    /// of the bucket, as EF-SGD does. Default (`None`): on when the lossy
    /// format is `log8`. Composes with any [`LossRecovery`]; costs a copy
    /// of the bucket per rank.
    pub compression_feedback: Option<bool>,
    /// A deadline for each call's lossy part, from the call (default
    /// [`StepDeadline::Off`]): with one, a call that meets a burst of
    /// other traffic ends near its usual time and delivers without the
    /// lossy chunks still on their way; they are missing as if lost
    /// (counted in the report's `missing` and `lost`), for `recovery` to
    /// handle: with [`LossRecovery::ErrorFeedback`] their senders add them
    /// into their next gradient, so nothing is lost, only delayed a step.
    /// [`StepDeadline::Adaptive`] follows recent calls (OptiReduce's
    /// adaptive timeout). With a deadline (and a loss tolerance above 0)
    /// the return is bounded too, by a tracker of its own: the least
    /// important chunks of each summed shard travel lossy (in the lossy
    /// format, whatever `lossy_return` says), a chunk any rank missed is
    /// zero at every rank and its owner adds it into its next call
    /// (reported in `return_missed`). The important part is never cut.
    pub deadline: StepDeadline,
    /// An allgather bucket ([`Group::allgather_differentiated`]): its
    /// layout holds one tensor per rank, and each rank's tensor is its own
    /// shard, which every rank gets back as a bounded return does (the
    /// least important chunks lossy, a chunk any rank missed zero at every
    /// rank) and which nothing is summed into. Default off.
    ///
    /// [`Group::allgather_differentiated`]: crate::Group::allgather_differentiated
    pub gather: bool,
}

impl BucketOptions {
    /// The options of an `f32` bucket with `recovery` and the links'
    /// formats.
    pub fn new(recovery: LossRecovery) -> Self {
        Self {
            recovery,
            ..Self::default()
        }
    }
}
