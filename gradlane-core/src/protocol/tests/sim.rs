//! A simulated pair: a sending end and a receiving end, each a driver of
//! this module's machines around the real encoder and reassembler, joined
//! by a deterministic model of a path, advanced by a loop over simulated
//! time. One seed, one run; no clock, no socket.
//!
//! The transport is a small model of what the machines rely on in quinn:
//! - a link per direction with a rate, a delay, jitter, reordering and
//!   random loss, one frame a packet;
//! - streams delivered in order and exactly, lost frames resent once
//!   their loss is declared (a retransmission timeout after sending);
//! - datagrams never resent, and sent ahead of stream data;
//! - streams sent by priority (the lanes, then the control stream, then
//!   the lossy streams);
//! - a count of stream bytes sent less those declared lost, and of
//!   packets declared lost;
//! - a close that discards unsent data, its frame resent a few times
//!   until it gets through.

use super::super::*;
use crate::control::{CloseNote, Control};
use crate::encode::{EncodedRound, Encoder, EncoderConfig};
use crate::layout::{Layout, TensorSpec};
use crate::reassembly::{Channel, Reassembler, ReassemblyConfig, Round, StreamDecoder};
use crate::rng::SplitMix64;
use crate::wire::{self, DATA_HEADER_LEN};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// The largest frame a simulated packet carries.
const MTU: usize = 1200;
/// A datagram's largest payload: quinn's at the 1200-byte floor.
const DATAGRAM: usize = 1162;
/// A lossy packet's size when the lossy part goes on streams.
const LOSSY_STREAM_PACKET: usize = 64 << 10;
/// Important bytes handed to a lane at a time.
const PIECE: usize = 4 << 10;
/// Attempts at delivering a close frame before the peer times out.
const CLOSE_ATTEMPTS: u32 = 8;
/// How long after the last close attempt the peer's connection times out.
const IDLE_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest simulated time a run may take: a run past it is stuck.
const LIMIT: Duration = Duration::from_secs(120);

const CONTROL: u64 = 0;

/// The path between the ends, the same both ways.
#[derive(Debug, Clone, Copy)]
pub(super) struct PathModel {
    /// Probability that a packet is lost.
    pub loss: f64,
    /// One-way delay.
    pub delay: Duration,
    /// Extra delay, uniform in `[0, jitter)` per packet.
    pub jitter: Duration,
    /// Probability that a packet is held back by `hold`.
    pub reorder: f64,
    /// How long a packet held back comes after the others.
    pub hold: Duration,
    /// Bytes a second.
    pub rate: u64,
}

impl PathModel {
    /// A 100 Mbit/s path with a 2 ms delay, 0.5 ms of jitter and 1% of
    /// packets held back by 2 ms, losing `loss`.
    pub(super) fn lossy(loss: f64) -> Self {
        Self {
            loss,
            delay: Duration::from_millis(2),
            jitter: Duration::from_micros(500),
            reorder: 0.01,
            hold: Duration::from_millis(2),
            rate: 12_500_000,
        }
    }

    fn rto(&self) -> Duration {
        self.delay * 3 + self.jitter + Duration::from_millis(1)
    }
}

/// When the receiving end closes its link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Leave {
    /// Never: it takes every round.
    Stay,
    /// In order ([`CloseInOrder`]; dropping a link runs the same close
    /// in the background) at the `n`th event of the run.
    Close(u64),
    /// At once, with the close note, at the `n`th event.
    CloseNow(u64),
}

/// What the sender's driver does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Abandon {
    /// Sends every round to its end.
    Never,
    /// Gives round `round` up at the `at`th event (its caller dropped
    /// `send_round`), then goes on with the next.
    At { round: u32, at: u64 },
}

/// One run's settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scenario {
    pub seed: u64,
    pub path: PathModel,
    pub timing: RoundTiming,
    pub rounds: u32,
    pub lanes: usize,
    pub leave: Leave,
    pub abandon: Abandon,
}

