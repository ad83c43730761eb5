//! One round of a variant on every local rank: the differentiated, exact
//! and sparse collectives and the TCP ring, what the round measured
//! ([`Sample`]), and across processes every rank's sample combined.

use std::time::{Duration, Instant};

use common::BoxError;
use futures_util::future::join_all;
use gradlane::{
    controller_state, BucketId, BucketOptions, Element, Group, Layout, ReduceOp, SparseAllgather,
    SparseRows, ValueFormat,
};
use gradlane_tools::cli as common;

use crate::formats::Narrowed;
use crate::inputs::sparse;
use crate::ring::Ring;

/// Every rank's sample of one round, combined: the slowest rank's time,
/// the mean bytes, the zero fill of all, and whether every rank ended
/// with the same bits (compared by a digest of each rank's result).
pub(crate) async fn gather(control: &mut Group, sample: Sample) -> Result<Sample, BoxError> {
    let world = control.world();
    // Four 16-bit pieces of the digest, each exact in an f32.
    let d = sample.digest;
    let mine = [
        sample.time.as_secs_f64() as f32,
        sample.bytes_per_rank as f32,
        sample.zero_filled as f32,
        (d & 0xffff) as f32,
        (d >> 16 & 0xffff) as f32,
        (d >> 32 & 0xffff) as f32,
        (d >> 48) as f32,
    ];
    let mut all = vec![0f32; mine.len() * world];
    control.allgather(&mine, &mut all).await?;
    let ranks: Vec<&[f32]> = all.chunks(mine.len()).collect();
    Ok(Sample {
        time: Duration::from_secs_f64(ranks.iter().map(|r| r[0] as f64).fold(0.0, f64::max)),
        bytes_per_rank: ranks.iter().map(|r| r[1] as f64).sum::<f64>() / world as f64,
        zero_filled: ranks.iter().map(|r| r[2] as u64).sum(),
        same: sample.same && ranks.iter().all(|r| r[3..] == ranks[0][3..]),
        digest: d,
    })
}

/// What one round of a variant did.
pub(crate) struct Sample {
    pub(crate) time: Duration,
    pub(crate) bytes_per_rank: f64,
    pub(crate) zero_filled: u64,
    /// Every rank of this process ended with the same bits.
    pub(crate) same: bool,
    /// A digest of the first rank's result, for comparing across processes.
    pub(crate) digest: u64,
}

/// A variant's open groups (or TCP ring), between rounds.
pub(crate) enum Runner {
    Differentiated(Vec<Group>, Vec<BucketId>),
    /// The groups, and the type of the buffer reduced.
    Exact(Vec<Group>, ValueFormat),
    Sparse(Vec<Group>, Option<SparseAllgather>),
    Tcp(Vec<Ring>),
}

impl Runner {
    pub(crate) async fn differentiated(
        mut groups: Vec<Group>,
        buckets: &[Layout],
        options: BucketOptions,
    ) -> Result<Self, BoxError> {
        let mut ids = Vec::new();
        for b in buckets {
            let regs = groups
                .iter_mut()
                .map(|g| g.register_bucket_with(b, options));
            let got: Result<Vec<BucketId>, _> = join_all(regs).await.into_iter().collect();
            ids.push(got?[0]);
        }
        Ok(Runner::Differentiated(groups, ids))
    }

