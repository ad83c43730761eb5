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

mod connect;
mod measure;
mod report;
mod rounds;
mod variants;

use gradlane_tools::cli as common;
use gradlane_tools::local_certs::localhost_certs;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use common::{grads, BoxError, Cc};
use gradlane::{CertFiles, Config, Congestion, Faults, Layout, Packets};

/// Round times of gradlane, raw quinn, all-reliable gradlane and TCP.
#[derive(Debug, Parser)]
#[command(name = "round_bench")]
struct Args {
    /// Streams each gradlane round's important part is spread over
    /// (`Config::lanes`; default: the library's).
    #[arg(long)]
    lanes: Option<u8>,
    #[command(flatten)]
    sweep: common::Sweep,
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
        let delay = Duration::from_millis(self.args.sweep.delay_ms);
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
        common::left_out(&self.args.only, name)
    }
}

fn main() -> std::process::ExitCode {
    common::main("round_bench", run)
}

async fn run(args: Args) -> Result<(), BoxError> {
    args.sweep.check()?;
    let layout = common::preset(&args.model)?;
    let (dir, files) = localhost_certs("round-bench")?;
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
    let result = measure::measure(&bench, model_bytes).await;
    let _ = std::fs::remove_dir_all(&dir);
    let (rows, important_quinn) = result?;
    report::report(&bench, model_bytes, &rows, &important_quinn);
    Ok(())
}
