//! The server runtime: accepts worker links and serves pulls and pushes
//! from one [`ParameterServer`] shared by all of them.
//!
//! One task per worker, in the style of mini-redis: `run` accepts links until
//! `shutdown` resolves; each link's task reads requests from the worker's
//! request stream, takes the gradient (a gradlane round on the link, or a
//! codec frame in the request), pushes it into the shared server under a
//! lock, and writes the fresh parameters back. A worker whose connection
//! drops gives its ticket back ([`ParameterServer::leave`]) and the others
//! go on.

use crate::{BufferPool, Endpoint, IncomingError, Link};
use gradlane_core::control::codes;
use gradlane_core::ps::messages;
use gradlane_core::ps::ParameterServer;
use quinn::VarInt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use thiserror::Error;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tracing::Instrument;

mod session;

use session::session;

/// Counters of a serving run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServeStats {
    /// Workers that took part: links that pulled parameters or pushed a
    /// gradient at least once. A link that only said hello (a worker that
    /// then refused the server's welcome) is not one.
    pub workers_joined: u64,
    /// Of those, the ones that went away (cleanly or not).
    pub workers_left: u64,
    /// Links refused (wrong model size, failed handshake).
    pub links_refused: u64,
    /// Parameter copies handed out (pulls and push replies).
    pub params_sent: u64,
    /// Gradients that changed the parameters.
    pub applied: u64,
    /// Gradients the server judged too stale and discarded.
    pub dropped: u64,
    /// Gradients stored for a later step (synchronous rounds).
    pub buffered: u64,
    /// Requests refused (unknown index, bad gradient, no slot).
    pub refused: u64,
    /// Sum of the staleness of applied gradients.
    pub applied_staleness_sum: u64,
    /// Gradients that came as gradlane rounds.
    pub round_pushes: u64,
    /// Gradients that came as codec frames.
    pub codec_pushes: u64,
    /// Gradient bytes that were lost on the way and zero-filled.
    pub zero_filled_bytes: u64,
    /// Gradient bytes of earlier rounds added into later ones.
    pub late_merged_bytes: u64,
    /// Rounds that arrived without a request naming them (their push
    /// failed or was cancelled after the first byte left), dropped.
    pub orphan_rounds: u64,
}

impl ServeStats {
    /// Mean staleness of applied gradients (0 when none).
    pub fn mean_applied_staleness(&self) -> f64 {
        if self.applied == 0 {
            0.0
        } else {
            self.applied_staleness_sum as f64 / self.applied as f64
        }
    }
}

/// Why serving stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The endpoint stopped accepting before shutdown was asked for.
    #[error("endpoint closed")]
    EndpointClosed,
    /// A welcome longer than a worker accepts
    /// ([`messages::MAX_WELCOME`] bytes).
    #[error("a welcome of {0} bytes, at most {max} allowed", max = messages::MAX_WELCOME)]
    WelcomeTooLarge(usize),
}

/// A worker as the server knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The name from its hello (`None` until the hello came).
    pub name: Option<String>,
    /// Its link is still being served.
    pub connected: bool,
}

/// One accepted link: the worker's name once it said hello, and its
/// connection while the session lasts (to close it from outside).
struct Seat {
    name: Option<String>,
    conn: Option<quinn::Connection>,
}

struct Shared<S> {
    server: Mutex<S>,
    stats: Mutex<ServeStats>,
    /// What every worker gets in answer to its hello.
    welcome: Vec<u8>,
    /// Every link accepted in this run, in order.
    seats: Mutex<Vec<Seat>>,
    /// Woken whenever the server's state moves (a push, a worker leaving):
    /// sessions waiting for a synchronous round to complete try again.
    changed: Notify,
    /// Buffers of params replies, reused.
    pool: Arc<BufferPool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking session must not take every other worker down with it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A parameter server shared between the serving runtime and its owner, who
/// can watch it while it runs (evaluate the parameters, read counters).
pub struct ServerHandle<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for ServerHandle<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<S: ParameterServer> ServerHandle<S> {
    /// Wraps a server; workers get an empty welcome.
    pub fn new(server: S) -> Self {
        Self::wrap(server, Vec::new())
    }

    /// Wraps a server; every worker gets `welcome` in answer to its hello
    /// ([`Worker::welcome`](super::Worker::welcome)). This is where the
    /// application tells workers what they must agree on with the server,
    /// such as the dataset seed. More than [`messages::MAX_WELCOME`] bytes
    /// is [`ServeError::WelcomeTooLarge`]: a worker would refuse it.
    pub fn with_welcome(server: S, welcome: Vec<u8>) -> Result<Self, ServeError> {
        if welcome.len() > messages::MAX_WELCOME {
            return Err(ServeError::WelcomeTooLarge(welcome.len()));
        }
        Ok(Self::wrap(server, welcome))
    }

