//! Collectives among N ranks: the differentiated allreduce against the
//! all-reliable one, the exact one, the sparse allgather, and a ring
//! allreduce over kernel TCP of the same bytes.
//!
//! ```text
//! cargo run --release --bin allreduce_bench -- --ranks 4 --model resnet50 --rounds 10
//! ```
//!
//! By default every rank is a task of this process with an endpoint of
//! its own, on loopback. With `--rank` (or torchrun's `RANK`,
//! `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` in the environment, as
//! `scripts/testbed.sh` sets them) this process is one rank of a group
//! across processes or hosts: it joins rank 0 at the master address
//! (ports from `MASTER_PORT` up, one group per variant), listens on
//! `--listen-ip` (`GRADLANE_RANK_ADDR`), needs `--cert-dir` from the certs
//! tool (the same CA on every rank), and rank 0 prints the table. A
//! model's gradient is cut into buckets of about
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
//!
//! Value formats: `--format` takes one or more specs, `IMPORTANT` or
//! `IMPORTANT+LOSSY` (`f32`, `bf16`, `f16`; the lossy part also `log8`),
//! and the three reducing variants run once per spec, named after it:
//! `exact bf16` reduces a `bf16` buffer (the gradient rounded once, before
//! the clock starts, as a bf16 model's gradient would already be), and
//! `differentiated bf16+log8` reduces the `f32` gradient with its buckets'
//! important part in bf16 and its lossy levels in log8. So
//!
//! ```text
//! cargo run --release --bin allreduce_bench -- --ranks 3 --model resnet18 --format f32,bf16,bf16+log8
//! ```
//!
//! puts exact f32, exact bf16 and differentiated bf16+log8 (and the
//! others) side by side. With the default `f32` alone the names carry no
//! format, as before formats existed.

use gradlane_tools::cli as common;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use common::BoxError;
use futures_util::future::join_all;
use gradlane::{
    bf16, controller_state, f16, generate_certs, presets, BucketId, BucketOptions, ClassFormats,
    Config, Element, Faults, Group, GroupConfig, Layout, LossRecovery, ReduceOp, Rendezvous,
    SparseAllgather, SparseRows, TensorSpec, ValueFormat,
};
use gradlane_core::format::{narrow, widen};
use gradlane_core::rng::SplitMix64;
use gradlane_tools::cpu::CpuTime;
use std::net::SocketAddr;
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
    /// Run one rank of a group across processes: this rank's number. Unset:
    /// every rank runs in this process on loopback.
    #[arg(long, env = "RANK")]
    rank: Option<usize>,
    /// With `--rank`: ranks in the group (replaces `--ranks`).
    #[arg(long, env = "WORLD_SIZE", requires = "rank")]
    world: Option<usize>,
    /// With `--rank`: rank 0's address.
    #[arg(long, env = "MASTER_ADDR", requires = "rank")]
    master_addr: Option<std::net::IpAddr>,
    /// With `--rank`: the first port; variant k's group meets rank 0 at
    /// this port + 1 + k, the TCP ring listens at this port + 100 + rank.
    #[arg(long, env = "MASTER_PORT", default_value_t = 29500)]
    master_port: u16,
    /// With `--rank`: the address this rank listens on (the one the
    /// others reach it at).
    #[arg(long, env = "GRADLANE_RANK_ADDR", requires = "rank")]
    listen_ip: Option<std::net::IpAddr>,
    /// With `--rank`: a directory with `ca.pem`, `server.pem` and
    /// `server.key` from the certs tool, the same CA on every rank.
    #[arg(long, env = "GRADLANE_CERT_DIR", requires = "rank")]
    cert_dir: Option<std::path::PathBuf>,
    /// After every round, print the first rank's paths (quinn's rtt,
    /// congestion window, packets lost) per variant, to stderr.
    #[arg(long)]
    path_stats: bool,
    /// The QUIC ranks' congestion controller.
    #[arg(long, value_enum, default_value = "capped-bbr")]
    congestion: common::Cc,
    /// With `--rank`: the name the ranks' certificate is issued to (by
    /// default each rank's IP address, which the certificate must name).
    #[arg(long, requires = "rank")]
    server_name: Option<String>,
    /// Value formats on the wire, comma separated; the exact and both
    /// differentiated variants run once per spec. A spec is IMPORTANT or
    /// IMPORTANT+LOSSY, each one of f32, bf16, f16 (LOSSY also log8; it
    /// defaults to IMPORTANT). The exact variant reduces a buffer of the
    /// IMPORTANT type (the gradient rounded to it); the differentiated
    /// ones reduce the f32 gradient, its important chunks in IMPORTANT
    /// and its lossy levels in LOSSY. E.g. `f32,bf16,bf16+log8`.
    #[arg(long, value_delimiter = ',', value_parser = format_spec, default_value = "f32")]
    format: Vec<ClassFormats>,
    /// The differentiated variants' owners send the sums of the chunks
    /// that every rank sent lossy back in the lossy format (reliably, so
    /// every rank still ends with the same bits) instead of the important
    /// part's: fewer bytes back, at the lossy format's error.
    #[arg(long)]
    lossy_return: bool,
    /// Loss tolerances of the differentiated variant (the share of each
    /// tensor's chunks sent lossy), comma separated: one variant per value,
    /// named after it unless it is the default 0.2 alone.
    #[arg(long, value_delimiter = ',', value_parser = tolerance, default_value = "0.2")]
    loss_tolerance: Vec<f64>,
    /// UDP sockets per QUIC rank (`GroupConfig::sockets`; default: the
    /// library's, from the cores).
    #[arg(long)]
    sockets: Option<usize>,
}

