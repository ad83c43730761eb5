//! BBR with the bounds on data in flight that quinn 0.11's BBR lacks.
//!
//! Why: BBR keeps its rate under random loss, where Cubic collapses
//! (docs/DESIGN.md §6), but quinn's BBR never bounds its window
//! (quinn-rs/quinn#2798): it overflows every queue on its path, and what
//! waits there waits ahead of the important stream's last bytes. Its window
//! also follows the smallest RTT it ever saw and restarts from what is in
//! flight at every loss, so on a lossy or loaded path it can stay at a few
//! packets and leave the link idle.
//!
//! [`InflightCap`] measures the delivery rate and the smallest RTT, from
//! samples that age out; [`CappedBbr`] is quinn's BBR with its window
//! raised to at least the delivery rate times the smoothed RTT and cut to a
//! gain times the bandwidth-delay product. The estimator is pure and tested
//! on its own; [`GatedController`] is the shell both of gradlane's
//! controllers share.

use std::time::{Duration, Instant};

use quinn::congestion::BbrConfig;

use crate::congestion::gate::{ControllerGate, GateFromSetting, GatedConfig, GatedController};

/// The shortest delivery-rate sampling period. Acknowledgements reach a
/// busy sender in bursts of a few milliseconds; a period several times
/// longer keeps a burst from passing for bandwidth.
pub(crate) const MIN_PERIOD: Duration = Duration::from_millis(10);

/// How long a bandwidth or minimum-RTT sample is remembered (between one
/// and two spans): long enough to span the gaps between rounds, short
/// enough to follow a path that changed.
pub(crate) const FILTER_SPAN: Duration = Duration::from_secs(10);

/// The cap is never below this many packets: a path must always be able to
/// carry a few packets per RTT to measure itself again.
pub(crate) const MIN_CAP_PACKETS: u64 = 64;

/// The cap treats a shorter path as this long. A busy host delays
/// acknowledgements by a millisecond or more (scheduling), far above a
/// LAN's or loopback's RTT: capped at a few of those microsecond
/// bandwidth-delay products, the window could not cover the host's delay,
/// the measured rate fell with it, and the cap after it: a spiral down to
/// rounds several times slower than under quinn's own BBR.
pub(crate) const MIN_CAP_RTT: Duration = Duration::from_millis(2);

/// A floor that holds the cap grows by this factor per probe
/// ([`InflightCap::floor`]).
pub(crate) const FLOOR_PROBE_GAIN: f64 = 1.25;

/// A floor probe succeeds if the delivery rate rose by at least this
/// factor; then the floor grows again.
pub(crate) const FLOOR_PROBE_EVIDENCE: f64 = 1.1;

/// The default gain over the bandwidth-delay product: BBR's `cwnd_gain`
/// (2) plus room for the scheduling delays of a busy host, which hold
/// acknowledgements back for milliseconds.
pub(crate) const DEFAULT_GAIN: f64 = 2.5;

/// The largest or smallest value seen over the last one to two spans: two
/// buckets, the current one and the one before.
#[derive(Debug, Clone, Copy)]
struct Windowed<T> {
    span: Duration,
    started: Option<Instant>,
    current: Option<T>,
    previous: Option<T>,
}

impl<T: Copy> Windowed<T> {
    fn new(span: Duration) -> Self {
        Self {
            span,
            started: None,
            current: None,
            previous: None,
        }
    }

    /// Takes `v` at `now`; `better(a, b)` is true when `a` should replace
    /// `b`. False when what [`get`](Self::get) returns cannot have changed.
    fn update(&mut self, now: Instant, v: T, better: impl Fn(T, T) -> bool) -> bool {
        let started = *self.started.get_or_insert(now);
        let age = now.saturating_duration_since(started);
        let rolled = age >= self.span;
        if rolled {
            self.previous = if age < 2 * self.span {
                self.current
            } else {
                None
            };
            self.current = None;
            self.started = Some(now);
        }
        match self.current {
            Some(c) if !better(v, c) => rolled,
            _ => {
                self.current = Some(v);
                true
            }
        }
    }

