//! The transport shell around QUIC: everything the link needs from the
//! network that does not depend on gradlane's wire format.
//!
//! - [`tls`]: certificates in, quinn client/server configurations out, and a
//!   small CA to make the certificates.
//! - [`tuning`]: UDP sockets with large kernel buffers, flow-control windows
//!   and the congestion controller, and an endpoint built from both.
//! - [`faults`]: a seeded loss/delay wrapper of the UDP socket for tests,
//!   examples and benchmarks (this host has no `netem`).

pub mod faults;
pub mod tls;
pub mod tuning;
