//! The worker role: joins the server, then pulls, computes a minibatch
//! gradient at its speed and pushes until the time or its steps are up.

use std::time::Duration;

use common::BoxError;
use gradlane::ps::Disposition;
use gradlane::ps_net::{Compression, Worker};
use gradlane::{Config, Faults};
use gradlane_core::rng::SplitMix64;
use gradlane_tools::cli as common;
use gradlane_tools::mlp::{Dataset, Mlp};

use crate::args::WorkerArgs;
use crate::error::TrainError;
use crate::welcome::Welcome;

pub(crate) async fn work(a: WorkerArgs) -> Result<(), BoxError> {
    let model = Mlp::demo();
    let addr = common::resolve(&a.client.connect).await?;
    let faults = (a.loss > 0.0 || a.delay_ms > 0).then(|| Faults {
        delay: Duration::from_millis(a.delay_ms),
        ..Faults::symmetric_loss(a.loss, 1000 + a.id)
    });
    let endpoint = a.client.endpoint(Config {
        faults,
        ..Config::default()
    })?;
    let compression = if a.codec {
        Compression::Codec {
            selection: gradlane::codec::Selection::TopK(model.param_count() / 10),
            base: gradlane::codec::DEFAULT_BASE,
        }
    } else {
        Compression::Rounds
    };
    let name = a.id.to_string();
    let join = Worker::join_as(
        &endpoint,
        addr,
        &a.client.server_name,
        model.layout(),
        compression,
        &name,
    );
    let wait = Duration::from_secs(a.client.connect_timeout_secs);
    let mut worker = tokio::time::timeout(wait, join)
        .await
        .map_err(|_| format!("no answer from {addr} within {wait:?}"))??;
    let welcome = Welcome::decode(worker.welcome())?;
    if let Some(mine) = a.seed.filter(|&s| s != welcome.seed) {
        return Err(TrainError::SeedMismatch {
            mine,
            server: welcome.seed,
        }
        .into());
    }
    if let Some(mine) = a.workers.filter(|&k| k != welcome.workers) {
        return Err(TrainError::WorkersMismatch {
            mine,
            server: welcome.workers,
        }
        .into());
    }
    println!(
        "worker {} joined: dataset seed {}, batch {}, from the server",
        a.id, welcome.seed, welcome.batch
    );
    let (train, _) = Dataset::demo(welcome.seed)?;
    let mut rng = SplitMix64::new(welcome.seed ^ (a.id + 1).wrapping_mul(0x9E37));
    let mut grad = vec![0f32; model.param_count()];
    let step = Duration::from_secs_f64(a.compute_ms as f64 * a.skew / 1e3);
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs(a.seconds);
    let budget = a.steps.unwrap_or(u64::MAX);
    let (mut pushes, mut dropped) = (0u64, 0u64);
    // A request still unanswered at the deadline, and since when.
    let mut unanswered = None;
    let asked = tokio::time::Instant::now();
    let mut params = match tokio::time::timeout_at(deadline, worker.pull()).await {
        Ok(params) => Some(params?),
        Err(_) => {
            unanswered = Some(asked);
            None
        }
    };
    while let Some(p) = params.as_mut() {
        if pushes >= budget || tokio::time::Instant::now() >= deadline {
            break;
        }
        let t = tokio::time::Instant::now();
        let batch: Vec<usize> = (0..welcome.batch).map(|_| rng.below(train.len())).collect();
        model.gradient(&p.values, &train, &batch, &mut grad)?;
        // A slower device: wait out the rest of this worker's step time.
        tokio::time::sleep_until((t + step).min(deadline)).await;
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        let asked = tokio::time::Instant::now();
        match tokio::time::timeout_at(deadline, worker.push_flat(p.index, &grad)).await {
            Ok(reply) => {
                let reply = reply?;
                pushes += 1;
                if matches!(reply.disposition, Disposition::Dropped { .. }) {
                    dropped += 1;
                }
                worker.recycle(std::mem::replace(p, reply.params).values);
            }
            Err(_) => {
                unanswered = Some(asked);
                break;
            }
        }
    }
    worker.leave().await;
    println!("worker {} pushes={pushes} dropped={dropped}", a.id);
    if let Some(asked) = unanswered {
        let waited = asked.elapsed().as_secs_f64();
        if pushes == 0 {
            return Err(TrainError::NothingAnswered {
                seconds: a.seconds,
                waited,
            }
            .into());
        }
        // A reply a few milliseconds late is the deadline cutting a normal
        // push; a long wait is the server holding it, worth a word.
        if waited > 1.0 {
            eprintln!(
                "ps_train worker {}: --seconds ran out with a push unanswered for {waited:.1} s",
                a.id
            );
        }
    }
    Ok(())
}