    fn get(&self, better: impl Fn(T, T) -> bool) -> Option<T> {
        match (self.current, self.previous) {
            (Some(a), Some(b)) => Some(if better(b, a) { b } else { a }),
            (a, b) => a.or(b),
        }
    }
}

/// Bounds the bytes in flight by `gain` times the measured bandwidth-delay
/// product. Pure: time is an argument.
#[derive(Debug, Clone)]
pub(crate) struct InflightCap {
    gain: f64,
    mtu: u64,
    /// When the current sampling period started, and the bytes
    /// acknowledged in it since.
    period_start: Option<Instant>,
    period_acked: u64,
    period_app_limited: bool,
    /// Bytes per second.
    bandwidth: Windowed<f64>,
    min_rtt: Windowed<Duration>,
    /// Whether the cap has been at its floor all this period.
    period_at_floor: bool,
    /// The floor in bytes: [`MIN_CAP_PACKETS`] packets, or more after
    /// probes.
    floor: u64,
    probe: FloorProbe,
    /// [`cap`](Self::cap), worked out when what it depends on changes:
    /// quinn asks for the window far more often than that.
    cap: Option<u64>,
    /// The smoothed RTT at the last acknowledgement.
    srtt: Duration,
}

impl InflightCap {
    /// A cap of `gain` (clamped to at least 1) times the bandwidth-delay
    /// product, on a path with packets of `mtu` bytes.
    pub(crate) fn new(gain: f64, mtu: u16) -> Self {
        let gain = if gain.is_nan() { DEFAULT_GAIN } else { gain };
        Self {
            gain: gain.max(1.0),
            mtu: u64::from(mtu),
            period_start: None,
            period_acked: 0,
            period_app_limited: false,
            bandwidth: Windowed::new(FILTER_SPAN),
            min_rtt: Windowed::new(FILTER_SPAN),
            period_at_floor: false,
            floor: MIN_CAP_PACKETS * u64::from(mtu),
            probe: FloorProbe::default(),
            cap: None,
            srtt: Duration::ZERO,
        }
    }

    /// The path's packet size changed.
    pub(crate) fn set_mtu(&mut self, mtu: u16) {
        self.mtu = u64::from(mtu);
        self.floor = self.floor.max(self.min_floor());
        self.cap = self.work_out_cap();
    }

    fn start_period(&mut self, now: Instant) {
        self.period_start = Some(now);
        self.period_acked = 0;
        self.period_app_limited = false;
        self.period_at_floor = self.cap == Some(self.floor);
    }

    /// Works the cap out again after a change.
    fn refresh(&mut self) {
        if self.bdp_cap().is_some_and(|c| c > self.floor) {
            // The bandwidth-delay product carries the cap again: a floor
            // grown by probes has done its job.
            self.floor = self.min_floor();
            self.probe = FloorProbe::default();
        }
        self.cap = self.work_out_cap();
        self.period_at_floor &= self.cap == Some(self.floor);
    }

    /// A period spent at the floor, sending all it allowed, delivered
    /// `rate`: grows the floor if the last growth raised the rate, or for
    /// a first probe. True if the floor changed.
    fn probe_floor(&mut self, now: Instant, rate: f64) -> bool {
        let p = &mut self.probe;
        if p.settling {
            // Acknowledged what was sent partly under the old floor.
            p.settling = false;
            return false;
        }
        if p.done {
            return false;
        }
        if p.baseline.is_some_and(|b| rate < FLOOR_PROBE_EVIDENCE * b) {
            // More in flight delivered no more: the path, not the floor,
            // limits. Keep the floor reached (it cost no rate), stop.
            p.done = true;
            return false;
        }
        p.baseline = Some(rate);
        p.started.get_or_insert(now);
        p.settling = true;
        self.floor = (self.floor as f64 * FLOOR_PROBE_GAIN) as u64;
        true
    }

    /// The sampling period: a few round trips, at least [`MIN_PERIOD`].
    fn period(&self) -> Duration {
        self.min_rtt()
            .map_or(MIN_PERIOD, |r| (2 * r).max(MIN_PERIOD))
    }

