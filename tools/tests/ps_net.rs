//! The parameter server over real gradlane links on loopback.

use gradlane::codec::{Selection, DEFAULT_BASE};
use gradlane::codes;
use gradlane::generate_certs;
use gradlane::ps::baselines::SyncMomentum;
use gradlane::ps::{Disposition, OrderedMomentum, OrderedMomentumConfig, ParameterServer};
use gradlane::ps_net::{
    self, Compression, Params, ServeStats, ServerHandle, Worker, WorkerError, WorkerInfo,
};
use gradlane::{Config, Endpoint, Faults};
use gradlane::{Layout, TensorSpec};
use gradlane_core::rng::SplitMix64;
use gradlane_tools::sim::LeastSquares;
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
    c.quic.max_idle_timeout = Some(Duration::from_secs(3));
    c.quic.keep_alive = Some(Duration::from_millis(500));
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

impl<S> Running<S> {
    /// Stops the server: what it counted.
    async fn finish(self) -> ServeStats {
        self.stop.send(()).unwrap();
        self.done.await.unwrap().unwrap()
    }
}

fn start<S: ParameterServer + Send + 'static>(tag: &str, server: S) -> Running<S> {
    start_with(tag, server, quick())
}

fn start_with<S: ParameterServer + Send + 'static>(
    tag: &str,
    server: S,
    config: Config,
) -> Running<S> {
    start_handle(tag, ServerHandle::new(server), config)
}

