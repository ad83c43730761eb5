//! The sending half: framing pipelined with the stream writer, the release
//! of the lossy datagrams, level by level.

use super::*;
use crate::blocking;
use gradlane_core::protocol::{Counter, RoundSend, SendAction, SendEvent, SendFailure, SendPlan};
use tokio::sync::watch;

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
        let span = tracing::info_span!("send_round", round, layout);
        self.send_round_inner(layout, round, grads, None)
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
        self.send_round_inner(0, round, &values, Some(&views))
            .instrument(span)
            .await
    }

    /// `shared`, if given, holds `grads` as little-endian bytes to take
    /// views of.
    async fn send_round_inner<G: AsRef<[f32]>>(
        &mut self,
        layout: LayoutId,
        round: u32,
        grads: &[G],
        shared: Option<&[Bytes]>,
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
        let on_stream = self.timing.lossy_on_stream(lost != self.lost_seen, marked);
        let max = if on_stream { LOSSY_STREAM_PACKET } else { max };
        // Scoring and classing read the whole round: every check on the
        // gradients happens here, before a byte is sent.
        let encoder = &mut self.encoders[layout as usize];
        let framer = blocking(|| encoder.start(round, grads, max))?;
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
        };
        let mut flight = InFlight::new(RoundSend::new(plan), self.control.clone());
        let sending = Sending { start, on_stream };
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
        let Sending { start, on_stream } = sending;
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
                self.send_lossy(&encoded, start, report, flight.datagrams_empty)
                    .await?;
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

    /// Opens the round's lossy streams, below the important lanes and the
    /// control stream, as many as the important part has lanes (each
    /// stream's flow-control window bounds its rate on a long path, as for
    /// the lanes), and has a writer task per stream hand it its share of
    /// the lossy levels, level 1 first, and finish it. No report follows:
    /// the receiver waits at most the grace period from the last lossy
    /// byte, so a retransmission on these streams can hold up a round only
    /// that long (what comes later is merged into the next round), and the
    /// next round, seeing the loss, sends its lossy levels as datagrams.
    async fn start_lossy_streams(
        &self,
        encoded: &EncodedRound,
        report: &mut SendReport,
        flight: &InFlight,
    ) -> Result<Vec<JoinHandle<Result<Option<Unconfirmed>, LinkError>>>, LinkError> {
        let total: u64 = encoded.end.bytes[1..].iter().sum();
        if total == 0 {
            return Ok(Vec::new());
        }
        let count = lane_count(self.lanes, total as usize);
        let mut queues = Vec::with_capacity(count);
        let mut writers = Vec::with_capacity(count);
        for _ in 0..count {
            let stream = self.conn.open_uni().await.map_err(LinkError::from_conn)?;
            let _ = stream.set_priority(LOSSY_STREAM_PRIORITY);
            let (pieces, queue) = mpsc::unbounded_channel();
            queues.push(pieces);
            // Like a lane's writer: the stream is reset, never cut, if the
            // round is abandoned.
            writers.push(tokio::spawn(write_lane(stream, queue, flight.signal())));
        }
        let (mut next, mut group, mut grouped) = (0, Vec::new(), 0);
        for (l, level) in encoded.lossy.iter().enumerate() {
            // The level's pieces may be views of the gradients, not
            // packets: count from the round's end, which the framing
            // matches.
            report.lossy_packets[l] += u64::from(encoded.end.packets[l + 1]);
            report.lossy_bytes[l] += encoded.wire_payload[l + 1];
            for piece in level {
                grouped += piece.len();
                // A lone header belongs with the values after it (see
                // `RoundFramer::finish_shared`); any other piece ends a
                // segment, where a stream's share may end.
                let whole = piece.len() != DATA_HEADER_LEN;
                group.push(piece.clone());
                if whole && grouped >= RELIABLE_PIECE {
                    let _ = queues[next % count].send(LanePiece::Bytes(std::mem::take(&mut group)));
                    (next, grouped) = (next + 1, 0);
                }
            }
        }
        if !group.is_empty() {
            let _ = queues[next % count].send(LanePiece::Bytes(group));
        }
        for q in &queues {
            let _ = q.send(LanePiece::End);
        }
        Ok(writers)
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

    /// Waits until quinn's datagram queue has `empty` bytes free again, or
    /// at most a second (a path that stalls that long is better served by
    /// the receiver's grace period than by a late report). Returns whether
    /// the queue is empty.
    async fn wait_datagrams_sent(&self, empty: usize) -> Result<bool, LinkError> {
        let give_up = Instant::now() + Duration::from_secs(1);
        // quinn has no event for it: poll at the timer's granularity.
        loop {
            if self.conn.datagram_send_buffer_space() >= empty {
                return Ok(true);
            }
            if Instant::now() >= give_up {
                return Ok(false);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                e = self.conn.closed() => return Err(LinkError::from_conn(e)),
            }
        }
    }

    async fn send_lossy(
        &self,
        encoded: &EncodedRound,
        start: Instant,
        report: &mut SendReport,
        empty: usize,
    ) -> Result<(), LinkError> {
        let deadline = self.timing.lossy_deadline.map(|d| start + d);
        let mut queued = false;
        for (l, datagrams) in encoded.lossy.iter().enumerate() {
            if let Some(mark) = self.mark.as_ref().filter(|_| !datagrams.is_empty()) {
                // The socket marks what quinn sends now: let quinn put the
                // level before into packets before marking the next.
                if queued {
                    self.wait_datagrams_sent(empty).await?;
                }
                mark.set_class(l as u8 + 1);
                queued = true;
            }
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
            Some(max) => {
                // The datagram says which layout's encoder can cut it.
                let layout = gradlane_core::wire::layout_of(d).unwrap_or(0) as usize;
                match self.encoders.get(layout) {
                    Some(encoder) => encoder.reframe(d, max).unwrap_or_default(),
                    None => Vec::new(),
                }
            }
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

/// How a classed round goes out, decided before its first byte.
#[derive(Clone, Copy)]
struct Sending {
    /// When `send_round` started.
    start: Instant,
    /// The lossy part goes on streams, not as datagrams.
    on_stream: bool,
}

/// Puts a connection's marks back to the important class when dropped.
struct ClassGuard<'a>(Option<&'a ConnectionMark>);

impl Drop for ClassGuard<'_> {
    fn drop(&mut self) {
        if let Some(mark) = self.0 {
            mark.set_class(gradlane_core::classify::IMPORTANT);
        }
    }
}

/// Important pieces handed to quinn at a time: small enough that the first
/// leaves within a fraction of a millisecond of framing, large enough that
/// the per-piece cost (a channel message, a `write_chunk`) is negligible.
const RELIABLE_PIECE: usize = 512 << 10;

/// Lanes a round's `reliable_len` important bytes are spread over: as many
/// as asked, but not more than about as many pieces as there are (pieces
/// may run a segment over their size, so the last lane can still end up
/// empty: a stream the receiver reads to its end and drops).
fn lane_count(asked: u8, reliable_len: usize) -> usize {
    (asked.max(1) as usize).min(reliable_len.div_ceil(RELIABLE_PIECE).max(1))
}

/// What a lane's writer is handed.
enum LanePiece {
    /// The next pieces of this lane's stream, in order.
    Bytes(Vec<Bytes>),
    /// Every piece was handed over: finish the stream.
    End,
}

/// Frames the important segments piece by piece into the lanes' queues in
/// turn (as views of `shared`, where given and long enough), ends the
/// lanes, then frames the lossy part (as views too, where given, if it
/// goes `on_stream`).
async fn frame_pipelined<G: AsRef<[f32]>>(
    mut framer: RoundFramer,
    grads: &[G],
    shared: Option<&[Bytes]>,
    on_stream: bool,
    lanes: &[mpsc::UnboundedSender<LanePiece>],
) -> Result<EncodedRound, LinkError> {
    let finish = |framer: RoundFramer| match shared {
        Some(tensors) if on_stream => framer.finish_shared(tensors),
        _ => framer.finish(grads),
    };
    let mut next = 0;
    let mut feed = |framer: &mut RoundFramer| -> Result<bool, LinkError> {
        let pieces = match shared {
            Some(tensors) => framer.next_reliable_shared(tensors, RELIABLE_PIECE)?,
            None => framer
                .next_reliable(grads, RELIABLE_PIECE)?
                .map(|b| vec![b]),
        };
        match pieces {
            // A closed queue means the writer failed; its error is reported.
            Some(piece) => {
                let lane = &lanes[next % lanes.len()];
                next += 1;
                Ok(lane.send(LanePiece::Bytes(piece)).is_ok())
            }
            // Every piece is handed over: the writers finish their streams.
            // (Stopped early, the queues are dropped instead: the writers
            // reset their streams.)
            None => {
                for lane in lanes {
                    let _ = lane.send(LanePiece::End);
                }
                Ok(false)
            }
        }
    };
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(|| {
            while feed(&mut framer)? {}
            Ok(finish(framer)?)
        }),
        // One thread for everything: let the writer and quinn's driver run
        // between pieces.
        _ => {
            while feed(&mut framer)? {
                tokio::task::yield_now().await;
            }
            Ok(finish(framer)?)
        }
    }
}

