//! Cubic that tells random loss from congestion.
//!
//! Why: quinn's Cubic cuts its window on every loss and collapses under
//! random loss, and its BBR keeps its rate but overflows the queues it
//! crosses. A queue that overflows first fills, so every packet's RTT rises
//! before the drops; random loss comes with no queue. [`LossFilter`]
//! passes a loss on to Cubic only with a standing queue in sight
//! ([`queue_delay_limit`]), a high loss rate, persistent congestion or ECN
//! marks, and counts the losses it lets go.
//!
//! On a CPU-bound host the host's own delay reads as a queue now and then,
//! so this controller is opt-in
//! ([`Congestion::QueueGatedCubic`](super::Congestion)); the default is
//! [`super::capped_bbr`]. The filter is pure and tested on its own;
//! [`GatedController`] is the shell both of gradlane's controllers share.

use std::time::{Duration, Instant};

use quinn::congestion::CubicConfig;

use crate::congestion::gate::{ControllerGate, GateFromSetting, GatedConfig};

/// The shortest rate-sampling period: on loopback the RTT is microseconds,
/// and a period must hold enough packets for a rate to mean anything.
pub(crate) const MIN_PERIOD: Duration = Duration::from_millis(5);

/// Queueing delay below this never counts as a queue: on a busy 2-core
/// host the smallest RTT samples stood 1-2 ms above the minimum with no
/// network queue at all.
pub(crate) const MIN_QUEUE_DELAY: Duration = Duration::from_millis(2);

/// Losses of up to this many packets in a sample are always tolerated by
/// the rate test: a single loss in a ten-packet window is 10% but says
/// nothing.
const SLACK_PACKETS: u64 = 2;

/// The loss rate tolerated without a queue by default: above the 5% random
/// loss gradlane is built for.
pub(crate) const DEFAULT_MAX_LOSS: f64 = 0.1;

/// The queueing delay (recent smallest RTT above the smallest ever) from
/// which a loss counts as congestion: half the minimum RTT, at least
/// [`MIN_QUEUE_DELAY`].
pub(crate) fn queue_delay_limit(min_rtt: Duration) -> Duration {
    (min_rtt / 2).max(MIN_QUEUE_DELAY)
}

/// Decides, per lost batch, whether a loss is congestion. Pure: time is an
/// argument.
#[derive(Debug, Clone)]
pub(crate) struct LossFilter {
    max_loss: f64,
    mtu: u64,
    period: Duration,
    started: Option<Instant>,
    current: Sample,
    previous: Sample,
    queue_delay: Duration,
    min_rtt: Duration,
    /// A loss was passed on for the queue now standing.
    in_episode: bool,
    /// The largest congestion window seen at a loss.
    max_window: u64,
    passed: u64,
    tolerated: u64,
}

/// Bytes acknowledged and lost in one sampling period.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    acked: u64,
    lost: u64,
    /// The smallest RTT sample of the period.
    min_sample: Option<Duration>,
}

impl LossFilter {
    /// A filter that tolerates a loss rate up to `max_loss` (a fraction,
    /// clamped to 0..=1) when the path shows no queue, on a path with
    /// packets of `mtu` bytes.
    pub(crate) fn new(max_loss: f64, mtu: u16) -> Self {
        let max_loss = if max_loss.is_nan() {
            0.0
        } else {
            max_loss.clamp(0.0, 1.0)
        };
        Self {
            max_loss,
            mtu: u64::from(mtu),
            period: MIN_PERIOD,
            started: None,
            current: Sample::default(),
            previous: Sample::default(),
            queue_delay: Duration::ZERO,
            min_rtt: Duration::ZERO,
            in_episode: false,
            max_window: 0,
            passed: 0,
            tolerated: 0,
        }
    }

    /// The path's packet size changed.
    pub(crate) fn set_mtu(&mut self, mtu: u16) {
        self.mtu = u64::from(mtu);
    }

