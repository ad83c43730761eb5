//! A bucket of the differentiated allreduce: its registration (shards at
//! chunk boundaries, or one per rank for an allgather; their layouts on
//! the links, two a bucket) and what it keeps from one call to the next
//! (residuals, the owner's sum and carry, the deadlines' trackers).

use super::bucket_options::{BucketOptions, LossRecovery};
use super::{Group, GroupError};
use crate::link::LayoutId;
use futures_util::future::try_join_all;
use gradlane_core::format::{ClassFormats, ValueFormat};
use gradlane_core::layout::{ChunkOptions, ConvChunking, Layout, TensorKind, TensorSpec};
use gradlane_core::protocol::{DeadlineTracker, StepDeadline};
use std::ops::Range;

/// A gradient bucket registered with a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketId(pub(super) usize);

/// One registered bucket.
pub(super) struct Bucket {
    /// Values in the bucket's flat buffer.
    pub(super) values: usize,
    /// Shard `r`'s range of the flat buffer, by rank.
    pub(super) shards: Vec<Range<usize>>,
    /// Shard `r`'s tensors (pieces of the bucket's), by rank: a round of
    /// them goes to rank `r`. Their value counts, to cut the shard.
    pub(super) pieces: Vec<Vec<usize>>,
    /// The layout id of shard `r` on the link to rank `r`.
    pub(super) ids: Vec<Option<LayoutId>>,
    /// What becomes of a lossy chunk that did not arrive.
    pub(super) recovery: LossRecovery,
    /// The buffer's type.
    pub(super) dtype: ValueFormat,
    /// The formats its rounds travel in (a 16-bit buffer's own type where
    /// the options asked for an element format).
    pub(super) formats: ClassFormats,
    /// The owner returns the least important sums in the lossy format.
    pub(super) lossy_return: bool,
    /// The group's loss tolerance: the share of each tensor's chunks a
    /// lossy return sends in the lossy format.
    pub(super) tolerance: f64,
    /// Compression feedback is on.
    pub(super) feedback: bool,
    /// What this rank adds into its next gradient: its values that did not
    /// arrive (error feedback) and what rounding took (compression
    /// feedback). Empty when neither is on.
    pub(super) residual: Vec<f32>,
    /// Each shard's chunks, as value ranges within the shard, by local
    /// chunk id (the id in the shard's own chunk plan).
    pub(super) chunks: Vec<Vec<Range<usize>>>,
    /// A 16-bit buffer widened to `f32` for the call (kept for the next).
    pub(super) widened: Vec<f32>,
    /// The owner's sum (kept for the next call).
    pub(super) sum: Vec<f32>,
    /// Recent calls' times and the next call's budget.
    pub(super) deadline: DeadlineTracker,
    /// The return's own (a bounded return), from its start.
    pub(super) return_deadline: DeadlineTracker,
    /// The return is bounded: the bucket has a deadline and a loss
    /// tolerance, so the return's least important chunks travel lossy
    /// and may be cut (`bounded_return.rs`).
    pub(super) bounded: bool,
    /// An allgather bucket: no first half, nothing summed or carried.
    pub(super) gather: bool,
    /// This rank's sums of its own shard's chunks that some rank missed in
    /// the last bounded return (zero elsewhere), added into its next sum.
    pub(super) carry: Vec<f32>,
}

impl Group {
    /// Registers an `f32` gradient bucket: a flat buffer of `layout`'s
    /// tensors in order, in the links' formats. Every rank registers the
    /// same buckets in the same order.
    pub async fn register_bucket(
        &mut self,
        layout: &Layout,
        recovery: LossRecovery,
    ) -> Result<BucketId, GroupError> {
        self.register_bucket_with(layout, BucketOptions::new(recovery))
            .await
    }

    /// Registers a gradient bucket with its options (its buffer's type, its
    /// formats, recovery and feedback). Every rank registers the same
    /// buckets, with the same options, in the same order.
    pub async fn register_bucket_with(
        &mut self,
        layout: &Layout,
        options: BucketOptions,
    ) -> Result<BucketId, GroupError> {
        let id = self.register_bucket_on_links(layout, options).await?;
        self.membership.buckets.push((layout.clone(), options));
        Ok(id)
    }

