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
//! [`Group::allreduce_differentiated`]: gradlane::Group::allreduce_differentiated
//! [`Group::allreduce`]: gradlane::Group::allreduce
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

mod formats;
mod inputs;
mod placement;
mod ring;
mod runner;
mod table;
mod variants;

use gradlane_tools::cli as common;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use common::BoxError;
use gradlane::{BucketOptions, ClassFormats, LossRecovery};
use gradlane_tools::cpu::CpuTime;

use formats::spec_name;
use inputs::{cut_buckets, gradient};
use placement::{control_transport, group, Placement, Transport};
use ring::ring;
use runner::{gather, Runner};
use table::{print_table, Row};
use variants::{variants, Kind};

/// Collectives among N ranks on loopback: a table per variant.
#[derive(Debug, Parser)]
#[command(name = "allreduce_bench")]
struct Args {
    /// Ranks in the group.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Model preset whose gradients are reduced.
    #[arg(long, value_parser = common::model_names(), default_value = "resnet50")]
    model: String,
    /// Buckets of about this many MB (consecutive tensors).
    #[arg(long, default_value_t = 25)]
    bucket_mb: usize,
    #[command(flatten)]
    sweep: common::Sweep,
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
    #[arg(long, value_delimiter = ',', value_parser = formats::format_spec, default_value = "f32")]
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
    #[arg(long, value_delimiter = ',', value_parser = formats::tolerance, default_value = "0.2")]
    loss_tolerance: Vec<f64>,
    /// UDP sockets per QUIC rank (`GroupConfig::sockets`; default: the
    /// library's, from the cores).
    #[arg(long)]
    sockets: Option<usize>,
}

fn main() -> std::process::ExitCode {
    common::main("allreduce_bench", run)
}

async fn run(args: Args) -> Result<(), BoxError> {
    args.sweep.check()?;
    let place = Placement::from_args(&args)?;
    let layout = common::preset(&args.model)?;
    let buckets = cut_buckets(&layout, args.bucket_mb << 20);
    let total: usize = layout.total_values() as usize;
    let skip = |name: &str| common::left_out(&args.only, name);
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
        * args.sweep.losses.len();
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
            args.sweep.rounds,
            args.sweep.delay_ms,
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
    for &loss in &args.sweep.losses {
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
                    delay_ms: args.sweep.delay_ms,
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
        for round in 0..=args.sweep.rounds {
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
                row.bytes_per_rank += sample.bytes_per_rank / args.sweep.rounds as f64;
                row.zero_filled += sample.zero_filled;
                row.mismatches += usize::from(!sample.same);
                row.cpu.add(&cpu);
                row.bytes_local += sent_here;
            }
            if place.reports() {
                eprintln!(
                    "loss {loss}: round {round} of {}{}: {} ms",
                    args.sweep.rounds,
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
