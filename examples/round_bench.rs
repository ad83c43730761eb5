//! Round times of gradlane against raw quinn, all-reliable gradlane and TCP.
//!
//! ```text
//! cargo run --release --example round_bench -- --rounds 10 --losses 0,0.01,0.05
//! ```
//!
//! ResNet-50 rounds (~102 MB) over loopback, every variant on its own fresh
//! connection, one warm-up round then `--rounds` timed rounds, one after the
//! other:
//!
//! - gradlane (default config);
//! - raw quinn: one unidirectional stream per round carrying the same bytes,
//!   tuned transport from `gradlane::transport::tuning`;
//! - gradlane with every chunk important (ratio 1.0);
//! - tokio TCP of the same bytes (lossless only: nothing to inject into).
//!
//! The QUIC variants run behind the seeded fault-injecting socket: the
//! client drops each outgoing and incoming packet with probability `loss`
//! (so each direction loses `loss`), and both ends delay their outgoing
//! packets by `--delay-ms`. A round's time runs from the start of sending to
//! the receiver holding the round (for gradlane: `recv_round` returning), on
//! one clock. "Important arrival" compares when gradlane's receiver held
//! every important chunk (`RoundArrival::important`, the round end read)
//! with when a raw quinn stream carrying only as many bytes as gradlane's
//! important class was read to its end; both from the start of sending.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use common::{grads, BoxError};
use gradlane::classify::ClassifyConfig;
use gradlane::encode::EncoderConfig;
use gradlane::layout::Layout;
use gradlane::presets;
use gradlane::transport::tls::{self, CertFiles};
use gradlane::transport::tuning::{self, Congestion, Tuning};
use gradlane::transport::{Config, Endpoint, Faults, LossyRelease, RoundTiming};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Round times of gradlane, raw quinn, all-reliable gradlane and TCP.
#[derive(Debug, Parser)]
#[command(name = "round_bench")]
struct Args {
    /// Streams each gradlane round's important part is spread over
    /// (`RoundTiming::lanes`; default: the library's).
    #[arg(long)]
    lanes: Option<u8>,
    /// Timed rounds per variant (after one warm-up round).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Injected loss probabilities (each direction), comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.0, 0.01, 0.05])]
    losses: Vec<f64>,
    /// One-way delay added by each QUIC end, in milliseconds.
    #[arg(long, default_value_t = 1)]
    delay_ms: u64,
    /// Model preset.
    #[arg(long, default_value = "resnet50")]
    model: String,
    /// Skip the Cubic rows.
    #[arg(long)]
    quick: bool,
    /// Stop a variant after this many seconds of timed rounds (slow Cubic
    /// rows under loss); the rounds done so far are reported.
    #[arg(long, default_value_t = 30)]
    budget_s: u64,
    /// Give up on a single round after this many seconds.
    #[arg(long, default_value_t = 60)]
    round_timeout_s: u64,
    /// Only run variants whose name contains this text (for profiling one
    /// variant; the goal lines then only cover what ran).
    #[arg(long)]
    only: Option<String>,
    /// Print, per gradlane round, where its datagrams went: sent, dropped
    /// by the fault injector (all packets, both directions), received in
    /// time, zero-filled, merged late into the next round, dropped by quinn.
    #[arg(long)]
    per_round: bool,
}

/// What a variant moves.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// gradlane with this important ratio and lossy release.
    Gradlane(f64, LossyRelease),
    /// One raw quinn stream of this many bytes per round.
    Quinn(usize),
    /// One TCP connection, this many bytes per round.
    Tcp(usize),
}

/// One measured row.
struct Row {
    name: String,
    congestion: Option<Congestion>,
    loss: f64,
    kind: Kind,
    /// Round times in seconds, sorted.
    times: Vec<f64>,
    /// gradlane: `RoundArrival::important` per round (from the start of
    /// sending), seconds, sorted.
    important: Vec<f64>,
    /// gradlane: `SendReport::plan` per round (scoring and classing, before
    /// the first byte can leave), seconds, sorted.
    plan: Vec<f64>,
    /// gradlane: important bytes per round (last round).
    important_bytes: u64,
    /// gradlane: mean zero-filled bytes per round.
    zero_filled: f64,
    note: String,
}

