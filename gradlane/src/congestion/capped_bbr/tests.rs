use super::*;

const MTU: u16 = 1452;
const PACKET: u64 = MTU as u64;
const MS: Duration = Duration::from_millis(1);

/// Acknowledges `packets` packets at one per `gap` from `start`, each
/// with an RTT of `rtt`; returns when the last was acknowledged.
fn deliver(
    cap: &mut InflightCap,
    start: Instant,
    packets: u32,
    gap: Duration,
    rtt: Duration,
    app_limited: bool,
) -> Instant {
    let mut now = start;
    for i in 0..packets {
        now = start + rtt + gap * i;
        cap.on_ack(now, now - rtt, PACKET, app_limited, rtt);
    }
    now
}

/// One packet per 10 us (145 MB/s) over a 2 ms RTT, from now: the path
/// most tests measure. Returns when the last was acknowledged.
fn steady(cap: &mut InflightCap) -> Instant {
    deliver(
        cap,
        Instant::now(),
        5_000,
        Duration::from_micros(10),
        2 * MS,
        false,
    )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 0.02 * b
}

#[test]
fn an_acknowledgement_timed_at_its_send_is_no_rtt_sample() {
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    let now = steady(&mut cap);
    cap.on_ack(now, now, PACKET, false, 2 * MS);
    cap.on_ack(now + MS, now + 2 * MS, PACKET, false, 2 * MS);
    assert_eq!(cap.min_rtt(), Some(2 * MS));
}

#[test]
fn the_cap_is_the_gain_times_the_bandwidth_delay_product() {
    let mut cap = InflightCap::new(2.0, MTU);
    assert_eq!(cap.cap(), None, "nothing measured: no cap");
    // One packet per 10 us (145 MB/s) over a 2 ms RTT: 290 kB in flight.
    steady(&mut cap);
    let bw = cap.bandwidth().expect("measured");
    assert!(close(bw, PACKET as f64 / 10e-6), "bandwidth {bw}");
    assert_eq!(cap.min_rtt(), Some(2 * MS));
    let c = cap.cap().expect("cap") as f64;
    assert!(close(c, 2.0 * PACKET as f64 / 10e-6 * 2e-3), "cap {c}");
}

#[test]
fn a_queue_does_not_raise_the_cap() {
    let mut cap = InflightCap::new(2.0, MTU);
    let gap = Duration::from_micros(10);
    let t = deliver(&mut cap, Instant::now(), 5_000, gap, 2 * MS, false);
    let before = cap.cap().expect("cap");
    // The same rate through a queue: every RTT 8 ms. Neither the rate
    // nor the smallest RTT changes, so neither does the cap.
    deliver(&mut cap, t + MS, 5_000, gap, 10 * MS, false);
    assert_eq!(cap.cap(), Some(before));
}

#[test]
fn app_limited_periods_do_not_lower_the_bandwidth() {
    let mut cap = InflightCap::new(2.0, MTU);
    let t = steady(&mut cap);
    let full = cap.bandwidth().expect("measured");
    // A trickle between rounds, then a long idle gap inside one period.
    let t = deliver(&mut cap, t, 100, Duration::from_millis(1), 2 * MS, true);
    cap.on_ack(t + Duration::from_secs(1), t, PACKET, false, 2 * MS);
    assert_eq!(cap.bandwidth(), Some(full));
}

#[test]
fn a_faster_app_limited_period_still_counts() {
    let mut cap = InflightCap::new(2.0, MTU);
    let t = deliver(
        &mut cap,
        Instant::now(),
        2_000,
        Duration::from_micros(20),
        2 * MS,
        false,
    );
    let slow = cap.bandwidth().expect("measured");
    deliver(&mut cap, t, 5_000, Duration::from_micros(10), 2 * MS, true);
    let fast = cap.bandwidth().expect("measured");
    assert!(close(fast, 2.0 * slow), "{slow} then {fast}");
}