impl Scenario {
    pub(super) fn new(seed: u64, loss: f64) -> Self {
        Self {
            seed,
            path: PathModel::lossy(loss),
            timing: RoundTiming::default(),
            rounds: 3,
            lanes: 2,
            leave: Leave::Stay,
            abandon: Abandon::Never,
        }
    }
}

/// What a run did, for the tests to check.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Every round's gradients, by index.
    pub grads: Vec<Vec<Vec<f32>>>,
    /// The classes of every round's chunks, by index (empty for a round
    /// that never started).
    pub classes: Vec<Vec<u8>>,
    /// The rounds delivered, in delivery order.
    pub delivered: Vec<Round>,
    /// The rounds the receiver confirmed.
    pub confirmed: BTreeSet<u32>,
    /// Each round's outcome at its sender.
    pub sent: BTreeMap<u32, Result<(), SendFailure>>,
    /// Which rounds sent their lossy part on streams.
    pub on_stream: BTreeMap<u32, bool>,
    /// Per round: whether the transport declared a packet lost between
    /// the start of the round before and this round's start.
    pub loss_declared_before: BTreeMap<u32, bool>,
    /// Per round: whether every important byte had left at least once
    /// when the lossy part was released (or the peer had confirmed).
    pub released_after_important: BTreeMap<u32, bool>,
    /// Lossy payload bytes lost on the path (datagrams are never resent).
    pub lossy_lost: u64,
    /// Late bytes still buffered at the end.
    pub late_buffered: u64,
    /// The receiver's counters at the end.
    pub counters: crate::reassembly::ReceiverCounters,
    /// How the receiver's orderly close ended, if it closed in order.
    pub close: Option<CloseOutcome>,
    /// A close frame reached the sender.
    pub close_delivered: bool,
    /// Events the run took.
    pub events: u64,
    /// Simulated time the run took.
    pub elapsed: Duration,
}

#[derive(Debug, Clone)]
enum Frame {
    /// Piece `index` of stream `id`; `fin` ends the stream after it.
    Stream {
        id: u64,
        index: u64,
        data: StreamData,
        fin: bool,
    },
    Reset {
        id: u64,
    },
    Datagram(Bytes),
    Close(CloseNote),
}

#[derive(Debug, Clone)]
enum StreamData {
    Bytes(Bytes),
    Control(Control),
    /// A lone end of stream.
    None,
}

impl Frame {
    fn len(&self) -> usize {
        match self {
            Frame::Stream {
                data: StreamData::Bytes(b),
                ..
            } => b.len(),
            Frame::Datagram(b) => b.len(),
            _ => 16,
        }
    }
}

struct OutStream {
    priority: i32,
    queue: VecDeque<(StreamData, bool)>,
    next: u64,
}

/// One direction's sending side.
#[derive(Default)]
struct Outgoing {
    streams: BTreeMap<u64, OutStream>,
    datagrams: VecDeque<Bytes>,
    /// Frames whose loss was declared, to send again first.
    resend: VecDeque<Frame>,
    /// Streams reset: their frames are never sent again.
    reset: BTreeSet<u64>,
    sent_bytes: u64,
    /// Stream bytes sent again after their loss was declared.
    resent_bytes: u64,
    lost_packets: u64,
    link_free: Option<Instant>,
    pump_at: Option<Instant>,
    next_id: u64,
    closed: bool,
}

