//! A bidirectional gradient link over one QUIC connection.
//!
//! Sending a round: the core encoder scores and classes it, then frames the
//! important segments piece by piece while a writer task hands each piece
//! to a fresh unidirectional stream at the highest priority, closed by the
//! round end. The lossy datagrams, level 1 first, are released once quinn
//! has sent the important data (or, as an option, once the peer confirmed
//! it; see [`LossyRelease`]): quinn puts datagrams ahead of stream data in
//! every packet, so releasing them earlier would slow the important bytes,
//! and the capped congestion window keeps them from queueing ahead of the
//! stream's last retransmissions. Because datagrams are queued with
//! `send_datagram_wait`, quinn never drops the oldest queued ones on its
//! own: what is not sent by the optional deadline is dropped here, lowest
//! level first, and counted. While the path loses nothing, the lossy levels
//! go on streams below the lanes instead ([`LossyCarrier`]), which cost
//! less than datagrams and which quinn sends only when the lanes have
//! nothing to send.
//!
//! Receiving: a reliable engine (one task per round stream) and an
//! unreliable engine (one task reading datagrams) both feed the core
//! [`Reassembler`]. When a round end arrives the round is complete;
//! `recv_round` then waits, at most a grace period after the last lossy
//! byte of that round (datagram or stream), for what is still in flight,
//! and delivers. Anything later is merged into the next round by the
//! core.
//!
//! When each of these happens (the release, the report, the wait, the
//! confirmation, the close) is decided by the core's state machines
//! ([`gradlane_core::protocol`]); this module is their driver: it feeds
//! them what quinn tells and carries out what they ask.
//!
//! This file holds the link, its errors and its shared state. The sending
//! half: `send` (a round from classing to confirmation), `lanes` (the
//! important part's framing and stream writers), `lossy` (the lossy part),
//! `in_flight` (abandoning a round). The receiving half and the background
//! tasks: `receive`. Both: `layouts` (more layouts on one link),
//! `messages` (exact messages), `close` (closing in order).
//! docs/DESIGN.md §2.7-2.8 tells the same story with a picture.

use crate::config::Config;
use crate::framing::{self, FrameError};
use crate::socket::marking::ConnectionMark;
use bytes::Bytes;
use gradlane_core::control::{codes, framed, CloseNote, Control, HandshakeError, MAX_MESSAGE};
use gradlane_core::encode::{EncodedRound, Encoder, EncoderConfig, RoundFramer};
use gradlane_core::layout::{ChunkOptions, Layout};
use gradlane_core::protocol::LossyReports;
use gradlane_core::reassembly::{Channel, Reassembler, ReassemblyError, Round, StreamDecoder};
use gradlane_core::wire::{self, DATA_HEADER_LEN};
use quinn::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tracing::Instrument;

mod close;
mod in_flight;
mod lanes;
mod layouts;
mod lossy;
mod messages;
mod point_to_point;
mod receive;
mod send;

pub use close::CLOSE_WAIT;
use close::{ControlTx, Linger, SharedControl};
pub use gradlane_core::protocol::{DatagramSize, LossyCarrier, LossyRelease, RoundTiming};
pub use layouts::LayoutId;
use layouts::Receivers;
pub use messages::{MessageBody, MAX_MESSAGE_BYTES};
pub use point_to_point::{PointToPointReceiver, PointToPointSender};

use receive::{control_reader, datagram_reader, stream_acceptor};

mod link_error;

pub use link_error::LinkError;
pub(crate) use link_error::{read_error, write_error};

/// The largest packet of a round's lossy part when it goes on streams
/// ([`LossyCarrier::Adaptive`]): no datagram limit applies there, and
/// fewer, longer segments cost less to frame and to place.
pub(crate) const LOSSY_STREAM_PACKET: usize = 64 << 10;

/// The lossy streams' priority: below the important lanes (`i32::MAX`)
/// and the control stream (0), so confirmations and reports never wait
/// behind them.
const LOSSY_STREAM_PRIORITY: i32 = -1;

