//! Round times of gradlane against raw quinn, all-reliable gradlane and TCP.
//!
//! ```text
//! cargo run --release --bin round_bench -- --rounds 10 --losses 0,0.01,0.05
//! ```
//!
//! ResNet-50 rounds (~102 MB) over loopback. Per loss rate every variant has
//! its own fresh connection, all open at once; after one warm-up round each,
//! the `--rounds` timed rounds are interleaved (round `r` of every variant
//! before round `r + 1`), so that a slow spell of a shared machine hits all
//! variants alike. Per congestion controller in `--controllers` (default:
//! gradlane's capped BBR, then quinn's own BBR):
//!
//! - gradlane (default config: the lossy part on streams below the
//!   important lanes while the path loses nothing, else as datagrams,
//!   released as soon as quinn has sent the important stream), the same
//!   with the lossy part always as datagrams, and the same with the lossy
//!   part released only once the receiver confirmed the important part
//!   (no lossy traffic in flight while it arrives);
//! - raw quinn: one unidirectional stream per round carrying the same number
//!   of bytes from one prepared buffer, read and discarded; tuned transport
//!   from `gradlane::tuning`;
//! - raw quinn, f32 in and out: the same, but each round writes the
//!   gradients tensor by tensor (quinn copies them into its buffer) and the
//!   receiver copies what it reads into tensors, as an application holding
//!   f32 tensors must;
//! - gradlane with every chunk important (ratio 1.0);
//! - tokio TCP of the same bytes (lossless only: nothing to inject into);
//! - with `--quick` left out, gradlane and raw quinn under Cubic and
//!   queue-gated Cubic.
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

use gradlane_tools::cli as common;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use common::{grads, BoxError, Cc};
use gradlane::{generate_certs, presets, quic, CertFiles, Congestion, Layout, Packets};
use gradlane::{
    Config, DatagramSize, Endpoint, FaultStats, Faults, Link, LossyCarrier, LossyRelease,
    RoundTiming,
};
use gradlane_tools::cpu::CpuTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Round times of gradlane, raw quinn, all-reliable gradlane and TCP.
#[derive(Debug, Parser)]
#[command(name = "round_bench")]
struct Args {
    /// Streams each gradlane round's important part is spread over
    /// (`Config::lanes`; default: the library's).
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
    /// Controllers to run the full set of rows with (gradlane both ways,
    /// raw quinn both ways, all-reliable); each gets its own goal lines.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Cc::CappedBbr, Cc::Bbr])]
    controllers: Vec<Cc>,
    /// Skip the gradlane and raw quinn rows of Cubic and of queue-gated
    /// Cubic.
    #[arg(long)]
    quick: bool,
    /// Stop a variant after this many seconds of timed rounds (slow Cubic
    /// rows under loss); the rounds done so far are reported.
    #[arg(long, default_value_t = 30)]
    budget_s: u64,
    /// Give up on a single round after this many seconds.
    #[arg(long, default_value_t = 60)]
    round_timeout_s: u64,
    /// Only run variants whose name and controller ("gradlane BBR", "raw
    /// quinn Cubic, queue-gated", ...) contain one of these texts (for
    /// profiling one variant, or comparing two alone; the goal lines then
    /// only cover what ran). Repeat the flag for several.
    #[arg(long)]
    only: Vec<String>,
    /// Print, per gradlane round, where its datagrams went: sent, dropped
    /// by the fault injector (all packets, both directions), received in
    /// time, zero-filled, merged late into the next round, dropped by quinn.
    #[arg(long)]
    per_round: bool,
    /// Idle time before each timed round, in milliseconds (the compute
    /// phase of a training step): shows what a controller does after the
    /// link has been quiet. Not counted in any time.
    #[arg(long, default_value_t = 0)]
    idle_ms: u64,
    /// Size of gradlane's lossy datagrams (`RoundTiming::datagram_size`).
    #[arg(long, value_enum, default_value_t = Datagrams::Floor)]
    datagram_size: Datagrams,
    /// Every QUIC variant in 8952-byte packets from the first
    /// (`Packets::Jumbo`), as on a network known to carry jumbo frames;
    /// loopback carries them. Without it (and `--ethernet`), the default:
    /// MTU discovery up to what loopback carries (`Packets::Route`).
    #[arg(long, conflicts_with = "ethernet")]
    jumbo: bool,
    /// Every QUIC variant with MTU discovery up to an Ethernet frame's
    /// 1452 bytes (`Packets::Ethernet`), as across a 1500-byte network.
    #[arg(long)]
    ethernet: bool,
}

