//! Collectives among N ranks: the differentiated allreduce against the
//! all-reliable one, the exact one, the sparse allgather, and a ring
//! allreduce over kernel TCP of the same bytes.
//!
//! ```text
//! cargo run --release --bin allreduce_bench -- --ranks 4 --model resnet50 --rounds 10
//! ```
//!
//! Every rank is a task of this process with an endpoint of its own, on
//! loopback. A model's gradient is cut into buckets of about
//! `--bucket-mb` (consecutive tensors, as DDP does) and each round reduces
//! every bucket in turn, on every rank at once (every variant but the
//! sparse allgather, which gathers rows of the whole gradient). The QUIC ranks sit behind
//! the seeded fault-injecting socket (each rank drops a share `loss` of
//! what it sends, so every packet meets that loss once, and delays what
//! it sends by `--delay-ms`); the TCP ring runs on the kernel's loopback, lossless.
//! After a warm-up round, the timed rounds of every variant are
//! interleaved, so a slow spell of the machine hits all of them alike.
//!
//! Variants:
//! - differentiated: [`Group::allreduce_differentiated`] with the default
//!   loss tolerance (20% of each tensor's chunks lossy), zero fill;
//! - differentiated, all reliable: the same with loss tolerance 0;
//! - exact: [`Group::allreduce`] on the links' exact messages;
//! - sparse allgather, equal / unequal counts: 1% of the gradient's rows
//!   (rows of 256 values), the same count on every rank or counts that
//!   differ, with the allgatherv or the broadcast in rank order;
//! - TCP ring: a ring allreduce (reduce-scatter then allgather) over
//!   tokio TCP streams.

use gradlane_tools::cli as common;