    /// `bytes` sent at `sent` were acknowledged at `now`; `srtt` is the
    /// smoothed RTT.
    ///
    /// The queue is judged from the smallest RTT sample of the last one to
    /// two smoothed RTTs against the smallest ever: a busy host delays some
    /// packets by milliseconds, but a standing queue delays them all.
    pub(crate) fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64, srtt: Duration) {
        self.period = srtt.max(MIN_PERIOD);
        let sample = now.saturating_duration_since(sent);
        self.min_rtt = match self.min_rtt {
            Duration::ZERO => sample,
            m => m.min(sample),
        };
        self.roll(now);
        self.current.acked = self.current.acked.saturating_add(bytes);
        self.current.min_sample = Some(self.current.min_sample.map_or(sample, |m| m.min(sample)));
        let recent = match (self.current.min_sample, self.previous.min_sample) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(sample),
        };
        self.queue_delay = recent.saturating_sub(self.min_rtt);
        if self.queue_delay < queue_delay_limit(self.min_rtt) / 2 {
            self.in_episode = false;
        }
    }

    /// `lost_bytes` were declared lost at `now` (0 for an ECN mark) with the
    /// congestion window at `window` bytes. Returns whether to pass the
    /// event on to the congestion controller.
    pub(crate) fn on_loss(
        &mut self,
        now: Instant,
        lost_bytes: u64,
        persistent: bool,
        window: u64,
    ) -> bool {
        self.roll(now);
        self.max_window = self.max_window.max(window);
        // Below a quarter of the largest window seen, both signals have
        // gone unreliable (few packets per RTT, a host's delay taken for a
        // queue): only persistent congestion cuts further.
        let floor = window < self.max_window / 4;
        self.current.lost = self.current.lost.saturating_add(lost_bytes);
        let acked = self.current.acked.saturating_add(self.previous.acked);
        let lost = self.current.lost.saturating_add(self.previous.lost);
        let tolerated_rate = lost as f64
            <= self.max_loss * acked.saturating_add(lost) as f64
                + (SLACK_PACKETS * self.mtu) as f64;
        // One loss per queue episode: Cubic's cut drains a real queue, and
        // a host that stalls must not cut the window again and again.
        let queue = !self.in_episode && self.queue_delay >= queue_delay_limit(self.min_rtt);
        // ECN marks (no bytes lost) and persistent congestion are never
        // random loss.
        let pass = persistent || (!floor && (lost_bytes == 0 || queue || !tolerated_rate));
        if pass && queue {
            self.in_episode = true;
        }
        if pass {
            self.passed += 1;
        } else {
            self.tolerated += 1;
        }
        pass
    }

    /// Loss events passed on to the controller so far.
    #[cfg(test)]
    pub(crate) fn passed(&self) -> u64 {
        self.passed
    }

    /// Loss events tolerated (not passed on) so far.
    #[cfg(test)]
    pub(crate) fn tolerated(&self) -> u64 {
        self.tolerated
    }

    /// Starts a new sampling period if the current one is over; a gap of
    /// more than two periods forgets both.
    fn roll(&mut self, now: Instant) {
        let started = *self.started.get_or_insert(now);
        let elapsed = now.saturating_duration_since(started);
        if elapsed < self.period {
            return;
        }
        self.previous = if elapsed < 2 * self.period {
            self.current
        } else {
            Sample::default()
        };
        self.current = Sample::default();
        self.started = Some(now);
    }
}

impl GateFromSetting for LossFilter {
    const DEFAULT_SETTING: f64 = DEFAULT_MAX_LOSS;

    fn from_setting(setting: f64, mtu: u16) -> Self {
        LossFilter::new(setting, mtu)
    }
}

impl ControllerGate for LossFilter {
    fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64, _: bool, srtt: Duration) {
        LossFilter::on_ack(self, now, sent, bytes, srtt);
    }

    fn pass_congestion(
        &mut self,
        now: Instant,
        lost_bytes: u64,
        persistent: bool,
        window: u64,
    ) -> bool {
        self.on_loss(now, lost_bytes, persistent, window)
    }

    fn set_mtu(&mut self, mtu: u16) {
        LossFilter::set_mtu(self, mtu);
    }
}

