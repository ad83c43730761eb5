//! Each variant's measurements at one loss rate ([`Row`]) and the table
//! rank 0 prints of them: output only.

use std::time::Duration;

use gradlane_tools::cpu::CpuTime;

/// One variant's measurements at one loss rate.
#[derive(Debug, Default)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) loss: f64,
    pub(crate) times: Vec<Duration>,
    /// Bytes each rank sent per round, averaged over ranks and rounds.
    pub(crate) bytes_per_rank: f64,
    pub(crate) zero_filled: u64,
    /// Rounds after which the ranks' results differed.
    pub(crate) mismatches: usize,
    /// This process's CPU time over the timed rounds (all its ranks).
    pub(crate) cpu: CpuTime,
    /// Bytes this process's ranks sent over the timed rounds.
    pub(crate) bytes_local: f64,
}

pub(crate) fn percentile(times: &[Duration], p: f64) -> f64 {
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let i = ((ms.len() as f64 - 1.0) * p).round() as usize;
    ms.get(i).copied().unwrap_or(0.0)
}

pub(crate) fn print_table(rows: &[Row], ranks: usize, total: usize) {
    let bound = 2.0 * (ranks - 1) as f64 / ranks as f64 * total as f64 * 4.0;
    println!();
    println!(
        "CPU s per GB sent: this process's user + system CPU time over the timed rounds \
         (every rank it runs) per GB its ranks sent"
    );
    println!("| variant | loss | rounds | median ms | p99 ms | Gbit/s of gradient (median) | MB sent per rank | vs 2(N-1)/N bound | zero-filled MB/round | ranks differ | CPU s per GB sent |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let median = percentile(&r.times, 0.5);
        let gbits = total as f64 * 32.0 / (median * 1e-3) / 1e9;
        println!(
            "| {} | {:.0}% | {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2}x | {:.2} | {} | {} |",
            r.name,
            r.loss * 100.0,
            r.times.len(),
            median,
            percentile(&r.times, 0.99),
            gbits,
            r.bytes_per_rank / 1e6,
            r.bytes_per_rank / bound,
            r.zero_filled as f64 / 1e6 / r.times.len().max(1) as f64,
            r.mismatches,
            r.cpu
                .per_gb(r.bytes_local as u64)
                .map_or("-".into(), |v| format!("{v:.2}"))
        );
    }
}