/// `--datagram-size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Datagrams {
    /// Packets of at most QUIC's 1200-byte MTU floor (the default).
    Floor,
    /// The path's size.
    Path,
}

/// What a variant moves.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// gradlane with this important ratio, lossy release and carrier; with
    /// `true`, sent with `send_round_shared` (no copy of the important
    /// part's long runs), else with `send_round` (from borrowed slices,
    /// copied).
    Gradlane(f64, LossyRelease, LossyCarrier, bool),
    /// One raw quinn stream of this many bytes per round; with `true`, the
    /// gradients copied into the stream and out into tensors each round.
    Quinn(usize, bool),
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
    /// The process's CPU time over the timed rounds (sender and receiver
    /// together: both ends live in this process, and the rounds of the
    /// variants run one at a time).
    cpu: CpuTime,
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
    /// Two rounds' gradients, used in turn; shared, so that gradlane can
    /// send them with `send_round_shared`.
    grads: [Vec<Arc<Vec<f32>>>; 2],
    payload: Bytes,
}

impl Bench {
    /// The controller of the reference rows (raw quinn of the important
    /// bytes only, TCP's ratio).
    fn first_controller(&self) -> Congestion {
        self.args
            .controllers
            .first()
            .map_or(Congestion::Bbr, |&c| c.into())
    }

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

    /// The transport settings of every QUIC variant (`--jumbo`).
    fn transport(&self, congestion: Congestion) -> Config {
        Config {
            congestion,
            packets: if self.args.jumbo {
                Packets::Jumbo
            } else if self.args.ethernet {
                Packets::Ethernet
            } else {
                Packets::Route
            },
            ..Config::default()
        }
    }

