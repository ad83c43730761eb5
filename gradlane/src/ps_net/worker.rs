//! The worker side: pull parameters, push gradients, over one gradlane link.

use super::stream::{read_into, read_len, write_bytes, StreamError};
use crate::{Endpoint, Link, LinkError, SendReport};
use bytes::Bytes;
use gradlane_core::codec::{self, Selection};
use gradlane_core::layout::Layout;
use gradlane_core::ps::messages::{self, ParamsHeader, ReplyKind, Request, PARAMS_HEADER_LEN};
use gradlane_core::ps::Disposition;
use quinn::{RecvStream, SendStream};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How a worker sends its gradients.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Compression {
    /// As a gradlane round: important chunks reliably, the rest as lossy
    /// datagrams; lost chunks reach the server as zeros.
    #[default]
    Rounds,
    /// As a sparse log-quantized codec frame on the reliable request
    /// stream: only the selected entries, each to within the codec's error
    /// bound, nothing lost.
    Codec {
        /// Which entries to keep.
        selection: Selection,
        /// Logarithm base (see [`codec::DEFAULT_BASE`]).
        base: f64,
    },
}

/// Parameters from the server with the ticket that goes with them.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// The index to push back with the gradient computed on `values`.
    pub index: u64,
    /// The server's step count when the parameters were copied.
    pub steps: u64,
    /// The parameters, flat, in layout order.
    pub values: Vec<f32>,
}

/// The server's answer to a push.
#[derive(Debug, Clone, PartialEq)]
pub struct PushReply {
    /// What the server did with the gradient.
    pub disposition: Disposition,
    /// Fresh parameters and the next ticket.
    pub params: Params,
    /// What the link did, when the gradient went as a round.
    pub send: Option<SendReport>,
    /// Gradient payload bytes sent: the round's reliable and lossy payload,
    /// or the codec frame.
    pub gradient_bytes: u64,
}

