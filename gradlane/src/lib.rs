//! gradlane moves gradient tensors between the processes of a distributed
//! training job over QUIC, and spends reliability only where it pays.
//!
//! Every round, each tensor is cut into chunks; each chunk is scored by its
//! smoothed contribution; the most important chunks travel exactly and
//! first on reliable, highest-priority QUIC streams and the rest as QUIC
//! datagrams in graded lossy levels. The receiver rebuilds each tensor as
//! soon as every important chunk is in, fills what is missing with zeros,
//! and adds chunks that arrive late into the next round.
//!
//! # The API
//!
//! - Links: [`Endpoint`] (from certificate files), [`Link`] and its halves
//!   [`LinkSender`] and [`LinkReceiver`], [`Round`] and [`SendReport`],
//!   [`LinkError`].
//! - Groups: [`Group`] of N ranks, formed by a [`Rendezvous`] with a
//!   [`GroupConfig`]; its collectives (exact, differentiated, sparse) and
//!   its [`PointToPoint`] messages ([`MessageBody`]); [`BufferPool`] for
//!   large sends.
//! - The model: [`Layout`], [`TensorSpec`], [`presets`].
//! - Settings: [`Config`]; [`Faults`] to inject loss and delay.
//! - Certificates: [`generate_certs`] (per address or host name),
//!   [`generate_job_certs`] (per job, for addresses not known beforehand).
//! - [`codec`]: the sparse log-quantized gradient codec.
//! - [`ps`]: the parameter-server algorithms (ordered momentum, the
//!   straggler filter); [`ps_net`]: a server and workers that run them
//!   over links.
//! - [`quic`]: baselines, plain quinn set up the way gradlane sets up its
//!   own connections, for measuring against.
//!
//! The deterministic core (chunking, scoring, framing, reassembly) is the
//! crate `gradlane-core`, for those who bring their own transport.
//!
//! # Example: one round over a real QUIC link on loopback
//!
//! ```
//! use gradlane::{generate_certs, Config, Endpoint, Layout, TensorSpec};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Certificates come from files; `cargo run --bin certs` makes them.
//! let dir = std::env::temp_dir().join(format!("gradlane-doc-{}", std::process::id()));
//! generate_certs(&dir, &["localhost"])?;
//!
//! let layout = Layout::new(vec![
//!     TensorSpec::conv2d("conv1.weight", [64, 3, 7, 7]),
//!     TensorSpec::dense("fc.weight", [10, 64]),
//!     TensorSpec::dense("fc.bias", [10]),
//! ])?;
//!
//! // Receiving side: it learns the layout in the handshake.
//! let server = Endpoint::server(
//!     "127.0.0.1:0".parse()?,
//!     dir.join("server.pem"),
//!     dir.join("server.key"),
//!     Config::default(),
//! )?;
//! let addr = server.local_addr()?;
//!
//! // Sending side.
//! let client = Endpoint::client(dir.join("ca.pem"), Config::default())?;
//! let (accepted, connected) =
//!     tokio::join!(server.accept(), client.connect(addr, "localhost", &layout));
//! let (mut rx, mut tx) = (accepted.expect("endpoint open")?, connected?);
//!
//! let grads: Vec<Vec<f32>> = (0..layout.len())
//!     .map(|t| (0..layout.tensor_len(t)).map(|i| (i as f32).sin()).collect())
//!     .collect();
//! let (report, round) = tokio::join!(
//!     tx.sender().send_round(0, &grads),
//!     rx.receiver().recv_round()
//! );
//! let (report, round) = (report?, round?);
//!
//! // 80% of each tensor's chunks travelled reliably and are exact.
//! assert_eq!(round.index, 0);
//! assert_eq!(round.stats.classes[0].received_bytes, report.important_bytes);
//! assert_eq!(round.tensors.len(), 3);
//! tx.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Map of the crate
//!
//! - `config`: [`Config`], the settings of a link end; `config_error`:
//!   [`ConfigError`], what makes a setting invalid, and QUIC's bounds on
//!   the UDP payload.
//! - `endpoint`: [`Endpoint`], where links come from: the gradlane
//!   handshake, each connection's own transport settings (the MTU of its
//!   route), and [`Incoming`], a client before its handshakes.
//! - `attempts`: attempts that overlap, a new one each window while the
//!   earlier ones go on: a connect's QUIC handshakes under heavy loss, and
//!   a rank's dial.
//! - `link/`: a [`Link`] over one QUIC connection, driving the core's round
//!   protocol machines (`gradlane_core::protocol`): `send` (a round from
//!   classing to the peer's confirmation), `lanes` (framing pipelined with
//!   the stream writers), `lossy` (the release of the lossy part),
//!   `in_flight` (abandoning a round), `receive` (the reliable and
//!   unreliable engines feeding the core's reassembler), `layouts` (more
//!   layouts on one link), `messages` (exact messages), `close` (closing in
//!   order).
//! - `framing`: one length-prefixed message at a time over a QUIC stream.
//! - `tls`: certificates in, rustls configurations out, and a small CA.
//! - `handshake_failure`: why an accepted connection's handshake failed,
//!   from the TLS alert its refusal sent.
//! - `tuning`: socket buffers, flow-control windows, MTU and the congestion
//!   controller, as quinn's transport configuration.
//! - `stack`: the QUIC stack under an endpoint: quinn's endpoint on the
//!   socket layers.
//! - `socket/`: the UDP socket under quinn and the layers over it (`layer`):
//!   GSO/GRO batches, DSCP marks, faults; the MTU of the route to a peer.
//! - `congestion/`: gradlane's two congestion controllers, quinn's own with
//!   one decision changed by a gate (`gate`).
//! - `group/`: a [`Group`] of N ranks over a mesh of links: forming it
//!   (`rendezvous`), ports from a firewall's range (`port_range`), further
//!   paths over several sockets (`paths`), the exact (`exact`) and
//!   differentiated (`differentiated`) collectives, the sparse allgather
//!   (`sparse`).
//! - [`ps_net`]: the parameter server over links.
//! - [`quic`]: baselines, plain quinn set up like gradlane.