    fn wrap(server: S, welcome: Vec<u8>) -> Self {
        Self {
            shared: Arc::new(Shared {
                server: Mutex::new(server),
                stats: Mutex::new(ServeStats::default()),
                welcome,
                seats: Mutex::new(Vec::new()),
                changed: Notify::new(),
                pool: BufferPool::new(REPLY_POOL_BYTES),
            }),
        }
    }

    /// Every worker link accepted so far, in order of arrival, with the
    /// name its hello gave.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        lock(&self.shared.seats)
            .iter()
            .map(|s| WorkerInfo {
                name: s.name.clone(),
                connected: s.conn.is_some(),
            })
            .collect()
    }

    /// Closes every connected worker's link with [`codes::ABORTED`] and
    /// `reason` (workers see it as
    /// [`LinkError::Rejected`](crate::LinkError::Rejected)). For a server
    /// that gives up, e.g. on a synchronous round that cannot fill: the
    /// workers learn why instead of waiting. Serving goes on until the
    /// shutdown future given to [`run`] resolves.
    pub fn close_workers(&self, reason: &str) {
        for seat in lock(&self.shared.seats).iter() {
            if let Some(conn) = &seat.conn {
                conn.close(VarInt::from_u32(codes::ABORTED), reason.as_bytes());
            }
        }
    }

    /// Runs `f` on the server (briefly: sessions wait for the lock).
    pub fn with<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        f(&lock(&self.shared.server))
    }

    /// A copy of the current parameters and the step count.
    pub fn snapshot(&self) -> (Vec<f32>, u64) {
        let s = lock(&self.shared.server);
        (s.params().to_vec(), s.steps())
    }

    /// The counters so far.
    pub fn stats(&self) -> ServeStats {
        *lock(&self.shared.stats)
    }
}

/// Serves workers on `endpoint` until `shutdown` resolves, then closes every
/// link and returns the counters.
///
/// Every link must carry a layout with as many values as the server has
/// parameters; others are closed with [`codes::LAYOUT_MISMATCH`]. A failed
/// handshake or a worker that breaks the protocol ends that link only.
/// Before it returns it waits, at most [`CLOSE_FLUSH`], until the
/// connections' close frames are out.
pub async fn run<S>(
    endpoint: &Endpoint,
    handle: ServerHandle<S>,
    shutdown: impl Future,
) -> Result<ServeStats, ServeError>
where
    S: ParameterServer + Send + 'static,
{
    let dim = handle.with(|s| s.params().len());
    let mut sessions = JoinSet::new();
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            // Reap finished sessions as we go so the set does not grow.
            Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
            // Each client's handshakes run in its own task: a client that
            // stalls after the QUIC handshake holds up nobody else (and is
            // closed after the endpoint's hello timeout).
            incoming = endpoint.incoming() => match incoming {
                None => break Err(ServeError::EndpointClosed),
                Some(incoming) => {
                    let shared = handle.shared.clone();
                    sessions.spawn(async move {
                        if let Some((link, seat)) = admit(incoming.finish().await, &shared, dim) {
                            let span = tracing::info_span!(
                                "ps_session",
                                remote = %link.connection().remote_address()
                            );
                            session(link, shared, dim, seat).instrument(span).await;
                        }
                    });
                }
            },
        }
    };
    endpoint.close();
    while sessions.join_next().await.is_some() {}
    // quinn's driver sends the close frames (the reason of
    // `close_workers` among them) after this: a process that exits right
    // after `run` could cut them off, and its workers would time out
    // instead of reading why. Bounded, because a connection to a peer that
    // is gone drains for three probe timeouts.
    let _ = tokio::time::timeout(CLOSE_FLUSH, endpoint.wait_idle()).await;
    result.map(|()| handle.stats())
}

/// The longest [`run`] waits for its connections' close frames to leave.
pub const CLOSE_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes a new link into service and gives it a seat, or refuses it
/// (failed handshake, wrong model size).
fn admit<S: ParameterServer>(
    finished: Result<Link, IncomingError>,
    shared: &Shared<S>,
    dim: usize,
) -> Option<(Link, usize)> {
    let link = match finished {
        Ok(link) => link,
        Err(e) => {
            tracing::info!(%e, "worker link failed");
            lock(&shared.stats).links_refused += 1;
            return None;
        }
    };
    let values = link.layout().total_values();
    if values != dim as u64 {
        let why = format!("model has {dim} parameters, link layout {values}");
        tracing::warn!(%why, "refusing worker");
        link.connection()
            .close(VarInt::from_u32(codes::LAYOUT_MISMATCH), why.as_bytes());
        lock(&shared.stats).links_refused += 1;
        return None;
    }
    let mut seats = lock(&shared.seats);
    seats.push(Seat {
        name: None,
        conn: Some(link.connection().clone()),
    });
    let seat = seats.len() - 1;
    drop(seats);
    Some((link, seat))
}

/// Free reply buffers kept for reuse: a few replies of a large model.
const REPLY_POOL_BYTES: usize = 1 << 30;