impl Outgoing {
    fn open(&mut self, priority: i32) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.streams.insert(
            id,
            OutStream {
                priority,
                queue: VecDeque::new(),
                next: 0,
            },
        );
        id
    }

    fn write(&mut self, id: u64, data: &[u8]) {
        let s = self.streams.entry(id).or_insert(OutStream {
            priority: 0,
            queue: VecDeque::new(),
            next: 0,
        });
        for piece in data.chunks(MTU) {
            s.queue
                .push_back((StreamData::Bytes(Bytes::copy_from_slice(piece)), false));
        }
    }

    fn control(&mut self, msg: Control) {
        let s = self.streams.entry(CONTROL).or_insert(OutStream {
            priority: 0,
            queue: VecDeque::new(),
            next: 0,
        });
        s.queue.push_back((StreamData::Control(msg), false));
    }

    fn finish(&mut self, id: u64) {
        let s = self.streams.entry(id).or_insert(OutStream {
            priority: 0,
            queue: VecDeque::new(),
            next: 0,
        });
        s.queue.push_back((StreamData::None, true));
    }

    fn reset(&mut self, id: u64) {
        if self.reset.insert(id) {
            self.streams.remove(&id);
            self.resend.push_back(Frame::Reset { id });
        }
    }

    fn next_frame(&mut self) -> Option<Frame> {
        if self.closed {
            return None;
        }
        while let Some(f) = self.resend.pop_front() {
            match &f {
                Frame::Stream { id, .. } if self.reset.contains(id) => continue,
                _ => {
                    self.resent_bytes += f.len() as u64;
                    return Some(f);
                }
            }
        }
        if let Some(d) = self.datagrams.pop_front() {
            return Some(Frame::Datagram(d));
        }
        let (&id, s) = self
            .streams
            .iter_mut()
            .filter(|(_, s)| !s.queue.is_empty())
            .max_by_key(|(&id, s)| (s.priority, std::cmp::Reverse(id)))?;
        let (data, mut fin) = s.queue.pop_front()?;
        // A finish right behind the data goes in the same frame.
        if matches!(s.queue.front(), Some((StreamData::None, true))) {
            s.queue.pop_front();
            fin = true;
        }
        let index = s.next;
        s.next += 1;
        if s.queue.is_empty() && fin && id != CONTROL {
            self.streams.remove(&id);
        }
        Some(Frame::Stream {
            id,
            index,
            data,
            fin,
        })
    }
}

#[derive(Default)]
struct InStream {
    next: u64,
    pending: BTreeMap<u64, (StreamData, bool)>,
    finished: bool,
}

/// One direction's receiving side: streams in order.
#[derive(Default)]
struct Incoming {
    streams: BTreeMap<u64, InStream>,
    reset: BTreeSet<u64>,
    datagrams: u64,
}

impl Incoming {
    /// Takes a stream frame; returns what is now in order.
    fn stream(
        &mut self,
        id: u64,
        index: u64,
        data: StreamData,
        fin: bool,
    ) -> Vec<(StreamData, bool)> {
        if self.reset.contains(&id) {
            return Vec::new();
        }
        let s = self.streams.entry(id).or_default();
        if s.finished || index < s.next {
            return Vec::new();
        }
        s.pending.insert(index, (data, fin));
        let mut out = Vec::new();
        while let Some(piece) = s.pending.remove(&s.next) {
            s.next += 1;
            s.finished |= piece.1;
            out.push(piece);
        }
        out
    }
}

#[derive(Debug)]
enum Event {
    /// A direction's link may send its next packet (0: sender to
    /// receiver, 1: back).
    Pump(usize),
    Arrive(usize, Frame),
    /// A frame's loss is declared at its sender.
    LossDeclared(usize, Frame),
    SendTimer,
    DeliverTimer,
    CloseTimer,
    /// The sender's connection timed out (no close frame got through).
    IdleTimeout,
}

struct Current {
    machine: RoundSend,
    encoded: EncodedRound,
    streams: Vec<u64>,
    /// The transport's count of resent bytes when the round started.
    resent_before: u64,
}

struct Sender {
    encoder: Encoder,
    out: Outgoing,
    current: Option<Current>,
    next_round: u32,
    acked: BTreeMap<u32, Instant>,
    peer_finished: bool,
    closed: Option<Option<CloseNote>>,
    lost_seen: u64,
    /// Stream bytes of each lane stream left to send for the first time.
    unsent: BTreeMap<u64, u64>,
    /// The control stream from the receiver.
    incoming: Incoming,
}

struct Receiver {
    reassembler: Reassembler,
    decoders: BTreeMap<u64, StreamDecoder>,
    confirmations: Confirmations,
    reports: LossyReports,
    incoming: Incoming,
    out: Outgoing,
    ended: VecDeque<u32>,
    waiting: Option<(u32, DeliveryWait)>,
    taking: bool,
    closing: Option<CloseInOrder>,
    peer_finished: bool,
    gone: bool,
}