#![warn(unreachable_pub)]

mod attempts;
mod buffer_pool;
mod config;
mod config_error;
mod congestion;
mod endpoint;
pub mod environment;
mod framing;
mod group;
mod handshake_failure;
mod link;
pub mod ps_net;
pub mod quic;
mod socket;
mod stack;
mod tls;
mod tuning;

#[cfg(test)]
mod tests;

pub use buffer_pool::BufferPool;
pub use config::{
    Config, ConfigError, Packets, QuicSettings, ReceiverLimits, Scoring, DEFAULT_CONNECT_TIMEOUT,
    ETHERNET_UDP_PAYLOAD, JUMBO_UDP_PAYLOAD, MAX_UDP_PAYLOAD, MIN_UDP_PAYLOAD,
};
pub use congestion::{controller_state, Congestion, ControllerState};
pub use endpoint::{Endpoint, Incoming, IncomingError, SetupError};
pub use gradlane_core::classify::{AdaptiveRatio, Ranking};
pub use gradlane_core::codec;
pub use gradlane_core::control::{codes, HandshakeError};
pub use gradlane_core::encode::EncodeError;
pub use gradlane_core::format::{bf16, f16, ClassFormats, Element, FormatError, ValueFormat};
pub use gradlane_core::layout::{
    ChunkOptions, ConvChunking, Layout, LayoutError, TensorKind, TensorSpec,
};
pub use gradlane_core::presets;
pub use gradlane_core::protocol::{AdaptiveDeadline, StepDeadline, StepDeadlineError};
pub use gradlane_core::ps;
pub use gradlane_core::reassembly::{
    ClassStats, ReassemblyError, ReceiverCounters, Round, RoundStats,
};
pub use gradlane_core::score::GradientError;
pub use gradlane_core::typed::{Dtype, Op as TypedOp, TypedError};
pub use group::{
    core_share, default_sockets, paths_per_peer, AllreduceReport, BucketId, BucketOptions, Group,
    GroupConfig, GroupError, LossRecovery, OnRankFailure, PointToPoint, PortRange, PortRangeError,
    ReduceOp, Rendezvous, SparseAllgather, SparsePath, SparseReport, SparseRows, MAILBOX_BYTES,
    MAX_SOCKETS,
};
pub use handshake_failure::{HandshakeFailure, Refuser};
pub use link::{
    DatagramSize, LayoutId, Link, LinkError, LinkReceiver, LinkSender, LossyCarrier, LossyRelease,
    MessageBody, PointToPointReceiver, PointToPointSender, RoundArrival, RoundTiming, SendReport,
    CLOSE_WAIT, MAX_MESSAGE_BYTES,
};
pub use socket::batching::BatchCounts;
pub use socket::faults::{FaultStats, Faults};
pub use socket::marking::DscpMarks;
#[cfg(target_os = "linux")]
pub use socket::marking::MarkedCounts;
pub use stack::EndpointError;
pub use tls::{
    cert_job_name, generate_certs, generate_job_certs, job_server_name, CertFiles,
    ClientConfigError, GenerateCertsError, PeerCertError, PemError, ServerConfigError,
    JOB_NAME_SUFFIX,
};

/// Runs CPU-heavy work (scoring and framing a round, applying a gradient to
/// a large model: tens of milliseconds). On a multi-threaded runtime it
/// tells tokio first, which moves the other tasks of this worker thread
/// (quinn's drivers, stream writers) to another thread meanwhile; a
/// current-thread runtime has no other thread, and outside a runtime there
/// is nothing to move.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
