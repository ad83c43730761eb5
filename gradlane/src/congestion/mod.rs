//! gradlane's congestion controllers: quinn's own, each with one decision
//! changed by a gate of ours ([`gate`]).
//!
//! - [`capped_bbr`]: BBR with the bound on bytes in flight that quinn's
//!   version lacks (the default).
//! - [`queue_gated_cubic`]: Cubic that reacts to loss only with a queue in
//!   sight, for paths with random loss.

pub(crate) mod capped_bbr;
pub(crate) mod gate;
pub(crate) mod queue_gated_cubic;
