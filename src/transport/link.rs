//! A bidirectional gradient link over one QUIC connection.
//!
//! Sending a round: the core encoder scores and classes it, then frames the
//! important segments piece by piece while a writer task hands each piece
//! to a fresh unidirectional stream at the highest priority, closed by the
//! round end. The lossy datagrams, level 1 first, are released once the
//! peer confirmed the important data (or, as an option, once quinn has sent
//! it; see [`LossyRelease`]): quinn puts datagrams ahead of stream data in
//! every packet, so releasing them earlier would slow the important bytes. Because datagrams are queued with
//! `send_datagram_wait`, quinn never drops the oldest queued ones on its
//! own: what is not sent by the optional deadline is dropped here, lowest
//! level first, and counted.
//!
//! Receiving: a reliable engine (one task per round stream) and an
//! unreliable engine (one task reading datagrams) both feed the core
//! [`Reassembler`]. When a round end arrives the round is complete;
//! `recv_round` then waits, at most a grace period after the last datagram
//! of that round, for the datagrams still in flight, and delivers. Anything
//! later is merged into the next round by the core.

use super::handshake::{codes, framed, Control, HandshakeError, MAX_MESSAGE};
use crate::encode::{EncodeError, EncodedRound, Encoder, EncoderConfig, RoundFramer};
use crate::layout::Layout;
use crate::reassembly::{
    Channel, Reassembler, ReassemblyConfig, ReassemblyError, Round, StreamDecoder,
};
use crate::wire::{self, DATA_HEADER_LEN};
use bytes::Bytes;
use quinn::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tracing::Instrument;

/// When a round's lossy datagrams may start.
///
/// Measured with round_bench (ResNet-50, loopback, 2 shared cores): with
/// [`LossyRelease::Sent`] the important data is complete 11-19% later (the
/// receiver's CPU is shared with the datagrams), while rounds are no
/// shorter at 0-1% loss and 3-21% shorter at 5% (the path is CPU-bound;
/// the round trip saved is a few milliseconds). Important data first is
/// the point, hence the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossyRelease {
    /// Once every important byte is in quinn's hands and quinn has sent at
    /// least as many bytes (less those lost) as the important stream holds.
    /// The path does not idle while the peer's confirmation travels back;
    /// the datagrams may overtake only the stream's unsent tail, which its
    /// flow-control window bounds (measured on loopback: about 200 kB of an
    /// 82 MB stream). The peer's confirmation, if it comes first, also
    /// releases them.
    Sent,
    /// Once the peer confirmed every important chunk: the path idles for
    /// about a round trip, but no datagram competes with important data, on
    /// the path or for the receiver's CPU.
    #[default]
    Acknowledged,
}

/// Timing and dropping policy of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundTiming {
    /// When the lossy datagrams start.
    pub release: LossyRelease,
    /// After a round's important data is in, how long to wait after the last
    /// datagram of the round before delivering without the rest (plus two
    /// round-trip times, for datagrams released on the peer's confirmation
    /// and still in flight). Once the sender reports every datagram of the
    /// round sent (`Control::LossySent`), the wait shrinks to a few
    /// milliseconds: under loss a round no longer waits out the grace period
    /// for datagrams that were lost. The default, 30 ms, is above quinn's 25 ms
    /// maximum ACK delay: a sender whose congestion window is full of
    /// datagrams can stall that long waiting for an ACK, and a shorter grace
    /// then turns a lossless round's datagrams into late ones (measured on
    /// loopback: with 5 ms, 94% of the first round's datagrams came late).
    /// Until the round's first lossy byte or the sender's report arrives,
    /// there is no last datagram to count from: the wait is then bounded
    /// by `max_grace` alone (the sender starts the datagrams only once it
    /// has this end's confirmation, which loss can delay by a probe
    /// timeout).
    pub grace: Duration,
    /// Upper bound on that wait, whatever arrives.
    pub max_grace: Duration,
    /// Drop lossy datagrams not yet queued this long after `send_round`
    /// started (lowest levels are sent last, so they are dropped first).
    pub lossy_deadline: Option<Duration>,
}

impl Default for RoundTiming {
    fn default() -> Self {
        Self {
            release: LossyRelease::default(),
            grace: Duration::from_millis(30),
            max_grace: Duration::from_secs(2),
            lossy_deadline: None,
        }
    }
}

