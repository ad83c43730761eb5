//! Sending a round: classing it, handing its important part to the lanes
//! (`lanes`), releasing its lossy part (`lossy`) when the round's machine
//! says so, and waiting for the peer's confirmation; `in_flight` guards the
//! round until then.

use super::in_flight::InFlight;
use super::lanes::{frame_pipelined, lane_count, write_lane};
use super::lossy::{lossy_datagram_limit, ClassGuard, LossyQueue};
use super::*;
use crate::blocking;
use gradlane_core::classify::Class;
use gradlane_core::protocol::{Counter, RoundSend, SendAction, SendEvent, SendFailure, SendPlan};

impl LinkSender {
    /// Sends one round; `grads` in layout order.
    ///
    /// Returns once the peer has confirmed every important chunk and every
    /// datagram was queued (or dropped by the deadline), so the caller may
    /// reuse `grads` right away.
    ///
    /// Round indexes must increase from one call to the next (gaps are
    /// fine); an index at or below the last one sent is refused with
    /// [`LinkError::RoundOrder`] before anything is sent. A round whose
    /// gradients were refused ([`LinkError::Encode`]) sent nothing, so its
    /// index may be used again; a round that failed or was cancelled later
    /// counts as sent.
    ///
    /// Dropping the returned future (a timeout, a `select!`) before the
    /// peer confirmed the important part abandons the round: its streams
    /// are reset, so quinn stops sending them, and the peer skips the round
    /// unless its important part had all arrived.
    pub async fn send_round<G: AsRef<[f32]>>(
        &mut self,
        round: u32,
        grads: &[G],
    ) -> Result<SendReport, LinkError> {
        self.send_round_on(0, round, grads).await
    }

    /// Sends one round of layout `layout` (0, the handshake's, or one
    /// [registered](Self::register_layout)); otherwise as
    /// [`send_round`](Self::send_round). Round indexes are one sequence per
    /// link, across layouts.
    pub async fn send_round_on<G: AsRef<[f32]>>(
        &mut self,
        layout: LayoutId,
        round: u32,
        grads: &[G],
    ) -> Result<SendReport, LinkError> {
        self.send_round_until(layout, round, grads, None).await
    }

    /// [`send_round_on`](Self::send_round_on) with a deadline for the lossy
    /// part ([`StepDeadline`](gradlane_core::protocol::StepDeadline)): its
    /// datagrams not queued by `lossy_until` are dropped (counted in
    /// [`SendReport::lossy_dropped`]), lowest level first, and the wait
    /// for those queued to leave ends there. A round with a deadline sends
    /// its lossy part as datagrams, and keeps no more of them in quinn's
    /// queue than leave in a few milliseconds, so that little is still
    /// going out after the deadline.
    pub async fn send_round_until<G: AsRef<[f32]>>(
        &mut self,
        layout: LayoutId,
        round: u32,
        grads: &[G],
        lossy_until: Option<Instant>,
    ) -> Result<SendReport, LinkError> {
        let span = tracing::info_span!("send_round", round, layout);
        self.send_round_inner(layout, round, grads, None, None, lossy_until)
            .instrument(span)
            .await
    }

    /// [`send_round_until`](Self::send_round_until) with the caller's
    /// `classes` (one per chunk of the layout's plan:
    /// [`IMPORTANT`](gradlane_core::classify::IMPORTANT) or a lossy level),
    /// not scored and classed by the link: for a round whose split must be
    /// the same on several links and known to the sender (an owner's
    /// return of a summed shard). A chunk holding a value that is not
    /// finite must be important ([`LinkError::Encode`] otherwise, before
    /// anything is sent).
    pub async fn send_round_classed_until<G: AsRef<[f32]>>(
        &mut self,
        layout: LayoutId,
        round: u32,
        grads: &[G],
        classes: &[Class],
        lossy_until: Option<Instant>,
    ) -> Result<SendReport, LinkError> {
        let span = tracing::info_span!("send_round", round, layout, classed = true);
        self.send_round_inner(layout, round, grads, None, Some(classes), lossy_until)
            .instrument(span)
            .await
    }

