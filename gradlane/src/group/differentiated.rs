//! The differentiated allreduce: the gradlane round inside a collective
//! (docs/DESIGN.md §4).
//!
//! A bucket (a flat gradient buffer with its layout) is cut into one shard
//! per rank, at chunk boundaries, about equal in bytes; rank `r` owns shard
//! `r`. Every rank sends its part of shard `r` to rank `r` as a gradlane
//! round: the important chunks exact, the rest lossy. The owner sums what
//! arrived in rank order and sends the sum back to every rank exactly, with
//! each rank's list of its own chunks that did not arrive. Every rank thus
//! ends with the owner's bits, and sends about `2 (N-1) / N` of the buffer.
//!
//! A chunk counts whole or not at all: of a chunk fragmented over
//! several datagrams, the fragments that arrived are dropped with those
//! that did not. What becomes of a lost lossy chunk is the bucket's
//! [`LossRecovery`].

use super::exact::{copy_into, to_bytes};
use super::{tag, Group, GroupError, Kind, ReduceOp};
use crate::link::{LayoutId, SendReport};
use bytes::Bytes;
use futures_util::future::try_join_all;
use gradlane_core::layout::{ChunkOptions, ConvChunking, Layout, TensorKind, TensorSpec};
use gradlane_core::reassembly::RoundStats;
use std::ops::Range;
use std::time::Duration;

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
}

/// A gradient bucket registered with a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketId(usize);

/// One registered bucket.
pub(super) struct Bucket {
    values: usize,
    /// Shard `r`'s range of the flat buffer, by rank.
    shards: Vec<Range<usize>>,
    /// Shard `r`'s tensors (pieces of the bucket's), by rank: a round of
    /// them goes to rank `r`. Their value counts, to cut the shard.
    pieces: Vec<Vec<usize>>,
    /// The layout id of shard `r` on the link to rank `r`.
    ids: Vec<Option<LayoutId>>,
    recovery: LossRecovery,
    /// Error feedback: this rank's values that did not arrive, to add into
    /// its next gradient.
    residual: Vec<f32>,
    /// Each shard's chunks, as value ranges within the shard, by local
    /// chunk id (the id in the shard's own chunk plan).
    chunks: Vec<Vec<Range<usize>>>,
}

/// What one differentiated allreduce did, seen from one rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllreduceReport {
    /// This rank's round to each other rank (the owner of that shard).
    pub sent: Vec<Option<SendReport>>,
    /// What arrived from each other rank at this rank, the owner of this
    /// rank's shard: per class sent, received, zero-filled, merged late.
    pub received: Vec<Option<RoundStats>>,
    /// Per other rank: the ranges of the bucket (one per chunk) of its
    /// part of this rank's shard that did not arrive in time.
    pub missing: Vec<Vec<Range<usize>>>,
    /// The ranges of the bucket (one per chunk) of this rank's own parts
    /// that did not reach their owners in time (with error feedback: added
    /// into its next gradient of the bucket).
    pub lost: Vec<Range<usize>>,
    /// How long the first half took at this rank: from the call until its
    /// parts were with their owners and its own shard's parts were in
    /// (this includes waiting for ranks that called later).
    pub reduce_time: Duration,
    /// How long the second half took: from the end of the first until the
    /// summed shards of every owner were in.
    pub return_time: Duration,
}