impl Row {
    fn median(&self) -> Option<f64> {
        median(&self.times)
    }
    fn p99(&self) -> Option<f64> {
        p99(&self.times)
    }
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Nearest-rank 99th percentile (the maximum for fewer than 100 samples).
fn p99(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let rank = ((0.99 * v.len() as f64).ceil() as usize).max(1);
    Some(v[rank - 1])
}

struct Bench {
    args: Args,
    layout: Layout,
    files: CertFiles,
    grads: [Vec<Vec<f32>>; 2],
    payload: Bytes,
}

impl Bench {
    fn faults(&self, loss: f64, seed: u64) -> (Faults, Faults) {
        let delay = Duration::from_millis(self.args.delay_ms);
        let client = Faults {
            loss_out: loss,
            loss_in: loss,
            delay,
            jitter: Duration::ZERO,
            seed,
        };
        let server = Faults {
            loss_out: 0.0,
            loss_in: 0.0,
            delay,
            jitter: Duration::ZERO,
            seed: seed ^ 0x5eed,
        };
        (client, server)
    }

    /// Runs one variant on a fresh connection: a warm-up round, then timed
    /// rounds until `--rounds` or the budget.
    async fn run(&self, name: &str, kind: Kind, congestion: Option<Congestion>, loss: f64) -> Row {
        let skip = self
            .args
            .only
            .as_ref()
            .is_some_and(|o| !name.contains(o.as_str()));
        let mut row = Row {
            name: name.to_string(),
            congestion,
            loss,
            kind,
            times: Vec::new(),
            important: Vec::new(),
            plan: Vec::new(),
            important_bytes: 0,
            zero_filled: 0.0,
            note: String::new(),
        };
        let seed = 1000 + (loss * 1e4) as u64;
        if skip {
            row.note = "skipped (--only)".into();
            return row;
        }
        let result = match kind {
            Kind::Gradlane(ratio, release) => {
                let cc = congestion.unwrap_or_default();
                self.gradlane(ratio, release, cc, loss, seed, &mut row)
                    .await
            }
            Kind::Quinn(bytes) => {
                self.quinn(bytes, congestion.unwrap_or_default(), loss, seed, &mut row)
                    .await
            }
            Kind::Tcp(bytes) => self.tcp(bytes, &mut row).await,
        };
        if let Err(e) = result {
            row.note = format!("error after {} rounds: {e}", row.times.len());
        }
        row.times.sort_by(f64::total_cmp);
        row.important.sort_by(f64::total_cmp);
        row.plan.sort_by(f64::total_cmp);
        eprintln!(
            "{name} {congestion:?} loss {loss}: {} rounds, median {:.1} ms, p99 {:.1} ms {}",
            row.times.len(),
            row.median().unwrap_or(f64::NAN) * 1e3,
            row.p99().unwrap_or(f64::NAN) * 1e3,
            row.note
        );
        row
    }

    fn budget_left(&self, started: Instant, row: &mut Row) -> bool {
        if started.elapsed() > Duration::from_secs(self.args.budget_s) {
            row.note = format!("stopped after {} s budget", self.args.budget_s);
            false
        } else {
            true
        }
    }

