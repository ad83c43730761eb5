//! The parameter server over real gradlane links on loopback.

use gradlane::codec::{Selection, DEFAULT_BASE};
use gradlane::layout::{Layout, TensorSpec};
use gradlane::ps::baselines::SyncMomentum;
use gradlane::ps::sim::{LeastSquares, SplitMix64};
use gradlane::ps::{Disposition, OrderedMomentum, OrderedMomentumConfig, ParameterServer};
use gradlane::ps_net::{self, Compression, ServeStats, ServerHandle, Worker, WorkerError};
use gradlane::transport::tls::generate_certs;
use gradlane::transport::{Config, Endpoint, Faults};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

fn cert_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gradlane-psnet-{tag}-{}", std::process::id()));
    generate_certs(&dir, &["localhost"]).unwrap();
    dir
}

fn quick() -> Config {
    let mut c = Config::default();
    c.tuning.max_idle_timeout = Some(Duration::from_secs(3));
    c.tuning.keep_alive = Some(Duration::from_millis(500));
    c.timing.grace = Duration::from_millis(5);
    c
}

/// A running server: its address, a handle to watch it, how to stop it.
struct Running<S> {
    addr: SocketAddr,
    dir: PathBuf,
    handle: ServerHandle<S>,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<ServeStats, ps_net::ServeError>>,
}

fn start<S: ParameterServer + Send + 'static>(tag: &str, server: S) -> Running<S> {
    let dir = cert_dir(tag);
    let endpoint = Endpoint::server(
        "127.0.0.1:0".parse().unwrap(),
        dir.join("server.pem"),
        dir.join("server.key"),
        quick(),
    )
    .unwrap();
    let addr = endpoint.local_addr().unwrap();
    let handle = ServerHandle::new(server);
    let (stop, stopped) = oneshot::channel::<()>();
    let h = handle.clone();
    let done = tokio::spawn(async move { ps_net::run(&endpoint, h, stopped).await });
    Running {
        addr,
        dir,
        handle,
        stop,
        done,
    }
}

/// The least-squares problem split into 256-value tensors so a round has
/// several chunks to classify.
fn problem() -> (LeastSquares, Layout) {
    let p = LeastSquares::synthetic(7, 512, 64, 10.0, 0.01).unwrap();
    let layout = Layout::new(vec![TensorSpec::dense("w", [p.dim()])]).unwrap();
    (p, layout)
}

/// One worker: `steps` pushes of minibatch gradients, with injected loss.
async fn worker_loop(
    run: (SocketAddr, PathBuf),
    layout: Layout,
    problem: Arc<LeastSquares>,
    steps: usize,
    seed: u64,
    compression: Compression,
) -> Result<Vec<Disposition>, WorkerError> {
    let (addr, dir) = run;
    let config = Config {
        faults: Some(Faults::symmetric_loss(0.05, seed)),
        ..quick()
    };
    let ep = Endpoint::client(dir.join("ca.pem"), config).unwrap();
    let mut w = Worker::join(&ep, addr, "localhost", &layout, compression).await?;
    let mut params = w.pull().await?;
    let mut rng = SplitMix64::new(seed);
    let mut grad = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..steps {
        let batch: Vec<usize> = (0..32).map(|_| rng.below(problem.samples())).collect();
        problem.gradient(&params.values, &batch, &mut grad);
        let reply = w.push(params.index, &[&grad]).await?;
        seen.push(reply.disposition);
        w.recycle(std::mem::replace(&mut params, reply.params).values);
    }
    w.leave().await;
    Ok(seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ormo_trains_over_lossy_links() {
    let (p, layout) = problem();
    let p = Arc::new(p);
    let w0 = vec![0.0; p.dim()];
    let start_loss = p.loss(&w0);
    let cfg = OrderedMomentumConfig {
        workers: 3,
        momentum: 0.9,
        learning_rate: 0.05,
    };
    let run = start("ormo", OrderedMomentum::new(cfg, w0).unwrap());
    let workers: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(worker_loop(
                (run.addr, run.dir.clone()),
                layout.clone(),
                p.clone(),
                40,
                10 + i,
                Compression::Rounds,
            ))
        })
        .collect();
    for w in workers {
        let seen = w.await.unwrap().unwrap();
        assert!(seen
            .iter()
            .all(|d| matches!(d, Disposition::Applied { .. })));
    }
    let (params, steps) = run.handle.snapshot();
    run.stop.send(()).unwrap();
    let stats = run.done.await.unwrap().unwrap();
    assert_eq!(steps, 120);
    assert_eq!(stats.applied, 120);
    assert_eq!(stats.workers_joined, 3);
    assert_eq!(stats.workers_left, 3);
    let end_loss = p.loss(&params);
    eprintln!(
        "loss {start_loss:.4} -> {end_loss:.4} (optimum {:.4}), {stats:?}",
        p.optimum()
    );
    assert!(end_loss < 0.05 * start_loss, "{end_loss} vs {start_loss}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codec_pushes_and_sync_rounds() {
    let (p, layout) = problem();
    let p = Arc::new(p);
    let w0 = vec![0.0; p.dim()];
    let start_loss = p.loss(&w0);
    let run = start("sync", SyncMomentum::new(2, 0.05, 0.9, w0).unwrap());
    let codec = Compression::Codec {
        selection: Selection::TopK(32),
        base: DEFAULT_BASE,
    };
    let workers: Vec<_> = (0..2)
        .map(|i| {
            tokio::spawn(worker_loop(
                (run.addr, run.dir.clone()),
                layout.clone(),
                p.clone(),
                30,
                20 + i,
                codec,
            ))
        })
        .collect();
    let mut buffered = 0;
    for w in workers {
        let seen = w.await.unwrap().unwrap();
        buffered += seen.iter().filter(|d| **d == Disposition::Buffered).count();
    }
    let (params, steps) = run.handle.snapshot();
    run.stop.send(()).unwrap();
    let stats = run.done.await.unwrap().unwrap();
    // Two workers per synchronous round: one of each pair waits.
    assert_eq!(steps, 30);
    assert_eq!(buffered, 30);
    assert_eq!(stats.codec_pushes, 60);
    let end_loss = p.loss(&params);
    assert!(end_loss < 0.1 * start_loss, "{end_loss} vs {start_loss}");
}
