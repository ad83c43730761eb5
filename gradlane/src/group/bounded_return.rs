//! The bounded return of a differentiated allreduce (docs/DESIGN.md §4):
//! with a deadline, the return half has one too.
//!
//! Each owner sends its summed shard to every rank as a gradlane round,
//! classed by the owner itself: the least important chunks of the sum
//! (the loss tolerance of each tensor's, by mean magnitude) lossy, the
//! rest important. A receiver delivers at the return's deadline with the
//! lossy chunks that are in. Then every rank sends every other one a
//! report ([`ReturnReport`]): as an owner, each rank's chunks that did not
//! arrive in the first half; as a receiver, the return chunks it missed.
//! A chunk any rank missed is zero at every rank, its owner's included,
//! and the owner adds its sum into its next call (unless the bucket's
//! recovery is `Drop`, or it is an allgather's): every rank ends with
//! the same bits, and nothing is lost, only delayed a step. An allgather
//! bucket is this half alone, each rank's own tensor its shard. The important
//! chunks, both halves' and the reports, are what a call waits for.

use super::buckets::bucket_layouts;
use super::differentiated::{cut, least_important, round_both_ways, FirstHalf, OutRound};
use super::{tag, BucketId, Group, GroupError, Kind, LossRecovery};
use bytes::Bytes;
use futures_util::future::try_join_all;
use gradlane_core::classify::{Class, IMPORTANT};
use gradlane_core::format::{log8_round_trip, ValueFormat};
use gradlane_core::group::{encode_return_report, missed_by_any, GroupMessageError, ReturnReport};
use gradlane_core::reassembly::Round;
use std::ops::Range;

/// The lossy level of a return's lossy chunks.
const RETURN_LEVEL: Class = 1;

impl Group {
    /// The return half with a deadline; `first` is what the first half
    /// left. Writes every shard's sum into `buf`.
    pub(super) async fn bounded_return(
        &mut self,
        bucket: BucketId,
        buf: &mut [f32],
        first: FirstHalf,
    ) -> Result<super::AllreduceReport, GroupError> {
        let FirstHalf {
            sum,
            parts,
            mut report,
        } = first;
        let (world, me) = (self.world, self.rank);
        let b = &mut self.buckets[bucket.0];
        let shards = b.shards.clone();
        let (formats, recovery) = (b.formats, b.recovery);
        let own_chunks = b.chunks[me].clone();
        let classes = return_classes(&sum, &own_chunks, &b.pieces[me], b.tolerance);
        // What every receiver decodes of this shard, so that the owner
        // holds the same bits.
        let mut own = vec![0.0f32; sum.len()];
        for (c, range) in own_chunks.iter().enumerate() {
            let format = match classes[c] {
                IMPORTANT => formats.important,
                _ => formats.lossy,
            };
            as_received(format, &sum[range.clone()], &mut own[range.clone()]);
        }
        // The first half's lost chunks, each rank's, for the reports.
        let lost: Vec<Vec<u32>> = parts
            .iter()
            .map(|p| {
                p.as_ref()
                    .map_or_else(Vec::new, |p| sorted(&p.missing_chunks))
            })
            .collect();
        for (r, part) in parts.into_iter().enumerate() {
            if let (Some(round), Some(receiver)) = (part, self.receivers[r].as_mut()) {
                receiver.recycle(round.tensors);
            }
        }

        // 1. The return rounds, out and in at once, to the return's
        //    deadline.
        let started = tokio::time::Instant::now();
        let budget = b.return_deadline.budget();
        let until = budget.map(|d| started.into_std() + d);
        let grads = cut(&sum, &b.pieces[me]);
        let return_id = bucket_layouts(bucket.0).1;
        let send_own = !shards[me].is_empty();
        let rounds = &mut self.next_round;
        let halves = self.senders.iter_mut().zip(self.receivers.iter_mut());
        let work = halves.enumerate().filter_map(|(r, (sender, receiver))| {
            let halves = (sender.as_mut()?, receiver.as_mut()?);
            let round = rounds[r];
            if send_own {
                rounds[r] += 1;
            }
            let out = send_own.then_some(OutRound {
                layout: return_id,
                round,
                grads: &grads,
                classes: Some(&classes),
            });
            let receive = !shards[r].is_empty();
            Some(round_both_ways(r, halves, out, receive, until))
        });
        let results = try_join_all(work).await?;
        self.buckets[bucket.0]
            .return_deadline
            .observe(started.elapsed());
        let mut got: Vec<Option<Round>> = (0..world).map(|_| None).collect();
        report.return_sent = vec![None; world];
        for (r, sent, round) in results {
            report.return_sent[r] = sent;
            if let Some(round) = round {
                check_return(r, &round, return_id, shards[r].len())?;
                got[r] = Some(round);
            }
        }

        // 2. The reports: every rank learns every rank's misses.
        let b = &self.buckets[bucket.0];
        let missed: Vec<Vec<u32>> = got
            .iter()
            .map(|g| {
                g.as_ref()
                    .map_or_else(Vec::new, |g| sorted(&g.missing_chunks))
            })
            .collect();
        let message = Bytes::from(encode_return_report(&lost, &missed));
        let counts: Vec<usize> = b.chunks.iter().map(Vec::len).collect();
        let t = tag(self.next_seq(), Kind::ReturnReport);
        let reports = self.exchange_with_all(t, &message).await?;
        let mut reports_of: Vec<Option<ReturnReport>> = (0..world).map(|_| None).collect();
        for (r, body) in reports.iter().enumerate() {
            let parsed = match body {
                Some(body) => ReturnReport::parse((me, r, world), body, &counts),
                None if r == me => ReturnReport::parse((me, me, world), &message, &counts),
                None => continue,
            };
            let parsed = parsed.map_err(|e: GroupMessageError| GroupError::OutOfStep {
                rank: r,
                what: e.to_string(),
            })?;
            reports_of[r] = Some(parsed);
        }
        report.return_bytes = report
            .return_sent
            .iter()
            .flatten()
            .map(|s| s.important_bytes + s.lossy_bytes.iter().sum::<u64>())
            .sum::<u64>()
            + message.len() as u64 * (world as u64 - 1);

        // 3. Every shard's sum into `buf`, the chunks any rank missed zero;
        //    this rank's lost chunks of the first half counted (and kept,
        //    with error feedback) before the sums replace its values.
        let b = &mut self.buckets[bucket.0];
        // What a rank missed is kept for the owner's next call, unless the
        // values' producer keeps its own (`Drop`) or nothing is summed.
        let carries = !b.gather && recovery != LossRecovery::Drop;
        for (owner, range) in shards.iter().enumerate() {
            let chunks = &b.chunks[owner];
            let union = missed_by_any(
                reports_of
                    .iter()
                    .flatten()
                    .map(|p| p.missed[owner].as_slice()),
            );
            if let Some(from_owner) = &reports_of[owner] {
                for &c in &from_owner.lost {
                    let local = chunks[c as usize].clone();
                    let at = range.start + local.start..range.start + local.end;
                    if recovery == LossRecovery::ErrorFeedback {
                        b.residual[at.clone()].copy_from_slice(&buf[at.clone()]);
                    }
                    report.lost.push(at);
                }
            }
            let out = &mut buf[range.clone()];
            match owner == me {
                true => out.copy_from_slice(&own),
                false => match &got[owner] {
                    Some(round) => copy_flat(&round.tensors, out),
                    None => continue,
                },
            }
            for &c in &union {
                let local = chunks[c as usize].clone();
                out[local.clone()].fill(0.0);
                report
                    .return_missed
                    .push(range.start + local.start..range.start + local.end);
                if owner == me && carries {
                    b.carry.resize(sum.len(), 0.0);
                    b.carry[local.clone()].copy_from_slice(&sum[local]);
                }
            }
        }
        b.sum = sum;
        report.return_budget = budget;
        report.return_time = started.elapsed();
        tracing::debug!(
            bucket = bucket.0,
            reduce_time = ?report.reduce_time,
            return_time = ?report.return_time,
            missed = report.return_missed.len(),
            "differentiated allreduce, bounded return"
        );
        Ok(report)
    }
}