/// A `--loss-tolerance` value: a share in `[0, 1]`.
fn tolerance(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if (0.0..=1.0).contains(&t) => Ok(t),
        _ => Err(format!("{s:?} is not a loss tolerance in [0, 1]")),
    }
}

/// A `--format` spec, `IMPORTANT` or `IMPORTANT+LOSSY`.
fn format_spec(spec: &str) -> Result<ClassFormats, String> {
    let (important, lossy) = spec.split_once('+').unwrap_or((spec, spec));
    let important: ValueFormat = important.trim().parse().map_err(|e| format!("{e}"))?;
    let lossy: ValueFormat = lossy.trim().parse().map_err(|e| format!("{e}"))?;
    if important == ValueFormat::Log8 {
        // log8 has no per-value round trip: it quantizes against a chunk's
        // scale, so it can neither be a buffer's type nor carry the part
        // that must arrive as sent.
        return Err(format!(
            "{spec:?}: log8 cannot be the important format (the important part travels \
             exact or rounded once: f32, bf16 or f16); log8 is for the lossy part, as in bf16+log8"
        ));
    }
    Ok(ClassFormats { important, lossy })
}

/// A spec as the user writes it: `bf16` when both parts agree, else
/// `bf16+log8`.
fn spec_name(formats: ClassFormats) -> String {
    match formats.important == formats.lossy {
        true => formats.important.to_string(),
        false => format!("{}+{}", formats.important, formats.lossy),
    }
}

/// Where this process's ranks are and how they meet.
#[derive(Debug, Clone)]
struct Placement {
    /// This process runs ranks `first..first + local` of `world`.
    first: usize,
    local: usize,
    world: usize,
    /// Rank 0's address, the listening IP and the certificate name; unset
    /// on loopback.
    across: Option<Across>,
    cert_dir: std::path::PathBuf,
}

#[derive(Debug, Clone)]
struct Across {
    master: std::net::IpAddr,
    port: u16,
    listen: std::net::IpAddr,
    server_name: Option<String>,
}