    fn skipped(&self, name: &str) -> bool {
        let only = &self.args.only;
        !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str()))
    }

    /// Opens a variant's fresh connection.
    async fn start(
        &self,
        kind: Kind,
        congestion: Option<Congestion>,
        loss: f64,
    ) -> Result<Runner, BoxError> {
        let seed = 1000 + (loss * 1e4) as u64;
        let cc = congestion.unwrap_or_default();
        Ok(match kind {
            Kind::Gradlane(ratio, release, carrier, shared) => Runner::Gradlane(Box::new(
                self.gradlane((ratio, release, carrier, shared), cc, loss, seed)
                    .await?,
            )),
            Kind::Quinn(bytes, f32s) => {
                Runner::Quinn(self.quinn(bytes, f32s, cc, loss, seed).await?)
            }
            Kind::Tcp(bytes) => Runner::Tcp(self.tcp(bytes).await?),
        })
    }

    async fn gradlane(
        &self,
        (ratio, release, carrier, shared): (f64, LossyRelease, LossyCarrier, bool),
        congestion: Congestion,
        loss: f64,
        seed: u64,
    ) -> Result<GradlaneRun, BoxError> {
        let (client_faults, server_faults) = self.faults(loss, seed);
        let transport = self.transport(congestion);
        let base = Config {
            loss_tolerance: 1.0 - ratio,
            lanes: self.args.lanes.unwrap_or(transport.lanes),
            timing: RoundTiming {
                release,
                lossy_carrier: carrier,
                datagram_size: match self.args.datagram_size {
                    Datagrams::Floor => DatagramSize::MtuFloor,
                    Datagrams::Path => DatagramSize::Path,
                },
                ..RoundTiming::default()
            },
            ..transport
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
        let rx = s.ok_or("server endpoint closed")??;
        let tx = c?;
        let faults_before = client.fault_stats().unwrap_or_default();
        Ok(GradlaneRun {
            _server: server,
            client,
            tx,
            rx,
            faults_before,
            shared,
        })
    }

    async fn quinn(
        &self,
        bytes: usize,
        f32s: bool,
        congestion: Congestion,
        loss: f64,
        seed: u64,
    ) -> Result<QuinnRun, BoxError> {
        let (client_faults, server_faults) = self.faults(loss, seed);
        let transport = self.transport(congestion);
        let local: SocketAddr = "127.0.0.1:0".parse()?;
        let files = &self.files;
        let server_config = Config {
            faults: Some(server_faults),
            ..transport.clone()
        };
        let client_config = Config {
            faults: Some(client_faults),
            ..transport
        };
        let server = quic::server(local, &files.server_cert, &files.server_key, &server_config)?;
        let client = quic::client(local, &files.ca_cert, &client_config)?;
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
        // The receiver: every stream read to its end (with `f32s`, copied
        // into tensors of the layout's shapes, as an application must),
        // then its arrival time.
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let mut tensors: Vec<Vec<f32>> = if f32s {
            (0..self.layout.len())
                .map(|t| vec![0f32; self.layout.tensor_len(t)])
                .collect()
        } else {
            Vec::new()
        };
        let reader = tokio::spawn(async move {
            while let Ok(mut recv) = server_conn.accept_uni().await {
                let mut got = 0usize;
                let mut cursor = (0, 0);
                loop {
                    match recv.read_chunk(usize::MAX, true).await {
                        Ok(Some(chunk)) => {
                            if f32s {
                                copy_into(&mut tensors, &mut cursor, got, &chunk.bytes);
                            }
                            got += chunk.bytes.len();
                        }
                        Ok(None) => break,
                        Err(_) => return,
                    }
                }
                if done_tx.send((got, Instant::now())).is_err() {
                    return;
                }
            }
        });
        Ok(QuinnRun {
            client,
            conn,
            reader,
            done_rx,
            payload: self.payload.slice(..bytes),
            f32s,
        })
    }

    async fn tcp(&self, bytes: usize) -> Result<TcpRun, BoxError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
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
        let sock = tokio::net::TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        Ok(TcpRun {
            sock,
            reader,
            done_rx,
            payload: self.payload.slice(..bytes),
        })
    }
}

/// Copies received stream bytes at stream offset `at` into the tensors
/// (laid end to end), as little-endian f32.
/// `cursor` is (tensor, its first byte in the stream) of the last copy:
/// chunks come in order, so the search goes on from there.
fn copy_into(
    tensors: &mut [Vec<f32>],
    cursor: &mut (usize, usize),
    mut at: usize,
    mut bytes: &[u8],
) {
    let (t, base) = cursor;
    while !bytes.is_empty() && *t < tensors.len() {
        let len = tensors[*t].len() * 4;
        if at >= *base + len {
            *base += len;
            *t += 1;
            continue;
        }
        let off = at - *base;
        let n = (len - off).min(bytes.len());
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut tensors[*t][..]);
        dst[off..off + n].copy_from_slice(&bytes[..n]);
        bytes = &bytes[n..];
        at += n;
    }
}

/// One timed round of a variant.
#[derive(Default)]
struct Sample {
    time: f64,
    /// gradlane: when every important chunk was held.
    important: Option<f64>,
    /// gradlane: scoring and classing before the first byte.
    plan: Option<f64>,
    important_bytes: u64,
    zero_filled: u64,
}

/// A variant's open connection, between rounds.
enum Runner {
    Gradlane(Box<GradlaneRun>),
    Quinn(QuinnRun),
    Tcp(TcpRun),
}

struct GradlaneRun {
    _server: Endpoint,
    client: Endpoint,
    tx: Link,
    rx: Link,
    faults_before: FaultStats,
    /// Send with `send_round_shared` (else `send_round`).
    shared: bool,
}