/// What sending one round did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SendReport {
    /// Round index.
    pub round: u32,
    /// Payload bytes sent reliably, in the important part's format.
    pub important_bytes: u64,
    /// The class of every chunk of the round, by chunk id (0 important,
    /// `l` lossy level `l`).
    pub classes: Vec<gradlane_core::classify::Class>,
    /// Streams the important bytes went on ([`Config::lanes`](crate::Config::lanes), fewer
    /// for a round too small to fill them).
    pub lanes: usize,
    /// The lossy levels went on streams, not as datagrams
    /// ([`LossyCarrier::Adaptive`] on a path without loss).
    pub lossy_on_stream: bool,
    /// Per lossy level (index `l - 1`): datagrams queued (on streams:
    /// packets of up to 64 KiB written).
    pub lossy_packets: Vec<u64>,
    /// Per lossy level: payload bytes in the queued datagrams (or written
    /// to the lossy streams), in the lossy levels' format.
    pub lossy_bytes: Vec<u64>,
    /// Per lossy level: datagrams dropped by the sender (deadline passed, or
    /// the path's datagram size shrank below what can be reframed).
    pub lossy_dropped: Vec<u64>,
    /// Per lossy level: datagrams cut into smaller ones because the path's
    /// datagram size shrank after the round was framed (the pieces are
    /// counted in `lossy_packets`).
    pub lossy_reframed: Vec<u64>,
    /// Datagrams queued (counted in `lossy_packets`) that quinn discarded
    /// before sending: it drops queued datagrams that a fall of the path
    /// MTU made too large (a black hole suspected under loss), which only
    /// datagrams at the path's size can be ([`DatagramSize`]): at most
    /// [`QuicSettings::datagram_send_buffer`](crate::QuicSettings)
    /// bytes' worth per fall. 0 when the queue had not drained a second
    /// after the last datagram (not yet known).
    pub lossy_dropped_by_quinn: u64,
    /// Time to score and class the round: until the first important byte
    /// could be handed to quinn.
    pub plan: Duration,
    /// Time until the whole round was framed (framing overlaps sending).
    pub encode: Duration,
    /// From the start until the peer confirmed every important chunk.
    pub important: Duration,
    /// From the start until the first datagram could be queued (or the
    /// lossy streams were opened).
    pub lossy_start: Duration,
    /// From the start until quinn had sent the last datagram (its queue
    /// drained, at most a second after the last was queued), or held all
    /// of the lossy streams (within their flow-control windows of the
    /// end).
    pub total: Duration,
}

/// When a delivered round's parts arrived, for measuring a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundArrival {
    /// When every important chunk and the round's end were in.
    pub important: Instant,
    /// When the round was delivered.
    pub delivered: Instant,
}

/// State shared between a link's receive tasks and `recv_round`.
struct RxShared {
    /// One reassembler per layout of the peer's.
    reassembler: Mutex<Receivers>,
    /// Woken whenever datagrams or stream data are placed.
    progress: Notify,
    /// Datagrams the unreliable engine took from quinn and placed.
    datagrams_read: AtomicU64,
    /// Rounds whose sender reported every datagram sent, with how many
    /// datagrams quinn had received by then: once the engine has placed as
    /// many, every datagram of the round that was not lost is in.
    lossy_sent: Mutex<LossyReports>,
    /// The peer's message stream arrived (a second one is a protocol
    /// error: messages must keep one order).
    message_stream: std::sync::atomic::AtomicBool,
    /// The same for the peer's point-to-point stream.
    point_to_point_stream: std::sync::atomic::AtomicBool,
}

/// State shared between the control reader and `send_round`.
struct TxShared {
    /// Rounds the peer confirmed, and when the confirmation came.
    acked: Mutex<HashMap<u32, Instant>>,
    /// Also woken when the peer is ready for a layout this end registered.
    acked_notify: Notify,
    /// Layouts of this end's the peer is ready for.
    layouts: Mutex<std::collections::HashSet<u16>>,
    /// The peer finished its control stream, and this end has read all of
    /// it: every confirmation it sent is processed.
    peer_finished: tokio::sync::watch::Sender<bool>,
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
    control: SharedControl,
    /// One encoder per layout this end registered, by id.
    encoders: Vec<Encoder>,
    /// How the encoder of a newly registered layout is made.
    encoder_template: EncoderConfig,
    levels: u8,
    /// Streams a round's important part is spread over
    /// ([`Config::lanes`](crate::Config::lanes)).
    lanes: u8,
    tx: Arc<TxShared>,
    timing: RoundTiming,
    /// The UDP payload the path is known to carry
    /// ([`Tuning::min_udp_payload`](crate::tuning::Tuning)):
    /// what [`DatagramSize::MtuFloor`] frames for.
    floor_mtu: u16,
    /// The last round whose data may have reached the peer: every round
    /// from the moment its encoding succeeded, whether or not it finished.
    last_sent: Option<u32>,
    /// quinn's count of packets declared lost when the last round started
    /// ([`LossyCarrier::Adaptive`] uses datagrams once it grows).
    lost_seen: u64,
    /// The class this connection's packets are marked with, if the
    /// endpoint marks them ([`Tuning::dscp`](crate::tuning::Tuning)).
    mark: Option<ConnectionMark>,
    linger: Arc<Linger>,
}