impl Placement {
    fn from_args(args: &Args) -> Result<Self, BoxError> {
        let Some(rank) = args.rank else {
            if args.ranks < 2 {
                return Err("--ranks must be at least 2".into());
            }
            let dir = std::env::temp_dir()
                .join(format!("gradlane-allreduce-bench-{}", std::process::id()));
            generate_certs(&dir, &["localhost", "127.0.0.1"])?;
            return Ok(Self {
                first: 0,
                local: args.ranks,
                world: args.ranks,
                across: None,
                cert_dir: dir,
            });
        };
        let world = args.world.ok_or("--rank needs --world (or WORLD_SIZE)")?;
        if world < 2 || rank >= world {
            return Err(format!(
                "rank {rank} of a group of {world}: need 2 or more ranks and rank < world"
            )
            .into());
        }
        let master = args
            .master_addr
            .ok_or("--rank needs --master-addr (or MASTER_ADDR)")?;
        let listen = args
            .listen_ip
            .ok_or("--rank needs --listen-ip (or GRADLANE_RANK_ADDR)")?;
        let cert_dir = args
            .cert_dir
            .clone()
            .ok_or("--rank needs --cert-dir (or GRADLANE_CERT_DIR)")?;
        if args.master_port > u16::MAX - 200 {
            return Err("--master-port leaves no room for the groups' ports".into());
        }
        Ok(Self {
            first: rank,
            local: 1,
            world,
            across: Some(Across {
                master,
                port: args.master_port,
                listen,
                server_name: args.server_name.clone(),
            }),
            cert_dir,
        })
    }

    /// Whether this process prints the table.
    fn reports(&self) -> bool {
        self.first == 0
    }

    fn ranks(&self) -> std::ops::Range<usize> {
        self.first..self.first + self.local
    }
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
    /// This process's CPU time over the timed rounds (all its ranks).
    cpu: CpuTime,
    /// Bytes this process's ranks sent over the timed rounds.
    bytes_local: f64,
}

/// What a variant of the table runs.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// The differentiated allreduce of the f32 gradient at this loss
    /// tolerance, its buckets' rounds in these formats.
    Differentiated {
        tolerance: f64,
        formats: ClassFormats,
    },
    /// The exact allreduce of a buffer of this type.
    Exact(ValueFormat),
    /// The sparse allgather; how unequal counts are gathered, if unequal.
    Sparse(Option<SparseAllgather>),
    /// The ring over kernel TCP.
    Tcp,
}

/// One row of the table per loss rate.
#[derive(Debug, Clone)]
struct Variant {
    name: String,
    kind: Kind,
    /// Seeds the QUIC ranks' fault injectors: the same for every format of
    /// a variant, so that formats meet the same draws.
    seed: u64,
}

/// The variants of a run: the differentiated, all-reliable and exact ones
/// once per format spec (the exact one once per important type), then the
/// sparse allgathers and the TCP ring. With the default `f32` alone the
/// names are the plain ones ("exact"), as before formats existed, so that
/// tables stay comparable; otherwise each says its format ("exact bf16",
/// "differentiated bf16+log8").
fn variants(formats: &[ClassFormats], lossy_return: bool, tolerances: &[f64]) -> Vec<Variant> {
    let plain = formats == [ClassFormats::F32] && !lossy_return;
    let named = |base: &str, spec: String| match plain {
        true => base.to_string(),
        false => format!("{base} {spec}"),
    };
    let default_tolerance = tolerances == [0.2];
    let mut out = Vec::new();
    let mut kinds: Vec<(&str, f64, u64)> = tolerances
        .iter()
        .map(|&t| ("differentiated", t, 100))
        .collect();
    kinds.push(("differentiated, all reliable", 0.0, 101));
    for (base, tolerance, seed) in kinds {
        for &f in formats {
            let mut name = named(base, spec_name(f));
            if lossy_return {
                name.push_str(", lossy return");
            }
            if !default_tolerance && tolerance > 0.0 {
                name.push_str(&format!(", tolerance {tolerance}"));
            }
            out.push(Variant {
                name,
                kind: Kind::Differentiated {
                    tolerance,
                    formats: f,
                },
                seed,
            });
        }
    }
    let mut types: Vec<ValueFormat> = Vec::new();
    for f in formats {
        if !types.contains(&f.important) {
            types.push(f.important);
        }
    }
    for t in types {
        out.push(Variant {
            name: named("exact", t.to_string()),
            kind: Kind::Exact(t),
            seed: 102,
        });
    }
    for (name, unequal, seed) in [
        ("sparse allgather, equal counts", None, 106),
        (
            "sparse allgather, unequal counts, allgatherv",
            Some(SparseAllgather::Allgatherv),
            107,
        ),
        (
            "sparse allgather, unequal counts, broadcast in order",
            Some(SparseAllgather::BroadcastInOrder),
            108,
        ),
    ] {
        out.push(Variant {
            name: name.to_string(),
            kind: Kind::Sparse(unequal),
            seed,
        });
    }
    out.push(Variant {
        name: "TCP ring".to_string(),
        kind: Kind::Tcp,
        seed: 0,
    });
    out
}