/// The writer of one lane of a round's important part (or of its lossy
/// stream): writes the pieces as they come, finishes the stream at
/// [`LanePiece::End`] and hands it back (quinn may still hold its data;
/// see [`Unconfirmed`]). If the round is
/// abandoned first (`send_round` dropped or failed: the queue closes or
/// `abandoned` fires), the stream is reset instead, so the peer never
/// mistakes a cut stream for a whole one and quinn stops sending it.
/// (Dropping a quinn `SendStream` would finish it, cut or not: this task
/// is signalled, never aborted.)
async fn write_lane(
    mut stream: SendStream,
    mut pieces: mpsc::UnboundedReceiver<LanePiece>,
    mut abandoned: watch::Receiver<()>,
) -> Result<Option<Unconfirmed>, LinkError> {
    let reset = |stream: &mut SendStream| {
        let _ = stream.reset(VarInt::from_u32(codes::ROUND_ABANDONED));
    };
    loop {
        let piece = tokio::select! {
            biased;
            _ = abandoned.changed() => None,
            piece = pieces.recv() => piece,
        };
        match piece {
            Some(LanePiece::Bytes(mut pieces)) => tokio::select! {
                biased;
                _ = abandoned.changed() => {
                    reset(&mut stream);
                    return Ok(None);
                }
                written = stream.write_all_chunks(&mut pieces) => written?,
            },
            Some(LanePiece::End) => {
                let _ = stream.finish();
                return Ok(Some(Unconfirmed(Some(stream))));
            }
            None => {
                reset(&mut stream);
                return Ok(None);
            }
        }
    }
}