/// The simulated pair.
pub(super) struct Pair {
    s: Scenario,
    t0: Instant,
    now: Instant,
    rng: SplitMix64,
    events: BTreeMap<(Instant, u64), Event>,
    seq: u64,
    count: u64,
    sender: Sender,
    receiver: Receiver,
    layout: Layout,
    out: Outcome,
    send_timer: Option<Instant>,
    deliver_timer: Option<Instant>,
    /// Changes of state that need no event: the loop goes on while they
    /// grow.
    moves: u64,
}

/// The model the simulated rounds have: a convolution chunked per kernel,
/// a dense matrix in blocks, a bias.
pub(super) fn layout() -> Layout {
    Layout::new(vec![
        TensorSpec::conv2d("conv.weight", [16, 8, 3, 3]),
        TensorSpec::dense("fc.weight", [32, 64]),
        TensorSpec::dense("fc.bias", [32]),
    ])
    .expect("a valid layout")
}

impl Pair {
    pub(super) fn new(s: Scenario) -> Self {
        let layout = layout();
        let t0 = Instant::now();
        let encoder = Encoder::new(&layout, EncoderConfig::default()).expect("encoder");
        let reassembler =
            Reassembler::new(layout.clone(), ReassemblyConfig::default()).expect("reassembler");
        Self {
            s,
            t0,
            now: t0,
            rng: SplitMix64::new(s.seed),
            events: BTreeMap::new(),
            seq: 0,
            count: 0,
            sender: Sender {
                encoder,
                out: Outgoing::default(),
                current: None,
                next_round: 0,
                acked: BTreeMap::new(),
                peer_finished: false,
                closed: None,
                lost_seen: 0,
                unsent: BTreeMap::new(),
                incoming: Incoming::default(),
            },
            receiver: Receiver {
                reassembler,
                decoders: BTreeMap::new(),
                confirmations: Confirmations::default(),
                reports: LossyReports::default(),
                incoming: Incoming::default(),
                out: Outgoing::default(),
                ended: VecDeque::new(),
                waiting: None,
                taking: true,
                closing: None,
                peer_finished: false,
                gone: false,
            },
            layout,
            out: Outcome::default(),
            send_timer: None,
            deliver_timer: None,
            moves: 0,
        }
    }

    /// Runs until nothing is left to happen.
    pub(super) fn run(mut self) -> Outcome {
        self.step();
        loop {
            let Some(((at, _), event)) = self.events.pop_first() else {
                // A receiver set to leave after the last event leaves now.
                if matches!(self.s.leave, Leave::Close(_) | Leave::CloseNow(_))
                    && !self.receiver.gone
                    && self.receiver.closing.is_none()
                {
                    self.leave();
                    self.step();
                    continue;
                }
                break;
            };
            self.now = at;
            assert!(
                at - self.t0 < LIMIT,
                "seed {}: the run is stuck ({:?})",
                self.s.seed,
                self.s
            );
            self.count += 1;
            self.handle(event);
            match self.s.leave {
                Leave::Close(n) | Leave::CloseNow(n) if n == self.count => self.leave(),
                _ => {}
            }
            if let Abandon::At { round, at } = self.s.abandon {
                if at == self.count {
                    self.abandon(round);
                }
            }
            self.step();
        }
        let r = &self.receiver;
        self.out.late_buffered = r.reassembler.late_buffered_bytes() as u64;
        self.out.counters = r.reassembler.counters();
        self.out.events = self.count;
        self.out.elapsed = self.now - self.t0;
        self.out
    }