    async fn gradlane(
        &self,
        ratio: f64,
        release: LossyRelease,
        congestion: Congestion,
        loss: f64,
        seed: u64,
        row: &mut Row,
    ) -> Result<(), BoxError> {
        let (client_faults, server_faults) = self.faults(loss, seed);
        let base = Config {
            encoder: EncoderConfig {
                classify: ClassifyConfig {
                    ratio,
                    ..ClassifyConfig::default()
                },
                ..EncoderConfig::default()
            },
            tuning: Tuning {
                congestion,
                ..Tuning::default()
            },
            timing: RoundTiming {
                release,
                lanes: self.args.lanes.unwrap_or(RoundTiming::default().lanes),
                ..RoundTiming::default()
            },
            ..Config::default()
        };
        let server = Endpoint::server(
            "127.0.0.1:0".parse()?,
            &self.files.server_cert,
            &self.files.server_key,
            Config {
                faults: Some(server_faults),
                ..base.clone()
            },
        )?;
        let client = Endpoint::client(
            &self.files.ca_cert,
            Config {
                faults: Some(client_faults),
                ..base
            },
        )?;
        let addr = server.local_addr()?;
        let (s, c) = tokio::join!(
            server.accept(),
            client.connect(addr, "localhost", &self.layout)
        );
        let mut rx = s.ok_or("server endpoint closed")??;
        let mut tx = c?;
        let limit = Duration::from_secs(self.args.round_timeout_s);
        let mut zero = 0u64;
        let mut started = None;
        let mut faults_before = client.fault_stats().unwrap_or_default();
        for r in 0..=self.args.rounds {
            let g = &self.grads[r % 2];
            let start = Instant::now();
            let both = async {
                tokio::join!(tx.send_round(r as u32, g), async {
                    let round = rx.recv_round_timed().await;
                    (round, Instant::now())
                })
            };
            let (report, (round, delivered)) = tokio::time::timeout(limit, both)
                .await
                .map_err(|_| format!("round {r} timed out"))?;
            let report = report?;
            let (round, arrival) = round?;
            if round.index != r as u32 {
                return Err(format!("round {r}: received round {}", round.index).into());
            }
            if r > 0 {
                row.times
                    .push(delivered.duration_since(start).as_secs_f64());
                row.important
                    .push(arrival.important.duration_since(start).as_secs_f64());
                row.plan.push(report.plan.as_secs_f64());
                row.important_bytes = report.important_bytes;
                zero += round.stats.lossy().zero_filled_bytes;
            }
            if self.args.per_round {
                let f = client.fault_stats().unwrap_or_default();
                let lossy = round.stats.lossy();
                eprintln!(
                    "  round {r}: datagrams sent {} ({:.2} MB), injector dropped {} out / {} in \
                     of {} / {} packets, lossy received {:.2} MB, zero-filled {:.2} MB, \
                     late merged into this round {:.2} MB, quinn dropped {} (total), \
                     path MTU {}, black holes detected {} (total)",
                    report.lossy_packets.iter().sum::<u64>(),
                    report.lossy_bytes.iter().sum::<u64>() as f64 / 1e6,
                    f.segments_dropped_out - faults_before.segments_dropped_out,
                    f.datagrams_dropped_in - faults_before.datagrams_dropped_in,
                    f.segments_sent - faults_before.segments_sent,
                    f.datagrams_received - faults_before.datagrams_received,
                    lossy.received_bytes as f64 / 1e6,
                    lossy.zero_filled_bytes as f64 / 1e6,
                    lossy.late_merged_bytes as f64 / 1e6,
                    rx.datagrams_dropped_by_quinn(),
                    tx.connection().stats().path.current_mtu,
                    tx.connection().stats().path.black_holes_detected,
                );
                faults_before = f;
            }
            rx.recycle(round.tensors);
            let started = *started.get_or_insert_with(Instant::now);
            if !self.budget_left(started, row) {
                break;
            }
        }
        row.zero_filled = zero as f64 / row.times.len().max(1) as f64;
        tx.close();
        client.wait_idle().await;
        Ok(())
    }

