//! A differentiated allreduce's report as the dict Python gets.

use gradlane::AllreduceReport;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The statistics of a differentiated allreduce, as Python sees them.
pub(crate) fn report_dict<'py>(
    py: Python<'py>,
    report: &AllreduceReport,
) -> PyResult<Bound<'py, PyDict>> {
    let sent = report.sent.iter().flatten();
    let sent_important: u64 = sent.clone().map(|s| s.important_bytes).sum();
    let lossy_of = |s: &gradlane::SendReport| s.lossy_bytes.iter().sum::<u64>();
    let sent_lossy: u64 = sent.clone().map(lossy_of).sum();
    let on_stream: u64 = sent.filter(|s| s.lossy_on_stream).map(lossy_of).sum();
    let received: Vec<_> = report.received.iter().flatten().collect();
    let important = |f: fn(&gradlane::ClassStats) -> u64| -> u64 {
        received.iter().map(|r| f(&r.classes[0])).sum()
    };
    let lossy = |f: fn(&gradlane::ClassStats) -> u64| -> u64 {
        received.iter().map(|r| f(&r.lossy())).sum()
    };
    let out = PyDict::new(py);
    out.set_item("sent_important_bytes", sent_important)?;
    out.set_item("sent_lossy_bytes", sent_lossy)?;
    out.set_item("sent_lossy_on_stream_bytes", on_stream)?;
    out.set_item("received_important_bytes", important(|c| c.received_bytes))?;
    out.set_item("received_lossy_bytes", lossy(|c| c.received_bytes))?;
    out.set_item(
        "zero_filled_important_bytes",
        important(|c| c.zero_filled_bytes),
    )?;
    out.set_item("zero_filled_lossy_bytes", lossy(|c| c.zero_filled_bytes))?;
    out.set_item("late_important_bytes", important(|c| c.late_merged_bytes))?;
    out.set_item("late_lossy_bytes", lossy(|c| c.late_merged_bytes))?;
    let missing = report.missing.iter().flatten();
    out.set_item("missing_ranges", missing.clone().count())?;
    out.set_item("missing_values", missing.map(|r| r.len()).sum::<usize>())?;
    out.set_item("lost_ranges", report.lost.len())?;
    out.set_item(
        "lost_values",
        report.lost.iter().map(|r| r.len()).sum::<usize>(),
    )?;
    let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    out.set_item("return_bytes", report.return_bytes)?;
    out.set_item("reduce_ns", ns(report.reduce_time))?;
    out.set_item("return_ns", ns(report.return_time))?;
    out.set_item("budget_ns", report.budget.map_or(0, ns))?;
    // A bounded return (a deadline): its lossy part as sent, what some
    // rank missed of it (zero everywhere, carried by the owners), its
    // budget and whether it ran to it.
    let return_lossy: u64 = report
        .return_sent
        .iter()
        .flatten()
        .map(|s| s.lossy_bytes.iter().sum::<u64>())
        .sum();
    out.set_item("return_lossy_bytes", return_lossy)?;
    out.set_item(
        "return_missed_values",
        report.return_missed.iter().map(|r| r.len()).sum::<usize>(),
    )?;
    out.set_item("return_budget_ns", report.return_budget.map_or(0, ns))?;
    // The first half ran to its deadline: the lossy data still on its
    // way was cut (counted in missing and lost).
    let at_deadline = report.budget.is_some_and(|b| report.reduce_time >= b);
    out.set_item("at_deadline", u64::from(at_deadline))?;
    let return_at_deadline = report
        .return_budget
        .is_some_and(|b| report.return_time >= b);
    out.set_item("return_at_deadline", u64::from(return_at_deadline))?;
    Ok(out)
}