/// The receiving half of a link.
pub struct LinkReceiver {
    conn: Connection,
    rx: Arc<RxShared>,
    ended: mpsc::UnboundedReceiver<Result<(u32, LayoutId, Instant), String>>,
    timing: RoundTiming,
    /// The peer finished its control stream: it is closing the link.
    peer_finished: tokio::sync::watch::Receiver<bool>,
    /// The peer's messages, read ahead.
    messages: mpsc::Receiver<messages::Message>,
    /// The peer's point-to-point messages, read ahead, until
    /// [`take_point_to_point`](Self::take_point_to_point) takes them.
    point_to_point: Option<mpsc::Receiver<messages::Message>>,
    /// Closes the link in order once both halves are gone.
    _linger: Arc<Linger>,
}

/// A bidirectional gradient link: both ends can send and receive rounds.
///
/// Its halves do the work: [`sender`](Self::sender) sends rounds and
/// messages, [`receiver`](Self::receiver) receives them; [`split`](Self::split)
/// hands them out to be used from two tasks at once.
///
/// Close it with [`close`](Self::close) when done: that waits until the
/// peer has read this end's confirmations of the rounds it sent. Dropping
/// it (both halves, if split) does the same in the background, within
/// [`CLOSE_WAIT`], as long as the tokio runtime and the process live on;
/// a process about to exit should `close().await` and then
/// [`Endpoint::wait_idle`](crate::Endpoint::wait_idle).
/// Rounds this end confirmed but never took with `recv_round` are lost
/// with it (their senders were told they arrived).
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

/// What a link runs on, once the handshake is done.
pub(crate) struct Carrier {
    /// The connection.
    pub conn: Connection,
    /// The handshake's stream pair, the control stream from then on.
    pub control: (SendStream, RecvStream),
    /// The UDP payload the path is known to carry
    /// ([`Tuning::min_udp_payload`](crate::tuning::Tuning)).
    pub floor_mtu: u16,
    /// Sets the class the connection's packets are marked with, if the
    /// endpoint marks them.
    pub mark: Option<ConnectionMark>,
}