    pub(crate) async fn round(
        &mut self,
        buckets: &[Layout],
        mut bufs: Vec<Vec<f32>>,
        round: usize,
        first_rank: usize,
    ) -> Result<Sample, BoxError> {
        // A 16-bit exact variant reduces its own type: the gradient is
        // rounded to it before the clock starts, as a bf16 model's gradient
        // would already be.
        let mut narrowed = match self {
            Runner::Exact(_, buffer_type) => Narrowed::of(*buffer_type, &bufs),
            _ => Narrowed::No,
        };
        let start = Instant::now();
        let before = self.bytes();
        let mut zero_filled = 0;
        match self {
            Runner::Differentiated(groups, ids) => {
                let mut offset = 0;
                for (b, id) in buckets.iter().zip(ids.iter()) {
                    let n = b.total_values() as usize;
                    let calls = groups.iter_mut().zip(bufs.iter_mut()).map(|(g, buf)| {
                        g.allreduce_differentiated(
                            *id,
                            &mut buf[offset..offset + n],
                            ReduceOp::Mean,
                        )
                    });
                    for report in join_all(calls).await {
                        let report = report?;
                        zero_filled += report
                            .received
                            .iter()
                            .flatten()
                            .map(|s| s.lossy().zero_filled_bytes)
                            .sum::<u64>();
                    }
                    offset += n;
                }
            }
            Runner::Exact(groups, _) => match &mut narrowed {
                Narrowed::No => exact_round(groups, buckets, &mut bufs).await?,
                Narrowed::Bf16(b) => exact_round(groups, buckets, b).await?,
                Narrowed::F16(b) => exact_round(groups, buckets, b).await?,
            },
            Runner::Sparse(groups, unequal) => {
                let rows: Vec<SparseRows> = bufs
                    .iter()
                    .enumerate()
                    .map(|(i, b)| sparse(first_rank + i, round, b, unequal.is_some()))
                    .collect();
                let how = unequal.unwrap_or_default();
                let calls = groups
                    .iter_mut()
                    .zip(&rows)
                    .map(|(g, m)| g.sparse_allgather(m, how));
                let mut gathered = Vec::new();
                for r in join_all(calls).await {
                    gathered.push(r?.0);
                }
                // The sum of duplicate rows stands for the reduced result.
                for (buf, g) in bufs.iter_mut().zip(&gathered) {
                    let sum = g.sum_duplicates();
                    buf.clear();
                    buf.extend_from_slice(&sum.values);
                }
            }
            Runner::Tcp(ring) => {
                bucket_by_bucket(
                    ring,
                    buckets,
                    &mut bufs,
                    async |r: &mut Ring, buf: &mut [f32]| r.allreduce(buf).await,
                )
                .await?
            }
        }
        let time = start.elapsed();
        let after = self.bytes();
        // Widening is exact, so the ranks' results compare bit for bit.
        narrowed.widen_into(&mut bufs);
        let ranks = bufs.len();
        let same = bufs.iter().all(|b| same_bits(b, &bufs[0]));
        Ok(Sample {
            time,
            bytes_per_rank: after.saturating_sub(before) as f64 / ranks as f64,
            zero_filled,
            same,
            digest: digest(&bufs[0]),
        })
    }

    /// The first local rank's paths to the others: rtt, congestion window,
    /// lost packets and PTO-driven probes so far.
    pub(crate) fn paths(&self) -> String {
        let group = match self {
            Runner::Differentiated(g, _) | Runner::Exact(g, _) | Runner::Sparse(g, _) => &g[0],
            Runner::Tcp(_) => return "kernel TCP".into(),
        };
        (0..group.world())
            .filter_map(|r| {
                group
                    .connection(r)
                    .map(|c| (r, c.stats(), controller_state(c)))
            })
            .map(|(r, s, c)| {
                format!(
                    "to {r}: rtt {:.1} ms cwnd {} KB lost {} sent {} [{c}]",
                    s.path.rtt.as_secs_f64() * 1e3,
                    s.path.cwnd / 1000,
                    s.path.lost_packets,
                    s.path.sent_packets
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Bytes sent by all ranks so far.
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            Runner::Differentiated(g, _) | Runner::Exact(g, _) | Runner::Sparse(g, _) => {
                g.iter().map(|g| g.bytes_sent()).sum()
            }
            Runner::Tcp(ring) => ring.iter().map(|r| r.sent).sum(),
        }
    }

    pub(crate) async fn close(self) {
        match self {
            Runner::Differentiated(g, _) | Runner::Exact(g, _) | Runner::Sparse(g, _) => {
                join_all(g.into_iter().map(|g| g.close())).await;
            }
            Runner::Tcp(_) => {}
        }
    }
}

/// Every bucket of one round through the exact allreduce (mean), on
/// every local rank at once, of buffers of type `T`.
pub(crate) async fn exact_round<T: Element>(
    groups: &mut [Group],
    buckets: &[Layout],
    bufs: &mut [Vec<T>],
) -> Result<(), BoxError> {
    bucket_by_bucket(
        groups,
        buckets,
        bufs,
        async |g: &mut Group, buf: &mut [T]| g.allreduce(buf, ReduceOp::Mean).await,
    )
    .await
}

/// Every bucket of one round in turn, each reduced by `reduce` on every
/// local rank at once (`ranks[i]` reduces its part of `bufs[i]`).
async fn bucket_by_bucket<R, T, E>(
    ranks: &mut [R],
    buckets: &[Layout],
    bufs: &mut [Vec<T>],
    reduce: impl AsyncFn(&mut R, &mut [T]) -> Result<(), E>,
) -> Result<(), BoxError>
where
    BoxError: From<E>,
{
    let mut offset = 0;
    for b in buckets {
        let n = b.total_values() as usize;
        let calls = ranks
            .iter_mut()
            .zip(bufs.iter_mut())
            .map(|(r, buf)| reduce(r, &mut buf[offset..offset + n]));
        for r in join_all(calls).await {
            r?;
        }
        offset += n;
    }
    Ok(())
}

/// FNV-1a over the values' bits.
pub(crate) fn digest(values: &[f32]) -> u64 {
    values.iter().fold(0xcbf2_9ce4_8422_2325, |h, v| {
        (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
    })
}

pub(crate) fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}