impl Group {
    /// Registers a gradient bucket: a flat buffer of `layout`'s tensors in
    /// order. Every rank registers the same buckets in the same order.
    pub async fn register_bucket(
        &mut self,
        layout: &Layout,
        recovery: LossRecovery,
    ) -> Result<BucketId, GroupError> {
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
        // Shard boundaries at chunk boundaries, about equal in bytes.
        let total: u64 = layout.total_values();
        let mut bounds = vec![0usize; world + 1];
        let starts: Vec<u64> = plan
            .chunks()
            .iter()
            .map(|c| layout.value_offset(c.tensor as usize) + c.start as u64)
            .collect();
        for (r, b) in bounds.iter_mut().enumerate().skip(1) {
            let target = total * r as u64 / world as u64;
            *b = starts.partition_point(|&s| s < target);
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
        let merge_late = recovery != LossRecovery::ErrorFeedback;
        let bucket_index = self.buckets.len();
        let registrations = self.senders.iter_mut().enumerate().filter_map(|(r, s)| {
            let s = s.as_mut()?;
            let tensors = layouts[r].clone();
            Some(async move {
                // An empty shard (fewer chunks than ranks) still takes an
                // id, so that ids keep following bucket indexes; no round
                // is ever sent on it.
                let tensors = match tensors.is_empty() {
                    true => vec![TensorSpec::dense("empty shard", [1])],
                    false => tensors,
                };
                let layout = Layout::new(tensors)
                    .map_err(|e| GroupError::Size(format!("shard {r}: {e}")))?;
                let id = s
                    .register_layout_with(&layout, merge_late)
                    .await
                    .map_err(|source| GroupError::Rank { rank: r, source })?;
                Ok::<_, GroupError>((r, Some(id)))
            })
        });
        let mut ids = vec![None; world];
        for (r, id) in try_join_all(registrations).await? {
            // Every rank registers the same buckets in the same order, so
            // a bucket's id on every link is its index plus one (0 is the
            // handshake's): an owner knows a round's bucket by it.
            if id.is_some_and(|id| id as usize != bucket_index + 1) {
                return Err(GroupError::Setup(format!(
                    "bucket {bucket_index} got layout {id:?} on the link to rank {r}"
                )));
            }
            ids[r] = id;
        }
        self.buckets.push(Bucket {
            values: total as usize,
            shards,
            pieces,
            ids,
            recovery,
            residual: match recovery {
                LossRecovery::ErrorFeedback => vec![0.0; total as usize],
                _ => Vec::new(),
            },
            chunks,
        });
        Ok(BucketId(bucket_index))
    }

    /// Reduces `buf` (the bucket's flat buffer) across the ranks: the
    /// important chunks of every rank's buffer exact, the rest as lossy as
    /// the links' loss tolerance says, what was lost handled by the
    /// bucket's [`LossRecovery`]. Every rank ends with the same bits.
    pub async fn allreduce_differentiated(
        &mut self,
        bucket: BucketId,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> Result<AllreduceReport, GroupError> {
        let (world, me) = (self.world, self.rank);
        let Some(b) = self.buckets.get_mut(bucket.0) else {
            return Err(GroupError::Size(format!("no bucket {}", bucket.0)));
        };
        if buf.len() != b.values {
            return Err(GroupError::Size(format!(
                "a bucket of {} values given {}",
                b.values,
                buf.len()
            )));
        }
        if b.recovery == LossRecovery::ErrorFeedback {
            for (v, r) in buf.iter_mut().zip(b.residual.iter_mut()) {
                *v += *r;
                *r = 0.0;
            }
        }
        let shards = b.shards.clone();
        let pieces = b.pieces.clone();
        let ids = b.ids.clone();
        let recovery = b.recovery;
        let own_chunks = b.chunks[me].clone();
        let layout_id = bucket.0 + 1;

        // 1. Every rank's part of shard r to rank r, as a round; at the
        //    same time this rank's shard from every other rank.
        let started = tokio::time::Instant::now();
        let own = shards[me].clone();
        let rounds = &mut self.next_round;
        let halves = self.senders.iter_mut().zip(self.receivers.iter_mut());
        let work = halves.enumerate().filter_map(|(r, (sender, receiver))| {
            let (sender, receiver) = (sender.as_mut()?, receiver.as_mut()?);
            let round = rounds[r];
            rounds[r] += 1;
            let part = &buf[shards[r].clone()];
            let grads: Vec<&[f32]> = cut(part, &pieces[r]);
            let id = ids[r].filter(|_| !shards[r].is_empty());
            let receive_own = !own.is_empty();
            Some(async move {
                let failed = |source| GroupError::Rank { rank: r, source };
                let send = async {
                    match id {
                        Some(id) => sender
                            .send_round_on(id, round, &grads)
                            .await
                            .map(Some)
                            .map_err(failed),
                        None => Ok(None),
                    }
                };
                let recv = async {
                    if !receive_own {
                        return Ok(None);
                    }
                    receiver.recv_round().await.map(Some).map_err(failed)
                };
                let (sent, got) = tokio::join!(send, recv);
                Ok::<_, GroupError>((r, sent?, got?))
            })
        });
        let results = try_join_all(work).await?;
        let mut report = AllreduceReport {
            sent: vec![None; world],
            received: vec![None; world],
            missing: vec![Vec::new(); world],
            lost: Vec::new(),
            reduce_time: Duration::ZERO,
            return_time: Duration::ZERO,
        };
        let mut parts: Vec<Option<gradlane_core::reassembly::Round>> =
            (0..world).map(|_| None).collect();
        for (r, sent, got) in results {
            report.sent[r] = sent;
            if let Some(got) = got {
                if got.layout as usize != layout_id {
                    return Err(GroupError::OutOfStep {
                        rank: r,
                        what: format!(
                            "a round of bucket {} where bucket {} was due",
                            got.layout as usize - 1,
                            bucket.0
                        ),
                    });
                }
                report.received[r] = Some(got.stats.clone());
                report.missing[r] = got
                    .missing_chunks
                    .iter()
                    .filter_map(|&c| own_chunks.get(c as usize))
                    .map(|c| own.start + c.start..own.start + c.end)
                    .collect();
                parts[r] = Some(got);
            }
        }

        // 2. The owner's sum, in rank order.
        let n = own.len();
        let mut sum = vec![0f32; n];
        // Per chunk of this rank's shard: how many ranks' parts of it are in.
        let mut arrived = vec![world as u32; own_chunks.len()];
        for (r, part) in parts.iter().enumerate() {
            let mut values: Vec<f32>;
            let src: &[f32] = if r == me {
                &buf[own.clone()]
            } else {
                match part {
                    Some(round) => {
                        values = round.tensors.concat();
                        if values.len() != n {
                            return Err(GroupError::OutOfStep {
                                rank: r,
                                what: format!("a shard of {} values, expected {n}", values.len()),
                            });
                        }
                        // A chunk counts whole or not at all: the part of a
                        // fragmented chunk that did arrive is dropped too,
                        // so that a rank's lost chunk is exactly what it
                        // is told it lost.
                        for &c in &round.missing_chunks {
                            if let Some(a) = arrived.get_mut(c as usize) {
                                *a = a.saturating_sub(1);
                            }
                            if let Some(range) = own_chunks.get(c as usize) {
                                values[range.clone()].fill(0.0);
                            }
                        }
                        &values
                    }
                    None => continue,
                }
            };
            for (s, v) in sum.iter_mut().zip(src) {
                *s += v;
            }
        }
        match (recovery, op) {
            (LossRecovery::Rescale, _) => {
                for (c, range) in own_chunks.iter().enumerate() {
                    let k = arrived[c].max(1) as f32;
                    let scale = match op {
                        ReduceOp::Sum => world as f32 / k,
                        ReduceOp::Mean => 1.0 / k,
                    };
                    if scale != 1.0 {
                        sum[range.clone()].iter_mut().for_each(|v| *v *= scale);
                    }
                }
            }
            (_, ReduceOp::Mean) => {
                let n = world as f32;
                sum.iter_mut().for_each(|v| *v /= n);
            }
            (_, ReduceOp::Sum) => {}
        }

        // 3. The sums back to everyone, exactly, with each rank's lost
        //    chunks.
        let t = tag(self.next_seq(), Kind::ReducedShard);
        let sum_bytes = to_bytes(&sum);
        let out = (0..world)
            .map(|r| {
                (r != me).then(|| {
                    let missing = parts[r]
                        .as_ref()
                        .map(|p| p.missing_chunks.as_slice())
                        .unwrap_or(&[]);
                    reduced_message(&sum_bytes, missing)
                })
            })
            .collect();
        let summed = started.elapsed();
        let from = self.others();
        let got = self.exchange(t, out, &from).await?;
        report.reduce_time = summed;
        report.return_time = started.elapsed() - summed;
        tracing::debug!(
            bucket = bucket.0,
            reduce_time = ?report.reduce_time,
            return_time = ?report.return_time,
            "differentiated allreduce"
        );
        let b = &mut self.buckets[bucket.0];
        for (r, body) in got.iter().enumerate() {
            let range = shards[r].clone();
            match body {
                Some(body) => {
                    let (values, missing) = parse_reduced(r, body, range.len())?;
                    for c in missing {
                        let Some(local) = b.chunks[r].get(c as usize) else {
                            return Err(GroupError::OutOfStep {
                                rank: r,
                                what: format!("lost chunk {c} is not in its shard"),
                            });
                        };
                        let at = range.start + local.start..range.start + local.end;
                        if recovery == LossRecovery::ErrorFeedback {
                            // Kept for this rank's next gradient.
                            b.residual[at.clone()].copy_from_slice(&buf[at.clone()]);
                        }
                        report.lost.push(at);
                    }
                    copy_into(r, &values, &mut buf[range], "reduced shard")?;
                }
                None => buf[range].copy_from_slice(&sum),
            }
        }
        Ok(report)
    }
}

/// `values` cut into consecutive pieces of `counts` values.
fn cut<'a>(values: &'a [f32], counts: &[usize]) -> Vec<&'a [f32]> {
    let mut out = Vec::with_capacity(counts.len());
    let mut rest = values;
    for &n in counts {
        let (a, b) = rest.split_at(n.min(rest.len()));
        out.push(a);
        rest = b;
    }
    out
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

/// The owner's answer to one rank: the reduced shard, then the ids of that
/// rank's chunks that did not arrive.
fn reduced_message(sum: &Bytes, missing: &[u32]) -> Bytes {
    let mut b = Vec::with_capacity(4 + missing.len() * 4 + sum.len());
    b.extend_from_slice(&(missing.len() as u32).to_le_bytes());
    b.extend_from_slice(bytemuck::cast_slice(missing));
    b.extend_from_slice(sum);
    b.into()
}

fn parse_reduced(rank: usize, body: &[u8], n: usize) -> Result<(Vec<u8>, Vec<u32>), GroupError> {
    let bad = |what: String| GroupError::OutOfStep { rank, what };
    let mut r = gradlane_core::bytes::Reader::new(body);
    let count = r.u32().map_err(|_| bad("an empty reduced shard".into()))? as usize;
    let ids = r.take(count.saturating_mul(4)).map_err(|_| {
        bad(format!(
            "{count} lost chunks in a message of {} bytes",
            body.len()
        ))
    })?;
    let missing: Vec<u32> = ids
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let values = r.rest();
    if values.len() != n * 4 {
        return Err(bad(format!(
            "a reduced shard of {} bytes, expected {}",
            values.len(),
            n * 4
        )));
    }
    Ok((values.to_vec(), missing))
}