#[test]
fn old_samples_are_forgotten() {
    let mut cap = InflightCap::new(2.0, MTU);
    let start = Instant::now();
    deliver(
        &mut cap,
        start,
        5_000,
        Duration::from_micros(10),
        2 * MS,
        false,
    );
    // Two spans later the path is slower and longer: only that counts.
    let later = start + 2 * FILTER_SPAN + MS;
    deliver(
        &mut cap,
        later,
        2_000,
        Duration::from_micros(100),
        20 * MS,
        false,
    );
    assert_eq!(cap.min_rtt(), Some(20 * MS));
    let bw = cap.bandwidth().expect("measured");
    assert!(close(bw, PACKET as f64 / 100e-6), "bandwidth {bw}");
}

#[test]
fn the_cap_never_falls_below_a_few_packets() {
    let mut cap = InflightCap::new(2.0, MTU);
    // A packet per 10 ms over 100 us: a BDP of a hundredth of a packet.
    let rtt = Duration::from_micros(100);
    deliver(&mut cap, Instant::now(), 100, 10 * MS, rtt, false);
    // One probe of the floor, which raised no rate and stopped.
    let min = MIN_CAP_PACKETS * PACKET;
    let c = cap.cap().expect("cap");
    assert!(
        c >= min && c as f64 <= FLOOR_PROBE_GAIN * min as f64,
        "cap {c}"
    );
}

#[test]
fn a_short_path_is_capped_as_if_it_were_two_milliseconds_long() {
    let mut cap = InflightCap::new(2.0, MTU);
    // 145 MB/s over 100 us: 14.5 kB in flight would do on the wire,
    // but not on a host that holds acknowledgements back.
    let rtt = Duration::from_micros(100);
    let gap = Duration::from_micros(10);
    deliver(&mut cap, Instant::now(), 5_000, gap, rtt, false);
    assert_eq!(cap.min_rtt(), Some(rtt));
    let c = cap.cap().expect("cap") as f64;
    let want = 2.0 * PACKET as f64 / 10e-6 * MIN_CAP_RTT.as_secs_f64();
    assert!(close(c, want), "cap {c}, want {want}");
}

/// A fluid model of a path: a link of `rate` bytes per second, an RTT
/// of `base` that no window changes (propagation, and what a busy host
/// adds before it acknowledges), and a queue in front of the link for
/// whatever is in flight beyond `rate * base`.
struct Path {
    rate: f64,
    base: Duration,
}

impl Path {
    fn rtt(&self, in_flight: u64) -> Duration {
        let queued = (in_flight as f64 - self.rate * self.base.as_secs_f64()).max(0.0);
        self.base + Duration::from_secs_f64(queued / self.rate)
    }

    fn delivery_rate(&self, in_flight: u64) -> f64 {
        let rtt = self.rtt(in_flight).as_secs_f64();
        (in_flight as f64 / rtt).min(self.rate)
    }
}

/// A connection's start: a handshake-sized trickle, its first
/// acknowledgements as fast as `rtt`. Returns when it ended.
fn handshake(cap: &mut InflightCap, rtt: Duration) -> Instant {
    deliver(cap, Instant::now(), 10, 2 * MS, rtt, true)
}

/// A sender that always has data and the cap for its window (BBR's
/// own never binds: quinn-rs/quinn#2798), on `path` for `span` from
/// `start`. Returns the rate delivered at the end.
fn saturate(cap: &mut InflightCap, path: &Path, start: Instant, span: Duration) -> f64 {
    let mut now = start;
    let mut rate = 0.0;
    while now < start + span {
        let window = cap.cap().unwrap_or(u64::MAX / 2);
        rate = path.delivery_rate(window);
        now += Duration::from_secs_f64(PACKET as f64 / rate);
        cap.on_ack(now, now - path.rtt(window), PACKET, false, path.rtt(window));
    }
    rate
}

