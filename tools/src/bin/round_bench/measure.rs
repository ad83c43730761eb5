//! The measurement loop: every variant on its own connection, a warm-up
//! round each, then the timed rounds interleaved across variants, gathered
//! into [`Row`]s.

use std::time::Duration;

use common::BoxError;
use gradlane::Congestion;
use gradlane_tools::cli as common;
use gradlane_tools::cpu::CpuTime;

use crate::connect::Runner;
use crate::variants::{cc_name, variants, Kind, Row};
use crate::Bench;

pub(crate) type Measured = (Vec<Row>, Vec<(f64, Row)>);

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
