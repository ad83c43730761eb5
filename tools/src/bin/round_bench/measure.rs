//! The variants compared at each loss rate and the measurement loop: every
//! variant on its own connection, a warm-up round each, then the timed
//! rounds interleaved across variants, gathered into [`Row`]s.

use std::time::Duration;

use common::BoxError;
use gradlane::{Congestion, LossyCarrier, LossyRelease};
use gradlane_tools::cli as common;
use gradlane_tools::cpu::CpuTime;

use crate::connect::Runner;
use crate::report::cc_name;
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

pub(crate) type Measured = (Vec<Row>, Vec<(f64, Row)>);

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

/// Per loss rate, every variant on its own fresh connection, all open at
/// once; a warm-up round each, then the timed rounds interleaved: round `r`
/// of every variant (in an order rotated each round) before round `r + 1`.
/// A slow spell of this shared machine then hits every variant alike: the
/// ratios compare rounds taken seconds, not minutes, apart.
pub(crate) async fn measure(bench: &Bench, model_bytes: usize) -> Result<Measured, BoxError> {
    let mut rows = Vec::new();
    let mut important_quinn = Vec::new();
    for &loss in &bench.args.sweep.losses {
        let mut live: Vec<(Row, Option<Runner>, f64)> = Vec::new();
        for (name, kind, cc) in variants(bench, loss, model_bytes) {
            live.push(open(bench, name, kind, cc, loss).await);
        }
        for (row, runner, _) in &mut live {
            warm_up(bench, row, runner).await;
        }
        // The important class's size is known after gradlane's warm-up.
        let imp = live
            .iter()
            .find(|(r, ..)| r.name == "gradlane")
            .map_or(0, |(r, ..)| r.important_bytes as usize);
        let mut imp_row = None;
        if imp > 0 {
            let name = "raw quinn, important bytes only";
            let mut entry = open(
                bench,
                name,
                Kind::Quinn(imp, false),
                Some(bench.first_controller()),
                loss,
            )
            .await;
            warm_up(bench, &mut entry.0, &mut entry.1).await;
            imp_row = Some(live.len());
            live.push(entry);
        }
        let budget = bench.args.budget_s as f64;
        for r in 1..=bench.args.sweep.rounds {
            let n = live.len();
            for i in 0..n {
                let (row, runner, spent) = &mut live[(i + r) % n];
                let Some(run) = runner else { continue };
                if bench.args.idle_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(bench.args.idle_ms)).await;
                }
                let cpu_before = CpuTime::now();
                let sample = run.round(bench, r).await;
                row.cpu.add(&CpuTime::now().since(&cpu_before));
                match sample {
                    Ok(s) => {
                        *spent += s.time;
                        row.times.push(s.time);
                        row.important.extend(s.important);
                        row.plan.extend(s.plan);
                        if s.important_bytes > 0 {
                            row.important_bytes = s.important_bytes;
                        }
                        row.zero_filled += s.zero_filled as f64;
                        if *spent > budget {
                            row.note = format!("stopped after {} s budget", bench.args.budget_s);
                            if let Some(run) = runner.take() {
                                run.stop().await;
                            }
                        }
                    }
                    Err(e) => {
                        row.note = format!("error after {} rounds: {e}", row.times.len());
                        *runner = None;
                    }
                }
            }
        }
        for (i, (mut row, runner, _)) in live.into_iter().enumerate() {
            if let Some(run) = runner {
                run.stop().await;
            }
            row.zero_filled /= row.times.len().max(1) as f64;
            row.times.sort_by(f64::total_cmp);
            row.important.sort_by(f64::total_cmp);
            row.plan.sort_by(f64::total_cmp);
            eprintln!(
                "{} {:?} loss {loss}: {} rounds, median {:.1} ms, p99 {:.1} ms {}",
                row.name,
                row.congestion,
                row.times.len(),
                row.median().unwrap_or(f64::NAN) * 1e3,
                row.p99().unwrap_or(f64::NAN) * 1e3,
                row.note
            );
            if Some(i) == imp_row {
                important_quinn.push((loss, row));
            } else {
                rows.push(row);
            }
        }
    }
    Ok((rows, important_quinn))
}

/// A row for a variant and its open connection (none if skipped or failed).
pub(crate) async fn open(
    bench: &Bench,
    name: &str,
    kind: Kind,
    congestion: Option<Congestion>,
    loss: f64,
) -> (Row, Option<Runner>, f64) {
    let mut row = Row {
        name: name.to_string(),
        congestion,
        loss,
        kind,
        times: Vec::new(),
        important: Vec::new(),
        plan: Vec::new(),
        important_bytes: 0,
        zero_filled: 0.0,
        cpu: CpuTime::default(),
        note: String::new(),
    };
    if bench.skipped(&format!("{name} {}", cc_name(congestion))) {
        row.note = "skipped (--only)".into();
        return (row, None, 0.0);
    }
    match bench.start(kind, congestion, loss).await {
        Ok(run) => (row, Some(run), 0.0),
        Err(e) => {
            row.note = format!("connection failed: {e}");
            (row, None, 0.0)
        }
    }
}

/// Round 0, untimed: connections and buffers settle.
pub(crate) async fn warm_up(bench: &Bench, row: &mut Row, runner: &mut Option<Runner>) {
    let Some(run) = runner else { return };
    match run.round(bench, 0).await {
        Ok(s) => row.important_bytes = s.important_bytes,
        Err(e) => {
            row.note = format!("warm-up failed: {e}");
            *runner = None;
        }
    }
}