    async fn quinn(
        &self,
        bytes: usize,
        congestion: Congestion,
        loss: f64,
        seed: u64,
        row: &mut Row,
    ) -> Result<(), BoxError> {
        let (client_faults, server_faults) = self.faults(loss, seed);
        let tuning = Tuning {
            congestion,
            ..Tuning::default()
        };
        let local: SocketAddr = "127.0.0.1:0".parse()?;
        let server_config = tls::server_config(&self.files.server_cert, &self.files.server_key)?;
        let (server, _) =
            tuning::endpoint(local, Some(server_config), &tuning, Some(server_faults))?;
        let (mut client, _) = tuning::endpoint(local, None, &tuning, Some(client_faults))?;
        client.set_default_client_config(tuning::tuned_client(
            tls::client_config(&self.files.ca_cert)?,
            &tuning,
        )?);
        let addr = server.local_addr()?;
        let accept = {
            let server = server.clone();
            tokio::spawn(async move {
                let incoming = server.accept().await.ok_or("server endpoint closed")?;
                Ok::<_, BoxError>(incoming.await?)
            })
        };
        let conn = client.connect(addr, "localhost")?.await?;
        let server_conn = accept.await??;
        // The receiver: every stream read to its end, then its arrival time.
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            while let Ok(mut recv) = server_conn.accept_uni().await {
                let mut got = 0usize;
                loop {
                    match recv.read_chunk(usize::MAX, true).await {
                        Ok(Some(chunk)) => got += chunk.bytes.len(),
                        Ok(None) => break,
                        Err(_) => return,
                    }
                }
                if done_tx.send((got, Instant::now())).is_err() {
                    return;
                }
            }
        });
        let payload = self.payload.slice(..bytes);
        let limit = Duration::from_secs(self.args.round_timeout_s);
        let mut started = None;
        for r in 0..=self.args.rounds {
            let start = Instant::now();
            let round = async {
                let mut send = conn.open_uni().await?;
                send.write_chunk(payload.clone()).await?;
                send.finish()?;
                done_rx
                    .recv()
                    .await
                    .ok_or_else(|| BoxError::from("receiver gone"))
            };
            let (got, end) = tokio::time::timeout(limit, round)
                .await
                .map_err(|_| format!("round {r} timed out"))??;
            if got != bytes {
                return Err(format!("round {r}: received {got} of {bytes} bytes").into());
            }
            if r > 0 {
                row.times.push(end.duration_since(start).as_secs_f64());
            }
            let started = *started.get_or_insert_with(Instant::now);
            if !self.budget_left(started, row) {
                break;
            }
        }
        conn.close(0u32.into(), b"done");
        reader.abort();
        client.wait_idle().await;
        Ok(())
    }

    async fn tcp(&self, bytes: usize, row: &mut Row) -> Result<(), BoxError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let rounds = self.args.rounds + 1;
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await?;
            let mut buf = vec![0u8; 1 << 20];
            for _ in 0..rounds {
                let mut got = 0;
                while got < bytes {
                    let want = (bytes - got).min(buf.len());
                    let n = sock.read(&mut buf[..want]).await?;
                    if n == 0 {
                        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
                    }
                    got += n;
                }
                if done_tx.send(Instant::now()).is_err() {
                    break;
                }
            }
            Ok::<_, std::io::Error>(())
        });
        let mut sock = tokio::net::TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        let payload = self.payload.slice(..bytes);
        let mut started = None;
        for r in 0..rounds {
            let start = Instant::now();
            sock.write_all(&payload).await?;
            let end = done_rx.recv().await.ok_or("tcp receiver gone")?;
            if r > 0 {
                row.times.push(end.duration_since(start).as_secs_f64());
            }
            let started = *started.get_or_insert_with(Instant::now);
            if !self.budget_left(started, row) {
                break;
            }
        }
        drop(sock);
        reader.abort();
        Ok(())
    }
}

fn cc_name(c: Option<Congestion>) -> &'static str {
    match c {
        None => "-",
        Some(Congestion::Bbr) => "BBR",
        Some(Congestion::Cubic) => "Cubic",
        Some(Congestion::NewReno) => "NewReno",
    }
}

fn main() -> std::process::ExitCode {
    common::main("round_bench", run)
}

async fn run(args: Args) -> Result<(), BoxError> {
    if args.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    if let Some(l) = args.losses.iter().find(|l| !(0.0..=1.0).contains(*l)) {
        return Err(format!("loss {l} is not in [0, 1]").into());
    }
    let layout = presets::by_name(&args.model).ok_or_else(|| {
        format!(
            "unknown model {:?} (one of {})",
            args.model,
            presets::NAMES.join(", ")
        )
    })?;
    let dir = std::env::temp_dir().join(format!("gradlane-round-bench-{}", std::process::id()));
    let files = tls::generate_certs(&dir, &["localhost"])?;
    let model_bytes = layout.total_bytes() as usize;
    eprintln!(
        "{}: {:.1} MB per round; generating gradients",
        args.model,
        model_bytes as f64 / 1e6
    );
    let grads = [grads(&layout, 1), grads(&layout, 2)];
    let payload = Bytes::from(vec![0xa5u8; model_bytes]);
    let bench = Bench {
        args,
        layout,
        files,
        grads,
        payload,
    };
    let result = measure(&bench, model_bytes).await;
    let _ = std::fs::remove_dir_all(&dir);
    let (rows, important_quinn) = result?;
    report(&bench, model_bytes, &rows, &important_quinn);
    Ok(())
}

