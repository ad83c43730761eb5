//! The report printed after the measurements: the table of every row, the
//! important-arrival table and goal lines per controller, and the reference
//! lines. It only reads the rows; nothing here measures.

use gradlane::Congestion;
use gradlane_tools::cpu::CpuTime;

use crate::variants::{cc_name, median, Kind, Row};
use crate::Bench;

pub(crate) fn report(
    bench: &Bench,
    model_bytes: usize,
    rows: &[Row],
    important_quinn: &[(f64, Row)],
) {
    let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}", v * 1e3));
    let find = |name: &str, cc: Option<Congestion>, loss: f64| {
        rows.iter()
            .find(|r| r.name == name && r.congestion == cc && r.loss == loss)
    };
    let gbps = |t: Option<f64>| t.map(|t| model_bytes as f64 * 8.0 / t / 1e9);
    let lossless_gl = |cc| find("gradlane", cc, 0.0).and_then(Row::p99);
    // Lossless throughput of variant `a` over variant `b`'s, both under `cc`.
    let throughput_ratio = |a: &str, b: &str, cc: Option<Congestion>| {
        let t = |name| find(name, cc, 0.0).and_then(|r| gbps(r.median()));
        t(a).zip(t(b)).map(|(x, y)| x / y)
    };

    println!();
    println!(
        "{} rounds of {:.1} MB ({}) per variant after 1 warm-up; every variant on its own \
         connection, rounds interleaved across variants; QUIC variants: {} ms delay each way, \
         seeded loss each way, {}; loopback, one process. CPU s/GB: the process's user + system \
         CPU time over its timed rounds (sender and receiver together, both in this process) \
         per GB of model data",
        bench.args.sweep.rounds,
        model_bytes as f64 / 1e6,
        bench.args.model,
        bench.args.sweep.delay_ms,
        if bench.args.jumbo {
            "8952-byte packets (--jumbo)"
        } else if bench.args.ethernet {
            "packets up to 1452 bytes (--ethernet)"
        } else {
            "packets up to what loopback carries (MTU discovery)"
        }
    );
    println!();
    println!(
        "| variant | CC | loss | rounds | median ms | p99 ms | Gbit/s (median) | vs raw quinn | \
         p99 vs own lossless p99 | zero-filled MB/round | CPU s/GB | of which system | note |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let g = gbps(r.median());
        let base = find(
            "raw quinn",
            r.congestion.or(Some(bench.first_controller())),
            r.loss,
        )
        .and_then(|q| gbps(q.median()));
        let vs = match (g, base) {
            (Some(a), Some(b)) if !matches!(r.kind, Kind::Quinn(_, false)) => {
                format!("{:.2}x", a / b)
            }
            _ => "-".into(),
        };
        let own = match (r.kind, r.p99(), lossless_gl(r.congestion)) {
            (Kind::Gradlane(x, ..), Some(p), Some(l)) if x < 1.0 && r.name == "gradlane" => {
                format!("{:.2}x", p / l)
            }
            _ => "-".into(),
        };
        let zero = match r.kind {
            Kind::Gradlane(..) => format!("{:.2}", r.zero_filled / 1e6),
            _ => "-".into(),
        };
        let moved = model_bytes as u64 * r.times.len() as u64;
        let cpu = r.cpu.per_gb(moved);
        let system = CpuTime {
            user: Default::default(),
            system: r.cpu.system,
        }
        .per_gb(moved);
        let per_gb = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        println!(
            "| {} | {} | {}% | {} | {} | {} | {} | {vs} | {own} | {zero} | {} | {} | {} |",
            r.name,
            cc_name(r.congestion),
            r.loss * 100.0,
            r.times.len(),
            ms(r.median()),
            ms(r.p99()),
            g.map_or("-".into(), |v| format!("{v:.2}")),
            per_gb(cpu),
            per_gb(system),
            r.note
        );
    }

    let mut imp_ratios = Vec::new();
    let list = |v: &[(f64, f64)]| {
        v.iter()
            .map(|(l, r)| format!("{}%: {r:.2}x", l * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for &cc in &bench.args.controllers {
        let bbr = Some(Congestion::from(cc));
        println!();
        println!(
            "Important arrival ({}): gradlane's receiver holding every important chunk vs a raw quinn \
             stream of the important bytes only read to its end",
            cc_name(bbr)
        );
        println!();
        println!(
            "| loss | important MB | gradlane median ms | of which before the first byte | raw quinn median ms | ratio | ratio without that | lossy after confirmation: median ms (no lossy in flight) | with / without lossy in flight |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (loss, q) in important_quinn {
            let q = if bbr == Some(bench.first_controller()) {
                Some(q)
            } else {
                None
            };
            let Some(gl) = find("gradlane", bbr, *loss) else {
                continue;
            };
            let a = median(&gl.important);
            let b = q.and_then(Row::median);
            let ratio = match (a, b) {
                (Some(a), Some(b)) => {
                    imp_ratios.push((*loss, a / b));
                    format!("{:.2}x", a / b)
                }
                _ => "-".into(),
            };
            let enc = median(&gl.plan);
            let net = match (a, enc, b) {
                (Some(a), Some(e), Some(b)) => format!("{:.2}x", (a - e) / b),
                _ => "-".into(),
            };
            let quiet = find("gradlane, lossy after confirmation", bbr, *loss)
                .and_then(|r| median(&r.important));
            let inflight = match (a, quiet) {
                (Some(a), Some(q)) => format!("{:.2}x", a / q),
                _ => "-".into(),
            };
            println!(
                "| {}% | {:.1} | {} | {} | {} | {ratio} | {net} | {} | {inflight} |",
                loss * 100.0,
                gl.important_bytes as f64 / 1e6,
                ms(a),
                ms(enc),
                ms(b),
                ms(quiet)
            );
        }

        println!();
        println!("Goals ({}):", cc_name(bbr));
        let verdict = |ok: Option<bool>| match ok {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measured",
        };
        let g1 = throughput_ratio("gradlane", "raw quinn", bbr);
        println!(
            "- lossless gradlane >= 0.95x raw quinn throughput: {} ({})",
            verdict(g1.map(|x| x >= 0.95)),
            g1.map_or("-".into(), |x| format!("{x:.2}x"))
        );
        let p = |name, loss| find(name, bbr, loss).and_then(Row::p99);
        let g2 = p("gradlane", 0.05).zip(p("gradlane", 0.0));
        let g3 = p("gradlane", 0.05).zip(p("gradlane all-reliable", 0.05));
        println!(
            "- at 5% loss gradlane p99 <= 1.2x its lossless p99: {} ({})",
            verdict(g2.map(|(a, b)| a <= 1.2 * b)),
            g2.map_or("-".into(), |(a, b)| format!(
                "{:.1} vs {:.1} ms, {:.2}x",
                a * 1e3,
                b * 1e3,
                a / b
            ))
        );
        println!(
            "- at 5% loss gradlane p99 below all-reliable p99: {} ({})",
            verdict(g3.map(|(a, b)| a < b)),
            g3.map_or("-".into(), |(a, b)| format!(
                "{:.1} vs {:.1} ms",
                a * 1e3,
                b * 1e3
            ))
        );
        // The goal: the important bytes' arrival with lossy traffic in
        // flight (the default: datagrams released once the stream is sent,
        // a lossy stream at once) against without (the lossy part after the
        // important part is confirmed).
        let inflight: Vec<(f64, f64)> = bench
            .args
            .sweep
            .losses
            .iter()
            .filter_map(|&l| {
                let with = find("gradlane", bbr, l).and_then(|r| median(&r.important))?;
                let without = find("gradlane, lossy after confirmation", bbr, l)
                    .and_then(|r| median(&r.important))?;
                Some((l, with / without))
            })
            .collect();
        let worst = |v: &[(f64, f64)]| v.iter().map(|x| x.1).reduce(f64::max);
        println!(
            "- important arrival with lossy traffic in flight <= 1.1x without (every loss): {} ({})",
            verdict(worst(&inflight).map(|w| w <= 1.1)),
            list(&inflight)
        );
    }
    println!();
    println!(
        "For reference, not goals ({}):",
        cc_name(Some(bench.first_controller()))
    );
    let g5 = throughput_ratio(
        "gradlane",
        "raw quinn, f32 in and out",
        Some(bench.first_controller()),
    );
    println!(
        "- lossless gradlane vs raw quinn copying the gradients in and out of the stream: {}",
        g5.map_or("-".into(), |x| format!("{x:.2}x"))
    );
    println!(
        "- important arrival vs a raw quinn stream of the important bytes only: {}",
        list(&imp_ratios)
    );
}