#[test]
fn a_path_slow_to_acknowledge_does_not_hold_the_cap_at_its_floor() {
    // 1 Gbit/s, but every acknowledgement comes 8 ms after its packet
    // however little is in flight, and the handshake saw 2 ms.
    let path = Path {
        rate: 125e6,
        base: 8 * MS,
    };
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    let t = handshake(&mut cap, 2 * MS);
    assert_eq!(
        cap.cap(),
        Some(MIN_CAP_PACKETS * PACKET),
        "starts at the floor"
    );
    let rate = saturate(&mut cap, &path, t, Duration::from_secs(2));
    // Without probes the floor stayed at 64 packets: 11.6 MB/s.
    assert!(
        rate >= 0.99 * path.rate,
        "delivered {rate} of {}",
        path.rate
    );
    assert_eq!(cap.min_rtt(), Some(2 * MS), "the lucky sample is kept");
    // Bounded all the same, below the gain: the probes stop one growth
    // after the rate stopped rising (at most 1.25 x 1.25 / 1.1).
    let c = cap.cap().expect("cap") as f64;
    let bdp = path.rate * path.base.as_secs_f64();
    assert!(c >= bdp && c <= 1.45 * bdp, "cap {c}, bdp {bdp}");
    assert_eq!(cap.cap(), Some(cap.floor()), "the floor holds it");
}

#[test]
fn a_slow_receiver_stops_the_floor_at_once() {
    // A loaded host whose receiver takes 2.4 MB/s, 40 ms behind: more
    // in flight only queues.
    let loaded = Path {
        rate: 2.4e6,
        base: 40 * MS,
    };
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    let t = handshake(&mut cap, 2 * MS);
    saturate(&mut cap, &loaded, t, Duration::from_secs(1));
    let min = (MIN_CAP_PACKETS * PACKET) as f64;
    let c = cap.cap().expect("cap") as f64;
    assert!(c <= FLOOR_PROBE_GAIN * min + 1.0, "cap {c}");
    // The load is gone: a 700 MB/s path over 2 ms, where the
    // bandwidth-delay product carries the cap and the floor falls back.
    let fast = Path {
        rate: 700e6,
        base: 2 * MS,
    };
    saturate(
        &mut cap,
        &fast,
        t + Duration::from_secs(2),
        Duration::from_secs(1),
    );
    assert_eq!(cap.floor(), MIN_CAP_PACKETS * PACKET);
    let c = cap.cap().expect("cap") as f64;
    let want = DEFAULT_GAIN * fast.rate * 2e-3;
    assert!(close(c, want), "cap {c}, want {want}");
}

#[test]
fn a_grown_floor_is_forgotten_after_a_span() {
    // Rounds of a second on a path that acknowledges 8 ms late, each
    // starting with one lucky 2 ms sample, as a handshake's.
    let rounds = |cap: &mut InflightCap, path: &Path, mut t: Instant, n: u32| {
        for _ in 0..n {
            cap.on_ack(t, t - 2 * MS, PACKET, true, 2 * MS);
            saturate(cap, path, t, Duration::from_secs(1));
            t += Duration::from_secs(1);
        }
        t
    };
    let path = Path {
        rate: 125e6,
        base: 8 * MS,
    };
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    let t = handshake(&mut cap, 2 * MS);
    let t = rounds(&mut cap, &path, t, 3);
    let grown = cap.floor();
    assert!(grown as f64 >= path.rate * 8e-3, "floor {grown}");
    // The path got slower. What the floor grew to would keep 1.15 MB
    // queued: it is forgotten after a span and probed again.
    let slower = Path {
        rate: 25e6,
        base: 8 * MS,
    };
    rounds(&mut cap, &slower, t, 3 * FILTER_SPAN.as_secs() as u32);
    // (Where the cap then is depends on how far the bandwidth-delay
    // product has decayed towards the floor: above it, the product
    // carries the cap; at it, probes.)
    let bdp = slower.rate * slower.base.as_secs_f64();
    let floor = cap.floor() as f64;
    assert!(
        floor <= 1.45 * bdp,
        "floor {floor}, bdp {bdp}, grown to {grown} before"
    );
}