type Measured = (Vec<Row>, Vec<(f64, Row)>);

async fn measure(bench: &Bench, model_bytes: usize) -> Result<Measured, BoxError> {
    let mut rows = Vec::new();
    let mut important_quinn = Vec::new();
    let bbr = Some(Congestion::Bbr);
    let cubic = Some(Congestion::Cubic);
    for &loss in &bench.args.losses {
        let default = LossyRelease::default();
        let gl = bench
            .run("gradlane", Kind::Gradlane(0.8, default), bbr, loss)
            .await;
        let imp = gl.important_bytes as usize;
        rows.push(gl);
        // The same, but datagrams start once quinn has sent the important
        // stream: the important bytes finish with lossy traffic in flight.
        let sent = Kind::Gradlane(0.8, LossyRelease::Sent);
        rows.push(
            bench
                .run("gradlane, datagrams once sent", sent, bbr, loss)
                .await,
        );
        rows.push(
            bench
                .run("raw quinn", Kind::Quinn(model_bytes), bbr, loss)
                .await,
        );
        rows.push(
            bench
                .run(
                    "gradlane all-reliable",
                    Kind::Gradlane(1.0, default),
                    bbr,
                    loss,
                )
                .await,
        );
        if imp > 0 {
            important_quinn.push((
                loss,
                bench
                    .run(
                        "raw quinn, important bytes only",
                        Kind::Quinn(imp),
                        bbr,
                        loss,
                    )
                    .await,
            ));
        }
        if loss == 0.0 {
            rows.push(
                bench
                    .run("tokio TCP", Kind::Tcp(model_bytes), None, loss)
                    .await,
            );
        } else if !bench.args.quick {
            rows.push(
                bench
                    .run("gradlane", Kind::Gradlane(0.8, default), cubic, loss)
                    .await,
            );
            rows.push(
                bench
                    .run("raw quinn", Kind::Quinn(model_bytes), cubic, loss)
                    .await,
            );
        }
    }
    Ok((rows, important_quinn))
}