    /// Registers a bucket's shards on the current view's links (again, on a
    /// new view's).
    pub(super) async fn register_bucket_on_links(
        &mut self,
        layout: &Layout,
        options: BucketOptions,
    ) -> Result<BucketId, GroupError> {
        let deadline = DeadlineTracker::new(options.deadline)
            .map_err(|e| GroupError::Unsupported(e.to_string()))?;
        if options.dtype.element_bytes().is_none() {
            return Err(GroupError::Unsupported(format!(
                "a bucket holds f32, bf16 or f16 values, not {}",
                options.dtype
            )));
        }
        let base = match options.formats {
            Some(f) => f,
            None => self
                .senders
                .iter()
                .flatten()
                .next()
                .map(|s| s.formats())
                .unwrap_or_default(),
        };
        base.validate()
            .map_err(|e| GroupError::Unsupported(e.to_string()))?;
        let formats = match options.dtype {
            ValueFormat::F32 => base,
            // A 16-bit buffer travels as itself; only log8 quantizes it.
            own => ClassFormats {
                important: own,
                lossy: match base.lossy {
                    ValueFormat::Log8 => ValueFormat::Log8,
                    _ => own,
                },
            },
        };
        let tolerance = self.membership.config.link.loss_tolerance;
        // An allgather's values are its ranks' own: nothing to feed back.
        let feedback = !options.gather
            && options
                .compression_feedback
                .unwrap_or(formats.lossy == ValueFormat::Log8);
        let recovery = options.recovery;
        let chunking = self
            .senders
            .iter()
            .flatten()
            .next()
            .map(|s| s.chunking())
            .unwrap_or_default();
        let plan = layout
            .plan(chunking)
            .map_err(|e| GroupError::Size(format!("bucket layout: {e}")))?;
        let world = self.world;
        let total: u64 = layout.total_values();
        let mut bounds = vec![0usize; world + 1];
        let starts: Vec<u64> = plan
            .chunks()
            .iter()
            .map(|c| layout.value_offset(c.tensor as usize) + c.start as u64)
            .collect();
        if options.gather {
            // Each rank's tensor is its shard.
            if layout.tensors().len() != world {
                return Err(GroupError::Size(format!(
                    "an allgather bucket holds one tensor per rank: {} for {world} ranks",
                    layout.tensors().len()
                )));
            }
            for (r, b) in bounds.iter_mut().enumerate().skip(1) {
                *b = plan.chunks().partition_point(|c| (c.tensor as usize) < r);
            }
        } else {
            // Shard boundaries at chunk boundaries, about equal in bytes.
            for (r, b) in bounds.iter_mut().enumerate().skip(1) {
                let target = total * r as u64 / world as u64;
                *b = starts.partition_point(|&s| s < target);
            }
        }
        bounds[world] = plan.len();
        let mut shards = Vec::with_capacity(world);
        let mut pieces = Vec::with_capacity(world);
        let mut layouts = Vec::with_capacity(world);
        let mut chunks = Vec::with_capacity(world);
        for r in 0..world {
            let (a, b) = (bounds[r], bounds[r + 1]);
            let value = |i: usize| match starts.get(i) {
                Some(&s) => s as usize,
                None => total as usize,
            };
            let (start, end) = (value(a), value(b));
            shards.push(start..end);
            chunks.push(
                (a..b)
                    .map(|c| {
                        let s = value(c) - start;
                        s..s + plan.chunks()[c].len as usize
                    })
                    .collect(),
            );
            let (tensors, counts) = shard_pieces(layout, &plan, chunking, a..b);
            pieces.push(counts);
            layouts.push(tensors);
        }
        let merge_late = recovery.merges_late();
        let bucket_index = self.buckets.len();
        let me = self.rank;
        let registrations = self.senders.iter_mut().enumerate().filter_map(|(r, s)| {
            let s = s.as_mut()?;
            let (reduce, back) = (layouts[r].clone(), layouts[me].clone());
            Some(async move {
                let failed = |source| GroupError::Rank { rank: r, source };
                // Shard r's part to its owner; then this rank's own shard,
                // for a bounded return to r, whose late chunks are dropped
                // (every rank must hold the same sum).
                let id = s
                    .register_layout_with(&shard_layout(r, reduce)?, merge_late, Some(formats))
                    .await
                    .map_err(failed)?;
                let back = s
                    .register_layout_with(&shard_layout(me, back)?, false, Some(formats))
                    .await
                    .map_err(failed)?;
                Ok::<_, GroupError>((r, id, back))
            })
        });
        let mut ids = vec![None; world];
        for (r, id, back) in try_join_all(registrations).await? {
            // Every rank registers the same buckets in the same order, so
            // a bucket's ids on every link are 2b + 1 and 2b + 2 (0 is the
            // handshake's): a rank knows a round's bucket and half by it.
            if (id, back) != bucket_layouts(bucket_index) {
                return Err(GroupError::Setup(format!(
                    "bucket {bucket_index} got layouts {id} and {back} on the link to rank {r}"
                )));
            }
            ids[r] = Some(id);
        }
        self.buckets.push(Bucket {
            values: total as usize,
            shards,
            pieces,
            ids,
            recovery,
            dtype: options.dtype,
            formats,
            lossy_return: options.lossy_return,
            tolerance,
            feedback,
            residual: match recovery == LossRecovery::ErrorFeedback || feedback {
                true => vec![0.0; total as usize],
                false => Vec::new(),
            },
            chunks,
            widened: Vec::new(),
            sum: Vec::new(),
            deadline,
            return_deadline: DeadlineTracker::new(options.deadline)
                .map_err(|e| GroupError::Unsupported(e.to_string()))?,
            bounded: options.gather || (options.deadline != StepDeadline::Off && tolerance > 0.0),
            gather: options.gather,
            carry: Vec::new(),
        });
        Ok(BucketId(bucket_index))
    }
}