struct QuinnRun {
    client: quinn::Endpoint,
    conn: quinn::Connection,
    reader: tokio::task::JoinHandle<()>,
    done_rx: mpsc::UnboundedReceiver<(usize, Instant)>,
    payload: Bytes,
    /// Serialize the gradients each round instead of sending `payload`.
    f32s: bool,
}

struct TcpRun {
    sock: tokio::net::TcpStream,
    reader: tokio::task::JoinHandle<Result<(), std::io::Error>>,
    done_rx: mpsc::UnboundedReceiver<Instant>,
    payload: Bytes,
}

impl Runner {
    /// One round, `r` (0 is the warm-up), bounded by `--round-timeout-s`.
    async fn round(&mut self, bench: &Bench, r: usize) -> Result<Sample, BoxError> {
        let limit = Duration::from_secs(bench.args.round_timeout_s);
        tokio::time::timeout(limit, self.round_inner(bench, r))
            .await
            .map_err(|_| format!("round {r} timed out"))?
    }

    async fn round_inner(&mut self, bench: &Bench, r: usize) -> Result<Sample, BoxError> {
        match self {
            Runner::Gradlane(g) => g.round(bench, r).await,
            Runner::Quinn(q) => {
                let start = Instant::now();
                let mut send = q.conn.open_uni().await?;
                let want = if q.f32s {
                    // What an application holding f32 tensors writes: each
                    // tensor's bytes, which quinn copies into its buffer.
                    let mut n = 0;
                    for t in &bench.grads[r % 2] {
                        let bytes: &[u8] = bytemuck::cast_slice(t.as_slice());
                        send.write_all(bytes).await?;
                        n += bytes.len();
                    }
                    n
                } else {
                    send.write_chunk(q.payload.clone()).await?;
                    q.payload.len()
                };
                send.finish()?;
                let (got, end) = q.done_rx.recv().await.ok_or("receiver gone")?;
                if got != want {
                    return Err(format!("round {r}: received {got} of {want} bytes").into());
                }
                Ok(Sample {
                    time: end.duration_since(start).as_secs_f64(),
                    ..Sample::default()
                })
            }
            Runner::Tcp(t) => {
                let start = Instant::now();
                t.sock.write_all(&t.payload).await?;
                let end = t.done_rx.recv().await.ok_or("tcp receiver gone")?;
                Ok(Sample {
                    time: end.duration_since(start).as_secs_f64(),
                    ..Sample::default()
                })
            }
        }
    }

    async fn stop(self) {
        match self {
            Runner::Gradlane(g) => {
                let _ = g.tx.close().await;
                g.client.wait_idle().await;
            }
            Runner::Quinn(q) => {
                q.conn.close(0u32.into(), b"done");
                q.reader.abort();
                q.client.wait_idle().await;
            }
            Runner::Tcp(t) => {
                drop(t.sock);
                t.reader.abort();
            }
        }
    }
}

