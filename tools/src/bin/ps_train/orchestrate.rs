//! The loopback comparison: one server process and K worker processes
//! (this program in its roles) per run, each algorithm in turn, their
//! output collected for the report.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{BoxError, Policy};
use gradlane::generate_certs;
use gradlane_tools::cli as common;
use gradlane_tools::mlp::Mlp;

use crate::args::{Algo, AllArgs};
use crate::error::TrainError;
use crate::processes::{collect_output, forward_lines, supervise, worker_counts, Guard};
use crate::report::report;
use crate::settings::{check_settings, momentum_lr, FilterChoice};

/// One server run of the comparison: an algorithm, and for the filter its
/// policy and threshold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) algo: Algo,
    pub(crate) filter: FilterChoice,
}

impl Run {
    pub(crate) fn label(&self) -> String {
        match self.algo {
            Algo::Filter => format!(
                "filter {} {}",
                self.filter.policy.name(),
                self.filter.threshold
            ),
            a => a.name().to_string(),
        }
    }
}

/// What one run's server and workers reported.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) evals: Vec<(f64, u64, f64, f64)>,
    pub(crate) done: String,
    /// Per worker: (pushes answered, of them dropped).
    pub(crate) worker_pushes: Vec<Option<(u64, u64)>>,
}

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

pub(crate) fn orchestrate(a: AllArgs) -> Result<(), BoxError> {
    let mut runs = Vec::new();
    for &algo in &a.algos {
        let mut filter = FilterChoice {
            sample: a.sample,
            threshold: 1.0,
            policy: Policy::SlidingWindow,
        };
        if algo != Algo::Filter {
            runs.push(Run { algo, filter });
            continue;
        }
        for &policy in &a.policies {
            for &threshold in &a.thresholds {
                filter.policy = policy;
                filter.threshold = threshold;
                runs.push(Run { algo, filter });
            }
        }
    }
    let skew = validate(&a, &runs)?;
    let k = a.training.workers;
    let dir = std::env::temp_dir().join(format!("gradlane-ps-train-{}", std::process::id()));
    let certs = generate_certs(&dir, &["localhost"])?;
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
        let mut server = Command::new(&exe);
        server
            .arg("server")
            .arg("--algo")
            .arg(run.algo.name())
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--cert")
            .arg(&certs.server_cert)
            .arg("--key")
            .arg(&certs.server_key)
            .arg("--eval-ms")
            .arg(a.eval_ms.to_string())
            .arg("--max-seconds")
            .arg((a.seconds * 3 + 60).to_string())
            .arg("--round-timeout")
            .arg(a.round_timeout.to_string())
            .arg("--sample")
            .arg(run.filter.sample.to_string())
            .arg("--threshold")
            .arg(run.filter.threshold.to_string())
            .arg("--policy")
            .arg(run.filter.policy.name())
            .arg("--workers")
            .arg(k.to_string())
            .arg("--seed")
            .arg(t.seed.to_string())
            .arg("--lr")
            .arg(t.lr.to_string())
            .arg("--momentum")
            .arg(t.momentum.to_string())
            .arg("--batch")
            .arg(t.batch.to_string());
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
            let mut w = Command::new(&exe);
            w.arg("worker")
                .arg("--connect")
                .arg(&addr)
                .arg("--ca")
                .arg(&certs.ca_cert)
                .arg("--id")
                .arg(i.to_string())
                .arg("--skew")
                .arg(s.to_string())
                .arg("--compute-ms")
                .arg(a.compute_ms.to_string())
                .arg("--seconds")
                .arg(a.seconds.to_string())
                .arg("--loss")
                .arg(a.loss.to_string())
                .arg("--delay-ms")
                .arg(a.delay_ms.to_string());
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
            if let Some(rest) = line.strip_prefix("eval ") {
                let f: Vec<&str> = rest.split(' ').collect();
                if let [t, steps, loss, acc] = f[..] {
                    if let (Ok(t), Ok(steps), Ok(loss), Ok(acc)) =
                        (t.parse(), steps.parse(), loss.parse(), acc.parse())
                    {
                        outcome.evals.push((t, steps, loss, acc));
                    }
                }
            } else if let Some(rest) = line.strip_prefix("done ") {
                outcome.done = rest.to_string();
            }
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