fn report(bench: &Bench, model_bytes: usize, rows: &[Row], important_quinn: &[(f64, Row)]) {
    let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}", v * 1e3));
    let find = |name: &str, cc: Option<Congestion>, loss: f64| {
        rows.iter()
            .find(|r| r.name == name && r.congestion == cc && r.loss == loss)
    };
    let gbps = |t: Option<f64>| t.map(|t| model_bytes as f64 * 8.0 / t / 1e9);
    let lossless_gl = |cc| find("gradlane", cc, 0.0).and_then(Row::p99);

    println!();
    println!(
        "{} rounds of {:.1} MB ({}) per variant after 1 warm-up, fresh connection each; \
         QUIC variants: {} ms delay each way, seeded loss each way; loopback, one process",
        bench.args.rounds,
        model_bytes as f64 / 1e6,
        bench.args.model,
        bench.args.delay_ms
    );
    println!();
    println!(
        "| variant | CC | loss | rounds | median ms | p99 ms | Gbit/s (median) | vs raw quinn | \
         p99 vs own lossless p99 | zero-filled MB/round | note |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let g = gbps(r.median());
        let base = find("raw quinn", r.congestion.or(Some(Congestion::Bbr)), r.loss)
            .and_then(|q| gbps(q.median()));
        let vs = match (g, base) {
            (Some(a), Some(b)) if !matches!(r.kind, Kind::Quinn(_)) => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        let own = match (r.kind, r.p99(), lossless_gl(r.congestion)) {
            (Kind::Gradlane(x, _), Some(p), Some(l)) if x < 1.0 && r.name == "gradlane" => {
                format!("{:.2}x", p / l)
            }
            _ => "-".into(),
        };
        let zero = match r.kind {
            Kind::Gradlane(..) => format!("{:.2}", r.zero_filled / 1e6),
            _ => "-".into(),
        };
        println!(
            "| {} | {} | {}% | {} | {} | {} | {} | {vs} | {own} | {zero} | {} |",
            r.name,
            cc_name(r.congestion),
            r.loss * 100.0,
            r.times.len(),
            ms(r.median()),
            ms(r.p99()),
            g.map_or("-".into(), |v| format!("{v:.2}")),
            r.note
        );
    }

    println!();
    println!(
        "Important arrival (BBR): gradlane's receiver holding every important chunk vs a raw quinn \
         stream of the important bytes only read to its end"
    );
    println!();
    println!(
        "| loss | important MB | gradlane median ms | of which before the first byte | raw quinn median ms | ratio | ratio without that | datagrams once sent: median ms (lossy in flight) | with / without lossy in flight |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut imp_ratios = Vec::new();
    for (loss, q) in important_quinn {
        let Some(gl) = find("gradlane", Some(Congestion::Bbr), *loss) else {
            continue;
        };
        let a = median(&gl.important);
        let b = q.median();
        let ratio = match (a, b) {
            (Some(a), Some(b)) => {
                imp_ratios.push((*loss, a / b));
                format!("{:.2}x", a / b)
            }
            _ => "-".into(),
        };
        let enc = median(&gl.plan);
        let net = match (a, enc, b) {
            (Some(a), Some(e), Some(b)) => format!("{:.2}x", (a - e) / b),
            _ => "-".into(),
        };
        let busy = find(
            "gradlane, datagrams once sent",
            Some(Congestion::Bbr),
            *loss,
        )
        .and_then(|r| median(&r.important));
        let inflight = match (busy, a) {
            (Some(b), Some(a)) => format!("{:.2}x", b / a),
            _ => "-".into(),
        };
        println!(
            "| {}% | {:.1} | {} | {} | {} | {ratio} | {net} | {} | {inflight} |",
            loss * 100.0,
            gl.important_bytes as f64 / 1e6,
            ms(a),
            ms(enc),
            ms(b),
            ms(busy)
        );
    }

    println!();
    println!("Goals:");
    let verdict = |ok: Option<bool>| match ok {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    };
    let bbr = Some(Congestion::Bbr);
    let t = |name, loss| find(name, bbr, loss).and_then(|r| gbps(r.median()));
    let g1 = t("gradlane", 0.0)
        .zip(t("raw quinn", 0.0))
        .map(|(a, b)| a / b);
    println!(
        "- lossless gradlane >= 0.95x raw quinn throughput: {} ({})",
        verdict(g1.map(|x| x >= 0.95)),
        g1.map_or("-".into(), |x| format!("{x:.2}x"))
    );
    let p = |name, loss| find(name, bbr, loss).and_then(Row::p99);
    let g2 = p("gradlane", 0.05).zip(p("gradlane", 0.0));
    let g3 = p("gradlane", 0.05).zip(p("gradlane all-reliable", 0.05));
    println!(
        "- at 5% loss gradlane p99 <= 1.2x its lossless p99: {} ({})",
        verdict(g2.map(|(a, b)| a <= 1.2 * b)),
        g2.map_or("-".into(), |(a, b)| format!(
            "{:.1} vs {:.1} ms, {:.2}x",
            a * 1e3,
            b * 1e3,
            a / b
        ))
    );
    println!(
        "- at 5% loss gradlane p99 below all-reliable p99: {} ({})",
        verdict(g3.map(|(a, b)| a < b)),
        g3.map_or("-".into(), |(a, b)| format!(
            "{:.1} vs {:.1} ms",
            a * 1e3,
            b * 1e3
        ))
    );
    let worst = imp_ratios
        .iter()
        .map(|x| x.1)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    println!(
        "- important arrival <= 1.1x raw quinn (every loss): {} ({})",
        verdict(worst.map(|w| w <= 1.1)),
        imp_ratios
            .iter()
            .map(|(l, r)| format!("{}%: {r:.2}x", l * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
