//! The server role: serves one algorithm to K workers and prints the
//! `listening`, `eval` and `done` lines the loopback comparison reads.

use std::io::Write;
use std::time::{Duration, Instant};

use common::BoxError;
use gradlane::ps::baselines::{Asgd, SyncMomentum};
use gradlane::ps::{OrderedMomentum, OrderedMomentumConfig, ParameterServer, StragglerFilter};
use gradlane::ps_net::{self, ServerHandle, WorkerInfo};
use gradlane::Config;
use gradlane_tools::cli as common;
use gradlane_tools::mlp::{Dataset, Mlp};

use crate::args::{Algo, ServerArgs};
use crate::error::TrainError;
use crate::settings::{check_settings, momentum_lr, FilterChoice};
use crate::welcome::Welcome;

pub(crate) async fn serve(a: ServerArgs) -> Result<(), BoxError> {
    let t = &a.training;
    let filter = FilterChoice {
        sample: a.sample,
        threshold: a.threshold,
        policy: a.policy,
    };
    check_settings(a.algo, t, filter)?;
    let model = Mlp::demo();
    let (_, test) = Dataset::demo(t.seed)?;
    let w0 = model.init(t.seed);
    let welcome = Welcome {
        seed: t.seed,
        batch: t.batch,
        workers: t.workers,
    }
    .encode();
    match a.algo {
        Algo::Ormo => {
            let cfg = OrderedMomentumConfig {
                workers: t.workers,
                momentum: t.momentum,
                learning_rate: momentum_lr(t),
            };
            let h = ServerHandle::with_welcome(OrderedMomentum::new(cfg, w0)?, welcome)?;
            serve_with(&a, &model, &test, h, |_| None).await
        }
        Algo::Asgd => {
            let h = ServerHandle::with_welcome(Asgd::new(t.lr, w0)?, welcome)?;
            serve_with(&a, &model, &test, h, |_| None).await
        }
        Algo::Ssgd => {
            let s = SyncMomentum::new(t.workers, momentum_lr(t), t.momentum, w0)?;
            serve_with(
                &a,
                &model,
                &test,
                ServerHandle::with_welcome(s, welcome)?,
                |_| None,
            )
            .await
        }
        Algo::Filter => {
            let s = StragglerFilter::new(filter.config(t.lr), w0)?;
            serve_with(
                &a,
                &model,
                &test,
                ServerHandle::with_welcome(s, welcome)?,
                |s: &StragglerFilter| Some(s.stats().mean_applied_staleness()),
            )
            .await
        }
    }
}