    fn at(&mut self, when: Instant, event: Event) {
        self.seq += 1;
        self.events.insert((when, self.seq), event);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Pump(dir) => {
                self.link(dir).pump_at = None;
            }
            Event::Arrive(0, frame) => self.receiver_gets(frame),
            Event::Arrive(_, frame) => self.sender_gets(frame),
            Event::LossDeclared(dir, frame) => {
                let link = self.link(dir);
                if link.closed {
                    return;
                }
                link.lost_packets += 1;
                if let Frame::Stream { .. } | Frame::Reset { .. } = frame {
                    link.sent_bytes = link.sent_bytes.saturating_sub(frame.len() as u64);
                    link.resend.push_back(frame);
                }
            }
            Event::SendTimer => {
                self.send_timer = None;
                if let Some(c) = &mut self.sender.current {
                    c.machine.handle_timeout(self.now);
                }
            }
            Event::DeliverTimer => {
                self.deliver_timer = None;
                let due = self
                    .receiver
                    .waiting
                    .as_ref()
                    .is_some_and(|(_, w)| w.timed_out(self.now));
                if due {
                    self.deliver();
                }
            }
            Event::CloseTimer => {
                if let Some(c) = &mut self.receiver.closing {
                    c.handle_timeout(self.now);
                }
            }
            Event::IdleTimeout => {
                if self.sender.closed.is_none() {
                    self.sender.closed = Some(None);
                }
            }
        }
    }

    fn link(&mut self, dir: usize) -> &mut Outgoing {
        match dir {
            0 => &mut self.sender.out,
            _ => &mut self.receiver.out,
        }
    }

    /// Moves both ends on as far as they can go now, then sends what they
    /// queued.
    fn step(&mut self) {
        for _ in 0..64 {
            let before = (self.seq, self.moves);
            self.drive_sender();
            self.drive_receiver();
            self.pump(0);
            self.pump(1);
            if (self.seq, self.moves) == before {
                return;
            }
        }
        panic!("seed {}: the ends do not settle", self.s.seed);
    }

    fn pump(&mut self, dir: usize) {
        let now = self.now;
        let path = self.s.path;
        loop {
            let link = self.link(dir);
            let free = link.link_free.unwrap_or(now).max(now);
            if free > now {
                if link.pump_at.is_none() {
                    link.pump_at = Some(free);
                    self.at(free, Event::Pump(dir));
                }
                return;
            }
            let Some(frame) = link.next_frame() else {
                return;
            };
            let wire = (frame.len() + 40) as u64;
            link.link_free = Some(now + Duration::from_nanos(wire * 1_000_000_000 / path.rate));
            if let Frame::Stream { .. } | Frame::Reset { .. } = frame {
                link.sent_bytes += frame.len() as u64;
            }
            if dir == 0 {
                if let Frame::Stream {
                    id,
                    data: StreamData::Bytes(b),
                    ..
                } = &frame
                {
                    if let Some(left) = self.sender.unsent.get_mut(id) {
                        *left = left.saturating_sub(b.len() as u64);
                    }
                }
                if let Frame::Datagram(_) = frame {
                    self.check_release_order();
                }
            }
            let lost = self.rng.next_f64() < path.loss;
            if lost {
                if let Frame::Datagram(d) = &frame {
                    self.out.lossy_lost += payload_bytes(d);
                }
                self.at(now + path.rto(), Event::LossDeclared(dir, frame));
                continue;
            }
            let mut delay = path.delay + path.jitter.mul_f64(self.rng.next_f64());
            if self.rng.next_f64() < path.reorder {
                delay += path.hold;
            }
            self.at(now + delay, Event::Arrive(dir, frame));
        }
    }

    /// A datagram leaves: the round's important part must have left
    /// whole at least once before, unless the peer confirmed it.
    fn check_release_order(&mut self) {
        let Some(c) = &self.sender.current else {
            return;
        };
        let round = c.machine.plan().round;
        if self.out.released_after_important.contains_key(&round) {
            return;
        }
        let left = c
            .streams
            .iter()
            .filter_map(|id| self.sender.unsent.get(id))
            .sum::<u64>();
        // The transport's count of sent bytes also counts, once more,
        // what it resent of an older round after declaring it lost
        // before this round began: the lanes may be short of that much.
        let ok = left <= self.sender.out.resent_bytes - c.resent_before
            || self.sender.acked.contains_key(&round);
        self.out.released_after_important.insert(round, ok);
    }

    fn drive_sender(&mut self) {
        let now = self.now;
        // The sender runs at most one round ahead of what the receiver
        // took, as the ranks of a collective do: a receiver holds at most
        // a few rounds open (`ReassemblyConfig::max_open_rounds`).
        let taken = self.receiver.reassembler.last_delivered();
        let ahead = taken.map_or(self.sender.next_round, |t| {
            self.sender.next_round.saturating_sub(t + 1)
        });
        if self.sender.current.is_none()
            && self.sender.next_round < self.s.rounds
            && (ahead < 2 || !self.receiver.taking)
        {
            self.start_round();
        }
        let Some(c) = &mut self.sender.current else {
            return;
        };
        let round = c.machine.plan().round;
        // Confirmations first: they are read before the peer's finish.
        if let Some(&at) = self.sender.acked.get(&round) {
            c.machine.handle(now, SendEvent::Confirmed { at });
        }
        if self.sender.peer_finished {
            c.machine.handle(now, SendEvent::PeerFinished);
        }
        if let Some(note) = self.sender.closed {
            c.machine.handle(
                now,
                SendEvent::Failed {
                    note,
                    peer_closed: false,
                },
            );
        }
        sample(c, &self.sender.out, now);
        while let Some(action) = c.machine.poll_action() {
            match action {
                SendAction::ReleaseLossy => {
                    release_lossy(&mut self.sender.out, c, self.s.lanes);
                    c.machine.handle(now, SendEvent::LossyQueued);
                    sample(c, &self.sender.out, now);
                }
                SendAction::ReportLossySent => self.sender.out.control(Control::LossySent(round)),
                SendAction::ResetStreams => {
                    for id in &c.streams {
                        self.sender.out.reset(*id);
                    }
                    // Queued datagrams of the round stay queued, as in quinn.
                }
            }
        }
        if let Some(result) = c.machine.outcome() {
            self.out.sent.insert(round, result.map(|_| ()));
            self.sender.acked.retain(|&r, _| r > round);
            let done = self.sender.current.take().expect("a current round");
            self.sender.encoder.recycle(done.encoded);
            self.moves += 1;
            return;
        }
        if let Some(t) = c.machine.poll_timeout() {
            if self.send_timer != Some(t) {
                self.send_timer = Some(t);
                self.at(t, Event::SendTimer);
            }
        }
    }

    fn start_round(&mut self) {
        let round = self.sender.next_round;
        self.sender.next_round += 1;
        let grads =
            crate::presets::gradients(&self.layout, self.s.seed.wrapping_mul(31) + round as u64);
        let sender = &mut self.sender;
        let lost = sender.out.lost_packets;
        let declared = lost != sender.lost_seen;
        let on_stream = self.s.timing.lossy_on_stream(declared, false);
        sender.lost_seen = lost;
        let max = if on_stream {
            LOSSY_STREAM_PACKET
        } else {
            DATAGRAM
        };
        let mut framer = sender
            .encoder
            .start(round, &grads, max)
            .expect("valid gradients");
        let reliable_len = framer.reliable_len() as u64;
        let mut streams = Vec::new();
        let lanes: Vec<u64> = (0..self.s.lanes)
            .map(|_| sender.out.open(i32::MAX))
            .collect();
        let mut next = 0;
        while let Some(piece) = framer.next_reliable(&grads, PIECE).expect("framing") {
            let lane = lanes[next % lanes.len()];
            next += 1;
            sender.out.write(lane, &piece);
            *sender.unsent.entry(lane).or_default() += piece.len() as u64;
        }
        for &lane in &lanes {
            sender.out.finish(lane);
            streams.push(lane);
        }
        let encoded = framer.finish(&grads).expect("framing");
        let plan = SendPlan {
            round,
            lossy_on_stream: on_stream,
            release_on_sent: self.s.timing.release_on_sent(false),
            sent_before: sender.out.sent_bytes,
            reliable_len,
            lossy_len: encoded.wire_payload[1..].iter().sum(),
            lossy_until: None,
        };
        let mut machine = RoundSend::new(plan);
        machine.handle(self.now, SendEvent::ImportantHanded);
        self.out.on_stream.insert(round, on_stream);
        self.out.loss_declared_before.insert(round, declared);
        self.out.grads.push(grads);
        self.out.classes.push(encoded.classes.clone());
        sender.current = Some(Current {
            machine,
            encoded,
            streams,
            resent_before: sender.out.resent_bytes,
        });
        self.moves += 1;
    }

    /// The sender's caller drops `send_round` of `round`.
    fn abandon(&mut self, round: u32) {
        let Some(c) = &mut self.sender.current else {
            return;
        };
        if c.machine.plan().round == round {
            c.machine.abandon();
        }
    }

    fn sender_gets(&mut self, frame: Frame) {
        if self.sender.closed.is_some() {
            return;
        }
        match frame {
            Frame::Stream {
                id,
                index,
                data,
                fin,
            } => {
                for (data, fin) in self.sender.incoming.stream(id, index, data, fin) {
                    if let StreamData::Control(Control::ImportantReceived(r)) = data {
                        self.sender.acked.insert(r, self.now);
                    }
                    if fin && id == CONTROL {
                        // The peer is closing and all it sent is read:
                        // finish this end's control stream in reply.
                        self.sender.out.finish(CONTROL);
                        self.sender.peer_finished = true;
                    }
                }
            }
            Frame::Close(note) => {
                self.out.close_delivered = true;
                self.sender.closed = Some(Some(note));
                self.sender.out.closed = true;
            }
            Frame::Reset { .. } | Frame::Datagram(_) => {}
        }
    }

    fn receiver_gets(&mut self, frame: Frame) {
        let r = &mut self.receiver;
        if r.gone {
            return;
        }
        match frame {
            Frame::Datagram(d) => {
                r.incoming.datagrams += 1;
                r.reassembler
                    .push(&d, Channel::Lossy)
                    .expect("a well-formed datagram");
                self.reevaluate();
            }
            Frame::Reset { id } => {
                r.incoming.reset.insert(id);
                r.incoming.streams.remove(&id);
                r.decoders.remove(&id);
            }
            Frame::Stream {
                id,
                index,
                data,
                fin,
            } => {
                let ready = r.incoming.stream(id, index, data, fin);
                for (data, fin) in ready {
                    match data {
                        StreamData::Control(Control::LossySent(round)) => {
                            let r = &mut self.receiver;
                            r.reports.reported(round, r.incoming.datagrams);
                        }
                        StreamData::Control(_) => {}
                        StreamData::Bytes(b) => {
                            let r = &mut self.receiver;
                            let decoder = r.decoders.entry(id).or_default();
                            let out = decoder
                                .feed(&mut r.reassembler, &b)
                                .expect("a well-formed stream");
                            if let Some(round) = out.completed {
                                if r.confirmations.complete(round) {
                                    self.out.confirmed.insert(round);
                                    r.out.control(Control::ImportantReceived(round));
                                    if r.taking {
                                        r.ended.push_back(round);
                                    }
                                }
                            }
                        }
                        StreamData::None => {}
                    }
                    let r = &mut self.receiver;
                    if fin {
                        if id == CONTROL {
                            r.peer_finished = true;
                            if let Some(c) = &mut r.closing {
                                c.peer_finished();
                            }
                        } else if let Some(d) = r.decoders.remove(&id) {
                            assert!(d.at_boundary(), "a stream ends inside a segment");
                        }
                    }
                }
                self.reevaluate();
            }
            Frame::Close(_) => {}
        }
    }

    fn drive_receiver(&mut self) {
        let r = &mut self.receiver;
        if r.gone {
            return;
        }
        if let Some(c) = &r.closing {
            if let Some(outcome) = c.outcome() {
                let note = c.note();
                self.out.close = Some(outcome);
                self.close_connection(note);
                return;
            }
            if let Some(t) = c.poll_timeout() {
                if !self.events.values().any(|e| matches!(e, Event::CloseTimer)) {
                    self.at(t, Event::CloseTimer);
                }
            }
        }
        let r = &mut self.receiver;
        if r.waiting.is_none() && r.taking {
            while let Some(round) = r.ended.pop_front() {
                if still_to_deliver(round, r.reassembler.last_delivered()) {
                    let rtt = self.s.path.delay * 2;
                    r.waiting = Some((round, DeliveryWait::new(self.now, self.s.timing, rtt)));
                    self.moves += 1;
                    self.reevaluate();
                    break;
                }
            }
        }
    }

    /// Re-decides the delivery under way, if any.
    fn reevaluate(&mut self) {
        let r = &mut self.receiver;
        let Some((round, wait)) = &mut r.waiting else {
            return;
        };
        let progress = LossyProgress {
            held: r.reassembler.lossy_progress(*round),
            placed: r.incoming.datagrams,
            reported: r.reports.get(*round),
        };
        match wait.progress(self.now, progress) {
            Delivery::Now => self.deliver(),
            Delivery::WaitUntil(t) => {
                if self.deliver_timer.is_none_or(|d| d != t) {
                    self.deliver_timer = Some(t);
                    self.at(t, Event::DeliverTimer);
                }
            }
        }
    }

    fn deliver(&mut self) {
        let r = &mut self.receiver;
        let Some((round, _)) = r.waiting.take() else {
            return;
        };
        self.moves += 1;
        let delivered = r.reassembler.deliver(round).expect("an open round");
        r.reports.delivered(round);
        self.out.delivered.push(delivered);
    }

    /// The receiving end closes its link.
    fn leave(&mut self) {
        let now = self.now;
        let r = &mut self.receiver;
        if r.gone || r.closing.is_some() {
            return;
        }
        r.taking = false;
        r.waiting = None;
        r.ended.clear();
        let last = r.confirmations.begin_close();
        match self.s.leave {
            Leave::CloseNow(_) => {
                let note = CloseNote {
                    last_confirmed: last,
                    read_all: r.peer_finished,
                };
                self.close_connection(note);
            }
            _ => {
                r.out.finish(CONTROL);
                let mut close = CloseInOrder::new(now, Duration::from_secs(5), last, false);
                if r.peer_finished {
                    close.peer_finished();
                }
                r.closing = Some(close);
            }
        }
    }

    /// The receiver closes its connection: unsent data is discarded; the
    /// close frame is tried until it gets through or the attempts run out.
    fn close_connection(&mut self, note: CloseNote) {
        let r = &mut self.receiver;
        r.gone = true;
        r.closing = None;
        r.out = Outgoing {
            closed: true,
            ..Outgoing::default()
        };
        let path = self.s.path;
        let mut at = self.now;
        for _ in 0..CLOSE_ATTEMPTS {
            if self.rng.next_f64() >= path.loss {
                self.at(at + path.delay, Event::Arrive(1, Frame::Close(note)));
                return;
            }
            at += path.rto();
        }
        self.at(at + IDLE_TIMEOUT, Event::IdleTimeout);
    }
}

