//! The QUIC shell around the deterministic core.
//!
//! - [`endpoint`]: [`Endpoint`] and its [`Config`]: where links come from.
//! - [`link`]: [`Link`], one bidirectional gradient link over one QUIC
//!   connection: `send_round` (or `send_round_shared`, which hands quinn
//!   views of shared tensors instead of copies) and `recv_round`.
//! - [`handshake`]: the control stream's messages (layout, acknowledgements).
//! - [`tls`]: certificates in, quinn client/server configurations out, and a
//!   small CA to make the certificates.
//! - [`tuning`]: UDP sockets with large kernel buffers, flow-control windows
//!   and the congestion controller, and an endpoint built from both.
//! - [`capped_bbr`]: quinn's BBR with the bound on bytes in flight it
//!   lacks.
//! - [`congestion`]: Cubic that reacts to loss only with a queue in sight,
//!   for paths with random loss.
//! - [`gated_controller`]: the shell both controllers share: quinn's
//!   controller with a gate of ours in front.
//! - [`gso_cap`]: keeps quinn's GSO batches within one UDP send, which
//!   jumbo packets need.
//! - [`marking`]: DSCP marks per traffic class, for networks with
//!   priority queues (quinn-udp writes only ECN).
//! - [`faults`]: a seeded loss/delay wrapper of the UDP socket for tests,
//!   examples and benchmarks (this host has no `netem`).

pub mod capped_bbr;
pub mod congestion;
pub mod endpoint;
pub mod faults;
pub mod gated_controller;
pub mod gso_cap;
pub mod handshake;
pub mod link;
pub mod marking;
pub mod tls;
pub mod tuning;

pub use endpoint::{Config, Endpoint, Incoming, IncomingError, SetupError};
pub use faults::Faults;
pub use link::{
    DatagramSize, Link, LinkError, LinkReceiver, LinkSender, LossyCarrier, LossyRelease,
    RoundArrival, RoundTiming, SendReport, LOSSY_STREAM_PACKET,
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
