//! The differentiated allreduce: the gradlane round inside a collective
//! (docs/DESIGN.md §4).
//!
//! A bucket (a flat gradient buffer with its layout) is cut into one shard
//! per rank, at chunk boundaries, about equal in bytes; rank `r` owns shard
//! `r`. Every rank sends its part of shard `r` to rank `r` as a gradlane
//! round: the important chunks exact (or rounded once to their format),
//! the rest lossy. The owner sums what arrived in rank order, in `f32`, and
//! sends the sum back to every rank reliably in the important part's format
//! (with [`BucketOptions::lossy_return`], the least important chunks of the
//! sum in the lossy format, quantized once), with each rank's list of its
//! own chunks that did not arrive. Every rank thus ends with the owner's
//! bits, and sends about `2 (N-1) / N` of the buffer.
//!
//! A chunk counts whole or not at all: of a chunk fragmented over
//! several datagrams, the fragments that arrived are dropped with those
//! that did not. What becomes of a lost lossy chunk is the bucket's
//! [`LossRecovery`]; what rounding took from a rank's own values can be
//! fed back into its next step ([`BucketOptions::compression_feedback`]).

use super::bucket_options::LossRecovery;
use super::buckets::{bucket_layouts, Bucket, BucketId};
use super::{tag, Group, GroupError, Kind, ReduceOp};
use crate::link::{LayoutId, LinkReceiver, LinkSender, SendReport};
use bytes::Bytes;
use futures_util::future::try_join_all;
use gradlane_core::classify::{Class, IMPORTANT};
use gradlane_core::format::{self, log8_scale, Element, ValueFormat};
use gradlane_core::group::{encode_reduced_shard, GroupMessageError, ReducedShard};
use gradlane_core::reassembly::{Round, RoundStats};
use std::ops::Range;
use std::time::Duration;

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
    /// Bytes of the summed shard this rank sent back to the other ranks,
    /// in all (the values in their formats, the lost-chunk lists, the
    /// message headers).
    pub return_bytes: u64,
    /// The call's budget for its lossy part, from the call, if the bucket
    /// has a [`StepDeadline`](gradlane_core::protocol::StepDeadline) and it was past its warm-up.
    pub budget: Option<Duration>,
    /// With a bounded return: this rank's return round to each other rank.
    pub return_sent: Vec<Option<SendReport>>,
    /// With a bounded return: the ranges of the bucket (one per chunk) of
    /// the sum that some rank missed, zero at every rank (their owners add
    /// them into their next call).
    pub return_missed: Vec<Range<usize>>,
    /// With a bounded return: the return's budget for its lossy part,
    /// from its start, once past its warm-up.
    pub return_budget: Option<Duration>,
}