/// Feeds the round the counter it waits on. The simulated transport
/// looks after every event: what quinn's driver polls for.
fn sample(c: &mut Current, out: &Outgoing, now: Instant) {
    match c.machine.wants() {
        Some(Counter::SentBytes) => c.machine.handle(now, SendEvent::SentBytes(out.sent_bytes)),
        Some(Counter::DatagramQueue) if out.datagrams.is_empty() => {
            c.machine.handle(now, SendEvent::DatagramsDrained)
        }
        _ => {}
    }
}

/// Opens the round's lossy streams or queues its datagrams.
fn release_lossy(out: &mut Outgoing, c: &mut Current, lanes: usize) {
    if c.machine.plan().lossy_on_stream {
        let packets: Vec<&Bytes> = c.encoded.lossy.iter().flatten().collect();
        if packets.is_empty() {
            return;
        }
        let ids: Vec<u64> = (0..lanes.max(1)).map(|_| out.open(-1)).collect();
        for (i, p) in packets.into_iter().enumerate() {
            out.write(ids[i % ids.len()], p);
        }
        for id in ids {
            out.finish(id);
            c.streams.push(id);
        }
    } else {
        out.datagrams
            .extend(c.encoded.lossy.iter().flatten().cloned());
    }
}

/// Payload bytes of a packet framed by the encoder.
fn payload_bytes(d: &[u8]) -> u64 {
    let headers = wire::decode_all(d).count() * DATA_HEADER_LEN;
    (d.len() - headers.min(d.len())) as u64
}