/// Why a link operation failed.
#[derive(Debug, Error)]
pub enum LinkError {
    /// The connection is gone (closed by either side, timed out, reset).
    #[error("connection: {0}")]
    Connection(#[from] ConnectionError),
    /// The peer closed the connection with a gradlane error code.
    #[error("peer closed the link (code {code:#x}): {reason}")]
    Rejected {
        /// The application error code (see [`codes`]).
        code: u64,
        /// The peer's reason.
        reason: String,
    },
    /// Writing to a stream failed.
    #[error("write: {0}")]
    Write(#[from] quinn::WriteError),
    /// Reading a stream failed.
    #[error("read: {0}")]
    Read(#[from] quinn::ReadError),
    /// The round could not be encoded (bad gradients, bad config).
    #[error("encode: {0}")]
    Encode(#[from] EncodeError),
    /// The received data broke the protocol; the connection was closed.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A local reassembly request failed.
    #[error("reassembly: {0}")]
    Reassembly(#[from] ReassemblyError),
    /// The handshake could not be decoded.
    #[error("handshake: {0}")]
    Handshake(#[from] HandshakeError),
    /// The peer does not accept QUIC datagrams.
    #[error("peer does not accept datagrams")]
    NoDatagrams,
    /// A datagram could not be sent.
    #[error("datagram: {0}")]
    Datagram(#[from] quinn::SendDatagramError),
    /// A task of the link failed (panicked or was cancelled).
    #[error("internal: {0}")]
    Internal(String),
}

impl LinkError {
    /// Maps a connection error that carries a gradlane close code to
    /// [`LinkError::Rejected`].
    pub(crate) fn from_conn(e: ConnectionError) -> Self {
        match e {
            ConnectionError::ApplicationClosed(c) => LinkError::Rejected {
                code: c.error_code.into_inner(),
                reason: String::from_utf8_lossy(&c.reason).into_owned(),
            },
            e => LinkError::Connection(e),
        }
    }
}

/// What sending one round did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SendReport {
    /// Round index.
    pub round: u32,
    /// Payload bytes sent reliably.
    pub important_bytes: u64,
    /// Per lossy level (index `l - 1`): datagrams queued.
    pub lossy_packets: Vec<u64>,
    /// Per lossy level: payload bytes in the queued datagrams.
    pub lossy_bytes: Vec<u64>,
    /// Per lossy level: datagrams dropped by the sender (deadline passed, or
    /// the path's datagram size shrank below what can be reframed).
    pub lossy_dropped: Vec<u64>,
    /// Per lossy level: datagrams cut into smaller ones because the path's
    /// datagram size shrank after the round was framed (the pieces are
    /// counted in `lossy_packets`).
    pub lossy_reframed: Vec<u64>,
    /// Time to score and class the round: until the first important byte
    /// could be handed to quinn.
    pub plan: Duration,
    /// Time until the whole round was framed (framing overlaps sending).
    pub encode: Duration,
    /// From the start until the peer confirmed every important chunk.
    pub important: Duration,
    /// From the start until the first datagram could be queued.
    pub lossy_start: Duration,
    /// From the start until quinn had sent the last datagram (its queue
    /// drained, at most a second after the last was queued).
    pub total: Duration,
}

/// When a delivered round's parts arrived, for measuring a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundArrival {
    /// When the round end was read: every important chunk was in.
    pub important: Instant,
    /// When the round was delivered.
    pub delivered: Instant,
}

/// State shared between a link's receive tasks and `recv_round`.
struct RxShared {
    reassembler: Mutex<Reassembler>,
    /// Woken whenever a datagram is placed.
    progress: Notify,
    /// Datagrams the unreliable engine took from quinn and placed.
    datagrams_read: AtomicU64,
    /// Rounds whose sender reported every datagram sent, with how many
    /// datagrams quinn had received by then: once the engine has placed as
    /// many, every datagram of the round that was not lost is in.
    lossy_sent: Mutex<HashMap<u32, u64>>,
}

/// State shared between the control reader and `send_round`.
struct TxShared {
    /// Rounds the peer confirmed, and when the confirmation came.
    acked: Mutex<HashMap<u32, Instant>>,
    acked_notify: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic in another task cannot leave the core half-updated in a way
    // that matters more than losing the link: keep going with its state.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The sending half of a link.
pub struct LinkSender {
    conn: Connection,
    /// The control stream to the peer (shared with the receive side, which
    /// sends its confirmations on it).
    control: Arc<tokio::sync::Mutex<SendStream>>,
    encoder: Encoder,
    levels: u8,
    tx: Arc<TxShared>,
    timing: RoundTiming,
}

/// The receiving half of a link.
pub struct LinkReceiver {
    conn: Connection,
    rx: Arc<RxShared>,
    ended: mpsc::UnboundedReceiver<Result<(u32, Instant), String>>,
    timing: RoundTiming,
    _tasks: TaskGuard,
}

/// Aborts the link's background tasks when the receiver goes away.
struct TaskGuard(Vec<JoinHandle<()>>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// A bidirectional gradient link: both ends can send and receive rounds.
pub struct Link {
    layout: Layout,
    sender: LinkSender,
    receiver: LinkReceiver,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("remote", &self.sender.conn.remote_address())
            .field("tensors", &self.layout.len())
            .finish()
    }
}

impl Link {
    /// Builds the link once the handshake is done; starts the receive tasks.
    pub(crate) fn start(
        conn: Connection,
        layout: Layout,
        encoder: EncoderConfig,
        reassembly: ReassemblyConfig,
        timing: RoundTiming,
        control_send: SendStream,
        control_recv: RecvStream,
    ) -> Result<Self, LinkError> {
        let levels = encoder.classify.levels;
        let encoder = Encoder::new(&layout, encoder)?;
        let reassembler = Reassembler::new(
            layout.clone(),
            ReassemblyConfig {
                chunking: encoder.plan().options(),
                ..reassembly
            },
        )?;
        let rx = Arc::new(RxShared {
            reassembler: Mutex::new(reassembler),
            progress: Notify::new(),
            datagrams_read: AtomicU64::new(0),
            lossy_sent: Mutex::new(HashMap::new()),
        });
        let tx = Arc::new(TxShared {
            acked: Mutex::new(HashMap::new()),
            acked_notify: Notify::new(),
        });
        let (ended_tx, ended) = mpsc::unbounded_channel();
        let control_send = Arc::new(tokio::sync::Mutex::new(control_send));
        let tasks = vec![
            tokio::spawn(control_reader(
                conn.clone(),
                control_recv,
                tx.clone(),
                rx.clone(),
            )),
            tokio::spawn(stream_acceptor(
                conn.clone(),
                rx.clone(),
                control_send.clone(),
                ended_tx,
            )),
            tokio::spawn(datagram_reader(conn.clone(), rx.clone())),
        ];
        Ok(Self {
            layout,
            sender: LinkSender {
                conn: conn.clone(),
                control: control_send,
                encoder,
                levels,
                tx,
                timing,
            },
            receiver: LinkReceiver {
                conn,
                rx,
                ended,
                timing,
                _tasks: TaskGuard(tasks),
            },
        })
    }

    /// The model layout both ends agreed on.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Sends one round; `grads` in layout order. See [`LinkSender::send_round`].
    pub async fn send_round<G: AsRef<[f32]>>(
        &mut self,
        round: u32,
        grads: &[G],
    ) -> Result<SendReport, LinkError> {
        self.sender.send_round(round, grads).await
    }

    /// Receives the next round. See [`LinkReceiver::recv_round`].
    pub async fn recv_round(&mut self) -> Result<Round, LinkError> {
        self.receiver.recv_round().await
    }

    /// Receives the next round with its arrival times. See
    /// [`LinkReceiver::recv_round_timed`].
    pub async fn recv_round_timed(&mut self) -> Result<(Round, RoundArrival), LinkError> {
        self.receiver.recv_round_timed().await
    }

    /// Reports the training loss to the classifier (adaptive ratio).
    pub fn report_loss(&mut self, loss: f64) -> Result<(), LinkError> {
        Ok(self.sender.encoder.report_loss(loss)?)
    }

    /// Hands a delivered round's tensors back for reuse (saves mapping fresh
    /// memory each round). Tensors of the wrong shape are ignored.
    pub fn recycle(&mut self, tensors: Vec<Vec<f32>>) {
        let _ = lock(&self.receiver.rx.reassembler).recycle(tensors);
    }

    /// The receiver's counters (malformed, duplicates, late drops, ...).
    pub fn counters(&self) -> crate::reassembly::ReceiverCounters {
        self.receiver.counters()
    }

    /// Datagrams quinn received but dropped before the link read them; see
    /// [`LinkReceiver::datagrams_dropped_by_quinn`].
    pub fn datagrams_dropped_by_quinn(&self) -> u64 {
        self.receiver.datagrams_dropped_by_quinn()
    }

    /// Payload bytes of late segments waiting to be added into the next round.
    pub fn late_buffered_bytes(&self) -> usize {
        lock(&self.receiver.rx.reassembler).late_buffered_bytes()
    }

    /// The underlying QUIC connection (for statistics: rtt, cwnd, losses).
    pub fn connection(&self) -> &Connection {
        &self.sender.conn
    }

    /// Splits into a sending and a receiving half that can be used from two
    /// tasks at once.
    pub fn split(self) -> (LinkSender, LinkReceiver) {
        (self.sender, self.receiver)
    }

    /// Closes the connection in an orderly way.
    pub fn close(&self) {
        self.sender
            .conn
            .close(VarInt::from_u32(codes::CLOSED), b"done");
    }
}

impl LinkSender {
    /// Sends one round; `grads` in layout order.
    ///
    /// Returns once the peer has confirmed every important chunk and every
    /// datagram was queued (or dropped by the deadline), so the caller may
    /// reuse `grads` right away.
    pub async fn send_round<G: AsRef<[f32]>>(
        &mut self,
        round: u32,
        grads: &[G],
    ) -> Result<SendReport, LinkError> {
        let span = tracing::info_span!("send_round", round);
        self.send_round_inner(round, grads).instrument(span).await
    }

    async fn send_round_inner<G: AsRef<[f32]>>(
        &mut self,
        round: u32,
        grads: &[G],
    ) -> Result<SendReport, LinkError> {
        let start = Instant::now();
        let max = lossy_datagram_limit(&self.conn).ok_or(LinkError::NoDatagrams)?;
        // Scoring and classing read the whole round: every check on the
        // gradients happens here, before a byte is sent.
        let encoder = &mut self.encoder;
        let framer = blocking(|| encoder.start(round, grads, max))?;
        let plan = start.elapsed();
        tracing::debug!(?plan, "classed");
        let mut report = SendReport {
            round,
            important_bytes: framer.end().bytes[0],
            lossy_packets: vec![0; self.levels as usize],
            lossy_bytes: vec![0; self.levels as usize],
            lossy_dropped: vec![0; self.levels as usize],
            lossy_reframed: vec![0; self.levels as usize],
            plan,
            ..Default::default()
        };

        // Bytes quinn sent so far, less those it declared lost (their
        // retransmissions are counted again): the baseline for knowing when
        // the important stream has left.
        let sent_before = sent_bytes(&self.conn);
        let reliable_len = framer.reliable_len() as u64;
        let stream = self.conn.open_uni().await.map_err(LinkError::from_conn)?;
        // Above the control stream and any stream of an older round.
        let _ = stream.set_priority(i32::MAX);
        // Framing ~100 MB takes tens of milliseconds: the important pieces go
        // to quinn from a writer task as soon as each is framed, while this
        // thread frames the next ones and then the datagrams.
        let (pieces, queue) = mpsc::unbounded_channel();
        let writer = tokio::spawn(write_reliable(stream, queue, framer.reliable_len()));
        let encoded = frame_pipelined(framer, grads, pieces).await;
        report.encode = start.elapsed();
        tracing::debug!(?report.encode, "framed");
        let written = writer
            .await
            .map_err(|e| LinkError::Internal(format!("stream writer: {e}")));
        let encoded = encoded?;
        written??;
        tracing::debug!(elapsed = ?start.elapsed(), "important data handed to quinn");
        // Every important byte is now in quinn's hands; its stream's
        // flow-control window (4 MiB by default) bounds how much of it is
        // still unsent (measured on loopback: about 200 kB of 82 MB). Also
        // wait until quinn has sent at least as many bytes as the stream
        // holds, a lower bound for its last byte having left.
        let released = match self.timing.release {
            LossyRelease::Sent => Some(sent_before + reliable_len),
            LossyRelease::Acknowledged => None,
        };
        tracing::debug!(
            sent = sent_bytes(&self.conn).saturating_sub(sent_before),
            reliable_len,
            "waiting to release"
        );
        self.wait_release(round, released).await?;
        report.lossy_start = start.elapsed();
        tracing::debug!(
            ?report.lossy_start,
            sent = sent_bytes(&self.conn).saturating_sub(sent_before),
            "lossy data released"
        );

        // quinn's datagram queue is empty between rounds: its free space now
        // is what "all sent" looks like.
        let empty = self.conn.datagram_send_buffer_space();
        self.send_lossy(&encoded, start, &mut report).await?;
        // Report the datagrams sent only once quinn has put the last one
        // into a packet, so the report travels behind all of them and the
        // receiver stops waiting as soon as it has what was not lost.
        self.wait_datagrams_sent(empty).await?;
        write_control(&mut *self.control.lock().await, Control::LossySent(round)).await?;
        report.total = start.elapsed();
        tracing::debug!(?report.total, "lossy data sent");
        let confirmed = self.wait_release(round, None).await?;
        lock(&self.tx.acked).remove(&round);
        report.important = confirmed.saturating_duration_since(start);
        tracing::debug!(?report.important, "important data confirmed");
        self.encoder.recycle(encoded);
        Ok(report)
    }

    /// Waits until the peer confirmed `round`'s important data, or (with
    /// `sent`) until quinn's count of sent bytes reaches `sent`, whichever
    /// comes first. Returns when the confirmation came, if it has (the
    /// caller removes it once done with the round).
    async fn wait_release(&self, round: u32, sent: Option<u64>) -> Result<Instant, LinkError> {
        let acked = self.tx.acked_notify.notified();
        tokio::pin!(acked);
        loop {
            acked.as_mut().enable();
            if let Some(&at) = lock(&self.tx.acked).get(&round) {
                return Ok(at);
            }
            if sent.is_some_and(|s| sent_bytes(&self.conn) >= s) {
                return Ok(Instant::now());
            }
            // quinn has no event for "sent": poll its counters at the
            // timer's granularity (a millisecond) while the stream drains.
            let poll = async {
                match sent {
                    Some(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = acked.as_mut() => acked.set(self.tx.acked_notify.notified()),
                _ = poll => {}
                e = self.conn.closed() => return Err(LinkError::from_conn(e)),
            }
        }
    }

    /// Waits until quinn's datagram queue has `empty` bytes free again, or
    /// at most a second (a path that stalls that long is better served by
    /// the receiver's grace period than by a late report).
    async fn wait_datagrams_sent(&self, empty: usize) -> Result<(), LinkError> {
        let give_up = Instant::now() + Duration::from_secs(1);
        // quinn has no event for it: poll at the timer's granularity.
        while self.conn.datagram_send_buffer_space() < empty && Instant::now() < give_up {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                e = self.conn.closed() => return Err(LinkError::from_conn(e)),
            }
        }
        Ok(())
    }

    async fn send_lossy(
        &self,
        encoded: &EncodedRound,
        start: Instant,
        report: &mut SendReport,
    ) -> Result<(), LinkError> {
        let deadline = self.timing.lossy_deadline.map(|d| start + d);
        for (l, datagrams) in encoded.lossy.iter().enumerate() {
            for (i, d) in datagrams.iter().enumerate() {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    // Everything not yet queued, this level and below, is dropped.
                    report.lossy_dropped[l] += (datagrams.len() - i) as u64;
                    for (k, rest) in encoded.lossy.iter().enumerate().skip(l + 1) {
                        report.lossy_dropped[k] += rest.len() as u64;
                    }
                    return Ok(());
                }
                match self.conn.send_datagram_wait(d.clone()).await {
                    Ok(()) => {
                        report.lossy_packets[l] += 1;
                        report.lossy_bytes[l] += payload_bytes(d);
                    }
                    // MTU black-hole detection may lower the limit below a
                    // datagram framed a moment ago: cut it for the new one.
                    Err(quinn::SendDatagramError::TooLarge) => {
                        self.send_reframed(d, l, report).await?
                    }
                    Err(quinn::SendDatagramError::ConnectionLost(e)) => {
                        return Err(LinkError::from_conn(e))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Sends a datagram that became too large as several smaller ones;
    /// counts it dropped if even that is impossible.
    async fn send_reframed(
        &self,
        d: &Bytes,
        level: usize,
        report: &mut SendReport,
    ) -> Result<(), LinkError> {
        let pieces = match self.conn.max_datagram_size() {
            Some(max) => self.encoder.reframe(d, max).unwrap_or_default(),
            None => Vec::new(),
        };
        if pieces.is_empty() {
            report.lossy_dropped[level] += 1;
            return Ok(());
        }
        report.lossy_reframed[level] += 1;
        for p in pieces {
            match self.conn.send_datagram_wait(p.clone()).await {
                Ok(()) => {
                    report.lossy_packets[level] += 1;
                    report.lossy_bytes[level] += payload_bytes(&p);
                }
                Err(quinn::SendDatagramError::TooLarge) => report.lossy_dropped[level] += 1,
                Err(quinn::SendDatagramError::ConnectionLost(e)) => {
                    return Err(LinkError::from_conn(e))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// How long a receiver waits, after the sender reported a round's datagrams
/// all sent and every one received by then is placed, for datagrams still
/// arriving (each one restarts it): a few packets' worth on any path, far
/// below the grace period that covers not knowing whether more will come.
const LOSSY_TAIL: Duration = Duration::from_millis(5);

/// Important pieces handed to quinn at a time: small enough that the first
/// leaves within a fraction of a millisecond of framing, large enough that
/// the per-piece cost (a channel message, a `write_chunk`) is negligible.
const RELIABLE_PIECE: usize = 512 << 10;

/// Runs CPU-heavy core work (scoring, framing: tens of milliseconds for a
/// large model). On a multi-threaded runtime it tells tokio, which moves the
/// other tasks of this worker (quinn's drivers, the stream writer) to
/// another thread meanwhile; a current-thread runtime has no other thread.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Frames the important segments piece by piece into `pieces`, then the
/// datagrams.
async fn frame_pipelined<G: AsRef<[f32]>>(
    mut framer: RoundFramer,
    grads: &[G],
    pieces: mpsc::UnboundedSender<Bytes>,
) -> Result<EncodedRound, LinkError> {
    let feed = |framer: &mut RoundFramer| -> Result<bool, LinkError> {
        match framer.next_reliable(grads, RELIABLE_PIECE)? {
            // A closed queue means the writer failed; its error is reported.
            Some(piece) => Ok(pieces.send(piece).is_ok()),
            None => Ok(false),
        }
    };
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(|| {
            while feed(&mut framer)? {}
            Ok(framer.finish(grads)?)
        }),
        // One thread for everything: let the writer and quinn's driver run
        // between pieces.
        _ => {
            while feed(&mut framer)? {
                tokio::task::yield_now().await;
            }
            Ok(framer.finish(grads)?)
        }
    }
}

/// The writer of a round's reliable stream: writes the pieces as they come
/// and finishes the stream once all `total` bytes are written. If the
/// queue closes before (the round was abandoned: `send_round` dropped or
/// failed), the stream is reset instead, so the peer never mistakes a cut
/// stream for a whole round.
async fn write_reliable(
    mut stream: SendStream,
    mut pieces: mpsc::UnboundedReceiver<Bytes>,
    total: usize,
) -> Result<(), LinkError> {
    let mut written = 0;
    while written < total {
        let Some(piece) = pieces.recv().await else {
            let _ = stream.reset(VarInt::from_u32(codes::ROUND_ABANDONED));
            return Ok(());
        };
        written += piece.len();
        stream.write_chunk(piece).await?;
    }
    let _ = stream.finish();
    Ok(())
}

/// The smallest path MTU quinn falls back to: its `TransportConfig::min_mtu`,
/// which [`Tuning`](super::tuning::Tuning) leaves at QUIC's minimum.
const QUIC_MIN_MTU: u16 = 1200;

/// The datagram payload a round's lossy part is framed for: what the path
/// takes now, less what MTU discovery added above the floor.
///
/// When quinn suspects a black hole (under random loss it sometimes does:
/// a burst of lost large packets) it drops the path MTU back to the floor
/// and silently discards every queued datagram that no longer fits
/// (`drop_oversized` in quinn-proto 0.11): with a whole round's lossy part
/// queued that was up to 8 MB, measured at 1% loss as rounds with 5-7 MB
/// zero-filled instead of 0.2. Datagrams framed for the floor survive the
/// fall; the price is ~23% more, smaller datagrams on a path whose MTU was
/// raised. The payload limit is linear in the MTU (quinn subtracts a fixed
/// packet overhead), so subtracting the MTU's rise is exact; when the peer's
/// own limit is the smaller one this errs on the small side. Never below
/// what the encoder needs: then the path's limit is used as it is, and
/// `SendDatagramError::TooLarge` is handled by reframing.
fn lossy_datagram_limit(conn: &Connection) -> Option<usize> {
    let max = conn.max_datagram_size()?;
    Some(limit_at_floor(max, conn.stats().path.current_mtu))
}

/// [`lossy_datagram_limit`] from the path's datagram limit `max` at path
/// MTU `mtu`.
fn limit_at_floor(max: usize, mtu: u16) -> usize {
    let rise = mtu.saturating_sub(QUIC_MIN_MTU) as usize;
    match max.saturating_sub(rise) {
        floor if floor >= crate::encode::MIN_DATAGRAM => floor,
        _ => max,
    }
}

/// Bytes quinn has sent on the connection, less those it declared lost.
fn sent_bytes(conn: &Connection) -> u64 {
    let stats = conn.stats();
    stats.udp_tx.bytes.saturating_sub(stats.path.lost_bytes)
}

/// Payload bytes of a datagram framed by this crate.
fn payload_bytes(d: &Bytes) -> u64 {
    let headers = wire::decode_all(d).count() * DATA_HEADER_LEN;
    (d.len() - headers.min(d.len())) as u64
}

impl LinkReceiver {
    /// Receives the next round: waits for its important data, then for its
    /// datagrams (see [`RoundTiming`]), and delivers the rebuilt tensors.
    pub async fn recv_round(&mut self) -> Result<Round, LinkError> {
        Ok(self.recv_round_timed().await?.0)
    }

    /// [`recv_round`](Self::recv_round), also telling when the round's
    /// important data was complete and when it was delivered.
    pub async fn recv_round_timed(&mut self) -> Result<(Round, RoundArrival), LinkError> {
        let (round, important) = tokio::select! {
            // A protocol error is queued before the connection is closed:
            // look at the queue first so the caller learns why.
            biased;
            m = self.ended.recv() => match m {
                Some(Ok(r)) => r,
                Some(Err(e)) => return Err(LinkError::Protocol(e)),
                None => return Err(LinkError::from_conn(self.conn.closed().await)),
            },
            e = self.conn.closed() => match self.ended.try_recv() {
                Ok(Err(why)) => return Err(LinkError::Protocol(why)),
                _ => return Err(LinkError::from_conn(e)),
            },
        };
        let span = tracing::info_span!("recv_round", round);
        let delivered = self.finish_round(round).instrument(span).await?;
        let arrival = RoundArrival {
            important,
            delivered: Instant::now(),
        };
        Ok((delivered, arrival))
    }

    async fn finish_round(&mut self, round: u32) -> Result<Round, LinkError> {
        let ended = Instant::now();
        let idle = self.timing.grace + self.conn.rtt() * 2;
        let cap = Instant::now() + self.timing.max_grace;
        loop {
            let progress = self.rx.progress.notified();
            tokio::pin!(progress);
            progress.as_mut().enable();
            let got = match lock(&self.rx.reassembler).lossy_progress(round) {
                Some((got, Some(sent))) if got < sent => got,
                _ => break,
            };
            // The sender reported them all sent, and every datagram quinn
            // had received by then is placed: what is missing was lost, or
            // was overtaken by the report by a packet or two (quinn puts a
            // small stream frame into the tail of a packet that the next
            // datagram does not fit) and is about to come. Wait a short
            // tail for those, not the whole grace period.
            let placed = self.rx.datagrams_read.load(Ordering::Relaxed);
            let reported = lock(&self.rx.lossy_sent).get(&round).copied();
            let drained = reported.is_some_and(|received| placed >= received);
            let idle = if drained {
                self.timing.grace.min(LOSSY_TAIL)
            } else if got == 0 && reported.is_none() {
                // Not one lossy byte yet and no report: the sender has not
                // started the datagrams (it waits for this end's
                // confirmation, which, if lost, quinn resends only after a
                // probe timeout of tens of milliseconds). The grace counts
                // from the last datagram, and there is none yet: wait for
                // the first one or the report, up to `max_grace`. Measured
                // at 5% loss before: a round delivered with none of its
                // 20 MB of datagrams, all merged late into the next.
                self.timing.max_grace
            } else {
                idle
            };
            let wait = idle.min(cap.saturating_duration_since(Instant::now()));
            if wait.is_zero() || tokio::time::timeout(wait, progress).await.is_err() {
                break;
            }
        }
        let waited = ended.elapsed();
        let progress = lock(&self.rx.reassembler).lossy_progress(round);
        let reported = lock(&self.rx.lossy_sent).get(&round).copied();
        lock(&self.rx.lossy_sent).retain(|&r, _| r > round);
        let delivered = lock(&self.rx.reassembler).deliver(round)?;
        tracing::debug!(
            ?waited,
            ?progress,
            ?reported,
            placed = self.rx.datagrams_read.load(Ordering::Relaxed),
            quinn_dropped = self.datagrams_dropped_by_quinn(),
            zero_filled = delivered.stats.lossy().zero_filled_bytes,
            late = delivered.stats.lossy().late_merged_bytes,
            "delivered"
        );
        Ok(delivered)
    }

    /// Hands a delivered round's tensors back for reuse.
    pub fn recycle(&mut self, tensors: Vec<Vec<f32>>) {
        let _ = lock(&self.rx.reassembler).recycle(tensors);
    }

    /// Datagrams quinn received but the link never got: quinn drops the
    /// oldest received datagrams when its receive buffer
    /// (`Tuning::datagram_receive_buffer`) fills faster than the link reads
    /// it. Includes the few that may be waiting in that buffer right now.
    pub fn datagrams_dropped_by_quinn(&self) -> u64 {
        let received = self.conn.stats().frame_rx.datagram;
        received.saturating_sub(self.rx.datagrams_read.load(Ordering::Relaxed))
    }

    /// The receiver's counters (malformed, duplicates, late drops, ...).
    pub fn counters(&self) -> crate::reassembly::ReceiverCounters {
        lock(&self.rx.reassembler).counters()
    }
}

fn protocol_close(conn: &Connection, why: &str) {
    tracing::warn!(why, "closing link: protocol error");
    conn.close(VarInt::from_u32(codes::PROTOCOL), why.as_bytes());
}

/// Reads one length-prefixed control message; `None` at a clean end.
pub(crate) async fn read_control(stream: &mut RecvStream) -> Result<Option<Vec<u8>>, LinkError> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(quinn::ReadExactError::FinishedEarly(_)) => {
            return Err(HandshakeError::Truncated.into())
        }
        Err(quinn::ReadExactError::ReadError(e)) => return Err(read_error(e)),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(HandshakeError::TooLarge(len).into());
    }
    let mut body = vec![0u8; len];
    match stream.read_exact(&mut body).await {
        Ok(()) => Ok(Some(body)),
        Err(quinn::ReadExactError::FinishedEarly(_)) => Err(HandshakeError::Truncated.into()),
        Err(quinn::ReadExactError::ReadError(e)) => Err(read_error(e)),
    }
}

fn read_error(e: quinn::ReadError) -> LinkError {
    match e {
        quinn::ReadError::ConnectionLost(c) => LinkError::from_conn(c),
        e => LinkError::Read(e),
    }
}

/// Writes one length-prefixed control message.
pub(crate) async fn write_control(stream: &mut SendStream, msg: Control) -> Result<(), LinkError> {
    stream.write_all(&framed(&msg.encode())).await?;
    Ok(())
}

async fn control_reader(
    conn: Connection,
    mut recv: RecvStream,
    tx: Arc<TxShared>,
    rx: Arc<RxShared>,
) {
    loop {
        let msg = match read_control(&mut recv).await {
            Ok(Some(body)) => Control::decode(&body),
            Ok(None) | Err(LinkError::Connection(_) | LinkError::Rejected { .. }) => return,
            Err(e) => {
                protocol_close(&conn, &format!("control stream: {e}"));
                return;
            }
        };
        match msg {
            Ok(Control::ImportantReceived(r)) => {
                lock(&tx.acked).insert(r, Instant::now());
                tx.acked_notify.notify_waiters();
            }
            Ok(Control::LossySent(r)) => {
                // Every datagram sent before this message that was not lost
                // has reached quinn by now (it sends datagrams ahead of
                // stream data; reordering on the path aside).
                let received = conn.stats().frame_rx.datagram;
                lock(&rx.lossy_sent).insert(r, received);
                rx.progress.notify_waiters();
            }
            Ok(Control::Welcome) | Err(_) => {
                protocol_close(&conn, "unexpected control message");
                return;
            }
        }
    }
}

async fn stream_acceptor(
    conn: Connection,
    rx: Arc<RxShared>,
    control: Arc<tokio::sync::Mutex<SendStream>>,
    ended: mpsc::UnboundedSender<Result<(u32, Instant), String>>,
) {
    while let Ok(stream) = conn.accept_uni().await {
        tokio::spawn(round_stream_reader(
            conn.clone(),
            stream,
            rx.clone(),
            control.clone(),
            ended.clone(),
        ));
    }
}

/// The reliable engine: one round's stream into the reassembler, straight
/// from quinn's buffers (no copy before the one into the tensor), several
/// received pieces per lock. Malformed data closes the connection: a
/// reliable stream cannot have been damaged in transit, so the peer is
/// broken.
async fn round_stream_reader(
    conn: Connection,
    mut stream: RecvStream,
    rx: Arc<RxShared>,
    control: Arc<tokio::sync::Mutex<SendStream>>,
    ended: mpsc::UnboundedSender<Result<(u32, Instant), String>>,
) {
    let mut decoder = StreamDecoder::new();
    // quinn hands over one received frame (about a packet) per piece.
    let mut pieces = vec![Bytes::new(); 64];
    loop {
        let n = match stream.read_chunks(&mut pieces).await {
            Ok(Some(n)) => n,
            Ok(None) if decoder.at_boundary() => return,
            Ok(None) => return fail(&conn, &ended, "round stream ends inside a segment".into()),
            // Reset by the sender (an abandoned round) or the connection is
            // gone: nothing to deliver.
            Err(_) => return,
        };
        let mut round_end = None;
        let fed = {
            let mut reassembler = lock(&rx.reassembler);
            pieces[..n].iter().try_for_each(|piece| {
                let out = decoder.feed(&mut reassembler, piece)?;
                round_end = round_end.or(out.ended);
                Ok::<_, ReassemblyError>(())
            })
        };
        if let Err(e) = fed {
            return fail(&conn, &ended, format!("{e}"));
        }
        // Let quinn reuse the buffers now, not when the slots are refilled.
        pieces[..n].fill(Bytes::new());
        if let Some(r) = round_end {
            let arrived = Instant::now();
            tracing::debug!(round = r, "round end arrived");
            let mut c = control.lock().await;
            if write_control(&mut c, Control::ImportantReceived(r))
                .await
                .is_err()
            {
                return;
            }
            drop(c);
            let _ = ended.send(Ok((r, arrived)));
        }
    }
}

fn fail(
    conn: &Connection,
    ended: &mpsc::UnboundedSender<Result<(u32, Instant), String>>,
    why: String,
) {
    let _ = ended.send(Err(why.clone()));
    protocol_close(conn, &why);
}

/// The unreliable engine: datagrams into the reassembler. Malformed ones are
/// counted (by the reassembler) and dropped; the link goes on.
///
/// A ResNet-50 round brings ~15k datagrams: after each wake-up it also takes
/// those quinn already holds, so one wake-up, one lock of the reassembler
/// and one notification serve many datagrams.
async fn datagram_reader(conn: Connection, rx: Arc<RxShared>) {
    const BATCH: usize = 64;
    let mut batch = Vec::with_capacity(BATCH);
    while let Ok(d) = conn.read_datagram().await {
        batch.push(d);
        while batch.len() < BATCH {
            match ready_now(conn.read_datagram()) {
                Some(Ok(d)) => batch.push(d),
                _ => break,
            }
        }
        {
            let mut reassembler = lock(&rx.reassembler);
            for d in &batch {
                if let Err(e) = reassembler.push(d, Channel::Lossy) {
                    tracing::debug!(%e, "dropped a malformed datagram");
                }
            }
        }
        // Counted once placed: a round waiting on this count must find
        // the datagrams in the reassembler.
        rx.datagrams_read
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        batch.clear();
        rx.progress.notify_waiters();
    }
}

/// Polls `f` once: its output if it is ready now, without waiting.
fn ready_now<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(x) => Some(x),
        std::task::Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lossy_datagrams_are_framed_for_the_mtu_floor() {
        // quinn 0.11 on loopback: 1162 at the 1200-byte floor, 1414 at 1452.
        assert_eq!(limit_at_floor(1162, 1200), 1162);
        assert_eq!(limit_at_floor(1414, 1452), 1162);
        // A peer's smaller limit: the result errs on the small side.
        assert_eq!(limit_at_floor(600, 1452), 348);
        // Never below what the encoder can frame: the path's limit as is.
        let tiny = crate::encode::MIN_DATAGRAM + 10;
        assert_eq!(limit_at_floor(tiny, 1452), tiny);
        // An MTU under the floor (a config this crate does not make) takes
        // nothing off.
        assert_eq!(limit_at_floor(1000, 1100), 1000);
    }
}