    /// The delivery rate, bytes per second: the largest sample of the
    /// last one to two [`FILTER_SPAN`]s. `None` before a full period.
    pub(crate) fn bandwidth(&self) -> Option<f64> {
        self.bandwidth.get(|a, b| a > b)
    }

    /// The smallest RTT sample of the last one to two [`FILTER_SPAN`]s.
    pub(crate) fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt.get(|a, b| a < b)
    }

    /// The most bytes to have in flight: `gain` times the bandwidth times
    /// the smallest RTT (at least [`MIN_CAP_RTT`]), at least the
    /// [`floor`](Self::floor). `None` (no cap) until the bandwidth and the
    /// smallest RTT are measured.
    pub(crate) fn cap(&self) -> Option<u64> {
        self.cap
    }

    /// The least the cap allows in flight: [`MIN_CAP_PACKETS`] packets, or
    /// more while probes show that the path carries more with more.
    ///
    /// Why: the cap grows only if the rate it measures grows, and the rate
    /// measured at `gain` times itself times the smallest RTT grows only
    /// while the typical RTT stays below `gain` times the smallest. A path
    /// that takes longer than that with only the floor in flight is not
    /// queueing our packets but slow to acknowledge them (a busy host,
    /// aggregated acknowledgements, one lucky early sample), and a cap at
    /// the floor stayed there for good: a 1 Gbit/s link carried a round at
    /// a tenth of its rate. So a floor that holds the cap for a period in
    /// which the sender had more to send grows by [`FLOOR_PROBE_GAIN`], and
    /// again each time the rate rose by [`FLOOR_PROBE_EVIDENCE`], until it
    /// does not: then the link, or a slow receiver, limits, not the floor.
    /// A queue raises no rate, so it stops the growth at once. The floor
    /// falls back once the bandwidth-delay product is above it, and after
    /// [`FILTER_SPAN`] probes again from [`MIN_CAP_PACKETS`].
    #[cfg(test)]
    pub(crate) fn floor(&self) -> u64 {
        self.floor
    }

    /// The window given the inner controller's: at least the delivery
    /// rate times the smoothed RTT, at most the cap (`gain` times the
    /// bandwidth-delay product).
    /// BBR's own until both are measured.
    pub(crate) fn window(&self, inner: u64) -> u64 {
        let Some(cap) = self.cap else {
            return inner;
        };
        inner.max(self.keep_rate()).min(cap)
    }

    /// The bytes in flight that keep the measured delivery rate at the
    /// smoothed RTT: what a window must allow so that it is not what slows
    /// the flow down (quinn paces at the window over the smoothed RTT).
    /// A shorter RTT counts as [`MIN_CAP_RTT`], as in the cap: on loopback
    /// or a LAN the smoothed RTT of an idle moment is microseconds, a busy
    /// host then holds acknowledgements back for milliseconds, and a window
    /// of the rate times those microseconds let the rate, the window and
    /// the rate again fall call after call.
    fn keep_rate(&self) -> u64 {
        let bw = self.bandwidth().unwrap_or(0.0);
        let rtt = self.srtt.max(MIN_CAP_RTT);
        (bw * rtt.as_secs_f64()).min(u64::MAX as f64) as u64
    }

    fn work_out_cap(&self) -> Option<u64> {
        Some(self.bdp_cap()?.max(self.floor))
    }

    /// `gain` times the bandwidth times the smallest RTT (at least
    /// [`MIN_CAP_RTT`]), before the floor.
    fn bdp_cap(&self) -> Option<u64> {
        let rtt = self.min_rtt()?.max(MIN_CAP_RTT);
        let bdp = self.bandwidth()? * rtt.as_secs_f64();
        Some((self.gain * bdp).min(u64::MAX as f64) as u64)
    }

    fn min_floor(&self) -> u64 {
        MIN_CAP_PACKETS * self.mtu
    }
}