fn start_handle<S: ParameterServer + Send + 'static>(
    tag: &str,
    handle: ServerHandle<S>,
    config: Config,
) -> Running<S> {
    let dir = cert_dir(tag);
    let endpoint = Endpoint::server(
        "127.0.0.1:0".parse().unwrap(),
        dir.join("server.pem"),
        dir.join("server.key"),
        config,
    )
    .unwrap();
    let addr = endpoint.local_addr().unwrap();
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

/// OrMo for `workers` over `dim` zero parameters, for tests about the
/// runtime rather than the training.
fn small_ormo(workers: usize, dim: usize) -> OrderedMomentum {
    let cfg = OrderedMomentumConfig {
        workers,
        momentum: 0.5,
        learning_rate: 0.01,
    };
    OrderedMomentum::new(cfg, vec![0.0; dim]).unwrap()
}

/// The least-squares problem split into 256-value tensors so a round has
/// several chunks to classify.
fn problem() -> (LeastSquares, Layout) {
    let p = LeastSquares::synthetic(7, 512, 64, 10.0, 0.01).unwrap();
    let layout = Layout::new(vec![TensorSpec::dense("w", [p.dim()])]).unwrap();
    (p, layout)
}

/// [`problem`] shared with the workers' tasks, its layout, and the zero
/// start with the loss there.
fn from_zero() -> (Arc<LeastSquares>, Layout, Vec<f32>, f64) {
    let (p, layout) = problem();
    let w0 = vec![0.0; p.dim()];
    let start_loss = p.loss(&w0);
    (Arc::new(p), layout, w0, start_loss)
}

/// One worker: `steps` pushes of minibatch gradients, with injected loss.
async fn worker_loop(
    run: (SocketAddr, PathBuf),
    layout: Layout,
    problem: Arc<LeastSquares>,
    steps: usize,
    seed: u64,
    compression: Compression,
    pause: Option<(usize, tokio::sync::watch::Receiver<bool>)>,
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
    let mut pause = pause;
    for step in 0..steps {
        // Hold here, mid-run, until told to go on (the kill test).
        if let Some((at, go)) = &mut pause {
            if step == *at {
                go.wait_for(|&v| v).await.unwrap();
            }
        }
        let batch: Vec<usize> = (0..32).map(|_| rng.below(problem.samples())).collect();
        problem.gradient(&params.values, &batch, &mut grad);
        let reply = w.push(params.index, &[&grad]).await?;
        seen.push(reply.disposition);
        w.recycle(std::mem::replace(&mut params, reply.params).values);
    }
    w.leave().await;
    Ok(seen)
}

/// A [`worker_loop`] of each seed in `seeds`, on tasks of their own, each
/// with its `pause`.
fn spawn_workers<S>(
    run: &Running<S>,
    layout: &Layout,
    problem: &Arc<LeastSquares>,
    seeds: std::ops::Range<u64>,
    steps: usize,
    compression: Compression,
    pause: Option<(usize, tokio::sync::watch::Receiver<bool>)>,
) -> Vec<tokio::task::JoinHandle<Result<Vec<Disposition>, WorkerError>>> {
    seeds
        .map(|seed| {
            tokio::spawn(worker_loop(
                (run.addr, run.dir.clone()),
                layout.clone(),
                problem.clone(),
                steps,
                seed,
                compression,
                pause.clone(),
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ormo_trains_over_lossy_links() {
    let (p, layout, w0, start_loss) = from_zero();
    let cfg = OrderedMomentumConfig {
        workers: 3,
        momentum: 0.9,
        learning_rate: 0.05,
    };
    let run = start("ormo", OrderedMomentum::new(cfg, w0).unwrap());
    let workers = spawn_workers(&run, &layout, &p, 10..13, 40, Compression::Rounds, None);
    for w in workers {
        let seen = w.await.unwrap().unwrap();
        assert!(seen
            .iter()
            .all(|d| matches!(d, Disposition::Applied { .. })));
    }
    let (params, steps) = run.handle.snapshot();
    let stats = run.finish().await;
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
    let (p, layout, w0, start_loss) = from_zero();
    let run = start("sync", SyncMomentum::new(2, 0.05, 0.9, w0).unwrap());
    let codec = Compression::Codec {
        selection: Selection::TopK(32),
        base: DEFAULT_BASE,
    };
    let workers = spawn_workers(&run, &layout, &p, 20..22, 30, codec, None);
    let mut buffered = 0;
    for w in workers {
        let seen = w.await.unwrap().unwrap();
        buffered += seen.iter().filter(|d| **d == Disposition::Buffered).count();
    }
    let (params, steps) = run.handle.snapshot();
    let stats = run.finish().await;
    // Two workers per synchronous round: one of each pair waits.
    assert_eq!(steps, 30);
    assert_eq!(buffered, 30);
    assert_eq!(stats.codec_pushes, 60);
    let end_loss = p.loss(&params);
    assert!(end_loss < 0.1 * start_loss, "{end_loss} vs {start_loss}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_leave_tickets_and_links_intact() {
    let (p, layout) = problem();
    let run = start("refuse", small_ormo(1, p.dim()));
    let ep = Endpoint::client(run.dir.join("ca.pem"), quick()).unwrap();
    let mut a = Worker::join(&ep, run.addr, "localhost", &layout, Compression::Rounds)
        .await
        .unwrap();
    let params = a.pull().await.unwrap();
    // K = 1: a second worker gets no slot, and is told why.
    let mut b = Worker::join(&ep, run.addr, "localhost", &layout, Compression::Rounds)
        .await
        .unwrap();
    match b.pull().await {
        Err(WorkerError::Refused(why)) => assert!(why.contains("slots"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A second pull while holding a ticket is refused too.
    assert!(matches!(a.pull().await, Err(WorkerError::Refused(_))));
    // A push with an index never handed out: refused, nothing applied, and
    // the real ticket still works afterwards.
    let grad = vec![0.5f32; p.dim()];
    match a.push(params.index + 5, &[&grad]).await {
        Err(WorkerError::Refused(why)) => assert!(why.contains("unknown index"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(run.handle.snapshot().1, 0);
    let reply = a.push(params.index, &[&grad]).await.unwrap();
    assert_eq!(reply.disposition, Disposition::Applied { staleness: 0 });
    // A gradient of the wrong shape never leaves the worker.
    assert!(matches!(
        a.push(reply.params.index, &[&grad[1..]]).await,
        Err(WorkerError::GradientShape { .. })
    ));
    // A NaN travels (exact, as an overflow must for mixed precision) and
    // the server refuses it, naming where: nothing applied, the link in
    // step, the ticket still good.
    let mut bad = grad.clone();
    bad[3] = f32::NAN;
    match a.push(reply.params.index, &[&bad]).await {
        Err(WorkerError::Refused(why)) => {
            assert!(why.contains("non-finite gradient at 3"), "{why}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(run.handle.snapshot().1, 1);
    let reply = a.push(reply.params.index, &[&grad]).await.unwrap();
    assert_eq!(reply.params.steps, 2);
    a.leave().await;
    b.leave().await;
    let stats = run.finish().await;
    assert_eq!(stats.refused, 4);
    assert_eq!(stats.applied, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_push_leaves_the_session_usable() {
    // 16 MB a push: more than quinn's stream windows let through before
    // the receiver acknowledges, so a push cannot finish within one poll
    // (a 256-byte one did, now and then: every wait in it was already
    // over when polled).
    let layout = Layout::new(vec![TensorSpec::dense("w", [1 << 22])]).unwrap();
    let dim = layout.total_values() as usize;
    let run = start("cancel", small_ormo(1, dim));
    let ep = Endpoint::client(run.dir.join("ca.pem"), quick()).unwrap();
    let mut a = Worker::join(&ep, run.addr, "localhost", &layout, Compression::Rounds)
        .await
        .unwrap();
    let mut params = a.pull().await.unwrap();
    let grad = vec![0.5f32; dim];
    // Polled once and dropped: the round is framed and partly on its way,
    // then abandoned (its lanes reset), and the request naming it is never
    // written. A push that still finished in that one poll is counted and
    // tried again.
    let applied = push_until_one_is_dropped(&mut a, &mut params, &grad, 5).await;
    // The ticket was never used, and the next push goes under a fresh
    // round index: the server drops the round no request named (or the
    // link skips it, when the next round overtakes it).
    let reply = a.push(params.index, &[&grad]).await.unwrap();
    assert_eq!(reply.disposition, Disposition::Applied { staleness: 0 });
    let reply = a.push(reply.params.index, &[&grad]).await.unwrap();
    assert_eq!(reply.disposition, Disposition::Applied { staleness: 0 });
    a.leave().await;
    let stats = run.finish().await;
    assert_eq!(stats.applied, applied + 2);
    assert!(stats.orphan_rounds <= 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_dropped_while_awaiting_its_reply_leaves_the_session_in_step() {
    let (p, layout) = problem();
    let run = start("dropped-reply", small_ormo(1, p.dim()));
    // The worker's packets leave 20 ms late, so a push's reply cannot be
    // in before the one poll that sent its request returns (that poll
    // would have to be descheduled for 40 ms).
    let delayed = Config {
        faults: Some(Faults {
            delay: Duration::from_millis(20),
            ..Faults::default()
        }),
        ..quick()
    };
    let ep = Endpoint::client(run.dir.join("ca.pem"), delayed).unwrap();
    let codec = Compression::Codec {
        selection: Selection::TopK(32),
        base: DEFAULT_BASE,
    };
    let mut a = Worker::join(&ep, run.addr, "localhost", &layout, codec)
        .await
        .unwrap();
    let mut params = a.pull().await.unwrap();
    let grad = vec![0.25f32; p.dim()];
    // A codec push sends its request at once, then waits a round trip for
    // the reply: polled once, it is under way, and dropped there. (Should
    // the test thread be descheduled for longer than the round trip
    // between sending and looking for the reply, that push is done, and
    // the next one is tried.)
    let applied = push_until_one_is_dropped(&mut a, &mut params, &grad, 20).await;
    // The server applied the request that left. The next pull returns the
    // parameters and ticket of that push's reply (before, it read that
    // reply as its own and failed: a push reply to a pull), and the calls
    // after it get their own replies.
    let params = a.pull().await.unwrap();
    assert_eq!(params.steps, applied + 1);
    let reply = a.push_flat(params.index, &grad).await.unwrap();
    assert_eq!(reply.disposition, Disposition::Applied { staleness: 0 });
    assert_eq!(reply.params.steps, applied + 2);
    a.leave().await;
    let stats = run.finish().await;
    assert_eq!(stats.applied, applied + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_model_size_and_malformed_requests_close_only_that_link() {
    let (p, layout) = problem();
    let run = start("malformed", small_ormo(2, p.dim()));
    let ep = Endpoint::client(run.dir.join("ca.pem"), quick()).unwrap();

    // A layout with one value too many: the server closes with the
    // layout-mismatch code.
    let big = Layout::new(vec![TensorSpec::dense("w", [p.dim() + 1])]).unwrap();
    let refused = async {
        let mut w = Worker::join(&ep, run.addr, "localhost", &big, Compression::Rounds).await?;
        w.pull().await
    };
    match refused.await {
        Err(WorkerError::Link(gradlane::LinkError::Rejected { code, .. }))
        | Err(WorkerError::Stream(gradlane::ps_net::StreamError::Link(
            gradlane::LinkError::Rejected { code, .. },
        ))) => assert_eq!(code, u64::from(codes::LAYOUT_MISMATCH)),
        other => panic!("expected a layout-mismatch close, got {other:?}"),
    }

    // Garbage on the request stream: closed with the protocol code.
    let link = ep.connect(run.addr, "localhost", &layout).await.unwrap();
    let (mut send, _recv) = link.connection().open_bi().await.unwrap();
    send.write_all(&[1, 0, 0, 0, 99]).await.unwrap();
    match link.connection().closed().await {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code.into_inner(), u64::from(codes::PROTOCOL))
        }
        other => panic!("expected an application close, got {other:?}"),
    }

    // The server still serves a well-behaved worker.
    let mut good = Worker::join(&ep, run.addr, "localhost", &layout, Compression::Rounds)
        .await
        .unwrap();
    let params = good.pull().await.unwrap();
    let reply = good
        .push(params.index, &[vec![1.0f32; p.dim()]])
        .await
        .unwrap();
    assert!(matches!(reply.disposition, Disposition::Applied { .. }));
    good.leave().await;
    let stats = run.finish().await;
    assert_eq!(stats.links_refused, 1);
    assert_eq!(stats.applied, 1);
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_does_not_stop_the_others() {
    let (p, layout) = problem();
    let p = Arc::new(p);
    let w0 = vec![0.0; p.dim()];
    let cfg = OrderedMomentumConfig {
        workers: 3,
        momentum: 0.9,
        learning_rate: 0.05,
    };
    let run = start("kill", OrderedMomentum::new(cfg, w0).unwrap());

    // Two survivors train; after 20 pushes each they hold until the victim
    // is dead, then push 40 more each.
    let (killed_tx, killed_rx) = tokio::sync::watch::channel(false);
    let survivors = spawn_workers(
        &run,
        &layout,
        &p,
        30..32,
        60,
        Compression::Rounds,
        Some((20, killed_rx)),
    );

    // The victim lives in its own runtime and dies mid-run holding a ticket,
    // without a goodbye: shutting its runtime down stops its packets at once,
    // as a killed process would.
    let (pushed_tx, pushed_rx) = oneshot::channel::<u64>();
    let victim = {
        let (addr, dir, layout, p) = (run.addr, run.dir.clone(), layout.clone(), p.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let ep = Endpoint::client(dir.join("ca.pem"), quick()).unwrap();
                let mut w = Worker::join(&ep, addr, "localhost", &layout, Compression::Rounds)
                    .await
                    .unwrap();
                let mut params = w.pull().await.unwrap();
                let mut grad = Vec::new();
                for i in 0..10 {
                    p.gradient(&params.values, &[i, i + 1, i + 2], &mut grad);
                    params = w.push(params.index, &[&grad]).await.unwrap().params;
                }
                pushed_tx.send(params.index).unwrap();
                // Hold the ticket and the connection while the runtime dies.
                std::mem::forget(w);
                std::mem::forget(ep);
            });
            rt.shutdown_background();
        })
    };
    pushed_rx.await.unwrap();
    victim.join().unwrap();
    let handle = run.handle.clone();
    // Both survivors are parked at their 20th push (or on their way there).
    assert!(
        eventually(Duration::from_secs(15), || handle.snapshot().1 == 10 + 40).await,
        "survivors did not reach the pause: {:?}",
        handle.stats()
    );
    let (at_kill, _) = run.handle.snapshot();
    let loss_at_kill = p.loss(&at_kill);
    killed_tx.send(true).unwrap();

    for s in survivors {
        let seen = s.await.unwrap().unwrap();
        assert_eq!(seen.len(), 60);
        assert!(seen
            .iter()
            .all(|d| matches!(d, Disposition::Applied { .. })));
    }
    // The victim's session ends at the idle timeout and gives its ticket back.
    assert!(
        eventually(Duration::from_secs(15), || handle.stats().workers_left == 3).await,
        "the dead worker's session never ended: {:?}",
        handle.stats()
    );
    assert_eq!(run.handle.with(|s| s.outstanding()), 0);
    let (params, steps) = run.handle.snapshot();
    assert_eq!(steps, 10 + 120);
    let end_loss = p.loss(&params);
    assert!(
        end_loss < 0.2 * loss_at_kill,
        "survivors did not keep training: {loss_at_kill} -> {end_loss}"
    );
    run.finish().await;
}

/// The acceptance run: K = 3 workers, 5% injected loss each
/// way on every link, gradients as differentiated rounds (lossy chunks
/// really are lost and zero-filled), OrMo on the server; the MLP reaches
/// 90% test accuracy on a problem where a linear model stays near 60%.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_train_an_mlp_to_90_percent_over_5_percent_loss() {
    use gradlane_tools::mlp::{Dataset, Mlp};
    let model = Arc::new(Mlp::demo());
    let (train, test) = Dataset::demo(7).unwrap();
    let train = Arc::new(train);
    let w0 = model.init(7);
    let before = model.evaluate(&w0, &test).unwrap();
    let cfg = OrderedMomentumConfig {
        workers: 3,
        momentum: 0.9,
        // lr 0.1 per gradient, averaged over K, with momentum's 1/(1-beta).
        learning_rate: 0.1 * 3.0 * 0.1,
    };
    let run = start("mlp", OrderedMomentum::new(cfg, w0).unwrap());
    let workers: Vec<_> = (0..3u64)
        .map(|i| {
            let (model, train, dir, addr) =
                (model.clone(), train.clone(), run.dir.clone(), run.addr);
            tokio::spawn(async move {
                let config = Config {
                    faults: Some(Faults::symmetric_loss(0.05, 40 + i)),
                    ..quick()
                };
                let ep = Endpoint::client(dir.join("ca.pem"), config).unwrap();
                let mut w =
                    Worker::join(&ep, addr, "localhost", model.layout(), Compression::Rounds)
                        .await
                        .unwrap();
                let mut params = w.pull().await.unwrap();
                let mut rng = SplitMix64::new(i);
                let mut grad = vec![0f32; model.param_count()];
                for _ in 0..300 {
                    let batch: Vec<usize> = (0..32).map(|_| rng.below(train.len())).collect();
                    model
                        .gradient(&params.values, &train, &batch, &mut grad)
                        .unwrap();
                    let reply = w.push_flat(params.index, &grad).await.unwrap();
                    w.recycle(std::mem::replace(&mut params, reply.params).values);
                }
                w.leave().await;
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let (params, steps) = run.handle.snapshot();
    let stats = run.finish().await;
    let after = model.evaluate(&params, &test).unwrap();
    eprintln!(
        "accuracy {:.3} -> {:.3}, {stats:?}",
        before.accuracy, after.accuracy
    );
    assert_eq!(steps, 900);
    // The loss was real: some gradient bytes were zero-filled.
    assert!(stats.zero_filled_bytes > 0, "{stats:?}");
    assert!(after.accuracy >= 0.9, "test accuracy {}", after.accuracy);
}

/// A server for two workers of the problem's dimension whose clients have
/// `hello_timeout` to say hello, and a QUIC connection to it (with its
/// endpoint) that never says hello.
async fn with_a_silent_client(
    tag: &str,
    hello_timeout: Duration,
) -> (Running<OrderedMomentum>, quinn::Endpoint, quinn::Connection) {
    let (p, _) = problem();
    let config = Config {
        hello_timeout,
        ..quick()
    };
    let run = start_with(tag, small_ormo(2, p.dim()), config);
    let cfg = gradlane::quic::client_config(&run.dir.join("ca.pem")).unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    let conn = ep.connect(run.addr, "localhost").unwrap().await.unwrap();
    (run, ep, conn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_says_hello_holds_up_nobody() {
    let (p, layout) = problem();
    // Long enough that a server handshaking one client at a time would
    // still be waiting on the silent one when the real worker is done.
    let (run, _silent_ep, silent) = with_a_silent_client("silent", Duration::from_secs(20)).await;

    let ep = Endpoint::client(run.dir.join("ca.pem"), quick()).unwrap();
    let mut w = Worker::join(&ep, run.addr, "localhost", &layout, Compression::Rounds)
        .await
        .unwrap();
    let params = w.pull().await.unwrap();
    w.push(params.index, &[vec![1.0f32; p.dim()]])
        .await
        .unwrap();
    w.leave().await;
    assert!(
        silent.close_reason().is_none(),
        "the worker only got through after the silent client was closed"
    );
    silent.close(0u32.into(), b"bye");
    let stats = run.finish().await;
    assert_eq!(stats.applied, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_says_hello_is_closed_after_the_timeout() {
    let (run, _silent_ep, silent) =
        with_a_silent_client("silent-timeout", Duration::from_millis(200)).await;
    match silent.closed().await {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code.into_inner(), u64::from(codes::BAD_HELLO))
        }
        other => panic!("expected a bad-hello close, got {other:?}"),
    }
    let stats = run.finish().await;
    assert_eq!(stats.links_refused, 1);
}

/// Pushes `grad` under `params`' ticket, each push polled once and dropped
/// if that poll did not finish it, until one is dropped (at most `tries`);
/// a push that finished hands its reply's parameters on. Returns how many
/// finished.
async fn push_until_one_is_dropped(
    a: &mut Worker,
    params: &mut Params,
    grad: &[f32],
    tries: usize,
) -> u64 {
    let mut applied = 0;
    for _ in 0..tries {
        let push = std::pin::pin!(a.push_flat(params.index, grad));
        match poll_once(push).await {
            std::task::Poll::Pending => return applied,
            std::task::Poll::Ready(reply) => {
                *params = reply.unwrap().params;
                applied += 1;
            }
        }
    }
    panic!("every push finished within one poll");
}

/// Polls `f` once, with the task's own waker: its output if that poll
/// finished it. Dropping `f` afterwards cancels it where it stopped.
async fn poll_once<F: std::future::Future>(
    mut f: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(f.as_mut().poll(cx))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_get_the_welcome_and_learn_why_the_server_gives_up() {
    let (p, layout) = problem();
    let too_long = vec![0u8; gradlane::ps::messages::MAX_WELCOME + 1];
    assert!(matches!(
        ServerHandle::with_welcome(small_ormo(3, p.dim()), too_long),
        Err(ps_net::ServeError::WelcomeTooLarge(_))
    ));
    let handle = ServerHandle::with_welcome(small_ormo(3, p.dim()), b"seed 11".to_vec()).unwrap();
    let run = start_handle("welcome", handle, quick());
    let ep = Endpoint::client(run.dir.join("ca.pem"), quick()).unwrap();
    let (ep_ref, layout_ref, addr) = (&ep, &layout, run.addr);
    let join = |name: String| async move {
        Worker::join_as(
            ep_ref,
            addr,
            "localhost",
            layout_ref,
            Compression::Rounds,
            &name,
        )
        .await
    };
    let mut a = join("a".into()).await.unwrap();
    let mut b = Worker::join(&ep, run.addr, "localhost", &layout, Compression::Rounds)
        .await
        .unwrap();
    assert_eq!(a.welcome(), b"seed 11");
    assert_eq!(b.welcome(), b"seed 11");
    let named = |name: &str, connected| WorkerInfo {
        name: Some(name.into()),
        connected,
    };
    // Both hellos were answered, so both are recorded.
    assert_eq!(
        run.handle.workers(),
        vec![named("a", true), named("", true)]
    );
    // A name too long never leaves the worker.
    let long = "x".repeat(gradlane::ps::messages::MAX_NAME + 1);
    assert!(matches!(join(long).await, Err(WorkerError::NameTooLong(_))));

    let params = a.pull().await.unwrap();
    let why = "round 0 cannot fill: worker c never joined";
    run.handle.close_workers(why);
    for result in [
        a.push(params.index, &[vec![0.0f32; p.dim()]])
            .await
            .map(|_| ()),
        b.pull().await.map(|_| ()),
    ] {
        match result {
            Err(WorkerError::Link(gradlane::LinkError::Rejected { code, reason }))
            | Err(WorkerError::Stream(gradlane::ps_net::StreamError::Link(
                gradlane::LinkError::Rejected { code, reason },
            ))) => {
                assert_eq!(code, u64::from(codes::ABORTED));
                assert_eq!(reason, why);
            }
            other => panic!("expected the server's reason, got {other:?}"),
        }
    }
    let handle = run.handle.clone();
    assert!(
        eventually(Duration::from_secs(15), || handle
            .workers()
            .iter()
            .all(|w| !w.connected))
        .await,
        "{:?}",
        handle.workers()
    );
    run.finish().await;
}