use clap::Parser;
use common::BoxError;
use futures_util::future::join_all;
use gradlane::{
    generate_certs, presets, BucketId, Config, Faults, Group, GroupConfig, Layout, LossRecovery,
    ReduceOp, Rendezvous, SparseAllgather, SparseRows, TensorSpec,
};
use gradlane_core::rng::SplitMix64;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Collectives among N ranks on loopback: a table per variant.
#[derive(Debug, Parser)]
#[command(name = "allreduce_bench")]
struct Args {
    /// Ranks in the group.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Model preset whose gradients are reduced.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(presets::NAMES), default_value = "resnet50")]
    model: String,
    /// Buckets of about this many MB (consecutive tensors).
    #[arg(long, default_value_t = 25)]
    bucket_mb: usize,
    /// Timed rounds per variant (after one warm-up round).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Injected loss probabilities of the QUIC ranks, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.0, 0.01, 0.05])]
    losses: Vec<f64>,
    /// One-way delay each QUIC rank adds to what it sends, in milliseconds.
    #[arg(long, default_value_t = 1)]
    delay_ms: u64,
    /// Only the variants whose names contain one of these.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

fn main() -> std::process::ExitCode {
    common::main("allreduce_bench", run)
}

/// One variant's measurements at one loss rate.
#[derive(Debug, Default)]
struct Row {
    name: String,
    loss: f64,
    times: Vec<Duration>,
    /// Bytes each rank sent per round, averaged over ranks and rounds.
    bytes_per_rank: f64,
    zero_filled: u64,
    /// Rounds after which the ranks' results differed.
    mismatches: usize,
}

const VARIANTS: [&str; 7] = [
    "differentiated",
    "differentiated, all reliable",
    "exact",
    "sparse allgather, equal counts",
    "sparse allgather, unequal counts, allgatherv",
    "sparse allgather, unequal counts, broadcast in order",
    "TCP ring",
];

async fn run(args: Args) -> Result<(), BoxError> {
    if args.ranks < 2 {
        return Err("--ranks must be at least 2".into());
    }
    if args.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    for &l in &args.losses {
        common::probability(&l.to_string())?;
    }
    let layout = presets::by_name(&args.model).ok_or("unknown model")?;
    let buckets = cut_buckets(&layout, args.bucket_mb << 20);
    let total: usize = layout.total_values() as usize;
    let dir = std::env::temp_dir().join(format!("gradlane-allreduce-bench-{}", std::process::id()));
    generate_certs(&dir, &["localhost", "127.0.0.1"])?;
    let skip =
        |name: &str| !args.only.is_empty() && !args.only.iter().any(|o| name.contains(o.as_str()));
    println!(
        "{} ranks, {} ({:.1} MB a gradient, {} buckets), {} rounds, {} ms delay each way; \
         bound per rank and round: 2(N-1)/N x {:.1} MB = {:.1} MB",
        args.ranks,
        args.model,
        total as f64 * 4e-6,
        buckets.len(),
        args.rounds,
        args.delay_ms,
        total as f64 * 4e-6,
        2.0 * (args.ranks - 1) as f64 / args.ranks as f64 * total as f64 * 4e-6
    );
    let mut rows: Vec<Row> = Vec::new();
    for &loss in &args.losses {
        // Every variant gets its groups at once; rounds interleave.
        let mut runners: Vec<Runner> = Vec::new();
        for (v, name) in VARIANTS.iter().enumerate() {
            if skip(name) || (name.starts_with("TCP") && loss > 0.0) {
                continue;
            }
            eprintln!("loss {loss}: setting up {name}");
            let runner = match v {
                0 | 1 => {
                    let tolerance = if v == 0 { 0.2 } else { 0.0 };
                    let groups = group(
                        &dir,
                        args.ranks,
                        loss,
                        args.delay_ms,
                        tolerance,
                        100 + v as u64,
                    )
                    .await?;
                    Runner::differentiated(groups, &buckets).await?
                }
                2 => Runner::Exact(group(&dir, args.ranks, loss, args.delay_ms, 0.2, 102).await?),
                3..=5 => {
                    let groups =
                        group(&dir, args.ranks, loss, args.delay_ms, 0.2, 103 + v as u64).await?;
                    let unequal = match v {
                        3 => None,
                        4 => Some(SparseAllgather::Allgatherv),
                        _ => Some(SparseAllgather::BroadcastInOrder),
                    };
                    Runner::Sparse(groups, unequal)
                }
                _ => Runner::Tcp(ring(args.ranks).await?),
            };
            rows.push(Row {
                name: name.to_string(),
                loss,
                ..Row::default()
            });
            runners.push(runner);
        }
        let first = rows.len() - runners.len();
        for round in 0..=args.rounds {
            for (i, runner) in runners.iter_mut().enumerate() {
                let inputs: Vec<Vec<f32>> =
                    (0..args.ranks).map(|r| gradient(r, round, total)).collect();
                let sample = runner.round(&buckets, inputs, round).await?;
                if round == 0 {
                    continue; // warm-up
                }
                let row = &mut rows[first + i];
                row.times.push(sample.time);
                row.bytes_per_rank += sample.bytes_per_rank / args.rounds as f64;
                row.zero_filled += sample.zero_filled;
                row.mismatches += usize::from(!sample.same);
            }
            eprintln!("loss {loss}: round {round} of {}", args.rounds);
        }
        for runner in runners {
            runner.close().await;
        }
    }
    print_table(&rows, args.ranks, total);
    Ok(())
}

/// What one round of a variant did.
struct Sample {
    time: Duration,
    bytes_per_rank: f64,
    zero_filled: u64,
    /// Every rank ended with the same bits.
    same: bool,
}

enum Runner {
    Differentiated(Vec<Group>, Vec<BucketId>),
    Exact(Vec<Group>),
    Sparse(Vec<Group>, Option<SparseAllgather>),
    Tcp(Vec<Ring>),
}

impl Runner {
    async fn differentiated(mut groups: Vec<Group>, buckets: &[Layout]) -> Result<Self, BoxError> {
        let mut ids = Vec::new();
        for b in buckets {
            let regs = groups
                .iter_mut()
                .map(|g| g.register_bucket(b, LossRecovery::ZeroFill));
            let got: Result<Vec<BucketId>, _> = join_all(regs).await.into_iter().collect();
            ids.push(got?[0]);
        }
        Ok(Runner::Differentiated(groups, ids))
    }