#[test]
fn a_queue_at_the_link_still_bounds_the_cap() {
    // 1 Gbit/s over 2 ms: whatever exceeds 250 kB in flight queues.
    let path = Path {
        rate: 125e6,
        base: 2 * MS,
    };
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    let t = handshake(&mut cap, 2 * MS);
    let rate = saturate(&mut cap, &path, t, Duration::from_secs(2));
    assert!(rate >= 0.99 * path.rate, "delivered {rate}");
    // The floor saw the empty path's RTT, so the cap, and the queue
    // behind it, stay where the smallest RTT puts them.
    let bdp = path.rate * path.base.as_secs_f64();
    let c = cap.cap().expect("cap") as f64;
    assert!(
        c >= 0.95 * DEFAULT_GAIN * bdp && c <= 1.05 * DEFAULT_GAIN * bdp,
        "cap {c}, bdp {bdp}"
    );
}

#[test]
fn a_trickle_does_not_probe_the_floor() {
    // The sender had less to send than the floor allowed: a probe
    // would measure the sender.
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    let t = handshake(&mut cap, 2 * MS);
    deliver(&mut cap, t, 200, MS, 25 * MS, true);
    assert_eq!(cap.cap(), Some(MIN_CAP_PACKETS * PACKET));
}

proptest::proptest! {
    /// The cap is kept, not worked out per call: it must always be
    /// what working it out gives.
    #[test]
    fn the_kept_cap_is_the_cap(
        acks in proptest::collection::vec(
            (0u64..5_000, 1_000u64..40_000, 1u64..200_000, proptest::bool::ANY),
            1..400,
        ),
        mtu_change in 0usize..400,
    ) {
        let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
        let mut now = Instant::now();
        for (i, (gap_us, rtt_us, bytes, app_limited)) in acks.into_iter().enumerate() {
            now += Duration::from_micros(gap_us);
            let sent = now.checked_sub(Duration::from_micros(rtt_us)).unwrap_or(now);
            cap.on_ack(now, sent, bytes, app_limited, Duration::from_micros(rtt_us));
            if i == mtu_change {
                cap.set_mtu(1200);
            }
            proptest::prop_assert_eq!(cap.cap(), cap.work_out_cap());
        }
    }
}

#[test]
fn nonsense_gains_are_clamped() {
    for gain in [f64::NAN, -1.0, 0.0] {
        let mut cap = InflightCap::new(gain, MTU);
        steady(&mut cap);
        let bdp = PACKET as f64 / 10e-6 * 2e-3;
        let c = cap.cap().expect("cap") as f64;
        assert!(c >= 0.98 * bdp, "gain {gain}: cap {c} below one BDP {bdp}");
    }
}

#[test]
fn the_window_is_bbrs_between_the_kept_rate_and_the_cap() {
    let mut cap = InflightCap::new(2.0, MTU);
    let window = |cap: &InflightCap, bbr| ControllerGate::window(cap, bbr);
    assert_eq!(window(&cap, 1 << 30), 1 << 30, "nothing measured: BBR's");
    assert_eq!(
        window(&cap, 4 * PACKET),
        4 * PACKET,
        "nothing measured: BBR's"
    );
    steady(&mut cap);
    let c = cap.cap().expect("cap");
    let kept = cap.keep_rate();
    assert!(kept > 0 && kept < c, "kept {kept}, cap {c}");
    assert_eq!(window(&cap, 1 << 30), c);
    let between = (kept + c) / 2;
    assert_eq!(window(&cap, between), between);
    assert_eq!(window(&cap, kept / 2), kept);
}

#[test]
fn loss_recovery_does_not_shrink_the_window_below_the_measured_rate() {
    // 145 MB/s over 2 ms measured; then BBR, in loss recovery, allows
    // only 4 packets: at 2 ms that would carry 2.9 MB/s.
    let mut cap = InflightCap::new(2.0, MTU);
    steady(&mut cap);
    let bw = cap.bandwidth().expect("measured");
    let w = cap.window(4 * PACKET) as f64;
    assert!(close(w, bw * 2e-3), "window {w}, rate x srtt {}", bw * 2e-3);
    // The window carries the measured rate at the RTT seen.
    assert!(w / 2e-3 >= 0.98 * bw);
}

