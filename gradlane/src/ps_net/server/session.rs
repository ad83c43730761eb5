//! One worker's session: its requests read, its pulls and pushes served
//! from the shared server, its ticket given back however it ends.

use super::{lock, Shared};
use crate::ps_net::stream::{read_body, write_bytes, StreamError};
use crate::{blocking, BufferPool, Link, LinkError};
use bytes::Bytes;
use gradlane_core::codec;
use gradlane_core::control::codes;
use gradlane_core::ps::messages::{self, Request};
use gradlane_core::ps::{Disposition, ParameterServer, PullError, PushError};
use quinn::{SendStream, VarInt};
use std::sync::Arc;
use thiserror::Error;

/// Why one worker's session ended.
#[derive(Debug, Error)]
enum SessionError {
    #[error("link: {0}")]
    Link(#[from] LinkError),
    #[error("request stream: {0}")]
    Stream(#[from] StreamError),
    #[error("request: {0}")]
    Message(#[from] messages::MessageError),
    #[error("round {got} arrived where round {expected} was announced")]
    RoundMismatch { expected: u32, got: u32 },
}

/// One worker's session; gives its ticket back however it ends.
pub(super) async fn session<S: ParameterServer>(
    mut link: Link,
    shared: Arc<Shared<S>>,
    dim: usize,
    seat: usize,
) {
    let mut held = None;
    let mut joined = false;
    let why = serve_worker(&mut link, &shared, dim, seat, &mut held, &mut joined).await;
    match &why {
        Ok(()) => tracing::info!("worker finished"),
        Err(e) => tracing::info!(%e, "worker gone"),
    }
    // A worker that broke the protocol learns why; one whose connection
    // is already gone needs no close.
    let broken = match &why {
        Err(SessionError::Stream(StreamError::Message(e)) | SessionError::Message(e)) => {
            Some(e.to_string())
        }
        Err(SessionError::Stream(StreamError::Truncated)) => Some("request truncated".into()),
        Err(e @ SessionError::RoundMismatch { .. }) => Some(e.to_string()),
        _ => None,
    };
    if let Some(why) = broken {
        link.connection()
            .close(VarInt::from_u32(codes::PROTOCOL), why.as_bytes());
    }
    if let Err(e) = lock(&shared.server).leave(held) {
        tracing::warn!(%e, "could not release the worker's ticket");
    }
    if let Some(s) = lock(&shared.seats).get_mut(seat) {
        s.conn = None;
    }
    if joined {
        lock(&shared.stats).workers_left += 1;
    }
    shared.changed.notify_waiters();
}

async fn serve_worker<S: ParameterServer>(
    link: &mut Link,
    shared: &Shared<S>,
    dim: usize,
    seat: usize,
    held: &mut Option<u64>,
    joined: &mut bool,
) -> Result<(), SessionError> {
    let conn = link.connection().clone();
    let (mut send, mut recv) = conn.accept_bi().await.map_err(LinkError::from_conn)?;
    let cap = messages::request_cap(dim);
    let mut grad = vec![0f32; dim];
    loop {
        let Some(body) = read_body(&mut recv, cap).await? else {
            return Ok(());
        };
        let request = Request::decode(&body)?;
        // A worker joins with its first pull or push, not its hello: one
        // that refuses the welcome (another K, another seed) never trained,
        // and must not count towards the workers a run waits for.
        if !*joined && !matches!(request, Request::Hello { .. }) {
            *joined = true;
            lock(&shared.stats).workers_joined += 1;
        }
        let (index, source) = match request {
            Request::Hello { name } => {
                tracing::info!(%name, "worker said hello");
                if let Some(s) = lock(&shared.seats).get_mut(seat) {
                    s.name = Some(name);
                }
                let welcome = messages::encode_welcome(&shared.welcome);
                write_bytes(&mut send, Bytes::from(welcome)).await?;
                continue;
            }
            Request::Pull => {
                if held.is_some() {
                    refuse(&mut send, shared, "pull while holding a ticket").await?;
                    continue;
                }
                wait_and_pull(&mut send, &conn, shared, held, None).await?;
                continue;
            }
            Request::PushRound { index, round } => {
                // The round is on its way whatever we think of the index:
                // take it off the link first so the link stays in step.
                // Rounds before it that no request named were sent by
                // pushes that failed or were cancelled after their first
                // byte left: counted and dropped.
                let delivered = loop {
                    let d = link.receiver().recv_round().await?;
                    if d.index >= round {
                        break d;
                    }
                    tracing::debug!(orphan = d.index, round, "dropped a round no request named");
                    lock(&shared.stats).orphan_rounds += 1;
                    link.receiver().recycle(d.tensors);
                };
                if delivered.index != round {
                    return Err(SessionError::RoundMismatch {
                        expected: round,
                        got: delivered.index,
                    });
                }
                blocking(|| {
                    let mut at = 0;
                    for t in &delivered.tensors {
                        grad[at..at + t.len()].copy_from_slice(t);
                        at += t.len();
                    }
                });
                let lossy = delivered.stats.lossy();
                {
                    let mut st = lock(&shared.stats);
                    st.round_pushes += 1;
                    st.zero_filled_bytes += lossy.zero_filled_bytes;
                    st.late_merged_bytes += lossy.late_merged_bytes;
                }
                link.receiver().recycle(delivered.tensors);
                (index, "round")
            }
            Request::PushCodec { index, frame } => {
                let decoded = blocking(|| {
                    grad.fill(0.0);
                    codec::decode_into_dense(&frame, &mut grad)
                });
                if let Err(e) = decoded {
                    refuse(&mut send, shared, &format!("codec frame: {e}")).await?;
                    continue;
                }
                lock(&shared.stats).codec_pushes += 1;
                (index, "codec")
            }
        };
        tracing::trace!(index, source, "push");
        push(&mut send, &conn, shared, held, &grad, index).await?;
    }
}

/// Pushes one gradient and answers with fresh parameters (at once, or once
/// the synchronous round it was buffered in completes).
async fn push<S: ParameterServer>(
    send: &mut SendStream,
    conn: &quinn::Connection,
    shared: &Shared<S>,
    held: &mut Option<u64>,
    grad: &[f32],
    index: u64,
) -> Result<(), SessionError> {
    let reply = blocking(|| {
        let mut server = lock(&shared.server);
        match server.push(grad, index) {
            Err(e) => Err(e),
            Ok(outcome) => {
                *held = None;
                let mut st = lock(&shared.stats);
                match outcome.disposition {
                    Disposition::Applied { staleness } => {
                        st.applied += 1;
                        st.applied_staleness_sum += staleness;
                    }
                    Disposition::Dropped { .. } => st.dropped += 1,
                    Disposition::Buffered => st.buffered += 1,
                }
                drop(st);
                let disposition = outcome.disposition;
                // A reply ticket carries the server's current parameters, so
                // they can be read again once the borrow ends.
                let next = outcome.reply.map(|t| t.index);
                let framed = next.map(|index| {
                    *held = Some(index);
                    params_message(
                        &shared.pool,
                        index,
                        server.steps(),
                        Some(disposition),
                        server.params(),
                    )
                });
                Ok((disposition, framed, server.steps()))
            }
        }
    });
    shared.changed.notify_waiters();
    match reply {
        Err(e) => refuse(send, shared, &push_refusal(&e)).await,
        Ok((_, Some(framed), _)) => {
            lock(&shared.stats).params_sent += 1;
            Ok(write_bytes(send, framed).await?)
        }
        // A buffered gradient's worker goes on with the round after the one
        // it pushed into; pulling earlier would hand it a second slot of
        // the round it already filled.
        Ok((disposition, None, steps)) => {
            let wait = Some((disposition, steps + 1));
            wait_and_pull(send, conn, shared, held, wait).await
        }
    }
}

fn push_refusal(e: &PushError) -> String {
    format!("push refused: {e}")
}

/// Pulls, waiting while the server says "not now" (a full synchronous
/// round), and writes the parameters. After a buffered push, `after` holds
/// its disposition and the step count to wait for before pulling.
async fn wait_and_pull<S: ParameterServer>(
    send: &mut SendStream,
    conn: &quinn::Connection,
    shared: &Shared<S>,
    held: &mut Option<u64>,
    after: Option<(Disposition, u64)>,
) -> Result<(), SessionError> {
    let (disposition, min_steps) = match after {
        Some((d, s)) => (Some(d), s),
        None => (None, 0),
    };
    loop {
        let changed = shared.changed.notified();
        tokio::pin!(changed);
        // Register before looking, so a push between the look and the wait
        // still wakes us.
        changed.as_mut().enable();
        let pulled = blocking(|| {
            let mut server = lock(&shared.server);
            let steps = server.steps();
            let pulled = if steps < min_steps {
                Ok(None)
            } else {
                server.pull()
            };
            match pulled {
                Ok(Some(t)) => {
                    *held = Some(t.index);
                    Ok(Some(params_message(
                        &shared.pool,
                        t.index,
                        steps,
                        disposition,
                        t.params,
                    )))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            }
        });
        match pulled {
            Ok(Some(framed)) => {
                lock(&shared.stats).params_sent += 1;
                return Ok(write_bytes(send, framed).await?);
            }
            Err(PullError::TicketsExhausted { workers }) => {
                let why = format!("pull refused: all {workers} worker slots are taken");
                return refuse(send, shared, &why).await;
            }
            Ok(None) => {}
        }
        tokio::select! {
            _ = changed => {}
            e = conn.closed() => return Err(LinkError::from_conn(e).into()),
        }
    }
}

async fn refuse<S>(
    send: &mut SendStream,
    shared: &Shared<S>,
    why: &str,
) -> Result<(), SessionError> {
    tracing::debug!(why, "refused");
    lock(&shared.stats).refused += 1;
    let mut why = why.to_owned();
    why.truncate(messages::MAX_REASON);
    Ok(write_bytes(send, Bytes::from(messages::encode_refused(&why))).await?)
}

/// Header and values of a params reply in one buffer (one copy of the
/// parameters, made while the server is locked). The buffer comes from
/// `pool` and goes back there once quinn has sent it: a fresh buffer the
/// size of the model would cost a page fault per 4 KiB on every reply.
fn params_message(
    pool: &Arc<BufferPool>,
    index: u64,
    steps: u64,
    disposition: Option<Disposition>,
    params: &[f32],
) -> Bytes {
    let header = messages::ParamsHeader {
        index,
        steps,
        disposition,
    };
    let head = header.encode(params.len());
    let mut out = pool.take(head.len() + params.len() * 4);
    out.extend_from_slice(&head);
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(params));
    } else {
        for v in params {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    pool.freeze(out)
}