/// Serves until every worker that joined has left; prints `listening`,
/// `eval` and `done` lines for the orchestrator. Under SSGD, gives up on a
/// round that has not filled for `--round-timeout` seconds.
pub(crate) async fn serve_with<S: ParameterServer + Send + 'static>(
    a: &ServerArgs,
    model: &Mlp,
    test: &Dataset,
    handle: ServerHandle<S>,
    filter_staleness: impl Fn(&S) -> Option<f64>,
) -> Result<(), BoxError> {
    let mut config = Config::default();
    config.timing.grace = Duration::from_millis(a.grace_ms);
    let endpoint = a.server.endpoint(config).await?;
    println!("listening {}", endpoint.local_addr()?);
    std::io::stdout().flush()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = handle.clone();
    let serving = tokio::spawn(async move { ps_net::run(&endpoint, h, stopped).await });

    let start = Instant::now();
    let round_timeout = Duration::from_secs(a.round_timeout);
    let mut tick = tokio::time::interval(Duration::from_millis(a.eval_ms.max(10)));
    let mut clock_started = None;
    // The last time the parameters moved (or the first worker came).
    let mut progress: Option<(Instant, u64)> = None;
    let outcome = loop {
        tick.tick().await;
        let stats = handle.stats();
        // Time runs from the first worker's arrival, so process start-up
        // does not count against any algorithm.
        if stats.workers_joined > 0 && clock_started.is_none() {
            clock_started = Some(Instant::now());
        }
        if let Some(t0) = clock_started {
            let (params, steps) = handle.snapshot();
            let e = model.evaluate(&params, test)?;
            println!(
                "eval {:.3} {steps} {:.5} {:.4}",
                t0.elapsed().as_secs_f64(),
                e.loss,
                e.accuracy
            );
            std::io::stdout().flush()?;
            if progress.is_none_or(|(_, s)| s != steps) {
                progress = Some((Instant::now(), steps));
            }
        }
        let all_left = stats.workers_joined >= a.training.workers as u64
            && stats.workers_left >= stats.workers_joined;
        if all_left || start.elapsed() > Duration::from_secs(a.max_seconds) {
            break Ok(());
        }
        // Only a synchronous round waits for particular workers; the
        // asynchronous servers go on with whoever is there.
        if let (Algo::Ssgd, Some((since, round))) = (a.algo, progress) {
            if since.elapsed() > round_timeout && stats.workers_left < stats.workers_joined {
                let why = stuck_round(
                    round,
                    a.round_timeout,
                    a.training.workers,
                    &handle.workers(),
                );
                handle.close_workers(&why);
                break Err(TrainError::RoundStuck(why));
            }
        }
    };
    let _ = stop.send(());
    let stats = serving.await??;
    let filter = handle.with(|s| filter_staleness(s));
    println!(
        "done applied={} dropped={} buffered={} refused={} staleness={:.3} filter_staleness={} zero_filled={} late={} joined={} left={}",
        stats.applied,
        stats.dropped,
        stats.buffered,
        stats.refused,
        stats.mean_applied_staleness(),
        filter.map_or("-".into(), |f| format!("{f:.3}")),
        stats.zero_filled_bytes,
        stats.late_merged_bytes,
        stats.workers_joined,
        stats.workers_left
    );
    Ok(outcome?)
}

/// Why a synchronous round cannot fill: the workers of `0..workers` that
/// never said hello, or, if every one did, that one of them holds the
/// round up.
pub(crate) fn stuck_round(round: u64, seconds: u64, workers: usize, seen: &[WorkerInfo]) -> String {
    let names: Vec<&str> = seen.iter().filter_map(|w| w.name.as_deref()).collect();
    let missing: Vec<String> = (0..workers)
        .map(|i| i.to_string())
        .filter(|i| !names.contains(&i.as_str()))
        .collect();
    let joined = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    };
    if missing.is_empty() {
        format!(
            "synchronous round {round} has not filled in {seconds} s although all {workers} \
             workers joined (joined: {joined}); one of them holds it up"
        )
    } else {
        format!(
            "synchronous round {round} has not filled in {seconds} s: it waits for {} {} of \
             --workers {workers}, never joined (joined: {joined})",
            if missing.len() == 1 {
                "worker"
            } else {
                "workers"
            },
            missing.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stuck_round_names_the_workers_that_never_joined() {
        let seen = |names: &[&str]| -> Vec<WorkerInfo> {
            names
                .iter()
                .map(|n| WorkerInfo {
                    name: Some(n.to_string()),
                    connected: true,
                })
                .collect()
        };
        let why = stuck_round(0, 30, 3, &seen(&["1", "0"]));
        assert!(why.contains("waits for worker 2 of --workers 3"), "{why}");
        assert!(why.contains("joined: 1, 0"), "{why}");
        let why = stuck_round(4, 30, 4, &seen(&["0"]));
        assert!(why.contains("workers 1, 2, 3"), "{why}");
        let why = stuck_round(4, 30, 2, &seen(&["0", "1"]));
        assert!(why.contains("all 2 workers joined"), "{why}");
        let why = stuck_round(0, 30, 1, &[]);
        assert!(why.contains("joined: none"), "{why}");
    }
}