/// Where the floor's probing stands.
#[derive(Debug, Clone, Copy, Default)]
struct FloorProbe {
    /// The rate delivered before the last growth.
    baseline: Option<f64>,
    /// The floor just grew: the next period is a transition.
    settling: bool,
    /// A growth raised no rate: the floor stays as it is.
    done: bool,
    /// When the first growth was.
    started: Option<Instant>,
}

impl GateFromSetting for InflightCap {
    const DEFAULT_SETTING: f64 = DEFAULT_GAIN;

    fn from_setting(setting: f64, mtu: u16) -> Self {
        InflightCap::new(setting, mtu)
    }
}

impl ControllerGate for InflightCap {
    /// `bytes` sent at `sent` were acknowledged at `now`; `app_limited`
    /// when the sender had less to send than it was allowed; `srtt` the
    /// connection's smoothed RTT after this acknowledgement.
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        srtt: Duration,
    ) {
        self.srtt = srtt;
        let rtt = now.saturating_duration_since(sent);
        // An acknowledgement timed no later than its packet's send (quinn
        // stamps both with per-batch times, and a loaded host can order
        // them so) says nothing of the path: a zero minimum would stay for
        // a whole filter span.
        let mut changed = !rtt.is_zero() && self.min_rtt.update(now, rtt, |a, b| a < b);
        // The first acknowledgement of a period marks its start; what it
        // acknowledged was delivered before.
        let Some(start) = self.period_start else {
            self.refresh();
            self.start_period(now);
            return;
        };
        self.period_acked = self.period_acked.saturating_add(bytes);
        self.period_app_limited |= app_limited;
        let elapsed = now.saturating_duration_since(start);
        if elapsed < self.period() {
            if changed {
                self.refresh();
            }
            return;
        }
        let rate = self.period_acked as f64 / elapsed.as_secs_f64();
        // A period with less to send than allowed measured the sender, not
        // the path: it counts only if it beats what the path has shown.
        if !self.period_app_limited || self.bandwidth().is_none_or(|bw| rate > bw) {
            changed |= self.bandwidth.update(now, rate, |a, b| a > b);
        }
        if self
            .probe
            .started
            .is_some_and(|s| now.saturating_duration_since(s) >= FILTER_SPAN)
        {
            // Probe again from the start: the path may have changed.
            self.floor = self.min_floor();
            self.probe = FloorProbe::default();
            changed = true;
        } else if self.period_at_floor && !self.period_app_limited {
            changed |= self.probe_floor(now, rate);
        }
        if changed {
            self.refresh();
        }
        // After the refresh: whether the next period starts at the floor.
        self.start_period(now);
    }

    fn window(&self, inner: u64) -> u64 {
        InflightCap::window(self, inner)
    }

    /// While the lower bound lifts the window above BBR's, BBR is told at
    /// most its own window in flight: what it would see had its window
    /// governed. quinn's BBR leaves ProbeRTT only after what is in flight
    /// fell under its ProbeRTT window (0.75 of its bandwidth-delay
    /// product, at least 4 packets) plus a packet, and the lower bound keeps
    /// more than that in flight for as long as the sender has data: told
    /// the truth, BBR stays in ProbeRTT until the sender runs dry, its
    /// window the lower bound's, which holds the rate already measured and
    /// never probes above it. Google's reference BBR also leaves once what
    /// is in flight falls to the sender's minimum window (quiche issue
    /// 2698, pull request 2711); the lower bound is that minimum here.
    fn inner_in_flight(&self, in_flight: u64, inner_window: u64) -> u64 {
        if InflightCap::window(self, inner_window) > inner_window {
            in_flight.min(inner_window)
        } else {
            in_flight
        }
    }

    fn set_mtu(&mut self, mtu: u16) {
        InflightCap::set_mtu(self, mtu);
    }
}

/// quinn's BBR with its window bounded by an [`InflightCap`] (its
/// [`gate`](GatedController::gate)).
pub(crate) type CappedBbr = GatedController<InflightCap>;

/// Builds [`CappedBbr`] controllers: quinn's BBR with its defaults, capped
/// at a gain times the bandwidth-delay product.
pub(crate) type CappedBbrConfig = GatedConfig<BbrConfig, InflightCap>;

#[cfg(test)]
mod tests;