    /// Sends one round like [`send_round`](Self::send_round), from
    /// gradients the link may share instead of copy: the values of the
    /// important part's longer runs go to quinn as views of `grads`
    /// (see [`ZERO_COPY_MIN`](gradlane_core::encode::ZERO_COPY_MIN)), which saves
    /// copying most of the round once. quinn holds those views until the
    /// peer acknowledged them, which may be a little after this returns:
    /// [`Arc::get_mut`] tells when a tensor is the caller's alone again
    /// (and [`Arc::make_mut`] copies it if not).
    pub async fn send_round_shared(
        &mut self,
        round: u32,
        grads: &[Arc<Vec<f32>>],
    ) -> Result<SendReport, LinkError> {
        let span = tracing::info_span!("send_round", round, shared = true);
        let values: Vec<&[f32]> = grads.iter().map(|g| g.as_slice()).collect();
        let views: Vec<Bytes> = grads
            .iter()
            .map(|g| gradlane_core::encode::shared_f32_bytes(g.clone()))
            .collect();
        self.send_round_inner(0, round, &values, Some(&views), None, None)
            .instrument(span)
            .await
    }

    /// Reports the training loss to the classifier (adaptive ratio), for
    /// every layout of this end's.
    pub fn report_loss(&mut self, loss: f64) -> Result<(), LinkError> {
        for encoder in &mut self.encoders {
            encoder.report_loss(loss)?;
        }
        Ok(())
    }

    /// `shared`, if given, holds `grads` as little-endian bytes to take
    /// views of; `classes`, if given, is the round's classing.
    async fn send_round_inner<G: AsRef<[f32]>>(
        &mut self,
        layout: LayoutId,
        round: u32,
        grads: &[G],
        shared: Option<&[Bytes]>,
        classes: Option<&[Class]>,
        lossy_until: Option<Instant>,
    ) -> Result<SendReport, LinkError> {
        let start = Instant::now();
        if layout as usize >= self.encoders.len() {
            return Err(LinkError::UnknownLayout(layout));
        }
        if let Some(last) = self.last_sent.filter(|&last| round <= last) {
            return Err(LinkError::RoundOrder { round, last });
        }
        let max = lossy_datagram_limit(&self.conn, self.timing.datagram_size, self.floor_mtu)
            .ok_or(LinkError::NoDatagrams)?;
        // Datagrams only pay off on a path that loses packets: see
        // `LossyCarrier`. quinn does not count lost MTU probes here.
        let lost = self.conn.stats().path.lost_packets;
        // Marked packets are classed by time (see `marking`): the lossy
        // levels go as datagrams, one level after another, once the peer
        // holds the important part.
        let marked = self.mark.is_some();
        // Streams cannot be cut at a deadline: a round with one sends
        // datagrams.
        let on_stream =
            lossy_until.is_none() && self.timing.lossy_on_stream(lost != self.lost_seen, marked);
        let max = if on_stream { LOSSY_STREAM_PACKET } else { max };
        // Scoring and classing read the whole round: every check on the
        // gradients happens here, before a byte is sent.
        let encoder = &mut self.encoders[layout as usize];
        let framer = match classes {
            Some(classes) => blocking(|| encoder.start_classed(round, grads, classes, max))?,
            None => blocking(|| encoder.start(round, grads, max))?,
        };
        // From here on bytes of this round may reach the peer.
        self.last_sent = Some(round);
        self.lost_seen = lost;
        let plan = start.elapsed();
        tracing::debug!(?plan, "classed");
        let wire = framer.wire_payload();
        let mut report = SendReport {
            round,
            important_bytes: wire[0],
            classes: framer.classes().to_vec(),
            lossy_on_stream: on_stream,
            lossy_packets: vec![0; self.levels as usize],
            lossy_bytes: vec![0; self.levels as usize],
            lossy_dropped: vec![0; self.levels as usize],
            lossy_reframed: vec![0; self.levels as usize],
            plan,
            ..Default::default()
        };
        // The round's machine decides when the lossy part goes and what
        // the round's outcome is; until the peer confirmed the important
        // part, a return (an error, or the caller dropping this future)
        // abandons the round: see `InFlight`.
        let plan = SendPlan {
            round,
            lossy_on_stream: on_stream,
            release_on_sent: self.timing.release_on_sent(marked),
            sent_before: sent_bytes(&self.conn),
            reliable_len: framer.reliable_len() as u64,
            // What goes on the wire, in the levels' format.
            lossy_len: wire[1..].iter().sum(),
            lossy_until,
        };
        let mut flight = InFlight::new(RoundSend::new(plan), self.control.clone());
        let sending = Sending {
            start,
            on_stream,
            lossy_until,
        };
        let sent = self
            .send_framed(framer, grads, shared, sending, &mut report, &mut flight)
            .await;
        // The confirmation is all that decides the round: once the peer
        // has the important part, a failure in what follows (the lossy
        // part, the report of it; the peer closing the link at once after
        // taking the round) does not undo it.
        let confirmed = match sent {
            Ok((confirmed, encoded)) => {
                self.encoders[layout as usize].recycle(encoded);
                confirmed
            }
            Err(e) => self.settle(&mut flight, e)?,
        };
        flight.disarm();
        // This round's confirmation, and any of an abandoned older round
        // that came after its sender had gone.
        lock(&self.tx.acked).retain(|&r, _| r > round);
        report.important = confirmed.saturating_duration_since(start);
        if report.total.is_zero() {
            report.total = start.elapsed();
        }
        tracing::debug!(?report.important, "important data confirmed");
        Ok(report)
    }