impl GradlaneRun {
    async fn round(&mut self, bench: &Bench, r: usize) -> Result<Sample, BoxError> {
        let g = &bench.grads[r % 2];
        let window_before = self.tx.connection().stats().path.cwnd;
        let start = Instant::now();
        let send = async {
            if self.shared {
                self.tx.sender().send_round_shared(r as u32, g).await
            } else {
                let slices: Vec<&[f32]> = g.iter().map(|t| t.as_slice()).collect();
                self.tx.sender().send_round(r as u32, &slices).await
            }
        };
        let (report, received) = tokio::join!(send, async {
            let round = self.rx.receiver().recv_round_timed().await;
            (round, Instant::now())
        });
        let (round, delivered) = received;
        let report = report?;
        let (round, arrival) = round?;
        if round.index != r as u32 {
            return Err(format!("round {r}: received round {}", round.index).into());
        }
        if bench.args.per_round {
            let f = self.client.fault_stats().unwrap_or_default();
            let before = &self.faults_before;
            let lossy = round.stats.lossy();
            eprintln!(
                "  round {r}: lossy on {}, lossy packets sent {} ({:.2} MB), injector dropped {} out / {} in \
                 of {} / {} packets, refused by the system {}, lossy received {:.2} MB, zero-filled {:.2} MB, \
                 late merged into this round {:.2} MB, quinn discarded from its send queue {}, quinn dropped received {} (total), \
                 path MTU {}, black holes detected {} (total), datagram frames sent {} / \
                 received {} (total), packets declared lost {} (total), congestion window {} KB \
                 ({} KB before the round), smoothed RTT {:?}; timeline ms: planned {:.1}, framed {:.1}, lossy released {:.1}, \
                 important held {:.1}, lossy all sent {:.1}, delivered {:.1}",
                if report.lossy_on_stream {
                    "streams"
                } else {
                    "datagrams"
                },
                report.lossy_packets.iter().sum::<u64>(),
                report.lossy_bytes.iter().sum::<u64>() as f64 / 1e6,
                f.segments_dropped_out - before.segments_dropped_out,
                f.datagrams_dropped_in - before.datagrams_dropped_in,
                f.segments_sent - before.segments_sent,
                f.datagrams_received - before.datagrams_received,
                f.segments_send_failed - before.segments_send_failed,
                lossy.received_bytes as f64 / 1e6,
                lossy.zero_filled_bytes as f64 / 1e6,
                lossy.late_merged_bytes as f64 / 1e6,
                report.lossy_dropped_by_quinn,
                self.rx.receiver().datagrams_dropped_by_quinn(),
                self.tx.connection().stats().path.current_mtu,
                self.tx.connection().stats().path.black_holes_detected,
                self.tx.connection().stats().frame_tx.datagram,
                self.rx.connection().stats().frame_rx.datagram,
                self.tx.connection().stats().path.lost_packets,
                self.tx.connection().stats().path.cwnd / 1000,
                window_before / 1000,
                self.tx.connection().stats().path.rtt,
                report.plan.as_secs_f64() * 1e3,
                report.encode.as_secs_f64() * 1e3,
                report.lossy_start.as_secs_f64() * 1e3,
                arrival.important.duration_since(start).as_secs_f64() * 1e3,
                report.total.as_secs_f64() * 1e3,
                delivered.duration_since(start).as_secs_f64() * 1e3,
            );
            self.faults_before = f;
        }
        let sample = Sample {
            time: delivered.duration_since(start).as_secs_f64(),
            important: Some(arrival.important.duration_since(start).as_secs_f64()),
            plan: Some(report.plan.as_secs_f64()),
            important_bytes: report.important_bytes,
            zero_filled: round.stats.lossy().zero_filled_bytes,
        };
        self.rx.receiver().recycle(round.tensors);
        Ok(sample)
    }
}

