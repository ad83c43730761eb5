//! What is compared and what each comparison measured: the variants at
//! each loss rate ([`Kind`], [`variants`]), the [`Row`] each fills, its
//! statistics, and the controllers' names the rows and `--only` use.

use gradlane::{Congestion, LossyCarrier, LossyRelease};
use gradlane_tools::cpu::CpuTime;

use crate::Bench;

/// What a variant moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    /// gradlane with this important ratio, lossy release and carrier; with
    /// `true`, sent with `send_round_shared` (no copy of the important
    /// part's long runs), else with `send_round` (from borrowed slices,
    /// copied).
    Gradlane(f64, LossyRelease, LossyCarrier, bool),
    /// One raw quinn stream of this many bytes per round; with `true`, the
    /// gradients copied into the stream and out into tensors each round.
    Quinn(usize, bool),
    /// One TCP connection, this many bytes per round.
    Tcp(usize),
}

/// One measured row.
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) congestion: Option<Congestion>,
    pub(crate) loss: f64,
    pub(crate) kind: Kind,
    /// Round times in seconds, sorted.
    pub(crate) times: Vec<f64>,
    /// gradlane: `RoundArrival::important` per round (from the start of
    /// sending), seconds, sorted.
    pub(crate) important: Vec<f64>,
    /// gradlane: `SendReport::plan` per round (scoring and classing, before
    /// the first byte can leave), seconds, sorted.
    pub(crate) plan: Vec<f64>,
    /// gradlane: important bytes per round (last round).
    pub(crate) important_bytes: u64,
    /// gradlane: mean zero-filled bytes per round.
    pub(crate) zero_filled: f64,
    /// The process's CPU time over the timed rounds (sender and receiver
    /// together: both ends live in this process, and the rounds of the
    /// variants run one at a time).
    pub(crate) cpu: CpuTime,
    pub(crate) note: String,
}

impl Row {
    pub(crate) fn median(&self) -> Option<f64> {
        median(&self.times)
    }
    pub(crate) fn p99(&self) -> Option<f64> {
        p99(&self.times)
    }
}

pub(crate) fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Nearest-rank 99th percentile (the maximum for fewer than 100 samples).
pub(crate) fn p99(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let rank = ((0.99 * v.len() as f64).ceil() as usize).max(1);
    Some(v[rank - 1])
}

/// The variants compared at one loss rate.
pub(crate) fn variants(
    bench: &Bench,
    loss: f64,
    model_bytes: usize,
) -> Vec<(&'static str, Kind, Option<Congestion>)> {
    let default = LossyRelease::default();
    let adaptive = LossyCarrier::default();
    let mut v = Vec::new();
    for &cc in &bench.args.controllers {
        let cc = Some(Congestion::from(cc));
        v.extend([
            ("gradlane", Kind::Gradlane(0.8, default, adaptive, true), cc),
            // The lossy part as datagrams even where the path loses
            // nothing.
            (
                "gradlane, lossy always as datagrams",
                Kind::Gradlane(0.8, default, LossyCarrier::Datagrams, true),
                cc,
            ),
            // The same from borrowed slices (`send_round`): the important
            // part is copied once more, into the framing buffer.
            (
                "gradlane, copied in",
                Kind::Gradlane(0.8, default, adaptive, false),
                cc,
            ),
            // The same, but the lossy part starts only once the receiver
            // confirmed the important part: no lossy traffic in flight
            // while it arrives (the default starts it once quinn has sent
            // the important stream).
            (
                "gradlane, lossy after confirmation",
                Kind::Gradlane(0.8, LossyRelease::Acknowledged, adaptive, true),
                cc,
            ),
            ("raw quinn", Kind::Quinn(model_bytes, false), cc),
            (
                "raw quinn, f32 in and out",
                Kind::Quinn(model_bytes, true),
                cc,
            ),
            (
                "gradlane all-reliable",
                Kind::Gradlane(1.0, default, adaptive, true),
                cc,
            ),
        ]);
    }
    if loss == 0.0 {
        v.push(("tokio TCP", Kind::Tcp(model_bytes), None));
    }
    if !bench.args.quick {
        for cc in [Congestion::Cubic, Congestion::QueueGatedCubic] {
            v.push((
                "gradlane",
                Kind::Gradlane(0.8, default, adaptive, true),
                Some(cc),
            ));
            v.push(("raw quinn", Kind::Quinn(model_bytes, false), Some(cc)));
        }
    }
    v
}

/// A congestion controller's name in the report and in `--only`'s filter
/// (`-` for the TCP row, which has none).
pub(crate) fn cc_name(c: Option<Congestion>) -> &'static str {
    match c {
        None => "-",
        Some(Congestion::Bbr) => "BBR",
        Some(Congestion::CappedBbr) => "BBR, capped",
        Some(Congestion::Cubic) => "Cubic",
        Some(Congestion::NewReno) => "NewReno",
        Some(Congestion::QueueGatedCubic) => "Cubic, queue-gated",
    }
}