    /// Sends a classed round: the important part on the lanes, then the
    /// lossy part; waits for the peer's confirmation. Returns when it came.
    async fn send_framed<G: AsRef<[f32]>>(
        &self,
        framer: RoundFramer,
        grads: &[G],
        shared: Option<&[Bytes]>,
        sending: Sending,
        report: &mut SendReport,
        flight: &mut InFlight,
    ) -> Result<(Instant, EncodedRound), LinkError> {
        let Sending {
            start,
            on_stream,
            lossy_until,
        } = sending;
        // Framing ~100 MB takes tens of milliseconds: the important pieces go
        // to quinn from one writer task per lane as soon as each is framed,
        // while this thread frames the next ones and then the datagrams.
        let lanes = lane_count(self.lanes, framer.reliable_len());
        let mut queues = Vec::with_capacity(lanes);
        let mut writers = Vec::with_capacity(lanes);
        for _ in 0..lanes {
            let stream = self.conn.open_uni().await.map_err(LinkError::from_conn)?;
            // Above the control stream and any stream of an older round.
            let _ = stream.set_priority(i32::MAX);
            let (pieces, queue) = mpsc::unbounded_channel();
            queues.push(pieces);
            writers.push(tokio::spawn(write_lane(stream, queue, flight.signal())));
        }
        let encoded = frame_pipelined(framer, grads, shared, on_stream, &queues).await;
        drop(queues);
        report.encode = start.elapsed();
        report.lanes = lanes;
        tracing::debug!(?report.encode, lanes, "framed");
        let mut written = Ok(());
        for w in writers {
            let w = w
                .await
                .map_err(|e| LinkError::Internal(format!("stream writer: {e}")))
                .and_then(|r| r);
            match w {
                Ok(Some(finished)) => flight.finished.push(finished),
                Ok(None) => {}
                Err(e) => written = written.and(Err(e)),
            }
        }
        let encoded = encoded?;
        written?;
        tracing::debug!(elapsed = ?start.elapsed(), "important data handed to quinn");
        // Every important byte is now in quinn's hands; the lanes'
        // flow-control windows (4 MiB each by default) bound how much of it
        // is still unsent. The machine releases the lossy part once quinn
        // has sent at least as many bytes as the lanes hold, a lower bound
        // for their last byte having left, or on the confirmation. (Lossy
        // streams wait too: quinn would send them only when no lane has
        // anything to send, but their bytes, queued early, would take up
        // quinn's connection-wide send window and the peer's flow-control
        // credit, which the lanes' writers then wait for.)
        flight
            .machine
            .handle(Instant::now(), SendEvent::ImportantHanded);
        let release = self.drive(flight, |m| m.lossy_sent()).await?;
        if release == Some(SendAction::ReleaseLossy) {
            report.lossy_start = start.elapsed();
            tracing::debug!(?report.lossy_start, "lossy data released");
            flight.datagrams_empty = self.conn.datagram_send_buffer_space();
            let frames_before = self.conn.stats().frame_tx.datagram;
            // Marks go back to the important class however this ends, once
            // the last datagram has left (the socket marks what quinn sends
            // when it sends it).
            let class = ClassGuard(self.mark.as_ref().filter(|_| !on_stream));
            if on_stream {
                let writers = self.start_lossy_streams(&encoded, report, flight).await?;
                for writer in writers {
                    let written = writer
                        .await
                        .map_err(|e| LinkError::Internal(format!("lossy stream writer: {e}")))??;
                    flight.finished.extend(written);
                }
            } else {
                let until = self.timing.lossy_deadline.map(|d| start + d);
                let until = match (until, lossy_until) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let queue = LossyQueue {
                    empty: flight.datagrams_empty,
                    shallow: lossy_until.is_some(),
                };
                self.send_lossy(&encoded, until, report, queue).await?;
            }
            flight
                .machine
                .handle(Instant::now(), SendEvent::LossyQueued);
            // Up to the streams' windows of the lossy part is still in
            // quinn's hands, below everything else on the connection; or
            // datagrams in its queue. The machine waits until they have
            // left: whatever this end sends next (the next round's lanes, a
            // message) would overtake lossy streams while the peer waits for
            // them; and the report of the datagrams sent must travel behind
            // the last of them, so the receiver stops waiting as soon as it
            // has what was not lost.
            while let Some(action) = self.drive(flight, |m| m.lossy_sent()).await? {
                if action == SendAction::ReportLossySent {
                    if flight.machine.datagrams_drained() == Some(true) {
                        // Queued but never put into a packet: discarded by
                        // quinn (a path MTU fall makes queued datagrams
                        // oversized). Datagrams are never resent, so frames
                        // sent count them one to one.
                        let frames = self.conn.stats().frame_tx.datagram - frames_before;
                        let queued: u64 = report.lossy_packets.iter().sum();
                        report.lossy_dropped_by_quinn = queued.saturating_sub(frames);
                    }
                    flight.report_lossy_sent().await;
                }
            }
            drop(class);
            report.total = start.elapsed();
            tracing::debug!(?report.total, on_stream, "lossy data sent");
        }
        while let Some(action) = self.drive(flight, |m| m.outcome().is_some()).await? {
            if action == SendAction::ReportLossySent {
                flight.report_lossy_sent().await;
            }
        }
        match flight.machine.outcome() {
            Some(Ok(confirmed)) => Ok((confirmed, encoded)),
            Some(Err(_)) => Err(LinkError::PeerClosed {
                round: Some(report.round),
            }),
            None => Err(LinkError::Internal("a round without an outcome".into())),
        }
    }