impl Link {
    /// Builds the link once the handshake is done; starts the receive tasks.
    /// `chunking` is the handshake's: the client's, for both directions.
    pub(crate) fn start(
        carrier: Carrier,
        layout: Layout,
        chunking: ChunkOptions,
        config: &Config,
    ) -> Result<Self, LinkError> {
        let Carrier {
            conn,
            control,
            floor_mtu,
            mark,
        } = carrier;
        let (control_send, control_recv) = control;
        let levels = config.levels;
        let timing = config.timing;
        let encoder_template = EncoderConfig {
            chunking,
            ..config.encoder()
        };
        let encoder = Encoder::new(&layout, encoder_template)?;
        let receive = config.reassembly(chunking);
        let reassembler = Reassembler::new(layout.clone(), receive)?;
        let rx = Arc::new(RxShared {
            reassembler: Mutex::new(Receivers::new(reassembler, receive)),
            progress: Notify::new(),
            datagrams_read: AtomicU64::new(0),
            lossy_sent: Mutex::new(LossyReports::default()),
            message_stream: std::sync::atomic::AtomicBool::new(false),
            point_to_point_stream: std::sync::atomic::AtomicBool::new(false),
        });
        let tx = Arc::new(TxShared {
            acked: Mutex::new(HashMap::new()),
            acked_notify: Notify::new(),
            layouts: Mutex::new(std::collections::HashSet::from([0])),
            peer_finished: tokio::sync::watch::Sender::new(false),
        });
        let (ended_tx, ended) = mpsc::unbounded_channel();
        let control_send = ControlTx::new(control_send);
        let (message_tx, message_rx) = messages::queue();
        let (p2p_tx, p2p_rx) = messages::queue();
        let tasks = vec![
            tokio::spawn(control_reader(
                conn.clone(),
                control_recv,
                control_send.clone(),
                tx.clone(),
                rx.clone(),
            )),
            tokio::spawn(stream_acceptor(
                conn.clone(),
                rx.clone(),
                control_send.clone(),
                ended_tx,
                message_tx,
                p2p_tx,
            )),
            tokio::spawn(datagram_reader(conn.clone(), rx.clone())),
        ];
        let linger = Arc::new(Linger::new(
            conn.clone(),
            control_send.clone(),
            tx.clone(),
            tasks,
        ));
        let peer_finished = tx.peer_finished.subscribe();
        Ok(Self {
            layout,
            sender: LinkSender {
                conn: conn.clone(),
                control: control_send,
                encoders: vec![encoder],
                encoder_template,
                levels,
                lanes: config.lanes,
                tx,
                timing,
                floor_mtu,
                last_sent: None,
                lost_seen: 0,
                mark,
                linger: linger.clone(),
            },
            receiver: LinkReceiver {
                conn,
                rx,
                ended,
                timing,
                peer_finished,
                messages: message_rx,
                point_to_point: Some(p2p_rx),
                _linger: linger,
            },
        })
    }

    /// The model layout both ends agreed on.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The sending half: this end's rounds, layouts and messages.
    pub fn sender(&mut self) -> &mut LinkSender {
        &mut self.sender
    }

    /// The receiving half: the peer's rounds and messages, and the
    /// receiver's counters.
    pub fn receiver(&mut self) -> &mut LinkReceiver {
        &mut self.receiver
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

    /// Closes the link in order, waiting at most [`CLOSE_WAIT`]; see
    /// [`close_within`](Self::close_within).
    pub async fn close(&self) -> Result<(), LinkError> {
        self.close_within(CLOSE_WAIT).await
    }

    /// Closes the link in order: this end stops confirming rounds (one
    /// that completes now was never taken with `recv_round`; its sender
    /// gets [`LinkError::PeerClosed`]), finishes its control stream behind
    /// the confirmations it wrote, waits until the peer's link has read
    /// them all (it finishes its own control stream in reply), and closes
    /// the connection. A receiver that closed the connection at once after
    /// its last `recv_round` could cut off that round's confirmation
    /// (quinn discards unsent stream data on close); the close frame also
    /// names the last round confirmed, so even then the peer's
    /// `send_round` of it succeeds, if the frame arrives.
    ///
    /// Returns [`LinkError::CloseUnacknowledged`] if the peer did not
    /// answer within `wait` (the connection is closed all the same), and
    /// [`LinkError::PeerClosed`] if the peer closed first without having
    /// read everything.
    pub async fn close_within(&self, wait: Duration) -> Result<(), LinkError> {
        self.sender.linger.close(wait).await
    }

    /// Closes the connection at once: whatever this end sent that the peer
    /// has not acknowledged is abandoned, except that the close frame
    /// still names the last round this end confirmed.
    pub fn close_now(&self) {
        self.sender.linger.close_now();
    }
}

fn protocol_close(conn: &Connection, why: &str) {
    tracing::warn!(why, "closing link: protocol error");
    conn.close(VarInt::from_u32(codes::PROTOCOL), why.as_bytes());
}

/// Reads one control message; `None` at a clean end.
pub(crate) async fn read_control(stream: &mut RecvStream) -> Result<Option<Vec<u8>>, LinkError> {
    framing::read_frame(stream, MAX_MESSAGE)
        .await
        .map_err(|e| match e {
            FrameError::Truncated => HandshakeError::Truncated.into(),
            FrameError::TooLarge { len, .. } => HandshakeError::TooLarge(len).into(),
            FrameError::Read(e) => read_error(e),
        })
}

/// Writes one control message.
pub(crate) async fn write_control(stream: &mut SendStream, msg: Control) -> Result<(), LinkError> {
    let frame = Bytes::from(framed(&msg.encode()));
    framing::write_frame(stream, frame)
        .await
        .map_err(write_error)
}
