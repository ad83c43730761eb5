//! The loopback comparison: one server process and K worker processes
//! (this program in its roles) per run, each algorithm in turn, their
//! output collected for the report.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use common::BoxError;
use gradlane_tools::cli as common;
use gradlane_tools::local_certs::localhost_certs;
use gradlane_tools::mlp::Mlp;

use crate::args::AllArgs;
use crate::error::TrainError;
use crate::processes::{collect_output, forward_lines, supervise, worker_counts, Guard};
use crate::report::report;
use crate::runs::{Outcome, Run};
use crate::settings::{check_settings, momentum_lr};

/// Every check of the flags that needs no process: done before anything
/// starts, so a bad value fails at once with the flag's name.
pub(crate) fn validate(a: &AllArgs, runs: &[Run]) -> Result<Vec<f64>, TrainError> {
    let k = a.training.workers;
    if k == 0 {
        return Err(TrainError::Invalid("--workers must be at least 1".into()));
    }
    if a.seconds == 0 {
        return Err(TrainError::Invalid("--seconds must be at least 1".into()));
    }
    if let Some(t) = a.thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
        return Err(TrainError::Invalid(format!(
            "--thresholds: {t} is not in [0, 1]"
        )));
    }
    let factor = |f: f64| f.is_finite() && f > 0.0;
    if !factor(a.spread.slowest) || a.spread.slowest < 1.0 {
        return Err(TrainError::Invalid(format!(
            "--slowest {} must be at least 1",
            a.spread.slowest
        )));
    }
    if let Some(s) = a.spread.straggler.filter(|&s| !factor(s)) {
        return Err(TrainError::Invalid(format!(
            "--straggler {s} must be a positive number"
        )));
    }
    if let Some(s) = a.skew.iter().find(|&&s| !factor(s)) {
        return Err(TrainError::Invalid(format!(
            "--skew {s} must be a positive number"
        )));
    }
    for run in runs {
        check_settings(run.algo, &a.training, run.filter)?;
    }
    if a.skew.is_empty() {
        Ok(a.spread.speeds(k))
    } else if a.skew.len() == k {
        Ok(a.skew.clone())
    } else {
        Err(TrainError::Invalid(format!(
            "--skew has {} values for {k} workers",
            a.skew.len()
        )))
    }
}

/// This program in `role` (`server` or `worker`), each flag followed by
/// its value.
fn role_command(exe: &Path, role: &str, flags: Vec<(&str, OsString)>) -> Command {
    let mut command = Command::new(exe);
    command.arg(role);
    for (flag, value) in flags {
        command.arg(flag).arg(value);
    }
    command
}

/// Runs every server run the flags ask for, each with its K workers, one
/// after the other, then prints the report.
pub(crate) fn orchestrate(a: AllArgs) -> Result<(), BoxError> {
    let runs = Run::all(&a);
    let skew = validate(&a, &runs)?;
    let k = a.training.workers;
    let (dir, certs) = localhost_certs("ps-train")?;
    let exe = std::env::current_exe()?;
    let t = &a.training;
    println!(
        "ps_train: MLP {} params, K = {k}, skew {:?}, {:.0}% loss + {} ms delay per worker link, {} s per algorithm, lr {} (momentum methods {:.4}, beta {}), gradients as {}",
        Mlp::demo().param_count(),
        skew,
        a.loss * 100.0,
        a.delay_ms,
        a.seconds,
        t.lr,
        momentum_lr(t),
        t.momentum,
        if a.codec { "codec frames" } else { "gradlane rounds" }
    );
    let mut outcomes = Vec::new();
    for run in &runs {
        println!("  {} ...", run.label());
        let mut server = role_command(
            &exe,
            "server",
            vec![
                ("--algo", run.algo.name().into()),
                ("--listen", "127.0.0.1:0".into()),
                ("--cert", certs.server_cert.clone().into()),
                ("--key", certs.server_key.clone().into()),
                ("--eval-ms", a.eval_ms.to_string().into()),
                ("--max-seconds", (a.seconds * 3 + 60).to_string().into()),
                ("--round-timeout", a.round_timeout.to_string().into()),
                ("--sample", run.filter.sample.to_string().into()),
                ("--threshold", run.filter.threshold.to_string().into()),
                ("--policy", run.filter.policy.name().into()),
                ("--workers", k.to_string().into()),
                ("--seed", t.seed.to_string().into()),
                ("--lr", t.lr.to_string().into()),
                ("--momentum", t.momentum.to_string().into()),
                ("--batch", t.batch.to_string().into()),
            ],
        );
        let mut server = Guard::spawn(server.stdout(Stdio::piped()))?;
        let mut lines = BufReader::new(server.0.stdout.take().ok_or("no server stdout")?).lines();
        let addr = match lines.next() {
            Some(Ok(l)) if l.starts_with("listening ") => l["listening ".len()..].to_string(),
            other => {
                return Err(format!("the {} server did not start: {other:?}", run.label()).into())
            }
        };
        let lines = forward_lines(lines);
        let mut workers = Vec::new();
        for (i, s) in skew.iter().enumerate() {
            let mut w = role_command(
                &exe,
                "worker",
                vec![
                    ("--connect", addr.clone().into()),
                    ("--ca", certs.ca_cert.clone().into()),
                    ("--id", i.to_string().into()),
                    ("--skew", s.to_string().into()),
                    ("--compute-ms", a.compute_ms.to_string().into()),
                    ("--seconds", a.seconds.to_string().into()),
                    ("--loss", a.loss.to_string().into()),
                    ("--delay-ms", a.delay_ms.to_string().into()),
                ],
            );
            if a.codec {
                w.arg("--codec");
            }
            workers.push(Guard::spawn(w.stdout(Stdio::piped()))?);
        }
        let outputs: Vec<_> = workers
            .iter_mut()
            .map(|w| collect_output(w.0.stdout.take()))
            .collect();
        let mut outcome = Outcome::default();
        supervise(&run.label(), &mut server, lines, &mut workers, |line| {
            outcome.take_line(line)
        })?;
        for (i, out) in outputs.into_iter().enumerate() {
            let out = out.join().unwrap_or_default();
            outcome.worker_pushes.push(worker_counts(&out, i));
        }
        outcomes.push((*run, outcome));
    }
    report(&a, &skew, &outcomes);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