fn cc_name(c: Option<Congestion>) -> &'static str {
    match c {
        None => "-",
        Some(Congestion::Bbr) => "BBR",
        Some(Congestion::CappedBbr) => "BBR, capped",
        Some(Congestion::Cubic) => "Cubic",
        Some(Congestion::NewReno) => "NewReno",
        Some(Congestion::QueueGatedCubic) => "Cubic, queue-gated",
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
    let files = generate_certs(&dir, &["localhost"])?;
    let model_bytes = layout.total_bytes() as usize;
    eprintln!(
        "{}: {:.1} MB per round; generating gradients",
        args.model,
        model_bytes as f64 / 1e6
    );
    let shared = |g: Vec<Vec<f32>>| g.into_iter().map(Arc::new).collect();
    let grads = [shared(grads(&layout, 1)), shared(grads(&layout, 2))];
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

/// The variants compared at one loss rate.
fn variants(
    bench: &Bench,
    loss: f64,
    model_bytes: usize,
) -> Vec<(&'static str, Kind, Option<Congestion>)> {
    let default = LossyRelease::default();
    let adaptive = LossyCarrier::default();
    let mut v = Vec::new();
    for &cc in &bench.args.controllers {
        let cc = Some(Congestion::from(cc));
        v.extend([
            ("gradlane", Kind::Gradlane(0.8, default, adaptive, true), cc),
            // The lossy part as datagrams even where the path loses
            // nothing.
            (
                "gradlane, lossy always as datagrams",
                Kind::Gradlane(0.8, default, LossyCarrier::Datagrams, true),
                cc,
            ),
            // The same from borrowed slices (`send_round`): the important
            // part is copied once more, into the framing buffer.
            (
                "gradlane, copied in",
                Kind::Gradlane(0.8, default, adaptive, false),
                cc,
            ),
            // The same, but the lossy part starts only once the receiver
            // confirmed the important part: no lossy traffic in flight
            // while it arrives (the default starts it once quinn has sent
            // the important stream).
            (
                "gradlane, lossy after confirmation",
                Kind::Gradlane(0.8, LossyRelease::Acknowledged, adaptive, true),
                cc,
            ),
            ("raw quinn", Kind::Quinn(model_bytes, false), cc),
            (
                "raw quinn, f32 in and out",
                Kind::Quinn(model_bytes, true),
                cc,
            ),
            (
                "gradlane all-reliable",
                Kind::Gradlane(1.0, default, adaptive, true),
                cc,
            ),
        ]);
    }
    if loss == 0.0 {
        v.push(("tokio TCP", Kind::Tcp(model_bytes), None));
    }
    if !bench.args.quick {
        for cc in [Congestion::Cubic, Congestion::QueueGatedCubic] {
            v.push((
                "gradlane",
                Kind::Gradlane(0.8, default, adaptive, true),
                Some(cc),
            ));
            v.push(("raw quinn", Kind::Quinn(model_bytes, false), Some(cc)));
        }
    }
    v
}

/// Per loss rate, every variant on its own fresh connection, all open at
/// once; a warm-up round each, then the timed rounds interleaved: round `r`
/// of every variant (in an order rotated each round) before round `r + 1`.
/// A slow spell of this shared machine then hits every variant alike: the
/// ratios compare rounds taken seconds, not minutes, apart.
async fn measure(bench: &Bench, model_bytes: usize) -> Result<Measured, BoxError> {
    let mut rows = Vec::new();
    let mut important_quinn = Vec::new();
    for &loss in &bench.args.losses {
        let mut live: Vec<(Row, Option<Runner>, f64)> = Vec::new();
        for (name, kind, cc) in variants(bench, loss, model_bytes) {
            live.push(open(bench, name, kind, cc, loss).await);
        }
        for (row, runner, _) in &mut live {
            warm_up(bench, row, runner).await;
        }
        // The important class's size is known after gradlane's warm-up.
        let imp = live
            .iter()
            .find(|(r, ..)| r.name == "gradlane")
            .map_or(0, |(r, ..)| r.important_bytes as usize);
        let mut imp_row = None;
        if imp > 0 {
            let name = "raw quinn, important bytes only";
            let mut entry = open(
                bench,
                name,
                Kind::Quinn(imp, false),
                Some(bench.first_controller()),
                loss,
            )
            .await;
            warm_up(bench, &mut entry.0, &mut entry.1).await;
            imp_row = Some(live.len());
            live.push(entry);
        }
        let budget = bench.args.budget_s as f64;
        for r in 1..=bench.args.rounds {
            let n = live.len();
            for i in 0..n {
                let (row, runner, spent) = &mut live[(i + r) % n];
                let Some(run) = runner else { continue };
                if bench.args.idle_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(bench.args.idle_ms)).await;
                }
                let cpu_before = CpuTime::now();
                let sample = run.round(bench, r).await;
                row.cpu.add(&CpuTime::now().since(&cpu_before));
                match sample {
                    Ok(s) => {
                        *spent += s.time;
                        row.times.push(s.time);
                        row.important.extend(s.important);
                        row.plan.extend(s.plan);
                        if s.important_bytes > 0 {
                            row.important_bytes = s.important_bytes;
                        }
                        row.zero_filled += s.zero_filled as f64;
                        if *spent > budget {
                            row.note = format!("stopped after {} s budget", bench.args.budget_s);
                            if let Some(run) = runner.take() {
                                run.stop().await;
                            }
                        }
                    }
                    Err(e) => {
                        row.note = format!("error after {} rounds: {e}", row.times.len());
                        *runner = None;
                    }
                }
            }
        }
        for (i, (mut row, runner, _)) in live.into_iter().enumerate() {
            if let Some(run) = runner {
                run.stop().await;
            }
            row.zero_filled /= row.times.len().max(1) as f64;
            row.times.sort_by(f64::total_cmp);
            row.important.sort_by(f64::total_cmp);
            row.plan.sort_by(f64::total_cmp);
            eprintln!(
                "{} {:?} loss {loss}: {} rounds, median {:.1} ms, p99 {:.1} ms {}",
                row.name,
                row.congestion,
                row.times.len(),
                row.median().unwrap_or(f64::NAN) * 1e3,
                row.p99().unwrap_or(f64::NAN) * 1e3,
                row.note
            );
            if Some(i) == imp_row {
                important_quinn.push((loss, row));
            } else {
                rows.push(row);
            }
        }
    }
    Ok((rows, important_quinn))
}