/// A round between its first important byte and its outcome: its machine,
/// and what abandoning it takes, done when `send_round` returns (fails,
/// or is dropped by its caller) before the peer confirmed the round's
/// important part.
///
/// Without it, a dropped `send_round` left its writer tasks running and
/// quinn holding up to its send window of the round: all of it was sent,
/// and resent under loss, for a round no one waits for any more.
/// Abandoning resets every lane: a writer still running resets its
/// stream, and a finished lane, whose data quinn may still hold, is reset
/// by its [`Unconfirmed`] (held here, or in the output of a writer not
/// yet awaited). The peer then delivers the round only if its important
/// part had all arrived; its datagrams are reported sent (none will
/// follow), so that delivery does not wait out the grace for them.
struct InFlight {
    machine: RoundSend,
    /// Dropped with this guard: the running writers' signal.
    signal: watch::Sender<()>,
    /// Lanes whose writer finished the stream.
    finished: Vec<Unconfirmed>,
    control: SharedControl,
    /// The report of the round's datagrams was written.
    reported: bool,
    /// quinn's free datagram queue space when the lossy part was released
    /// (its queue is empty between rounds): what "all sent" looks like.
    datagrams_empty: usize,
}

impl InFlight {
    fn new(machine: RoundSend, control: SharedControl) -> Self {
        Self {
            machine,
            signal: watch::Sender::new(()),
            finished: Vec::new(),
            control,
            reported: false,
            datagrams_empty: usize::MAX,
        }
    }

    /// What a lane's writer watches: it fires when this guard goes.
    fn signal(&self) -> watch::Receiver<()> {
        self.signal.subscribe()
    }

    /// Tells the peer that every datagram of the round is sent. The report
    /// only saves the peer time. It fails when the peer is closing the
    /// link (this end finished its control stream in reply) or the
    /// connection is gone; the confirmation tells which, and whether the
    /// round arrived.
    async fn report_lossy_sent(&mut self) {
        let round = self.machine.plan().round;
        let stream = &mut *self.control.stream.lock().await;
        if let Err(e) = write_control(stream, Control::LossySent(round)).await {
            tracing::debug!(%e, "report of the datagrams not written");
        }
        self.reported = true;
    }

