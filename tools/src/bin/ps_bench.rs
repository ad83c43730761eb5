//! Parameter-server updates per second over loopback gradlane links.
//!
//! ```text
//! cargo run --release --bin ps_bench -- --workers 4 --model resnet18 --seconds 10
//! ```
//!
//! One process: an OrMo server ([`gradlane::ps_net::run`]) and K worker
//! tasks, each on its own QUIC link with seeded injected loss. A worker
//! pushes a precomputed synthetic gradient as fast as the server answers
//! (no compute time: this measures the transport and the server), and gets
//! the full parameters back, exactly, after every push. Variants, one after
//! the other in the same run:
//!
//! - gradlane rounds (default classification: 80% of chunks important);
//! - gradlane rounds with every chunk important (all reliable);
//! - codec frames on the reliable request stream (top 1% of values).
//!
//! Both ends share this machine's cores, so the figure is a floor for a
//! server with the network to itself.

use gradlane_tools::cli as common;
use gradlane_tools::local_certs::localhost_certs;

use clap::Parser;
use common::{grads, BoxError};
use gradlane::codec::{Selection, DEFAULT_BASE};
use gradlane::ps::{OrderedMomentum, OrderedMomentumConfig};
use gradlane::ps_net::{self, Compression, ServerHandle, Worker};
use gradlane::CertFiles;
use gradlane::Layout;
use gradlane::{Config, Endpoint, Faults};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Parameter-server updates per second over loopback links.
#[derive(Debug, Parser)]
#[command(name = "ps_bench")]
struct Args {
    /// Workers K.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Model preset.
    #[arg(long, default_value = "resnet18")]
    model: String,
    /// Seconds per variant (after each worker's first push).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Injected loss on each worker's link, each direction.
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Codec variant: fraction of values kept.
    #[arg(long, default_value_t = 0.01)]
    keep: f64,
}

fn main() -> std::process::ExitCode {
    common::main("ps_bench", run)
}

/// One variant's outcome.
struct Row {
    name: &'static str,
    updates: u64,
    elapsed: Duration,
    up_bytes: f64,
    zero_filled: u64,
    latencies: Vec<Duration>,
}

async fn run(a: Args) -> Result<(), BoxError> {
    let layout = common::preset(&a.model)?;
    let (dir, certs) = localhost_certs("ps-bench")?;
    let n = layout.total_values() as usize;
    println!(
        "ps_bench: {} ({} values, {:.1} MB), K = {}, {:.0}% loss each way, {} s per variant",
        a.model,
        n,
        n as f64 * 4e-6,
        a.workers,
        a.loss * 100.0,
        a.seconds
    );
    let keep = ((n as f64 * a.keep) as usize).max(1);
    let variants: [(&'static str, Compression, f64); 3] = [
        ("gradlane rounds", Compression::Rounds, 0.8),
        ("rounds, all reliable", Compression::Rounds, 1.0),
        (
            "codec frames",
            Compression::Codec {
                selection: Selection::TopK(keep),
                base: DEFAULT_BASE,
            },
            0.8,
        ),
    ];
    let mut rows = Vec::new();
    for (name, compression, ratio) in variants {
        let row = variant(&a, &layout, &certs, name, compression, ratio).await?;
        println!(
            "  {name}: {} updates in {:.1} s",
            row.updates,
            row.elapsed.as_secs_f64()
        );
        rows.push(row);
    }
    println!();
    println!("| variant | updates/s | vs all reliable | push p50 ms | push p99 ms | MB up/update | zero-filled MB/update |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let reliable = rows[1].updates as f64 / rows[1].elapsed.as_secs_f64();
    for r in &mut rows {
        r.latencies.sort();
        let rate = r.updates as f64 / r.elapsed.as_secs_f64();
        let pct = |q: f64| {
            r.latencies
                .get(((r.latencies.len() as f64 - 1.0) * q).round() as usize)
                .map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        let per = r.updates.max(1) as f64;
        println!(
            "| {} | {:.2} | {:.2}x | {:.0} | {:.0} | {:.1} | {:.2} |",
            r.name,
            rate,
            rate / reliable,
            pct(0.5),
            pct(0.99),
            r.up_bytes / per / 1e6,
            r.zero_filled as f64 / per / 1e6
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn variant(
    a: &Args,
    layout: &Layout,
    certs: &CertFiles,
    name: &'static str,
    compression: Compression,
    ratio: f64,
) -> Result<Row, BoxError> {
    let n = layout.total_values() as usize;
    let cfg = OrderedMomentumConfig {
        workers: a.workers,
        momentum: 0.9,
        learning_rate: 1e-3,
    };
    let handle = ServerHandle::new(OrderedMomentum::new(cfg, vec![0.0; n])?);
    let server = Endpoint::server(
        "127.0.0.1:0".parse()?,
        &certs.server_cert,
        &certs.server_key,
        Config::default(),
    )?;
    let addr = server.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = handle.clone();
    let serving = tokio::spawn(async move { ps_net::run(&server, h, stopped).await });

    let grad = grads(layout, 7);
    let budget = Duration::from_secs(a.seconds);
    let mut tasks = Vec::new();
    for w in 0..a.workers {
        let (layout, grad, ca) = (layout.clone(), grad.clone(), certs.ca_cert.clone());
        let config = Config {
            loss_tolerance: 1.0 - ratio,
            faults: (a.loss > 0.0).then(|| Faults::symmetric_loss(a.loss, 100 + w as u64)),
            ..Config::default()
        };
        tasks.push(tokio::spawn(async move {
            worker(&ca, config, addr, &layout, compression, &grad, budget).await
        }));
    }
    let mut row = Row {
        name,
        updates: 0,
        elapsed: Duration::ZERO,
        up_bytes: 0.0,
        zero_filled: 0,
        latencies: Vec::new(),
    };
    for t in tasks {
        let (updates, elapsed, up, lat) = t.await??;
        row.updates += updates;
        row.elapsed = row.elapsed.max(elapsed);
        row.up_bytes += up;
        row.latencies.extend(lat);
    }
    let _ = stop.send(());
    let stats = serving.await??;
    row.zero_filled = stats.zero_filled_bytes;
    Ok(row)
}

/// Pushes until the budget is spent; returns updates, time, bytes sent up,
/// and each push's latency.
async fn worker(
    ca: &Path,
    config: Config,
    addr: SocketAddr,
    layout: &Layout,
    compression: Compression,
    grad: &[Vec<f32>],
    budget: Duration,
) -> Result<(u64, Duration, f64, Vec<Duration>), BoxError> {
    let ep = Endpoint::client(ca, config)?;
    let mut w = Worker::join(&ep, addr, "localhost", layout, compression).await?;
    let mut params = w.pull().await?;
    let start = Instant::now();
    let mut updates = 0;
    let mut up = 0.0;
    let mut latencies = Vec::new();
    while start.elapsed() < budget {
        let t = Instant::now();
        let reply = w.push(params.index, grad).await?;
        latencies.push(t.elapsed());
        updates += 1;
        up += reply.gradient_bytes as f64;
        w.recycle(std::mem::replace(&mut params, reply.params).values);
    }
    let elapsed = start.elapsed();
    w.leave().await;
    Ok((updates, elapsed, up, latencies))
}