async fn run(args: Args) -> Result<(), BoxError> {
    if args.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    for &l in &args.losses {
        common::probability(&l.to_string())?;
    }
    let place = Placement::from_args(&args)?;
    let layout = presets::by_name(&args.model).ok_or("unknown model")?;
    let buckets = cut_buckets(&layout, args.bucket_mb << 20);
    let total: usize = layout.total_values() as usize;
    let skip =
        |name: &str| !args.only.is_empty() && !args.only.iter().any(|o| name.contains(o.as_str()));
    let world = place.world;
    // A spec given twice would only repeat its rows.
    let mut formats: Vec<ClassFormats> = Vec::new();
    for &f in &args.format {
        if !formats.contains(&f) {
            formats.push(f);
        }
    }
    let plain = formats == [ClassFormats::F32] && !args.lossy_return;
    let variants = variants(&formats, args.lossy_return, &args.loss_tolerance);
    // Across processes every QUIC group of every loss rate meets rank 0 at
    // a port of its own from MASTER_PORT + 1 on, and the TCP ring listens
    // from MASTER_PORT + 100: more groups than that would collide.
    let quic_groups = variants
        .iter()
        .filter(|v| !skip(&v.name) && !matches!(v.kind, Kind::Tcp))
        .count()
        * args.losses.len();
    if place.across.is_some() && quic_groups >= 100 {
        return Err(format!(
            "{quic_groups} groups (variants x loss rates) do not fit the 99 ports from \
             --master-port + 1 (the TCP ring's start at + 100): fewer formats, loss rates or \
             variants (--only)"
        )
        .into());
    }
    // Across processes a group of its own times the rounds and gathers
    // what each rank measured; its port is the first.
    let mut control = match place.across {
        Some(_) => Some(
            group(&place, 0, 0.0, 0.0, 0, control_transport(&args))
                .await?
                .remove(0),
        ),
        None => None,
    };
    if place.reports() {
        println!(
            "{} ranks{}, {} ({:.1} MB a gradient, {} buckets), {} rounds, {} ms delay each way; \
             bound per rank and round: 2(N-1)/N x {:.1} MB = {:.1} MB",
            world,
            if place.across.is_some() {
                " (one per process)"
            } else {
                " (tasks of one process, loopback)"
            },
            args.model,
            total as f64 * 4e-6,
            buckets.len(),
            args.rounds,
            args.delay_ms,
            total as f64 * 4e-6,
            2.0 * (world - 1) as f64 / world as f64 * total as f64 * 4e-6
        );
        if !plain {
            let specs: Vec<String> = formats.iter().map(|&f| spec_name(f)).collect();
            println!(
                "formats {}: exact reduces a buffer of the important type, differentiated the \
                 f32 gradient (important+lossy parts){}; MB sent are wire bytes, the bound and \
                 Gbit/s count the gradient at 4 bytes a value",
                specs.join(", "),
                if args.lossy_return {
                    ", the sums of lossy chunks returned in the lossy format"
                } else {
                    ""
                }
            );
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut next_group = 1;
    for &loss in &args.losses {
        // Every variant gets its groups at once; rounds interleave.
        let mut runners: Vec<Runner> = Vec::new();
        for variant in &variants {
            let name = variant.name.as_str();
            if skip(name) || (matches!(variant.kind, Kind::Tcp) && loss > 0.0) {
                continue;
            }
            if place.reports() {
                eprintln!("loss {loss}: setting up {name}");
            }
            let mut join = |tolerance: f64, seed: u64| {
                next_group += 1;
                let cc = args.congestion;
                let transport = Transport {
                    delay_ms: args.delay_ms,
                    congestion: cc,
                    sockets: args.sockets,
                };
                group(&place, next_group - 1, loss, tolerance, seed, transport)
            };
            let runner = match variant.kind {
                Kind::Differentiated { tolerance, formats } => {
                    let groups = join(tolerance, variant.seed).await?;
                    let options = BucketOptions {
                        recovery: LossRecovery::ZeroFill,
                        formats: Some(formats),
                        lossy_return: args.lossy_return,
                        ..BucketOptions::default()
                    };
                    Runner::differentiated(groups, &buckets, options).await?
                }
                Kind::Exact(buffer_type) => {
                    Runner::Exact(join(0.2, variant.seed).await?, buffer_type)
                }
                Kind::Sparse(unequal) => Runner::Sparse(join(0.2, variant.seed).await?, unequal),
                Kind::Tcp => Runner::Tcp(ring(&place, control.as_mut()).await?),
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
            let mut took = Vec::new();
            for (i, runner) in runners.iter_mut().enumerate() {
                let inputs: Vec<Vec<f32>> =
                    place.ranks().map(|r| gradient(r, round, total)).collect();
                if let Some(c) = control.as_mut() {
                    c.barrier().await?;
                }
                let cpu_before = CpuTime::now();
                let sample = runner.round(&buckets, inputs, round, place.first).await?;
                let cpu = CpuTime::now().since(&cpu_before);
                let sent_here = sample.bytes_per_rank * place.local as f64;
                let sample = match control.as_mut() {
                    Some(c) => gather(c, sample).await?,
                    None => sample,
                };
                took.push(format!("{:.0}", sample.time.as_secs_f64() * 1e3));
                if args.path_stats {
                    eprintln!("  {}: {}", rows[first + i].name, runner.paths());
                }
                if round == 0 {
                    continue; // warm-up
                }
                let row = &mut rows[first + i];
                row.times.push(sample.time);
                row.bytes_per_rank += sample.bytes_per_rank / args.rounds as f64;
                row.zero_filled += sample.zero_filled;
                row.mismatches += usize::from(!sample.same);
                row.cpu.add(&cpu);
                row.bytes_local += sent_here;
            }
            if place.reports() {
                eprintln!(
                    "loss {loss}: round {round} of {}{}: {} ms",
                    args.rounds,
                    if round == 0 { " (warm-up)" } else { "" },
                    took.join(" / ")
                );
            }
        }
        for runner in runners {
            runner.close().await;
        }
    }
    if let Some(c) = control {
        c.close().await;
    }
    if place.reports() {
        print_table(&rows, world, total);
    }
    Ok(())
}

/// Every rank's sample of one round, combined: the slowest rank's time,
/// the mean bytes, the zero fill of all, and whether every rank ended
/// with the same bits (compared by a digest of each rank's result).
async fn gather(control: &mut Group, sample: Sample) -> Result<Sample, BoxError> {
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
struct Sample {
    time: Duration,
    bytes_per_rank: f64,
    zero_filled: u64,
    /// Every rank of this process ended with the same bits.
    same: bool,
    /// A digest of the first rank's result, for comparing across processes.
    digest: u64,
}

enum Runner {
    Differentiated(Vec<Group>, Vec<BucketId>),
    /// The groups, and the type of the buffer reduced.
    Exact(Vec<Group>, ValueFormat),
    Sparse(Vec<Group>, Option<SparseAllgather>),
    Tcp(Vec<Ring>),
}

impl Runner {
    async fn differentiated(
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

    async fn round(
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
    fn paths(&self) -> String {
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
    fn bytes(&self) -> u64 {
        match self {
            Runner::Differentiated(g, _) | Runner::Exact(g, _) | Runner::Sparse(g, _) => {
                g.iter().map(|g| g.bytes_sent()).sum()
            }
            Runner::Tcp(ring) => ring.iter().map(|r| r.sent).sum(),
        }
    }

    async fn close(self) {
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
async fn exact_round<T: Element>(
    groups: &mut [Group],
    buckets: &[Layout],
    bufs: &mut [Vec<T>],
) -> Result<(), BoxError> {
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
    Ok(())
}

/// One round's buffers of a 16-bit exact variant, one per local rank
/// (`No`: the variant reduces the f32 buffers themselves).
enum Narrowed {
    No,
    Bf16(Vec<Vec<bf16>>),
    F16(Vec<Vec<f16>>),
}

impl Narrowed {
    /// `grads` rounded once to `buffer_type`.
    fn of(buffer_type: ValueFormat, grads: &[Vec<f32>]) -> Self {
        fn to<T: Element>(grads: &[Vec<f32>]) -> Vec<Vec<T>> {
            grads
                .iter()
                .map(|g| {
                    let mut out = vec![T::from_f32(0.0); g.len()];
                    narrow(g, &mut out);
                    out
                })
                .collect()
        }
        match buffer_type {
            ValueFormat::Bf16 => Narrowed::Bf16(to(grads)),
            ValueFormat::F16 => Narrowed::F16(to(grads)),
            // f32; log8 is refused as a buffer type by `format_spec`.
            _ => Narrowed::No,
        }
    }

    /// The reduced values back into `bufs`, exactly.
    fn widen_into(&self, bufs: &mut [Vec<f32>]) {
        fn back<T: Element>(narrowed: &[Vec<T>], bufs: &mut [Vec<f32>]) {
            for (n, b) in narrowed.iter().zip(bufs.iter_mut()) {
                widen(n, b);
            }
        }
        match self {
            Narrowed::No => {}
            Narrowed::Bf16(n) => back(n, bufs),
            Narrowed::F16(n) => back(n, bufs),
        }
    }
}

/// FNV-1a over the values' bits.
fn digest(values: &[f32]) -> u64 {
    values.iter().fold(0xcbf2_9ce4_8422_2325, |h, v| {
        (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
    })
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// How a group's ranks send: the delay each adds, the congestion
/// controller, the sockets (the library's default if unset).
#[derive(Debug, Clone, Copy)]
struct Transport {
    delay_ms: u64,
    congestion: common::Cc,
    sockets: Option<usize>,
}

/// The group across processes that times the rounds: no delay, one socket.
fn control_transport(args: &Args) -> Transport {
    Transport {
        delay_ms: 0,
        congestion: args.congestion,
        sockets: Some(1),
    }
}

/// This process's ranks of group number `index` (a fresh group per
/// variant), each behind its fault injector: all `world` ranks on
/// loopback, or this process's one rank meeting rank 0 at the master
/// address, port `master_port + index`.
async fn group(
    place: &Placement,
    index: u16,
    loss: f64,
    loss_tolerance: f64,
    seed: u64,
    transport: Transport,
) -> Result<Vec<Group>, BoxError> {
    let Transport {
        delay_ms,
        congestion,
        sockets,
    } = transport;
    let (rendezvous, server_name) = match &place.across {
        None => {
            let root = std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
            let listen = SocketAddr::new(root.ip(), 0);
            (Rendezvous::Root { root, listen }, None)
        }
        Some(a) => {
            let root = SocketAddr::new(a.master, a.port + index);
            let listen = SocketAddr::new(a.listen, if place.first == 0 { root.port() } else { 0 });
            (Rendezvous::Root { root, listen }, a.server_name.clone())
        }
    };
    let dir = &place.cert_dir;
    let joins = place.ranks().map(|r| {
        let mut c = GroupConfig::new(
            r,
            place.world,
            rendezvous.clone(),
            dir.join("server.pem"),
            dir.join("server.key"),
            dir.join("ca.pem"),
        );
        c.server_name = server_name.clone();
        c.link = Config {
            loss_tolerance,
            congestion: congestion.into(),
            faults: (loss > 0.0 || delay_ms > 0).then(|| Faults {
                delay: Duration::from_millis(delay_ms),
                loss_out: loss,
                seed: seed * 1000 + r as u64,
                ..Faults::default()
            }),
            ..Config::default()
        };
        if let Some(sockets) = sockets {
            c.sockets = sockets;
        }
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

/// This process's ranks joined in a ring of TCP connections: all of them
/// on loopback, or this process's one rank listening at its address,
/// port `master_port + 100 + rank`, having learnt the others' addresses
/// through `control`.
async fn ring(place: &Placement, control: Option<&mut Group>) -> Result<Vec<Ring>, BoxError> {
    let world = place.world;
    let (listeners, addrs) = match (&place.across, control) {
        (Some(a), Some(control)) => {
            let std::net::IpAddr::V4(ip) = a.listen else {
                return Err("the TCP ring across processes takes IPv4 addresses".into());
            };
            let port = a.port + 100;
            let listener = TcpListener::bind((ip, port + place.first as u16)).await?;
            // Each rank's IPv4 address in two 16-bit halves, exact in f32s.
            let o = ip.octets();
            let mine = [
                f32::from(u16::from_be_bytes([o[0], o[1]])),
                f32::from(u16::from_be_bytes([o[2], o[3]])),
            ];
            let mut all = vec![0f32; 2 * world];
            control.allgather(&mine, &mut all).await?;
            let addrs = all
                .chunks(2)
                .enumerate()
                .map(|(r, h)| {
                    let [a, b] = (h[0] as u16).to_be_bytes();
                    let [c, d] = (h[1] as u16).to_be_bytes();
                    SocketAddr::from(([a, b, c, d], port + r as u16))
                })
                .collect();
            (vec![listener], addrs)
        }
        _ => {
            let mut listeners = Vec::new();
            for _ in 0..world {
                listeners.push(TcpListener::bind("127.0.0.1:0").await?);
            }
            let addrs: Vec<SocketAddr> = listeners
                .iter()
                .map(|l| l.local_addr())
                .collect::<Result<_, _>>()?;
            (listeners, addrs)
        }
    };
    let connects = place
        .ranks()
        .map(|r| connect_retrying(addrs[(r + 1) % world]));
    let accepts = listeners.iter().map(|l| l.accept());
    let (nexts, prevs) = tokio::join!(join_all(connects), join_all(accepts));
    let mut ring = Vec::new();
    for (r, (next, prev)) in place.ranks().zip(nexts.into_iter().zip(prevs)) {
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

/// Connects to `addr`, trying again for up to 30 s while nothing listens
/// there yet (the next rank may not have bound its port).
async fn connect_retrying(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect(addr).await {
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => return other,
        }
    }
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
    println!(
        "CPU s per GB sent: this process's user + system CPU time over the timed rounds \
         (every rank it runs) per GB its ranks sent"
    );
    println!("| variant | loss | rounds | median ms | p99 ms | Gbit/s of gradient (median) | MB sent per rank | vs 2(N-1)/N bound | zero-filled MB/round | ranks differ | CPU s per GB sent |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let median = percentile(&r.times, 0.5);
        let gbits = total as f64 * 32.0 / (median * 1e-3) / 1e9;
        println!(
            "| {} | {:.0}% | {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2}x | {:.2} | {} | {} |",
            r.name,
            r.loss * 100.0,
            r.times.len(),
            median,
            percentile(&r.times, 0.99),
            gbits,
            r.bytes_per_rank / 1e6,
            r.bytes_per_rank / bound,
            r.zero_filled as f64 / 1e6 / r.times.len().max(1) as f64,
            r.mismatches,
            r.cpu
                .per_gb(r.bytes_local as u64)
                .map_or("-".into(), |v| format!("{v:.2}"))
        );
    }
}