#[test]
fn a_microsecond_path_keeps_the_rate_over_a_busy_hosts_delay() {
    // Loopback: 145 MB/s over 20 us, its smoothed RTT microseconds
    // after an idle moment. The window still carries the rate over
    // MIN_CAP_RTT, where a busy host's acknowledgements arrive.
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    let rtt = Duration::from_micros(20);
    deliver(
        &mut cap,
        Instant::now(),
        5_000,
        Duration::from_micros(10),
        rtt,
        false,
    );
    let bw = cap.bandwidth().expect("measured");
    let w = cap.window(4 * PACKET) as f64;
    let floor = bw * MIN_CAP_RTT.as_secs_f64();
    assert!(w >= 0.98 * floor, "window {w}, rate x MIN_CAP_RTT {floor}");
    assert!(w <= cap.cap().expect("cap") as f64);
}

#[test]
fn a_queue_of_other_flows_raises_the_window_up_to_the_cap() {
    let mut cap = InflightCap::new(2.0, MTU);
    let t = steady(&mut cap);
    let bw = cap.bandwidth().expect("measured");
    let c = cap.cap().expect("cap");
    // Others' packets queue ahead of ours: every RTT 3 ms, then 10 ms.
    // The rate and the smallest RTT stay, and so does the cap.
    cap.on_ack(t + MS, t - 2 * MS, PACKET, false, 3 * MS);
    let w = cap.window(4 * PACKET) as f64;
    assert!(close(w, bw * 3e-3), "window {w} at 3 ms");
    cap.on_ack(t + 2 * MS, t - 8 * MS, PACKET, false, 10 * MS);
    assert_eq!(cap.window(4 * PACKET), c, "no further than the cap");
    assert_eq!(cap.cap(), Some(c));
}
/// quinn 0.11's BBR window outside startup, by the rules of
/// quinn-proto 0.11.19 (`congestion/bbr/mod.rs`): `cwnd_gain` (2)
/// times its bandwidth estimate times its smallest RTT (whole
/// microseconds; zero counts as unmeasured, the initial window), at
/// least 4 packets; in ProbeRTT 0.75 times the same product, also at
/// least 4 packets. Its smallest RTT is `RttEstimator::min`, the
/// smallest sample of the connection's life, which never rises again;
/// its bandwidth the largest sample (quinn's own samples are biased
/// low; the model gives it the path's rate, which favours quinn).
struct QuinnBbr {
    min_rtt: Duration,
    bandwidth: f64,
}

impl QuinnBbr {
    fn on_ack(&mut self, rtt: Duration, rate: f64) {
        self.min_rtt = self.min_rtt.min(rtt);
        self.bandwidth = self.bandwidth.max(rate);
    }

    fn window(&self) -> u64 {
        let bdp = self.min_rtt.as_micros() as f64 * self.bandwidth / 1e6;
        if bdp < 1.0 {
            return 200 * 1200;
        }
        ((2.0 * bdp) as u64).max(4 * PACKET)
    }
}

/// A sender that always has data, under quinn's BBR behind the gate,
/// on `path` for `span` from `start`; `stale` acknowledgements are
/// stamped as received 5 us after their packet's send, as quinn's
/// endpoint driver stamps a whole receive batch with the time its poll
/// began, which a loaded host can hold for longer than the path's RTT.
/// Returns the rate delivered at the end and when it ended.
fn under_bbr(
    cap: &mut InflightCap,
    bbr: &mut QuinnBbr,
    path: &Path,
    start: Instant,
    span: Duration,
    stale: u32,
) -> (f64, Instant) {
    let mut now = start;
    let mut rate = 0.0;
    let mut stale = stale;
    while now < start + span {
        let window = ControllerGate::window(cap, bbr.window());
        rate = path.delivery_rate(window);
        now += Duration::from_secs_f64(PACKET as f64 / rate);
        let srtt = path.rtt(window);
        let rtt = if stale > 0 {
            stale -= 1;
            Duration::from_micros(5)
        } else {
            srtt
        };
        bbr.on_ack(rtt, rate);
        cap.on_ack(now, now - rtt, PACKET, false, srtt);
    }
    (rate, now)
}

