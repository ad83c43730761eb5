//! One of quinn's congestion controllers with a gate of ours in front.
//!
//! Why: both of gradlane's controllers are quinn's own with one decision
//! changed: [`crate::congestion::queue_gated_cubic`] decides which losses reach
//! Cubic, [`crate::congestion::capped_bbr`] bounds BBR's window. The gates
//! are pure and tested on their own; this is the one thin shell that
//! feeds them quinn's events and hands everything else through.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics};

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

    /// The bytes in flight to tell the inner controller at the end of a
    /// batch of acknowledgements, given the true count and the inner
    /// controller's own window: a gate that lifts the window above the
    /// inner's can keep more in flight than the inner ever could.
    fn inner_in_flight(&self, in_flight: u64, _inner_window: u64) -> u64 {
        in_flight
    }

    /// The path's packet size changed.
    fn set_mtu(&mut self, mtu: u16);
}

/// A gate made from one setting (BBR's cap gain, Cubic's tolerated loss
/// rate), which [`GatedConfig`] builds one of per connection.
pub(crate) trait GateFromSetting: ControllerGate + std::fmt::Debug {
    /// The setting [`GatedConfig::default`] builds gates with.
    const DEFAULT_SETTING: f64;

    /// A connection's gate from `setting`, on a path of packet size `mtu`.
    fn from_setting(setting: f64, mtu: u16) -> Self;
}

/// Builds [`GatedController`]s: quinn's factory `F` with its defaults
/// behind a gate `G` made from `setting`; give it to
/// `quinn::TransportConfig::congestion_controller_factory`.
#[derive(Debug, Clone)]
pub(crate) struct GatedConfig<F, G> {
    inner: Arc<F>,
    setting: f64,
    gate: PhantomData<fn() -> G>,
}

impl<F: Default, G: GateFromSetting> GatedConfig<F, G> {
    /// quinn's `F` with its defaults, each connection's gate made from
    /// `setting`.
    pub(crate) fn new(setting: f64) -> Self {
        Self {
            inner: Arc::new(F::default()),
            setting,
            gate: PhantomData,
        }
    }
}

impl<F: Default, G: GateFromSetting> Default for GatedConfig<F, G> {
    fn default() -> Self {
        Self::new(G::DEFAULT_SETTING)
    }
}

impl<F: ControllerFactory, G: GateFromSetting> ControllerFactory for GatedConfig<F, G> {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(GatedController::new(
            self.inner.clone().build(now, current_mtu),
            G::from_setting(self.setting, current_mtu),
        ))
    }
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
        let in_flight = self.gate.inner_in_flight(in_flight, self.inner.window());
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A controller that records the bytes in flight it is told.
    #[derive(Clone, Default)]
    struct Recorder {
        told: Arc<Mutex<Vec<u64>>>,
    }

    impl Controller for Recorder {
        fn on_end_acks(&mut self, _: Instant, in_flight: u64, _: bool, _: Option<u64>) {
            self.told.lock().expect("not poisoned").push(in_flight);
        }
        fn on_congestion_event(&mut self, _: Instant, _: Instant, _: bool, _: u64) {}
        fn on_mtu_update(&mut self, _: u16) {}
        fn window(&self) -> u64 {
            5_000
        }
        fn clone_box(&self) -> Box<dyn Controller> {
            Box::new(self.clone())
        }
        fn initial_window(&self) -> u64 {
            5_000
        }
        fn into_any(self: Box<Self>) -> Box<dyn Any> {
            self
        }
    }

    /// Lifts every window to at least 50 kB, and says so to the inner.
    #[derive(Clone)]
    struct Lift;

    impl ControllerGate for Lift {
        fn on_ack(&mut self, _: Instant, _: Instant, _: u64, _: bool, _: Duration) {}
        fn window(&self, inner: u64) -> u64 {
            inner.max(50_000)
        }
        fn inner_in_flight(&self, in_flight: u64, inner_window: u64) -> u64 {
            in_flight.min(inner_window)
        }
        fn set_mtu(&mut self, _: u16) {}
    }

    /// Changes nothing.
    #[derive(Clone)]
    struct Pass;

    impl ControllerGate for Pass {
        fn on_ack(&mut self, _: Instant, _: Instant, _: u64, _: bool, _: Duration) {}
        fn set_mtu(&mut self, _: u16) {}
    }

    #[test]
    fn the_inner_controller_is_told_what_the_gate_makes_of_the_bytes_in_flight() {
        let now = Instant::now();
        let inner = Recorder::default();
        let told = inner.told.clone();
        let mut lifted = GatedController::new(Box::new(inner), Lift);
        assert_eq!(lifted.window(), 50_000);
        lifted.on_end_acks(now, 40_000, false, Some(7));
        lifted.on_end_acks(now, 3_000, false, Some(8));

        let inner = Recorder::default();
        let told_plain = inner.told.clone();
        let mut plain = GatedController::new(Box::new(inner), Pass);
        plain.on_end_acks(now, 40_000, false, Some(7));

        assert_eq!(*told.lock().expect("not poisoned"), [5_000, 3_000]);
        assert_eq!(*told_plain.lock().expect("not poisoned"), [40_000]);
    }
}
