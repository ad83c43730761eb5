//! One of quinn's congestion controllers with a gate of ours in front.
//!
//! Why: both of gradlane's controllers are quinn's own with one decision
//! changed: [`crate::congestion::queue_gated_cubic`] decides which losses reach
//! Cubic, [`crate::congestion::capped_bbr`] bounds BBR's window. The gates
//! are pure and tested on their own; this is the one thin shell that
//! feeds them quinn's events and hands everything else through.

use std::any::Any;
use std::time::{Duration, Instant};

use quinn::congestion::{Controller, ControllerMetrics};

/// What a gate sees of quinn's events and what it may change.
pub(crate) trait ControllerGate: Clone + Send + Sync + 'static {
    /// `bytes` sent at `sent` were acknowledged at `now`; `srtt` is the
    /// smoothed RTT; `app_limited` when the sender had less to send than
    /// it was allowed.
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        srtt: Duration,
    );

    /// A congestion event (`lost_bytes`, 0 for an ECN mark) with the inner
    /// controller's window at `window`: whether to pass it on.
    fn pass_congestion(
        &mut self,
        _now: Instant,
        _lost_bytes: u64,
        _persistent: bool,
        _window: u64,
    ) -> bool {
        true
    }

    /// The window to use, given the inner controller's.
    fn window(&self, inner: u64) -> u64 {
        inner
    }

    /// The path's packet size changed.
    fn set_mtu(&mut self, mtu: u16);
}

/// quinn's controller `inner` behind the gate `G`.
pub(crate) struct GatedController<G> {
    inner: Box<dyn Controller>,
    gate: G,
}

impl<G: ControllerGate> GatedController<G> {
    /// `inner` behind `gate`.
    pub(crate) fn new(inner: Box<dyn Controller>, gate: G) -> Self {
        Self { inner, gate }
    }

    /// The gate, with what it measured and decided so far.
    pub(crate) fn gate(&self) -> &G {
        &self.gate
    }

    /// quinn's controller inside.
    pub(crate) fn into_inner(self) -> Box<dyn Controller> {
        self.inner
    }
}

impl<G: ControllerGate> Controller for GatedController<G> {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.inner.on_sent(now, bytes, last_packet_number);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &quinn_proto::RttEstimator,
    ) {
        self.gate.on_ack(now, sent, bytes, app_limited, rtt.get());
        self.inner.on_ack(now, sent, bytes, app_limited, rtt);
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
        self.inner
            .on_end_acks(now, in_flight, app_limited, largest_packet_num_acked);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        let window = self.inner.window();
        if self
            .gate
            .pass_congestion(now, lost_bytes, is_persistent_congestion, window)
        {
            self.inner
                .on_congestion_event(now, sent, is_persistent_congestion, lost_bytes);
        }
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.gate.set_mtu(new_mtu);
        self.inner.on_mtu_update(new_mtu);
    }

    fn window(&self) -> u64 {
        self.gate.window(self.inner.window())
    }

    fn metrics(&self) -> ControllerMetrics {
        let mut m = self.inner.metrics();
        m.congestion_window = self.window();
        m
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(Self {
            inner: self.inner.clone_box(),
            gate: self.gate.clone(),
        })
    }

    fn initial_window(&self) -> u64 {
        self.inner.initial_window()
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}
