//! The loopback comparison's report: loss and accuracy over time per run,
//! then each run's summary and every worker's pushes.

use crate::args::AllArgs;
use crate::processes::field;
use crate::runs::{Outcome, Run};

pub(crate) fn report(a: &AllArgs, skew: &[f64], outcomes: &[(Run, Outcome)]) {
    // Loss and accuracy over time, one column per run, sampled at whole
    // seconds (the last evaluation at or before each mark).
    println!();
    print!("| t (s) |");
    for (run, _) in outcomes {
        print!(" {} acc / loss |", run.label());
    }
    println!();
    print!("|---:|");
    for _ in outcomes {
        print!("---:|");
    }
    println!();
    for s in 1..=a.seconds {
        print!("| {s} |");
        for (_, o) in outcomes {
            match o.evals.iter().rev().find(|e| e.0 <= s as f64 + 1e-9) {
                Some(e) => print!(" {:.3} / {:.3} |", e.3, e.2),
                None => print!(" - |"),
            }
        }
        println!();
    }
    // The slowest worker against the others: with --straggler, the
    // straggler.
    let slowest = skew
        .iter()
        .enumerate()
        .max_by(|x, y| x.1.total_cmp(y.1))
        .map_or(0, |(i, _)| i);
    println!();
    println!(
        "| run | server steps | applied | dropped | mean staleness | worker {slowest} ({}x) dropped | others dropped | zero-filled KB | final acc | final loss | steps to loss {tl} | s to loss {tl} | s to acc {} |",
        skew.get(slowest).copied().unwrap_or(1.0),
        a.target_accuracy,
        tl = a.target_loss,
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (run, o) in outcomes {
        let last = o.evals.last().copied().unwrap_or_default();
        let to_acc = o.evals.iter().find(|e| e.3 >= a.target_accuracy);
        let to_loss = o.evals.iter().find(|e| e.2 <= a.target_loss);
        let secs =
            |e: Option<&(f64, u64, f64, f64)>| e.map_or("-".into(), |e| format!("{:.1}", e.0));
        let zero: f64 = field(&o.done, "zero_filled").parse().unwrap_or(0.0);
        let share = |pick: &dyn Fn(usize) -> bool| {
            let (mut pushes, mut dropped) = (0, 0);
            for (i, c) in o.worker_pushes.iter().enumerate() {
                if let Some((p, d)) = c.filter(|_| pick(i)) {
                    pushes += p;
                    dropped += d;
                }
            }
            if pushes == 0 {
                "-".to_string()
            } else {
                format!(
                    "{:.1}% ({dropped} of {pushes})",
                    100.0 * dropped as f64 / pushes as f64
                )
            }
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.3} | {:.3} | {} | {} | {} |",
            run.label(),
            last.1,
            field(&o.done, "applied"),
            field(&o.done, "dropped"),
            field(&o.done, "staleness"),
            share(&|i| i == slowest),
            share(&|i| i != slowest),
            zero / 1e3,
            last.3,
            last.2,
            to_loss.map_or("-".into(), |e| e.1.to_string()),
            secs(to_loss),
            secs(to_acc),
        );
    }
    // Each worker's pushes show how much slower the slow ones really were
    // (network and server time dilute the compute skew).
    println!();
    for (run, o) in outcomes {
        let per: Vec<String> = o
            .worker_pushes
            .iter()
            .map(|c| c.map_or("-".into(), |(p, d)| format!("{p}/{d}")))
            .collect();
        println!(
            "{}: pushes/dropped per worker {}",
            run.label(),
            per.join(", ")
        );
    }
}