#[test]
fn one_stale_rtt_sample_does_not_wedge_the_window_at_four_packets() {
    // Loopback with 1 ms of delay each way (allreduce_bench's paths),
    // 125 MB/s. The soak of docs/RESULTS.md ("Stalls under quinn's
    // BBR") saw rounds stall from some round on, a path's window at
    // quinn's 4-packet minimum; on a
    // loaded host quinn's BBR holds smallest RTTs of 0.3-0.5 ms on such
    // paths, and zero. One acknowledgement stamped 5 us after its
    // packet's send puts it at 4 packets for the rest of the connection
    // (2 x 125 MB/s x 5 us is 1.25 kB). With the window at most BBR's
    // (the gate of ffc0228, where the stalls were seen) the path then
    // carried 4 packets per 2 ms, 2.9 MB/s, for good.
    let path = Path {
        rate: 125e6,
        base: 2 * MS,
    };
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    let mut bbr = QuinnBbr {
        min_rtt: Duration::MAX,
        bandwidth: 0.0,
    };
    let t = handshake(&mut cap, 2 * MS);
    let (before, t) = under_bbr(&mut cap, &mut bbr, &path, t, Duration::from_secs(1), 0);
    assert!(before >= 0.99 * path.rate, "delivered {before} before");
    let (_, t) = under_bbr(&mut cap, &mut bbr, &path, t, MS, 1);
    assert_eq!(bbr.window(), 4 * PACKET, "quinn's BBR is at its minimum");
    // Longer than a filter span: what the gate measured before the
    // stale sample has been forgotten, so it holds the rate by itself.
    let (after, _) = under_bbr(
        &mut cap,
        &mut bbr,
        &path,
        t,
        2 * FILTER_SPAN + Duration::from_secs(1),
        0,
    );
    assert_eq!(bbr.window(), 4 * PACKET, "quinn's BBR never recovers");
    assert!(
        after >= 0.99 * path.rate,
        "delivered {after} of {} with quinn's BBR at 4 packets",
        path.rate
    );
}

/// quinn's ProbeRTT by the rules of quinn-proto 0.11.19
/// (`Bbr::maybe_enter_or_exit_probe_rtt`): entered at the first end of
/// acknowledgements not app-limited, and again 10 s after each entry;
/// its window then 0.75 times BBR's bandwidth-delay product, at least
/// 4 packets (the model's: 4); its exit armed at an end of
/// acknowledgements that reports less in flight than that window plus
/// a packet, and taken 200 ms later at the start of a round trip.
#[derive(Default)]
struct QuinnProbeRtt {
    entered: Option<Instant>,
    exit_at: Option<Instant>,
    active: bool,
}

impl QuinnProbeRtt {
    const WINDOW: u64 = 4 * PACKET;

    fn on_end_acks(&mut self, now: Instant, in_flight: u64, round_start: bool) {
        let expired = self
            .entered
            .is_none_or(|e| now.saturating_duration_since(e) > Duration::from_secs(10));
        if expired && !self.active {
            self.active = true;
            self.entered = Some(now);
            self.exit_at = None;
        }
        if !self.active {
            return;
        }
        match self.exit_at {
            None if in_flight < Self::WINDOW + PACKET => {
                self.exit_at = Some(now + Duration::from_millis(200));
            }
            Some(at) if round_start && now >= at => self.active = false,
            _ => {}
        }
    }
}

/// A sender that always has data, on `path` for `span` from `start`,
/// behind the gate with quinn's BBR inside: its window `outside` out
/// of ProbeRTT (BBR's own never binds: the cap does), its ProbeRTT by
/// `probe`, told what `tell` makes of the bytes in flight and BBR's
/// window. Returns the rate delivered at the end and how long ProbeRTT
/// lasted in all.
fn through_probe_rtt(
    cap: &mut InflightCap,
    probe: &mut QuinnProbeRtt,
    tell: impl Fn(&InflightCap, u64, u64) -> u64,
    path: &Path,
    start: Instant,
    span: Duration,
) -> (f64, Duration) {
    let outside = 1 << 30;
    let (mut now, mut rate) = (start, 0.0);
    let mut round_end = start;
    let mut in_probe = Duration::ZERO;
    while now < start + span {
        let inner = if probe.active {
            QuinnProbeRtt::WINDOW
        } else {
            outside
        };
        let window = ControllerGate::window(cap, inner);
        rate = path.delivery_rate(window);
        let step = Duration::from_secs_f64(PACKET as f64 / rate);
        if probe.active {
            in_probe += step;
        }
        now += step;
        let rtt = path.rtt(window);
        cap.on_ack(now, now - rtt, PACKET, false, rtt);
        let round_start = now >= round_end;
        if round_start {
            round_end = now + rtt;
        }
        probe.on_end_acks(now, tell(cap, window, inner), round_start);
    }
    (rate, in_probe)
}