/// The return's classes of an owner's summed shard: the least important
/// chunks of each tensor lossy, the rest (and every chunk whose sum is
/// not finite) important.
fn return_classes(
    sum: &[f32],
    chunks: &[Range<usize>],
    pieces: &[usize],
    tolerance: f64,
) -> Vec<Class> {
    least_important(sum, chunks, pieces, tolerance)
        .into_iter()
        .zip(chunks)
        .map(|(lossy, range)| {
            let finite = sum[range.clone()].iter().all(|v| v.is_finite());
            match lossy && finite {
                true => RETURN_LEVEL,
                false => IMPORTANT,
            }
        })
        .collect()
}

/// `values` as a receiver decodes them from `format` (one chunk's).
fn as_received(format: ValueFormat, values: &[f32], out: &mut [f32]) {
    match format {
        ValueFormat::Log8 => {
            // return_classes keeps chunks that are not finite important.
            if log8_round_trip(values, out).is_err() {
                out.copy_from_slice(values);
            }
        }
        f => {
            for (o, &v) in out.iter_mut().zip(values) {
                *o = f.round(v);
            }
        }
    }
}

/// A return round from `owner`: of the bucket's return layout, holding the
/// owner's whole shard.
fn check_return(owner: usize, round: &Round, id: u16, values: usize) -> Result<(), GroupError> {
    let got: usize = round.tensors.iter().map(Vec::len).sum();
    if round.layout != id || got != values {
        return Err(GroupError::OutOfStep {
            rank: owner,
            what: format!(
                "a round of layout {} with {got} values where the return (layout {id}) of \
                 {values} was due",
                round.layout
            ),
        });
    }
    Ok(())
}

/// The concatenation of `tensors` into `out` (of their total length).
fn copy_flat(tensors: &[Vec<f32>], out: &mut [f32]) {
    let mut at = 0;
    for t in tensors {
        out[at..at + t.len()].copy_from_slice(t);
        at += t.len();
    }
}

fn sorted(ids: &[u32]) -> Vec<u32> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    ids
}