    async fn round(
        &mut self,
        buckets: &[Layout],
        mut bufs: Vec<Vec<f32>>,
        round: usize,
    ) -> Result<Sample, BoxError> {
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
            Runner::Exact(groups) => {
                let mut offset = 0;
                for b in buckets {
                    let n = b.total_values() as usize;
                    let calls = groups
                        .iter_mut()
                        .zip(bufs.iter_mut())
                        .map(|(g, buf)| g.allreduce(&mut buf[offset..offset + n], ReduceOp::Mean));
                    for r in join_all(calls).await {
                        r?;
                    }
                    offset += n;
                }
            }
            Runner::Sparse(groups, unequal) => {
                let world = groups.len();
                let rows: Vec<SparseRows> = (0..world)
                    .map(|r| sparse(r, round, &bufs[r], unequal.is_some()))
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
                let mut offset = 0;
                for b in buckets {
                    let n = b.total_values() as usize;
                    let calls = ring
                        .iter_mut()
                        .zip(bufs.iter_mut())
                        .map(|(r, buf)| r.allreduce(&mut buf[offset..offset + n]));
                    for r in join_all(calls).await {
                        r?;
                    }
                    offset += n;
                }
            }
        }
        let time = start.elapsed();
        let after = self.bytes();
        let ranks = bufs.len();
        let same = bufs.iter().all(|b| same_bits(b, &bufs[0]));
        Ok(Sample {
            time,
            bytes_per_rank: after.saturating_sub(before) as f64 / ranks as f64,
            zero_filled,
            same,
        })
    }

    /// Bytes sent by all ranks so far.
    fn bytes(&self) -> u64 {
        match self {
            Runner::Differentiated(g, _) | Runner::Exact(g) | Runner::Sparse(g, _) => {
                g.iter().map(|g| g.bytes_sent()).sum()
            }
            Runner::Tcp(ring) => ring.iter().map(|r| r.sent).sum(),
        }
    }

