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

use capped_bbr::CappedBbrConfig;
use queue_gated_cubic::QueueGatedCubicConfig;
use quinn::congestion::{BbrConfig, ControllerFactory, CubicConfig, NewRenoConfig};
use std::sync::Arc;

/// The congestion controller of a connection. The important stream and
/// the lossy datagrams share it, so under random loss the controller, not
/// retransmission, decides how long a round takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Congestion {
    /// quinn's BBR with its window capped at a gain times the measured
    /// bandwidth-delay product: BBR's rate under random loss, without
    /// filling every queue on the way (quinn 0.11's BBR never bounds its
    /// window). The default; change it only to compare.
    #[default]
    CappedBbr,
    /// quinn's BBR as it is: holds its rate under random loss, but its
    /// window grows without bound and overflows the queues it crosses.
    Bbr,
    /// quinn's CUBIC (quinn's own default): loss-based, so random loss
    /// collapses its rate.
    Cubic,
    /// NewReno: the conservative reference.
    NewReno,
    /// CUBIC told of a loss only when the RTT shows a standing queue or the
    /// loss rate is high: keeps its rate under random loss like BBR and
    /// backs off when a queue fills. On a CPU-bound host the host's own
    /// delay reads as a queue, and it falls behind BBR.
    QueueGatedCubic,
}

impl Congestion {
    /// The quinn factory of this controller.
    pub(crate) fn factory(self) -> Arc<dyn ControllerFactory + Send + Sync> {
        match self {
            Congestion::CappedBbr => Arc::new(CappedBbrConfig::default()),
            Congestion::Bbr => Arc::new(BbrConfig::default()),
            Congestion::Cubic => Arc::new(CubicConfig::default()),
            Congestion::NewReno => Arc::new(NewRenoConfig::default()),
            Congestion::QueueGatedCubic => Arc::new(QueueGatedCubicConfig::default()),
        }
    }
}