    /// The peer confirmed the round: let quinn finish sending its streams.
    fn disarm(&mut self) {
        for stream in self.finished.drain(..) {
            stream.confirm();
        }
    }
}

/// A finished stream of a round the peer has not confirmed yet: reset
/// when dropped, unless confirmed. quinn goes on sending what it holds of
/// a finished stream whose handle is dropped; whoever drops this one (an
/// abandoned round's guard, or a writer's output no one awaited) stops
/// that.
struct Unconfirmed(Option<SendStream>);

impl Unconfirmed {
    /// The round was confirmed: let quinn finish sending the stream.
    fn confirm(mut self) {
        self.0.take();
    }
}

impl Drop for Unconfirmed {
    fn drop(&mut self) {
        if let Some(stream) = &mut self.0 {
            // Fails harmlessly if the peer already acknowledged it all.
            let _ = stream.reset(VarInt::from_u32(codes::ROUND_ABANDONED));
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(Ok(_)) = self.machine.outcome() {
            return self.disarm();
        }
        self.machine.abandon();
        tracing::debug!(round = self.machine.plan().round, "round abandoned");
        // Dropping them resets them (the machine's `ResetStreams`).
        self.finished.clear();
        if self.reported {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let control = self.control.clone();
            let round = self.machine.plan().round;
            runtime.spawn(async move {
                // The link may be gone: nothing to tell then.
                let stream = &mut *control.stream.lock().await;
                let _ = write_control(stream, Control::LossySent(round)).await;
            });
        }
    }
}

/// The datagram payload a round's lossy part is framed for (see
/// [`DatagramSize`]).
/// `floor` is the MTU quinn never falls below (its `min_mtu`).
fn lossy_datagram_limit(conn: &Connection, size: DatagramSize, floor: u16) -> Option<usize> {
    let max = conn.max_datagram_size()?;
    Some(match size {
        DatagramSize::MtuFloor => limit_at_floor(max, conn.stats().path.current_mtu, floor),
        DatagramSize::Path => max,
    })
}

/// The datagram payload whose packets fit the MTU floor `floor`, from the
/// path's datagram limit `max` at path MTU `mtu`. quinn's limit is the MTU
/// less a fixed worst-case overhead, so taking off the MTU's rise above the
/// floor is exact; when the peer's own limit is the smaller one this errs
/// on the small side. Never below what the encoder needs: then the path's
/// limit is used as it is.
fn limit_at_floor(max: usize, mtu: u16, floor: u16) -> usize {
    let rise = mtu.saturating_sub(floor) as usize;
    match max.saturating_sub(rise) {
        floor if floor >= gradlane_core::encode::MIN_DATAGRAM => floor,
        _ => max,
    }
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

/// Payload bytes of a datagram framed by this crate.
fn payload_bytes(d: &Bytes) -> u64 {
    let headers = wire::decode_all(d).count() * DATA_HEADER_LEN;
    (d.len() - headers.min(d.len())) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_datagrams_fit_the_mtu_floor() {
        // quinn 0.11 on loopback: 1162 at the 1200-byte floor, 1414 at 1452.
        assert_eq!(limit_at_floor(1162, 1200, 1200), 1162);
        assert_eq!(limit_at_floor(1414, 1452, 1200), 1162);
        // A known jumbo path: the floor is the path's size.
        assert_eq!(limit_at_floor(8914, 8952, 8952), 8914);
        // Discovery above a raised floor takes off only the rise above it.
        assert_eq!(limit_at_floor(8914, 8952, 4000), 3962);
        // A peer's smaller limit: the result errs on the small side.
        assert_eq!(limit_at_floor(600, 1452, 1200), 348);
        // Never below what the encoder can frame: the path's limit as is.
        let tiny = gradlane_core::encode::MIN_DATAGRAM + 10;
        assert_eq!(limit_at_floor(tiny, 1452, 1200), tiny);
        // An MTU under the floor (the peer accepts less than our floor)
        // takes nothing off.
        assert_eq!(limit_at_floor(1000, 1100, 1200), 1000);
        assert_eq!(limit_at_floor(1414, 1452, 8952), 1414);
    }
}