    /// What a failure while sending the round means, given what the peer
    /// said: the round arrived if the peer confirmed it, on the control
    /// stream or in the note of its close (the confirmation itself may
    /// have been cut off by the close); it did not if the peer closed in
    /// order without confirming it. Returns when the confirmation came.
    fn settle(&self, flight: &mut InFlight, e: LinkError) -> Result<Instant, LinkError> {
        let round = flight.machine.plan().round;
        let now = Instant::now();
        // Read before the confirmations: the control reader records every
        // confirmation before it marks the peer's stream finished.
        let peer_finished = *self.tx.peer_finished.borrow();
        if let Some(&at) = lock(&self.tx.acked).get(&round) {
            flight.machine.handle(now, SendEvent::Confirmed { at });
        }
        if peer_finished {
            flight.machine.handle(now, SendEvent::PeerFinished);
        }
        let note = self.conn.close_reason().and_then(|c| close::close_note(&c));
        let peer_closed = matches!(e, LinkError::PeerClosed { .. });
        flight
            .machine
            .handle(now, SendEvent::Failed { note, peer_closed });
        match flight.machine.outcome() {
            Some(Ok(at)) => {
                tracing::debug!(%e, "round confirmed before the failure");
                Ok(at)
            }
            Some(Err(SendFailure::PeerClosed)) => Err(LinkError::PeerClosed { round: Some(round) }),
            _ => Err(e),
        }
    }