/// A row for a variant and its open connection (none if skipped or failed).
async fn open(
    bench: &Bench,
    name: &str,
    kind: Kind,
    congestion: Option<Congestion>,
    loss: f64,
) -> (Row, Option<Runner>, f64) {
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
        cpu: CpuTime::default(),
        note: String::new(),
    };
    if bench.skipped(&format!("{name} {}", cc_name(congestion))) {
        row.note = "skipped (--only)".into();
        return (row, None, 0.0);
    }
    match bench.start(kind, congestion, loss).await {
        Ok(run) => (row, Some(run), 0.0),
        Err(e) => {
            row.note = format!("connection failed: {e}");
            (row, None, 0.0)
        }
    }
}

/// Round 0, untimed: connections and buffers settle.
async fn warm_up(bench: &Bench, row: &mut Row, runner: &mut Option<Runner>) {
    let Some(run) = runner else { return };
    match run.round(bench, 0).await {
        Ok(s) => row.important_bytes = s.important_bytes,
        Err(e) => {
            row.note = format!("warm-up failed: {e}");
            *runner = None;
        }
    }
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
        "{} rounds of {:.1} MB ({}) per variant after 1 warm-up; every variant on its own \
         connection, rounds interleaved across variants; QUIC variants: {} ms delay each way, \
         seeded loss each way, {}; loopback, one process. CPU s/GB: the process's user + system \
         CPU time over its timed rounds (sender and receiver together, both in this process) \
         per GB of model data",
        bench.args.rounds,
        model_bytes as f64 / 1e6,
        bench.args.model,
        bench.args.delay_ms,
        if bench.args.jumbo {
            "8952-byte packets (--jumbo)"
        } else if bench.args.ethernet {
            "packets up to 1452 bytes (--ethernet)"
        } else {
            "packets up to what loopback carries (MTU discovery)"
        }
    );
    println!();
    println!(
        "| variant | CC | loss | rounds | median ms | p99 ms | Gbit/s (median) | vs raw quinn | \
         p99 vs own lossless p99 | zero-filled MB/round | CPU s/GB | of which system | note |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let g = gbps(r.median());
        let base = find(
            "raw quinn",
            r.congestion.or(Some(bench.first_controller())),
            r.loss,
        )
        .and_then(|q| gbps(q.median()));
        let vs = match (g, base) {
            (Some(a), Some(b)) if !matches!(r.kind, Kind::Quinn(_, false)) => {
                format!("{:.2}x", a / b)
            }
            _ => "-".into(),
        };
        let own = match (r.kind, r.p99(), lossless_gl(r.congestion)) {
            (Kind::Gradlane(x, ..), Some(p), Some(l)) if x < 1.0 && r.name == "gradlane" => {
                format!("{:.2}x", p / l)
            }
            _ => "-".into(),
        };
        let zero = match r.kind {
            Kind::Gradlane(..) => format!("{:.2}", r.zero_filled / 1e6),
            _ => "-".into(),
        };
        let moved = model_bytes as u64 * r.times.len() as u64;
        let cpu = r.cpu.per_gb(moved);
        let system = CpuTime {
            user: Default::default(),
            system: r.cpu.system,
        }
        .per_gb(moved);
        let per_gb = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        println!(
            "| {} | {} | {}% | {} | {} | {} | {} | {vs} | {own} | {zero} | {} | {} | {} |",
            r.name,
            cc_name(r.congestion),
            r.loss * 100.0,
            r.times.len(),
            ms(r.median()),
            ms(r.p99()),
            g.map_or("-".into(), |v| format!("{v:.2}")),
            per_gb(cpu),
            per_gb(system),
            r.note
        );
    }

    let mut imp_ratios = Vec::new();
    let list = |v: &[(f64, f64)]| {
        v.iter()
            .map(|(l, r)| format!("{}%: {r:.2}x", l * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for &cc in &bench.args.controllers {
        let bbr = Some(Congestion::from(cc));
        println!();
        println!(
            "Important arrival ({}): gradlane's receiver holding every important chunk vs a raw quinn \
             stream of the important bytes only read to its end",
            cc_name(bbr)
        );
        println!();
        println!(
            "| loss | important MB | gradlane median ms | of which before the first byte | raw quinn median ms | ratio | ratio without that | lossy after confirmation: median ms (no lossy in flight) | with / without lossy in flight |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (loss, q) in important_quinn {
            let q = if bbr == Some(bench.first_controller()) {
                Some(q)
            } else {
                None
            };
            let Some(gl) = find("gradlane", bbr, *loss) else {
                continue;
            };
            let a = median(&gl.important);
            let b = q.and_then(Row::median);
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
            let quiet = find("gradlane, lossy after confirmation", bbr, *loss)
                .and_then(|r| median(&r.important));
            let inflight = match (a, quiet) {
                (Some(a), Some(q)) => format!("{:.2}x", a / q),
                _ => "-".into(),
            };
            println!(
                "| {}% | {:.1} | {} | {} | {} | {ratio} | {net} | {} | {inflight} |",
                loss * 100.0,
                gl.important_bytes as f64 / 1e6,
                ms(a),
                ms(enc),
                ms(b),
                ms(quiet)
            );
        }

        println!();
        println!("Goals ({}):", cc_name(bbr));
        let verdict = |ok: Option<bool>| match ok {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measured",
        };
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
        // The goal: the important bytes' arrival with lossy traffic in
        // flight (the default: datagrams released once the stream is sent,
        // a lossy stream at once) against without (the lossy part after the
        // important part is confirmed).
        let inflight: Vec<(f64, f64)> = bench
            .args
            .losses
            .iter()
            .filter_map(|&l| {
                let with = find("gradlane", bbr, l).and_then(|r| median(&r.important))?;
                let without = find("gradlane, lossy after confirmation", bbr, l)
                    .and_then(|r| median(&r.important))?;
                Some((l, with / without))
            })
            .collect();
        let worst = |v: &[(f64, f64)]| v.iter().map(|x| x.1).reduce(f64::max);
        println!(
            "- important arrival with lossy traffic in flight <= 1.1x without (every loss): {} ({})",
            verdict(worst(&inflight).map(|w| w <= 1.1)),
            list(&inflight)
        );
    }
    println!();
    println!(
        "For reference, not goals ({}):",
        cc_name(Some(bench.first_controller()))
    );
    let bbr = Some(bench.first_controller());
    let t = |name, loss| find(name, bbr, loss).and_then(|r| gbps(r.median()));
    let g5 = t("gradlane", 0.0)
        .zip(t("raw quinn, f32 in and out", 0.0))
        .map(|(a, b)| a / b);
    println!(
        "- lossless gradlane vs raw quinn copying the gradients in and out of the stream: {}",
        g5.map_or("-".into(), |x| format!("{x:.2}x"))
    );
    println!(
        "- important arrival vs a raw quinn stream of the important bytes only: {}",
        list(&imp_ratios)
    );
}