#[test]
fn probe_rtt_ends_though_the_lower_bound_keeps_more_in_flight() {
    // The gate measured 40 MB/s (a sender with less to send, or a
    // busier path); now the path carries 125 MB/s and the sender has
    // data for 3 s. quinn's BBR enters ProbeRTT at once (it has never
    // been in it), at 4 packets, and the lower bound holds the window at
    // the measured rate times the RTT.
    let path = Path {
        rate: 125e6,
        base: 2 * MS,
    };
    let measured = |cap: &mut InflightCap| {
        let gap = Duration::from_secs_f64(PACKET as f64 / 40e6);
        deliver(cap, Instant::now(), 5_000, gap, 2 * MS, false)
    };
    let span = Duration::from_secs(3);

    // Told the true bytes in flight (a gate without `inner_in_flight`),
    // BBR never sees them under its ProbeRTT window: it stays there for
    // the whole transfer, and the window stays at the rate measured.
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    let t = measured(&mut cap);
    let mut probe = QuinnProbeRtt::default();
    let truth = |_: &InflightCap, in_flight: u64, _: u64| in_flight;
    let (rate, in_probe) = through_probe_rtt(&mut cap, &mut probe, truth, &path, t, span);
    assert!(
        probe.active && probe.exit_at.is_none(),
        "wedged in ProbeRTT"
    );
    assert!(in_probe + MS >= span, "in ProbeRTT for {in_probe:?}");
    assert!(rate < 0.5 * path.rate, "delivered {rate} of {}", path.rate);

    // Told at most its own window while the lower bound lifts it, BBR
    // leaves ProbeRTT 200 ms and a round trip later, and the cap, no
    // longer held at the lower bound, lets the rate grow to the path's.
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    let t = measured(&mut cap);
    let mut probe = QuinnProbeRtt::default();
    let told = |cap: &InflightCap, in_flight: u64, inner: u64| {
        ControllerGate::inner_in_flight(cap, in_flight, inner)
    };
    let (rate, in_probe) = through_probe_rtt(&mut cap, &mut probe, told, &path, t, span);
    assert!(!probe.active, "ProbeRTT ended");
    assert!(
        in_probe < Duration::from_millis(210),
        "in ProbeRTT for {in_probe:?}"
    );
    assert!(
        rate >= 0.99 * path.rate,
        "delivered {rate} of {}",
        path.rate
    );
}

#[test]
fn bbr_is_told_the_true_bytes_in_flight_when_its_own_window_governs() {
    let mut cap = InflightCap::new(DEFAULT_GAIN, MTU);
    steady(&mut cap);
    let lifted = 4 * PACKET;
    assert!(
        cap.window(lifted) > lifted,
        "the lower bound lifts 4 packets"
    );
    assert_eq!(cap.inner_in_flight(100 * PACKET, lifted), lifted);
    // Where BBR's window is at least the lower bound (or the cap cuts
    // it), the gate's window is no larger than BBR's: the truth.
    let big = 1 << 30;
    assert!(cap.window(big) <= big);
    assert_eq!(cap.inner_in_flight(100 * PACKET, big), 100 * PACKET);
    // Before any measurement nothing is lifted.
    let fresh = InflightCap::new(DEFAULT_GAIN, MTU);
    assert_eq!(fresh.inner_in_flight(100 * PACKET, lifted), 100 * PACKET);
}
