//! The UDP socket under quinn, in layers, each a wrapper of quinn's
//! `AsyncUdpSocket` that forwards what it does not change:
//!
//! - [`gso_cap`]: keeps quinn's GSO batches within one UDP send, which
//!   jumbo packets need.
//! - [`marking`]: writes the DSCP of the class a link is sending into every
//!   packet (quinn-udp writes only ECN).
//! - [`faults`]: seeded loss, delay and jitter, for tests, examples and
//!   benchmarks (this kind of host has no `netem`).

pub(crate) mod faults;
pub(crate) mod gso_cap;
pub(crate) mod marking;