/// The layout ids of bucket `b` on every link: its first half's, and its
/// bounded return's.
pub(super) fn bucket_layouts(b: usize) -> (LayoutId, LayoutId) {
    ((2 * b + 1) as LayoutId, (2 * b + 2) as LayoutId)
}

/// The layout of shard `r`'s pieces. An empty shard (fewer chunks than
/// ranks) still takes an id, so that ids keep following bucket indexes;
/// no round is ever sent on it.
fn shard_layout(r: usize, tensors: Vec<TensorSpec>) -> Result<Layout, GroupError> {
    let tensors = match tensors.is_empty() {
        true => vec![TensorSpec::dense("empty shard", [1])],
        false => tensors,
    };
    Layout::new(tensors).map_err(|e| GroupError::Size(format!("shard {r}: {e}")))
}

/// The tensors of the chunks `range` of a bucket: pieces of its tensors
/// that keep the chunking (a conv weight's kernels stay whole, so a piece
/// has the chunks the bucket has, in order), and their value counts.
fn shard_pieces(
    layout: &Layout,
    plan: &gradlane_core::layout::ChunkPlan,
    chunking: ChunkOptions,
    range: Range<usize>,
) -> (Vec<TensorSpec>, Vec<usize>) {
    let mut tensors = Vec::new();
    let mut counts = Vec::new();
    let chunks = &plan.chunks()[range.clone()];
    let mut i = 0;
    while i < chunks.len() {
        let t = chunks[i].tensor;
        let j = i + chunks[i..].iter().take_while(|c| c.tensor == t).count();
        let spec = &layout.tensors()[t as usize];
        let values: usize = chunks[i..j].iter().map(|c| c.len as usize).sum();
        let k = j - i;
        let piece = match spec.kind {
            TensorKind::Conv2d => {
                let (kh, kw) = (spec.shape[2], spec.shape[3]);
                match chunking.conv {
                    ConvChunking::PerKernel => {
                        TensorSpec::conv2d(spec.name.clone(), [k, spec.shape[1], kh, kw])
                    }
                    ConvChunking::PerSlice => TensorSpec::conv2d(spec.name.clone(), [1, k, kh, kw]),
                }
            }
            TensorKind::Dense => TensorSpec::dense(spec.name.clone(), [values]),
        };
        tensors.push(piece);
        counts.push(values);
        i = j;
    }
    (tensors, counts)
}