/// Builds quinn's Cubic, with its defaults, behind a [`LossFilter`]
/// tolerating a loss rate up to a setting while the path shows no queue
/// (a [`GatedController`](super::gate::GatedController)).
pub(crate) type QueueGatedCubicConfig = GatedConfig<CubicConfig, LossFilter>;

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u16 = 1452;
    const PACKET: u64 = MTU as u64;
    const WINDOW: u64 = 1 << 20;
    const MS: Duration = Duration::from_millis(1);

    /// Acknowledges `packets` packets at one per `gap` from `start`, each
    /// with an RTT of `rtt`, losing every `lose_every`th (0: none); returns
    /// how many loss events were passed on.
    fn run(
        filter: &mut LossFilter,
        start: Instant,
        packets: u64,
        gap: Duration,
        rtt: Duration,
        lose_every: u64,
    ) -> u64 {
        let before = filter.passed();
        for i in 0..packets {
            let now = start + rtt + gap * i as u32;
            if lose_every > 0 && i % lose_every == lose_every - 1 {
                filter.on_loss(now, PACKET, false, WINDOW);
            } else {
                filter.on_ack(now, now - rtt, PACKET, rtt);
            }
        }
        filter.passed() - before
    }

    #[test]
    fn random_loss_without_a_queue_is_not_congestion() {
        let mut filter = LossFilter::new(0.1, MTU);
        // 5% loss, 100k packets at one per 10 us (~1.2 Gbit/s), RTT flat.
        let passed = run(
            &mut filter,
            Instant::now(),
            100_000,
            Duration::from_micros(10),
            2 * MS,
            20,
        );
        assert_eq!(passed, 0);
        assert_eq!(filter.tolerated(), 5_000);
    }

    #[test]
    fn loss_above_the_tolerated_rate_is_congestion() {
        let mut filter = LossFilter::new(0.1, MTU);
        // 25% loss: after the first period fills, every loss is passed on.
        let passed = run(
            &mut filter,
            Instant::now(),
            40_000,
            Duration::from_micros(10),
            2 * MS,
            4,
        );
        assert!(passed >= 9_000, "passed {passed} of 10000");
    }

    #[test]
    fn a_standing_queue_passes_one_loss_until_it_drains() {
        let mut filter = LossFilter::new(0.1, MTU);
        let start = Instant::now();
        let gap = Duration::from_micros(10);
        // A clean path at 2 ms, then every packet 3 ms later: a queue.
        run(&mut filter, start, 2_000, gap, 2 * MS, 0);
        let t = start + 30 * MS;
        run(&mut filter, t, 2_000, gap, 5 * MS, 0);
        let t = t + 30 * MS;
        assert!(
            filter.on_loss(t, PACKET, false, WINDOW),
            "a queue: congestion"
        );
        assert!(
            !filter.on_loss(t, PACKET, false, WINDOW),
            "the same queue: once"
        );
        // The queue drains, builds again: the next loss is passed on.
        run(&mut filter, t, 2_000, gap, 2 * MS, 0);
        let t = t + 30 * MS;
        run(&mut filter, t, 2_000, gap, 5 * MS, 0);
        assert!(filter.on_loss(t + 30 * MS, PACKET, false, WINDOW));
    }

    #[test]
    fn a_busy_host_delaying_some_packets_is_not_a_queue() {
        let mut filter = LossFilter::new(0.1, MTU);
        let start = Instant::now();
        run(
            &mut filter,
            start,
            2_000,
            Duration::from_micros(10),
            2 * MS,
            0,
        );
        // Most packets 6 ms late, a few on time: no standing queue.
        let t = start + 30 * MS;
        for i in 0..2_000u32 {
            let now = t + Duration::from_micros(10) * i;
            let rtt = if i % 50 == 0 { 2 * MS } else { 8 * MS };
            filter.on_ack(now, now - rtt, PACKET, 6 * MS);
        }
        assert!(!filter.on_loss(t + 25 * MS, PACKET, false, WINDOW));
    }

    #[test]
    fn the_queue_limit_grows_with_the_path() {
        assert_eq!(
            queue_delay_limit(Duration::from_micros(100)),
            MIN_QUEUE_DELAY
        );
        assert_eq!(queue_delay_limit(40 * MS), 20 * MS);
    }

    #[test]
    fn a_small_window_is_cut_only_by_persistent_congestion() {
        let mut filter = LossFilter::new(0.0, MTU);
        let now = Instant::now();
        filter.on_ack(now, now - MS, 100 * PACKET, MS);
        assert!(!filter.on_loss(now, PACKET, false, WINDOW));
        assert!(!filter.on_loss(now, PACKET, false, WINDOW));
        assert!(
            filter.on_loss(now, PACKET, false, WINDOW),
            "above the slack"
        );
        assert!(
            !filter.on_loss(now, PACKET, false, WINDOW / 5),
            "below the floor"
        );
        assert!(filter.on_loss(now, PACKET, true, WINDOW / 5));
    }

    #[test]
    fn ecn_and_persistent_congestion_always_pass() {
        let mut filter = LossFilter::new(1.0, MTU);
        let now = Instant::now();
        filter.on_ack(now, now - MS, 1 << 30, MS);
        assert!(filter.on_loss(now, 0, false, WINDOW));
        assert!(filter.on_loss(now, PACKET, true, WINDOW));
        assert!(!filter.on_loss(now, PACKET, false, WINDOW));
    }

    #[test]
    fn old_samples_are_forgotten() {
        let mut filter = LossFilter::new(0.1, MTU);
        let start = Instant::now();
        // Heavy loss, then a long quiet gap: the next single loss is judged
        // on fresh samples only.
        run(&mut filter, start, 100, Duration::from_micros(10), MS, 2);
        let later = start + Duration::from_secs(1);
        filter.on_ack(later, later - MS, 1_000 * PACKET, MS);
        assert!(!filter.on_loss(later, PACKET, false, WINDOW));
    }

    #[test]
    fn nonsense_tolerances_are_clamped() {
        let now = Instant::now();
        for bad in [f64::NAN, -1.0, f64::NEG_INFINITY] {
            let mut filter = LossFilter::new(bad, MTU);
            filter.on_ack(now, now - MS, 1_000 * PACKET, MS);
            for _ in 0..SLACK_PACKETS {
                assert!(!filter.on_loss(now, PACKET, false, WINDOW));
            }
            assert!(filter.on_loss(now, PACKET, false, WINDOW), "{bad}");
        }
    }
}