    async fn close(self) {
        match self {
            Runner::Differentiated(g, _) | Runner::Exact(g) | Runner::Sparse(g, _) => {
                join_all(g.into_iter().map(|g| g.close())).await;
            }
            Runner::Tcp(_) => {}
        }
    }
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A group of `world` ranks on loopback, each behind its fault injector.
async fn group(
    dir: &Path,
    world: usize,
    loss: f64,
    delay_ms: u64,
    loss_tolerance: f64,
    seed: u64,
) -> Result<Vec<Group>, BoxError> {
    let root = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
    let joins = (0..world).map(|r| {
        let mut c = GroupConfig::new(
            r,
            world,
            Rendezvous::Root {
                root,
                listen: "127.0.0.1:0".parse().unwrap_or(root),
            },
            dir.join("server.pem"),
            dir.join("server.key"),
            dir.join("ca.pem"),
        );
        c.link = Config {
            loss_tolerance,
            faults: (loss > 0.0 || delay_ms > 0).then(|| Faults {
                delay: Duration::from_millis(delay_ms),
                loss_out: loss,
                seed: seed * 1000 + r as u64,
                ..Faults::default()
            }),
            ..Config::default()
        };
        Group::join(c)
    });
    let groups: Result<Vec<Group>, _> = join_all(joins).await.into_iter().collect();
    Ok(groups?)
}

/// The model's tensors cut into buckets of about `bytes` (consecutive
/// tensors; a tensor larger than that is a bucket of its own).
fn cut_buckets(layout: &Layout, bytes: usize) -> Vec<Layout> {
    let mut buckets = Vec::new();
    let mut current: Vec<TensorSpec> = Vec::new();
    let mut size = 0;
    for (t, spec) in layout.tensors().iter().enumerate() {
        current.push(spec.clone());
        size += layout.tensor_len(t) * 4;
        if size >= bytes {
            buckets.extend(Layout::new(std::mem::take(&mut current)));
            size = 0;
        }
    }
    if !current.is_empty() {
        buckets.extend(Layout::new(current));
    }
    buckets
}

/// A rank's gradient of `n` values for round `round`.
fn gradient(rank: usize, round: usize, n: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(((rank as u64) << 32) | round as u64);
    let mut scale = 1.0f32;
    (0..n)
        .map(|i| {
            if i % 256 == 0 {
                scale = (rng.next_f64() as f32 * 6.0).exp() * 1e-3;
            }
            (rng.next_f64() as f32 - 0.5) * scale
        })
        .collect()
}

/// 1% of the gradient's rows of 256 values: the same count on every rank,
/// or counts from 50% to 150% of it.
fn sparse(rank: usize, round: usize, grad: &[f32], unequal: bool) -> SparseRows {
    let width = 256;
    let height = (grad.len() / width) as u64;
    let base = (height as usize / 100).max(1);
    let count = match unequal {
        true => base / 2 + base * rank / 2,
        false => base,
    };
    let mut rng = SplitMix64::new(((rank as u64) << 32) | round as u64 | 1 << 20);
    let rows: Vec<u64> = (0..count).map(|_| rng.next_u64() % height).collect();
    let values = rows
        .iter()
        .flat_map(|&r| {
            grad[r as usize * width..(r as usize + 1) * width]
                .iter()
                .copied()
        })
        .collect();
    SparseRows {
        height,
        width,
        rows,
        values,
    }
}

/// One rank of a ring over kernel TCP.
struct Ring {
    rank: usize,
    world: usize,
    next: TcpStream,
    prev: TcpStream,
    sent: u64,
}

/// `world` ranks joined in a ring of TCP connections on loopback.
async fn ring(world: usize) -> Result<Vec<Ring>, BoxError> {
    let mut listeners = Vec::new();
    for _ in 0..world {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
    }
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()?;
    let connects = (0..world).map(|r| TcpStream::connect(addrs[(r + 1) % world]));
    let accepts = listeners.iter().map(|l| l.accept());
    let (nexts, prevs) = tokio::join!(join_all(connects), join_all(accepts));
    let mut ring = Vec::new();
    for (r, (next, prev)) in nexts.into_iter().zip(prevs).enumerate() {
        let (next, (prev, _)) = (next?, prev?);
        next.set_nodelay(true)?;
        ring.push(Ring {
            rank: r,
            world,
            next,
            prev,
            sent: 0,
        });
    }
    Ok(ring)
}

impl Ring {
    /// The ring allreduce (mean): N-1 steps of reduce-scatter, N-1 of
    /// allgather, each sending one segment to the next rank while taking
    /// one from the previous.
    async fn allreduce(&mut self, buf: &mut [f32]) -> Result<(), BoxError> {
        let (n, w) = (buf.len(), self.world);
        let seg = |i: usize| (i % w) * n / w..((i % w) + 1) * n / w;
        let mut incoming = vec![0f32; n / w + 1];
        for phase in 0..2 {
            for step in 0..w - 1 {
                let send = seg(self.rank + w - step + if phase == 0 { 0 } else { 1 });
                let recv = seg(self.rank + w - step - 1 + if phase == 0 { 0 } else { 1 });
                let out: Vec<u8> = bytemuck::cast_slice(&buf[send.clone()]).to_vec();
                let into = &mut incoming[..recv.len()];
                let (w_res, r_res) = tokio::join!(
                    self.next.write_all(&out),
                    self.prev.read_exact(bytemuck::cast_slice_mut(into))
                );
                w_res?;
                r_res?;
                self.sent += out.len() as u64;
                match phase {
                    0 => buf[recv.clone()]
                        .iter_mut()
                        .zip(into.iter())
                        .for_each(|(a, b)| *a += b),
                    _ => buf[recv.clone()].copy_from_slice(into),
                }
            }
        }
        let scale = 1.0 / w as f32;
        buf.iter_mut().for_each(|v| *v *= scale);
        Ok(())
    }
}

fn percentile(times: &[Duration], p: f64) -> f64 {
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let i = ((ms.len() as f64 - 1.0) * p).round() as usize;
    ms.get(i).copied().unwrap_or(0.0)
}

fn print_table(rows: &[Row], ranks: usize, total: usize) {
    let bound = 2.0 * (ranks - 1) as f64 / ranks as f64 * total as f64 * 4.0;
    println!();
    println!("| variant | loss | rounds | median ms | p99 ms | Gbit/s of gradient (median) | MB sent per rank | vs 2(N-1)/N bound | zero-filled MB/round | ranks differ |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let median = percentile(&r.times, 0.5);
        let gbits = total as f64 * 32.0 / (median * 1e-3) / 1e9;
        println!(
            "| {} | {:.0}% | {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2}x | {:.2} | {} |",
            r.name,
            r.loss * 100.0,
            r.times.len(),
            median,
            percentile(&r.times, 0.99),
            gbits,
            r.bytes_per_rank / 1e6,
            r.bytes_per_rank / bound,
            r.zero_filled as f64 / 1e6 / r.times.len().max(1) as f64,
            r.mismatches
        );
    }
}