/// Why a worker operation failed.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// The link could not be made or broke.
    #[error("link: {0}")]
    Link(#[from] LinkError),
    /// The request stream failed or carried a malformed reply.
    #[error("request stream: {0}")]
    Stream(#[from] StreamError),
    /// The server refused the request; the worker's ticket is unchanged.
    #[error("server refused: {0}")]
    Refused(String),
    /// The gradients do not match the layout.
    #[error("gradient tensor {tensor} has {got} values, layout says {expected}")]
    GradientShape {
        /// Tensor position.
        tensor: usize,
        /// Values the layout gives it.
        expected: usize,
        /// Values passed.
        got: usize,
    },
    /// A flat gradient of the wrong length.
    #[error("flat gradient has {got} values, the model {expected}")]
    FlatLength {
        /// Values in the layout.
        expected: usize,
        /// Values passed.
        got: usize,
    },
    /// Not one gradient tensor per layout tensor.
    #[error("{got} gradient tensors for a layout of {expected}")]
    TensorCount {
        /// Tensors in the layout.
        expected: usize,
        /// Tensors passed.
        got: usize,
    },
    /// Compressing the gradient failed (non-finite values, bad base).
    #[error("codec: {0}")]
    Codec(#[from] codec::EncodeError),
    /// The server answered a push with a pull's reply or the other way round.
    #[error("unexpected reply: {0}")]
    UnexpectedReply(&'static str),
    /// The worker's name is longer than [`messages::MAX_NAME`] bytes.
    #[error("worker name of {0} bytes, at most {max} allowed", max = messages::MAX_NAME)]
    NameTooLong(usize),
}

/// A reply as the reader task hands it over: parameters (with the
/// disposition of a push), or why there are none.
type Reply = Result<(Option<Disposition>, Params), WorkerError>;

/// A worker's session with a parameter server.
///
/// Every call is cancel-safe: a `push` or `pull` dropped part way (a
/// timeout around it, a `select!`) leaves the session usable. A request is
/// handed to the stream whole or not at all (a writer task owns the send
/// half), replies are parsed whole by a reader task, and a reply owed to a
/// call that went away is skipped by the next call. The server may still
/// have acted on such a request: a push dropped after its request left can
/// be applied, and the parameters and ticket its reply carried are what
/// the next [`pull`](Self::pull) returns (the server refuses a pull from a
/// worker holding a ticket).
pub struct Worker {
    link: Link,
    /// Whole request messages, to the writer task.
    requests: mpsc::UnboundedSender<Bytes>,
    writer: JoinHandle<()>,
    /// Whole replies, from the reader task; it stops after a stream error.
    replies: mpsc::Receiver<Reply>,
    _reader: AbortOnDrop,
    /// Replies due to requests already sent that no call is waiting for
    /// any more: skipped before the next request.
    owed: usize,
    /// Parameters and ticket from the reply to a dropped call, for the
    /// next pull.
    held: Option<Params>,
    dim: usize,
    compression: Compression,
    next_round: u32,
    /// A params buffer handed back by the caller, reused by the next reply.
    spare: Arc<Mutex<Vec<f32>>>,
    /// Flat gradient for the codec.
    flat: Vec<f32>,
    /// The server's answer to the hello.
    welcome: Vec<u8>,
}

/// Stops the reply reader with the session: it holds the receive half,
/// which would keep the connection open.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("link", &self.link)
            .field("params", &self.dim)
            .field("compression", &self.compression)
            .finish()
    }
}

impl Worker {
    /// Connects to the server at `addr` with the model's `layout` (as
    /// [`Endpoint::connect`] does: trying within the endpoint's
    /// [`connect_timeout`](crate::Config::connect_timeout), several
    /// handshakes under heavy loss), opens the request stream and says
    /// hello without a name.
    pub async fn join(
        endpoint: &Endpoint,
        addr: SocketAddr,
        server_name: &str,
        layout: &Layout,
        compression: Compression,
    ) -> Result<Self, WorkerError> {
        Self::join_as(endpoint, addr, server_name, layout, compression, "").await
    }

    /// [`join`](Self::join) under `name`, which the server uses when it
    /// speaks of this worker ([`ServerHandle::workers`](super::ServerHandle::workers)).
    /// Returns once the server's welcome is in ([`welcome`](Self::welcome)).
    pub async fn join_as(
        endpoint: &Endpoint,
        addr: SocketAddr,
        server_name: &str,
        layout: &Layout,
        compression: Compression,
        name: &str,
    ) -> Result<Self, WorkerError> {
        if name.len() > messages::MAX_NAME {
            return Err(WorkerError::NameTooLong(name.len()));
        }
        let link = endpoint.connect(addr, server_name, layout).await?;
        let (mut send, mut recv) = link
            .connection()
            .open_bi()
            .await
            .map_err(LinkError::from_conn)?;
        // The hello goes before the reader and writer tasks start: nothing
        // else is in flight, so its reply is the first on the stream.
        let hello = Request::Hello {
            name: name.to_owned(),
        };
        write_bytes(&mut send, Bytes::from(hello.encode())).await?;
        let welcome = read_welcome(&mut recv, &link).await?;
        let dim = layout.total_values() as usize;
        let spare = Arc::new(Mutex::new(Vec::new()));
        let (requests, queue) = mpsc::unbounded_channel();
        // One reply in hand and one being read: the server answers only
        // what was asked, so this bounds nothing that could pile up.
        let (reply_tx, replies) = mpsc::channel(1);
        Ok(Self {
            link,
            requests,
            writer: tokio::spawn(write_requests(send, queue)),
            replies,
            _reader: AbortOnDrop(tokio::spawn(read_replies(
                recv,
                dim,
                spare.clone(),
                reply_tx,
            ))),
            owed: 0,
            held: None,
            dim,
            compression,
            next_round: 0,
            spare,
            flat: Vec::new(),
            welcome,
        })
    }

    /// What the server said in answer to the hello (empty if it had nothing
    /// to say): whatever its application hands every worker.
    pub fn welcome(&self) -> &[u8] {
        &self.welcome
    }

    /// The link under this session (statistics, layout).
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Asks for parameters and a ticket. A synchronous server answers once
    /// its current round has room.
    pub async fn pull(&mut self) -> Result<Params, WorkerError> {
        self.skip_owed().await?;
        if let Some(params) = self.held.take() {
            return Ok(params);
        }
        self.request(Request::Pull.encode())?;
        match self.reply().await? {
            (None, params) => Ok(params),
            (Some(_), _) => Err(WorkerError::UnexpectedReply("push reply to a pull")),
        }
    }

    /// Pushes the gradient computed for ticket `index` (`grads` in layout
    /// order) and returns the server's verdict with fresh parameters.
    pub async fn push<G: AsRef<[f32]>>(
        &mut self,
        index: u64,
        grads: &[G],
    ) -> Result<PushReply, WorkerError> {
        self.check_shape(grads)?;
        self.skip_owed().await?;
        // A push with no pull for the held parameters: the caller kept
        // its own ticket, and the held one is moot.
        if let Some(held) = self.held.take() {
            self.recycle(held.values);
        }
        let (send, gradient_bytes) = match self.compression {
            Compression::Rounds => {
                // The round goes first and the request naming it after: a
                // round the encoder refuses (a NaN, say) is refused before
                // any byte leaves, and then no request announces it, so the
                // server is never left waiting for a round that never comes.
                let round = self.next_round;
                // Once this round may have left, its index is spent: the
                // link refuses it again (`LinkError::RoundOrder`), and the
                // server drops a round no request names. Only a round the
                // encoder refused sent nothing and keeps its index. Set
                // before sending, so a cancelled push spends it too.
                self.next_round = round.wrapping_add(1);
                let report = match self.link.sender().send_round(round, grads).await {
                    Err(LinkError::Encode(e)) => {
                        self.next_round = round;
                        return Err(LinkError::Encode(e).into());
                    }
                    sent => sent?,
                };
                self.request(Request::PushRound { index, round }.encode())?;
                let bytes = report.important_bytes + report.lossy_bytes.iter().sum::<u64>();
                (Some(report), bytes)
            }
            Compression::Codec { selection, base } => {
                self.flat.clear();
                for g in grads {
                    self.flat.extend_from_slice(g.as_ref());
                }
                let frame = codec::encode_dense(&self.flat, selection, base)?;
                let bytes = frame.len() as u64;
                self.request(Request::PushCodec { index, frame }.encode())?;
                (None, bytes)
            }
        };
        match self.reply().await? {
            (Some(disposition), params) => Ok(PushReply {
                disposition,
                params,
                send,
                gradient_bytes,
            }),
            (None, _) => Err(WorkerError::UnexpectedReply("pull reply to a push")),
        }
    }

    /// [`push`](Self::push) with the gradient flat, in layout order (the
    /// shape [`Params::values`] has).
    pub async fn push_flat(&mut self, index: u64, grad: &[f32]) -> Result<PushReply, WorkerError> {
        if grad.len() != self.dim {
            return Err(WorkerError::FlatLength {
                expected: self.dim,
                got: grad.len(),
            });
        }
        let layout = self.link.layout();
        let mut tensors = Vec::with_capacity(layout.len());
        let mut at = 0;
        for t in 0..layout.len() {
            let n = layout.tensor_len(t);
            tensors.push(&grad[at..at + n]);
            at += n;
        }
        self.push(index, &tensors).await
    }

    /// Hands a [`Params::values`] buffer back so the next reply reuses it
    /// (saves mapping fresh memory for every reply of a large model).
    pub fn recycle(&mut self, values: Vec<f32>) {
        *lock(&self.spare) = values;
    }

    /// Ends the session in an orderly way: the server gives the ticket back.
    pub async fn leave(self) {
        let Self {
            link,
            requests,
            writer,
            ..
        } = self;
        // The writer finishes the stream once it has written what is
        // queued, and waits (a bounded time) for the server to see the end.
        drop(requests);
        let _ = writer.await;
        if let Err(e) = link.close().await {
            tracing::debug!(%e, "leaving");
        }
    }

    /// Hands a whole request to the writer; its reply is owed from now on.
    fn request(&mut self, message: Vec<u8>) -> Result<(), WorkerError> {
        self.requests
            .send(Bytes::from(message))
            .map_err(|_| self.ended())?;
        self.owed += 1;
        Ok(())
    }

    /// The next reply, in the order of the requests.
    async fn reply(&mut self) -> Result<(Option<Disposition>, Params), WorkerError> {
        let reply = self.replies.recv().await.ok_or_else(|| self.ended())?;
        self.owed -= 1;
        reply
    }

    /// Reads the replies owed to calls that were dropped before theirs
    /// came, keeping the latest parameters for the next pull (a refusal
    /// among them is no error of this call: the ticket stays as it was).
    async fn skip_owed(&mut self) -> Result<(), WorkerError> {
        while self.owed > 0 {
            match self.reply().await {
                Ok((_, params)) => {
                    if let Some(old) = self.held.replace(params) {
                        self.recycle(old.values);
                    }
                }
                Err(WorkerError::Refused(_)) => {}
                Err(e) => return Err(e),
            }
            tracing::debug!("took the reply to a dropped request");
        }
        Ok(())
    }

    /// Why the request stream can carry nothing more: the connection's end,
    /// or the stream's (after an error reported to an earlier call).
    fn ended(&self) -> WorkerError {
        match self.link.connection().close_reason() {
            Some(e) => WorkerError::Link(LinkError::from_conn(e)),
            None => WorkerError::Stream(StreamError::Truncated),
        }
    }

    fn check_shape<G: AsRef<[f32]>>(&self, grads: &[G]) -> Result<(), WorkerError> {
        let layout = self.link.layout();
        if grads.len() != layout.len() {
            return Err(WorkerError::TensorCount {
                expected: layout.len(),
                got: grads.len(),
            });
        }
        for (t, g) in grads.iter().enumerate() {
            let expected = layout.tensor_len(t);
            if g.as_ref().len() != expected {
                return Err(WorkerError::GradientShape {
                    tensor: t,
                    expected,
                    got: g.as_ref().len(),
                });
            }
        }
        Ok(())
    }
}

/// The writer task: writes each request whole, in order; once the session
/// drops its end, finishes the stream and waits (at most a second, so a
/// vanished server cannot hold a leaving worker) for the server to see it.
async fn write_requests(mut send: SendStream, mut queue: mpsc::UnboundedReceiver<Bytes>) {
    while let Some(message) = queue.recv().await {
        if write_bytes(&mut send, message).await.is_err() {
            // The reader sees the same failure and reports it.
            return;
        }
    }
    let _ = send.finish();
    let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
}

/// The reader task: parses replies whole and hands them over in order.
/// Stops at the stream's end or at an error, after handing the error over
/// (a refusal is a reply, not an error of the stream).
async fn read_replies(
    mut recv: RecvStream,
    dim: usize,
    spare: Arc<Mutex<Vec<f32>>>,
    replies: mpsc::Sender<Reply>,
) {
    loop {
        let reply = match read_len(&mut recv).await {
            Ok(Some(len)) => read_reply(&mut recv, len, dim, &spare).await,
            Ok(None) => return,
            Err(e) => Err(e.into()),
        };
        let go_on = matches!(reply, Ok(_) | Err(WorkerError::Refused(_)));
        if replies.send(reply).await.is_err() || !go_on {
            return;
        }
    }
}

/// Reads the welcome that answers the hello (or the refusal that takes its
/// place).
async fn read_welcome(recv: &mut RecvStream, link: &Link) -> Result<Vec<u8>, WorkerError> {
    let len = match read_len(recv).await? {
        Some(len) => len,
        // The server finished the stream without a word: it is closing
        // the connection, and the close says why.
        None => {
            return Err(match link.connection().close_reason() {
                Some(e) => WorkerError::Link(LinkError::from_conn(e)),
                None => WorkerError::Stream(StreamError::Truncated),
            })
        }
    };
    if len == 0 {
        return Err(StreamError::Message(messages::MessageError::Empty).into());
    }
    let mut tag = [0u8; 1];
    read_into(recv, &mut tag).await?;
    let kind = messages::reply_kind(tag[0]).map_err(StreamError::from)?;
    if kind == ReplyKind::Params {
        return Err(WorkerError::UnexpectedReply(
            "params in answer to the hello",
        ));
    }
    messages::check_reply_len(kind, len, 0).map_err(StreamError::from)?;
    let mut body = vec![0u8; len];
    body[0] = tag[0];
    read_into(recv, &mut body[1..]).await?;
    match kind {
        ReplyKind::Refused => Err(WorkerError::Refused(
            messages::decode_refused(&body).map_err(StreamError::from)?,
        )),
        _ => Ok(messages::decode_welcome(&body).map_err(StreamError::from)?),
    }
}

/// Reads one reply of `len` bytes (its length prefix read): parameters
/// (with the disposition of a push), or a refusal as an error.
async fn read_reply(
    recv: &mut RecvStream,
    len: usize,
    dim: usize,
    spare: &Mutex<Vec<f32>>,
) -> Reply {
    let mut tag = [0u8; 1];
    if len == 0 {
        return Err(StreamError::Message(messages::MessageError::Empty).into());
    }
    read_into(recv, &mut tag).await?;
    let kind = messages::reply_kind(tag[0]).map_err(StreamError::from)?;
    messages::check_reply_len(kind, len, dim).map_err(StreamError::from)?;
    match kind {
        ReplyKind::Welcome => Err(WorkerError::UnexpectedReply(
            "a welcome where no hello was sent",
        )),
        ReplyKind::Refused => {
            let mut body = vec![0u8; len];
            body[0] = tag[0];
            read_into(recv, &mut body[1..]).await?;
            let why = messages::decode_refused(&body).map_err(StreamError::from)?;
            Err(WorkerError::Refused(why))
        }
        ReplyKind::Params => {
            let mut head = [0u8; PARAMS_HEADER_LEN];
            head[0] = tag[0];
            read_into(recv, &mut head[1..]).await?;
            let header = ParamsHeader::decode(&head).map_err(StreamError::from)?;
            let mut values = std::mem::take(&mut *lock(spare));
            values.resize(dim, 0.0);
            // Straight into the f32 buffer: one copy from quinn's.
            read_into(recv, bytemuck::cast_slice_mut(&mut values)).await?;
            if cfg!(target_endian = "big") {
                for v in &mut values {
                    *v = f32::from_bits(u32::from_le(v.to_bits()));
                }
            }
            Ok((
                header.disposition,
                Params {
                    index: header.index,
                    steps: header.steps,
                    values,
                },
            ))
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere leaves at worst a spare buffer of any length.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