impl Group {
    /// Reduces `buf` (the bucket's flat buffer, of the type it was
    /// registered with: `f32`, [`bf16`](crate::bf16) or
    /// [`f16`](crate::f16)) across the ranks: the important chunks of every
    /// rank's buffer exact (or rounded once to their format), the rest as
    /// lossy as the links' loss tolerance says, what was lost handled by
    /// the bucket's [`LossRecovery`]. Every rank ends with the same bits.
    /// `ReduceOp::Max` and `Min` are the exact collectives' only.
    pub async fn allreduce_differentiated<T: Element>(
        &mut self,
        bucket: BucketId,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<AllreduceReport, GroupError> {
        // Run again among the survivors, the bucket carries into it what it
        // carried into the first attempt.
        let carried = match self.membership.policy.reruns_restore_residuals() {
            true => self.buckets.get(bucket.0).map(|b| b.residual.clone()),
            false => None,
        };
        self.resilient(
            "allreduce_differentiated",
            buf,
            async |g: &mut Group, buf: &mut [T]| {
                if let (Some(carried), Some(b)) = (&carried, g.buckets.get_mut(bucket.0)) {
                    if b.residual.len() == carried.len() {
                        b.residual.copy_from_slice(carried);
                    }
                }
                g.allreduce_differentiated_once(bucket, buf, op).await
            },
        )
        .await
    }

    async fn allreduce_differentiated_once<T: Element>(
        &mut self,
        bucket: BucketId,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<AllreduceReport, GroupError> {
        if matches!(op, ReduceOp::Max | ReduceOp::Min) {
            return Err(GroupError::Unsupported(format!(
                "the differentiated allreduce sums (Sum, Mean), not {op:?}: use allreduce"
            )));
        }
        let Some(b) = self.buckets.get_mut(bucket.0) else {
            return Err(GroupError::Size(format!("no bucket {}", bucket.0)));
        };
        if b.gather {
            return Err(GroupError::Unsupported(format!(
                "bucket {} is an allgather bucket: use allgather_differentiated",
                bucket.0
            )));
        }
        if T::FORMAT != b.dtype {
            return Err(GroupError::Unsupported(format!(
                "bucket {} holds {} values, given a buffer of {}",
                bucket.0,
                b.dtype,
                T::FORMAT
            )));
        }
        if buf.len() != b.values {
            return Err(GroupError::Size(format!(
                "a bucket of {} values given {}",
                b.values,
                buf.len()
            )));
        }
        if T::FORMAT == ValueFormat::F32 {
            let values: &mut [f32] = bytemuck::cast_slice_mut(buf);
            return self.reduce_bucket(bucket, values, op).await;
        }
        // The rounds frame f32; a 16-bit buffer widens exactly, and its
        // result narrows exactly but for log8-returned sums, which every
        // rank rounds the same way.
        let mut widened = std::mem::take(&mut b.widened);
        widened.resize(buf.len(), 0.0);
        format::widen(buf, &mut widened);
        let report = self.reduce_bucket(bucket, &mut widened, op).await;
        if report.is_ok() {
            format::narrow(&widened, buf);
        }
        self.buckets[bucket.0].widened = widened;
        report
    }

    /// Every rank's tensor of an allgather bucket ([`BucketOptions::gather`])
    /// to every rank, in place: this rank's own tensor goes to each other
    /// rank as a gradlane round, its least important chunks (the links'
    /// loss tolerance of them) lossy and, with a deadline, cut at it; a
    /// chunk any rank missed is zero at every rank, in its sender's tensor
    /// too (the report's `return_missed`), so every rank ends with the
    /// same bits.
    ///
    /// [`BucketOptions::gather`]: super::BucketOptions::gather
    pub async fn allgather_differentiated(
        &mut self,
        bucket: BucketId,
        buf: &mut [f32],
    ) -> Result<AllreduceReport, GroupError> {
        let Some(b) = self.buckets.get(bucket.0) else {
            return Err(GroupError::Size(format!("no bucket {}", bucket.0)));
        };
        if !b.gather || b.dtype != ValueFormat::F32 {
            return Err(GroupError::Unsupported(format!(
                "bucket {} is not an f32 allgather bucket: use allreduce_differentiated",
                bucket.0
            )));
        }
        if buf.len() != b.values {
            return Err(GroupError::Size(format!(
                "a bucket of {} values given {}",
                b.values,
                buf.len()
            )));
        }
        self.resilient(
            "allgather_differentiated",
            buf,
            async |g: &mut Group, buf: &mut [f32]| {
                let b = &g.buckets[bucket.0];
                let own = b.shards[g.rank].clone();
                let first = FirstHalf {
                    sum: buf[own].to_vec(),
                    parts: (0..g.world).map(|_| None).collect(),
                    report: AllreduceReport {
                        sent: vec![None; g.world],
                        received: vec![None; g.world],
                        missing: vec![Vec::new(); g.world],
                        ..AllreduceReport::default()
                    },
                };
                g.bounded_return(bucket, buf, first).await
            },
        )
        .await
    }

    /// [`allreduce_differentiated`](Self::allreduce_differentiated) on the
    /// `f32` values of a checked bucket.
    async fn reduce_bucket(
        &mut self,
        bucket: BucketId,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> Result<AllreduceReport, GroupError> {
        let (world, me) = (self.world, self.rank);
        let b = &mut self.buckets[bucket.0];
        if !b.residual.is_empty() {
            for (v, r) in buf.iter_mut().zip(b.residual.iter_mut()) {
                *v += *r;
                *r = 0.0;
            }
        }
        let shards = b.shards.clone();
        let pieces = b.pieces.clone();
        let ids = b.ids.clone();
        let recovery = b.recovery;
        let formats = b.formats;
        let own_chunks = b.chunks[me].clone();
        let layout_id = bucket_layouts(bucket.0).0 as usize;

        // 1. Every rank's part of shard r to rank r, as a round; at the
        //    same time this rank's shard from every other rank.
        let started = tokio::time::Instant::now();
        let budget = b.deadline.budget();
        let until = budget.map(|d| started.into_std() + d);
        let own = shards[me].clone();
        let rounds = &mut self.next_round;
        let halves = self.senders.iter_mut().zip(self.receivers.iter_mut());
        let work = halves.enumerate().filter_map(|(r, (sender, receiver))| {
            let halves = (sender.as_mut()?, receiver.as_mut()?);
            let round = rounds[r];
            rounds[r] += 1;
            let part = &buf[shards[r].clone()];
            let grads: Vec<&[f32]> = cut(part, &pieces[r]);
            let id = ids[r].filter(|_| !shards[r].is_empty());
            let receive_own = !own.is_empty();
            Some(async move {
                let out = id.map(|layout| OutRound {
                    layout,
                    round,
                    grads: &grads,
                    classes: None,
                });
                round_both_ways(r, halves, out, receive_own, until).await
            })
        });
        let results = try_join_all(work).await?;
        let mut report = AllreduceReport {
            sent: vec![None; world],
            received: vec![None; world],
            missing: vec![Vec::new(); world],
            budget,
            ..AllreduceReport::default()
        };
        let mut parts: Vec<Option<Round>> = (0..world).map(|_| None).collect();
        for (r, sent, got) in results {
            report.sent[r] = sent;
            if let Some(got) = got {
                if got.layout as usize != layout_id {
                    return Err(GroupError::OutOfStep {
                        rank: r,
                        what: format!(
                            "a round of layout {} where bucket {}'s first half (layout \
                             {layout_id}) was due",
                            got.layout, bucket.0
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
        let b = &mut self.buckets[bucket.0];
        if b.feedback {
            keep_rounding_error(b, buf, &report.sent);
        }

        // 2. The owner's sum, in rank order.
        let n = own.len();
        let mut sum = std::mem::take(&mut b.sum);
        sum.clear();
        sum.resize(n, 0.0);
        // Per chunk of this rank's shard: how many ranks' parts of it are in.
        let mut arrived = vec![world as u32; own_chunks.len()];
        for (r, part) in parts.iter_mut().enumerate() {
            if r == me {
                add_into(&mut sum, &buf[own.clone()]);
                continue;
            }
            let Some(round) = part else { continue };
            let got: usize = round.tensors.iter().map(Vec::len).sum();
            if got != n {
                return Err(GroupError::OutOfStep {
                    rank: r,
                    what: format!("a shard of {got} values, expected {n}"),
                });
            }
            // A chunk counts whole or not at all: the part of a fragmented
            // chunk that did arrive is dropped too, so that a rank's lost
            // chunk is exactly what it is told it lost. The round's tensors
            // are this rank's to change (they go back to the link next).
            for &c in &round.missing_chunks {
                if let Some(a) = arrived.get_mut(c as usize) {
                    *a = a.saturating_sub(1);
                }
                if let Some(range) = own_chunks.get(c as usize) {
                    zero_flat(&mut round.tensors, range.clone());
                }
            }
            let mut at = 0;
            for t in &round.tensors {
                add_into(&mut sum[at..at + t.len()], t);
                at += t.len();
            }
        }
        match (recovery, op) {
            (LossRecovery::Rescale, _) => {
                for (c, range) in own_chunks.iter().enumerate() {
                    let k = arrived[c].max(1) as f32;
                    let scale = match op {
                        ReduceOp::Mean => 1.0 / k,
                        _ => world as f32 / k,
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
            _ => {}
        }
        // What the last bounded return could not deliver everywhere.
        if b.carry.len() == sum.len() {
            for (s, c) in sum.iter_mut().zip(b.carry.iter_mut()) {
                *s += *c;
                *c = 0.0;
            }
        }
        if b.bounded {
            let summed = started.elapsed();
            b.deadline.observe(summed);
            report.reduce_time = summed;
            let first_half = FirstHalf { sum, parts, report };
            return self.bounded_return(bucket, buf, first_half).await;
        }

        // 3. The sums back to everyone, reliably, in their formats, with
        //    every rank's lost chunks: one message for all, so that it is
        //    framed once. The owner takes its own shard from it too, so it
        //    holds the bits everyone gets.
        let lossy_return = b
            .lossy_return
            .then(|| least_important(&sum, &own_chunks, &b.pieces[me], b.tolerance));
        let missing: Vec<&[u32]> = parts
            .iter()
            .map(|p| p.as_ref().map_or(&[][..], |p| p.missing_chunks.as_slice()))
            .collect();
        let message = Bytes::from(encode_reduced_shard(
            &missing,
            &sum,
            &own_chunks,
            formats,
            lossy_return.as_deref(),
        ));
        b.sum = sum;
        // The parts' tensors back to their links, for the next rounds.
        for (r, part) in parts.into_iter().enumerate() {
            if let (Some(round), Some(receiver)) = (part, self.receivers[r].as_mut()) {
                receiver.recycle(round.tensors);
            }
        }
        let t = tag(self.next_seq(), Kind::ReducedShard);
        report.return_bytes = message.len() as u64 * (world as u64 - 1);
        let summed = started.elapsed();
        self.buckets[bucket.0].deadline.observe(summed);
        let got = self.exchange_with_all(t, &message).await?;
        report.reduce_time = summed;
        report.return_time = started.elapsed() - summed;
        tracing::debug!(
            bucket = bucket.0,
            reduce_time = ?report.reduce_time,
            return_time = ?report.return_time,
            "differentiated allreduce"
        );
        let b = &mut self.buckets[bucket.0];
        for (r, received) in got.iter().enumerate() {
            let range = shards[r].clone();
            let message = match received {
                Some(m) => m,
                None if r == me => &message,
                None => continue,
            };
            let out_of_step = |e: GroupMessageError| GroupError::OutOfStep {
                rank: r,
                what: e.to_string(),
            };
            let shard = ReducedShard::parse((me, world), message, &b.chunks[r], formats)
                .map_err(out_of_step)?;
            for local in shard.lost_ranges() {
                let at = range.start + local.start..range.start + local.end;
                if recovery == LossRecovery::ErrorFeedback {
                    // Kept whole for this rank's next gradient: the values
                    // it sent, before the sums replace them.
                    b.residual[at.clone()].copy_from_slice(&buf[at.clone()]);
                }
                report.lost.push(at);
            }
            shard.decode_into(&mut buf[range]).map_err(out_of_step)?;
        }
        Ok(report)
    }
}

/// A round for [`round_both_ways`] to send.
pub(super) struct OutRound<'a> {
    pub(super) layout: LayoutId,
    pub(super) round: u32,
    pub(super) grads: &'a [&'a [f32]],
    /// The sender's classes, or `None` for the link's own.
    pub(super) classes: Option<&'a [Class]>,
}

/// One round each way on the link to `rank` at once: `out` sent (if any),
/// the peer's next round received (if `receive`), the lossy parts of both
/// cut at `until`. Returns the rank with what was sent and what came.
pub(super) async fn round_both_ways(
    rank: usize,
    (sender, receiver): (&mut LinkSender, &mut LinkReceiver),
    out: Option<OutRound<'_>>,
    receive: bool,
    until: Option<std::time::Instant>,
) -> Result<(usize, Option<SendReport>, Option<Round>), GroupError> {
    let failed = |source| GroupError::Rank { rank, source };
    let send = async {
        let Some(out) = out else { return Ok(None) };
        let sent = match out.classes {
            Some(classes) => {
                sender
                    .send_round_classed_until(out.layout, out.round, out.grads, classes, until)
                    .await
            }
            None => {
                sender
                    .send_round_until(out.layout, out.round, out.grads, until)
                    .await
            }
        };
        sent.map(Some).map_err(failed)
    };
    let recv = async {
        if !receive {
            return Ok(None);
        }
        receiver
            .recv_round_until(until)
            .await
            .map(Some)
            .map_err(failed)
    };
    let (sent, got) = tokio::join!(send, recv);
    Ok((rank, sent?, got?))
}

/// What the first half of a call leaves for the return: the owner's sum,
/// the parts that came, and the report so far.
pub(super) struct FirstHalf {
    pub(super) sum: Vec<f32>,
    pub(super) parts: Vec<Option<Round>>,
    pub(super) report: AllreduceReport,
}

/// `values` cut into consecutive pieces of `counts` values.
pub(super) fn cut<'a>(values: &'a [f32], counts: &[usize]) -> Vec<&'a [f32]> {
    let mut out = Vec::with_capacity(counts.len());
    let mut rest = values;
    for &n in counts {
        let (a, b) = rest.split_at(n.min(rest.len()));
        out.push(a);
        rest = b;
    }
    out
}

/// Keeps in the bucket's residual what the formats took from this rank's
/// values in the rounds it sent: for each chunk, its values less what the
/// owner decodes of them. A value that is not finite keeps nothing (the
/// sum carries it; feeding it back would poison the next step), and a
/// log8 chunk holding one went in the important format.
fn keep_rounding_error(b: &mut Bucket, buf: &[f32], sent: &[Option<SendReport>]) {
    for (r, report) in sent.iter().enumerate() {
        let Some(report) = report else { continue };
        let shard = b.shards[r].clone();
        for (c, range) in b.chunks[r].iter().enumerate() {
            let class = report.classes.get(c).copied().unwrap_or(IMPORTANT);
            let mut format = b.formats.of(class);
            let at = shard.start + range.start..shard.start + range.end;
            let values = &buf[at.clone()];
            if format == ValueFormat::Log8 && log8_scale(values).is_err() {
                format = b.formats.important;
            }
            format::rounding_error(format, values, &mut b.residual[at]);
        }
    }
}

/// Which chunks of a summed shard (`chunks`, as value ranges; `pieces`,
/// its tensors' value counts) a lossy return sends in the lossy format:
/// of each tensor, the `tolerance` share with the smallest mean magnitude
/// of the sum (ties by position), as a sender classes its own chunks.
pub(super) fn least_important(
    sum: &[f32],
    chunks: &[Range<usize>],
    pieces: &[usize],
    tolerance: f64,
) -> Vec<bool> {
    let mut lossy = vec![false; chunks.len()];
    let (mut first, mut tensor_end) = (0, 0);
    for &values in pieces {
        tensor_end += values;
        let n = chunks[first..]
            .iter()
            .take_while(|c| c.end <= tensor_end)
            .count();
        let mut order: Vec<(f32, usize)> = (first..first + n)
            .map(|c| {
                let v = &sum[chunks[c].clone()];
                (gradlane_core::score::abs_sum(v) / v.len().max(1) as f32, c)
            })
            .collect();
        // NaN (a sum not finite) ranks as most important.
        order.sort_by(|a, b| {
            let key = |x: f32| if x.is_nan() { f32::INFINITY } else { x };
            key(a.0).total_cmp(&key(b.0)).then(a.1.cmp(&b.1))
        });
        let keep = gradlane_core::classify::important_count(tolerance, n);
        for &(_, c) in &order[..n - keep] {
            lossy[c] = true;
        }
        first += n;
    }
    lossy
}

/// Adds `values` into `sum`, value by value.
fn add_into(sum: &mut [f32], values: &[f32]) {
    for (s, v) in sum.iter_mut().zip(values) {
        *s += v;
    }
}

/// Sets values `range` of the concatenation of `tensors` to zero.
fn zero_flat(tensors: &mut [Vec<f32>], range: Range<usize>) {
    let mut start = 0;
    for t in tensors {
        let end = start + t.len();
        let (from, to) = (range.start.max(start), range.end.min(end));
        if from < to {
            t[from - start..to - start].fill(0.0);
        }
        start = end;
    }
}