    /// Feeds the round's machine what the connection tells (the peer's
    /// confirmation, its finish, quinn's counters, the machine's timer)
    /// until the machine asks for an action (returned) or `stop` holds of
    /// it, or its outcome is decided (`None`).
    async fn drive(
        &self,
        flight: &mut InFlight,
        stop: impl Fn(&RoundSend) -> bool,
    ) -> Result<Option<SendAction>, LinkError> {
        let round = flight.machine.plan().round;
        let mut finished = self.tx.peer_finished.subscribe();
        loop {
            let acked = self.tx.acked_notify.notified();
            tokio::pin!(acked);
            acked.as_mut().enable();
            let now = Instant::now();
            // Read before the confirmations: the control reader records
            // every confirmation before it marks the peer's stream finished.
            let peer_finished = *finished.borrow_and_update();
            if let Some(&at) = lock(&self.tx.acked).get(&round) {
                flight.machine.handle(now, SendEvent::Confirmed { at });
            }
            if peer_finished {
                flight.machine.handle(now, SendEvent::PeerFinished);
            }
            match flight.machine.wants() {
                Some(Counter::SentBytes) => {
                    let sent = sent_bytes(&self.conn);
                    flight.machine.handle(now, SendEvent::SentBytes(sent));
                }
                Some(Counter::DatagramQueue)
                    if self.conn.datagram_send_buffer_space() >= flight.datagrams_empty =>
                {
                    flight.machine.handle(now, SendEvent::DatagramsDrained);
                }
                _ => {}
            }
            if flight.machine.poll_timeout().is_some_and(|t| now >= t) {
                flight.machine.handle_timeout(now);
            }
            if let Some(action) = flight.machine.poll_action() {
                return Ok(Some(action));
            }
            if stop(&flight.machine) || flight.machine.outcome().is_some() {
                return Ok(None);
            }
            // quinn has no event for "sent": poll its counters at the
            // timer's granularity (a millisecond) while the machine waits
            // on them.
            let sample = flight.machine.wants().is_some();
            let deadline = flight.machine.poll_timeout();
            let tick = async {
                match (sample, deadline) {
                    (true, _) => tokio::time::sleep(Duration::from_millis(1)).await,
                    (false, Some(t)) => tokio::time::sleep_until(t.into()).await,
                    (false, None) => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = acked.as_mut() => {}
                _ = tick => {}
                _ = finished.changed() => {}
                e = self.conn.closed() => return Err(LinkError::from_conn(e)),
            }
        }
    }
}

/// How a classed round goes out, decided before its first byte.
#[derive(Clone, Copy)]
struct Sending {
    /// When `send_round` started.
    start: Instant,
    /// The lossy part goes on streams, not as datagrams.
    on_stream: bool,
    /// The round's deadline for its lossy part.
    lossy_until: Option<Instant>,
}

/// What a QUIC packet of stream data carries besides the data: the short
/// header (flags, the peer's 8-byte connection ID, a 1-4 byte packet
/// number), the 16-byte AEAD tag and the STREAM frame's type, stream ID,
/// offset and length: 33 bytes a packet on average over whole
/// all-reliable rounds. One byte less errs on the early side by about 72 kB
/// of an 82 MB stream; one byte more would never count the stream as sent.
const STREAM_PACKET_OVERHEAD: u64 = 32;

/// Stream bytes quinn has sent on the connection, less those it declared
/// lost (their retransmissions are counted again), estimated from its
/// packet counters: UDP payload less [`STREAM_PACKET_OVERHEAD`] a packet.
/// Counting raw UDP bytes would release the datagrams with ~2.5% of the
/// important stream unsent; quinn puts datagrams ahead of stream data in
/// every packet, so that tail would trickle out in the ~250 bytes each
/// datagram packet leaves free, tens of milliseconds late.
fn sent_bytes(conn: &Connection) -> u64 {
    let stats = conn.stats();
    let bytes = stats.udp_tx.bytes.saturating_sub(stats.path.lost_bytes);
    let packets = stats
        .udp_tx
        .datagrams
        .saturating_sub(stats.path.lost_packets);
    bytes.saturating_sub(packets.saturating_mul(STREAM_PACKET_OVERHEAD))
}
