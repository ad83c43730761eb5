//! The receiving half: `recv_round`'s wait for a round's datagrams, and the
//! background tasks (control reader, round streams, datagrams) that feed
//! the reassembler.

use super::*;
use gradlane_core::protocol::{still_to_deliver, Delivery, DeliveryWait, LossyProgress};

impl LinkReceiver {
    /// Receives the next round: waits for its important data, then for its
    /// datagrams (see [`RoundTiming`]), and delivers the rebuilt tensors.
    pub async fn recv_round(&mut self) -> Result<Round, LinkError> {
        Ok(self.recv_round_timed().await?.0)
    }

    /// [`recv_round`](Self::recv_round), also telling when the round's
    /// important data was complete and when it was delivered.
    pub async fn recv_round_timed(&mut self) -> Result<(Round, RoundArrival), LinkError> {
        self.recv_round_by(None).await
    }

    /// [`recv_round`](Self::recv_round) with a deadline for the lossy
    /// part ([`StepDeadline`](gradlane_core::protocol::StepDeadline)): the
    /// round is delivered at `lossy_until` at the latest once its
    /// important part is in (at once, if that comes later), with the lossy
    /// chunks that are in by then; the rest are missing
    /// ([`Round::missing_chunks`]), and merged into the next round if they
    /// come later and the layout merges late data.
    pub async fn recv_round_until(
        &mut self,
        lossy_until: Option<Instant>,
    ) -> Result<Round, LinkError> {
        Ok(self.recv_round_by(lossy_until).await?.0)
    }

    async fn recv_round_by(
        &mut self,
        lossy_until: Option<Instant>,
    ) -> Result<(Round, RoundArrival), LinkError> {
        let (round, layout, important) = loop {
            let (round, layout, important) = tokio::select! {
                // A protocol error is queued before the connection is
                // closed: look at the queue first so the caller learns why.
                biased;
                m = self.ended.recv() => match m {
                    Some(Ok(r)) => r,
                    Some(Err(e)) => return Err(LinkError::Protocol(e)),
                    None => return Err(self.closed_error(self.conn.closed().await)),
                },
                e = self.conn.closed() => match self.ended.try_recv() {
                    Ok(Err(why)) => return Err(LinkError::Protocol(why)),
                    _ => return Err(self.closed_error(e)),
                },
            };
            // One skipped over by a later delivery is counted abandoned
            // already and has nothing left to deliver.
            let delivered = lock(&self.rx.reassembler)
                .get(layout)
                .and_then(|r| r.last_delivered());
            if still_to_deliver(round, delivered) {
                break (round, layout, important);
            }
            tracing::debug!(round, layout, ?delivered, "skipped a round delivered past");
        };
        let span = tracing::info_span!("recv_round", round, layout);
        let delivered = self
            .finish_round(round, layout, lossy_until)
            .instrument(span)
            .await?;
        let arrival = RoundArrival {
            important,
            delivered: Instant::now(),
        };
        Ok((delivered, arrival))
    }

    /// Waits for the round's lossy part as its [`DeliveryWait`] says,
    /// re-deciding whenever lossy data is placed or a report comes, and
    /// delivers.
    async fn finish_round(
        &mut self,
        round: u32,
        layout: LayoutId,
        lossy_until: Option<Instant>,
    ) -> Result<Round, LinkError> {
        let ended = Instant::now();
        let mut wait = DeliveryWait::new(ended, self.timing, self.conn.rtt()).until(lossy_until);
        loop {
            let progress = self.rx.progress.notified();
            tokio::pin!(progress);
            progress.as_mut().enable();
            let now = Instant::now();
            let state = LossyProgress {
                held: lock(&self.rx.reassembler)
                    .get(layout)
                    .and_then(|r| r.lossy_progress(round)),
                placed: self.rx.datagrams_read.load(Ordering::Relaxed),
                reported: lock(&self.rx.lossy_sent).get(round),
            };
            let until = match wait.progress(now, state) {
                Delivery::Now => break,
                Delivery::WaitUntil(until) => until,
            };
            if tokio::time::timeout_at(until.into(), progress)
                .await
                .is_err()
            {
                break;
            }
        }
        let waited = ended.elapsed();
        let reported = lock(&self.rx.lossy_sent).get(round);
        lock(&self.rx.lossy_sent).delivered(round);
        let (progress, delivered) = {
            let mut receivers = lock(&self.rx.reassembler);
            let Some(r) = receivers.get(layout) else {
                return Err(LinkError::UnknownLayout(layout));
            };
            (r.lossy_progress(round), r.deliver(round)?)
        };
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

    /// Why no round will come: the connection's end, which is the peer's
    /// closing if it had finished its control stream before (its close
    /// frame may have been lost, and the connection then ended in a
    /// stateless reset or an idle timeout).
    pub(super) fn closed_error(&self, e: ConnectionError) -> LinkError {
        match LinkError::from_conn(e) {
            LinkError::Connection(_) if *self.peer_finished.borrow() => {
                LinkError::PeerClosed { round: None }
            }
            e => e,
        }
    }

    /// Hands a delivered round's tensors back for reuse (saves mapping fresh
    /// memory each round). Tensors of the wrong shape are ignored.
    pub fn recycle(&mut self, tensors: Vec<Vec<f32>>) {
        lock(&self.rx.reassembler).recycle(tensors);
    }

    /// Payload bytes of late segments waiting to be added into the next round.
    pub fn late_buffered_bytes(&self) -> usize {
        lock(&self.rx.reassembler).late_buffered_bytes()
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
    pub fn counters(&self) -> gradlane_core::reassembly::ReceiverCounters {
        lock(&self.rx.reassembler).counters()
    }
}

pub(super) async fn control_reader(
    conn: Connection,
    mut recv: RecvStream,
    control: SharedControl,
    tx: Arc<TxShared>,
    rx: Arc<RxShared>,
) {
    loop {
        let msg = match read_control(&mut recv).await {
            Ok(Some(body)) => Control::decode(&body),
            // The peer is closing (`Link::close`) and all it sent is read:
            // finish this end's stream in reply, so the peer knows.
            // (Rounds completing from now on are not confirmed: the
            // peer no longer reads confirmations.)
            Ok(None) => {
                control.finish().await;
                tx.peer_finished.send_replace(true);
                return;
            }
            Err(
                LinkError::Connection(_)
                | LinkError::Rejected { .. }
                | LinkError::PeerClosed { .. },
            ) => return,
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
                lock(&rx.lossy_sent).reported(r, received);
                rx.progress.notify_waiters();
            }
            Ok(Control::Layout {
                id,
                merge_late,
                hello,
            }) => {
                if let Err(why) = lock(&rx.reassembler).add(id, hello, merge_late) {
                    protocol_close(&conn, &why);
                    return;
                }
                let stream = &mut *control.stream.lock().await;
                if write_control(stream, Control::LayoutReady(id))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Ok(Control::LayoutReady(id)) => {
                lock(&tx.layouts).insert(id);
                tx.acked_notify.notify_waiters();
            }
            Ok(Control::Welcome) | Err(_) => {
                protocol_close(&conn, "unexpected control message");
                return;
            }
        }
    }
}

pub(super) async fn stream_acceptor(
    conn: Connection,
    rx: Arc<RxShared>,
    control: SharedControl,
    ended: mpsc::UnboundedSender<Result<(u32, LayoutId, Instant), String>>,
    messages: mpsc::Sender<messages::Message>,
    point_to_point: mpsc::Sender<messages::Message>,
) {
    while let Ok(stream) = conn.accept_uni().await {
        tokio::spawn(round_stream_reader(
            conn.clone(),
            stream,
            rx.clone(),
            control.clone(),
            ended.clone(),
            [messages.clone(), point_to_point.clone()],
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
    control: SharedControl,
    ended: mpsc::UnboundedSender<Result<(u32, LayoutId, Instant), String>>,
    [messages, point_to_point]: [mpsc::Sender<messages::Message>; 2],
) {
    let mut decoder = StreamDecoder::new();
    // quinn hands over one received frame (about a packet) per piece.
    let mut pieces = vec![Bytes::new(); 64];
    // The stream's layout, from its first segment's prefix; the pieces
    // that came before those bytes were all in wait here.
    let mut layout: Option<LayoutId> = None;
    let mut held: Vec<Bytes> = Vec::new();
    loop {
        let n = match stream.read_chunks(&mut pieces).await {
            Ok(Some(n)) => n,
            Ok(None) if decoder.at_boundary() && held.is_empty() => return,
            Ok(None) => return fail(&conn, &ended, "round stream ends inside a segment".into()),
            // Reset by the sender (an abandoned round) or the connection is
            // gone: nothing to deliver.
            Err(_) => return,
        };
        let id = match layout {
            Some(id) => id,
            None => {
                held.extend(pieces[..n].iter().cloned());
                pieces[..n].fill(Bytes::new());
                let prefix: Vec<u8> = held
                    .iter()
                    .flat_map(|b| b.iter().copied())
                    .take(wire::PREFIX_LEN)
                    .collect();
                // The peer's message stream, not a round's.
                if prefix.starts_with(&messages::MESSAGE_MAGIC) {
                    if rx.message_stream.swap(true, Ordering::Relaxed) {
                        return fail(&conn, &ended, "a second message stream".into());
                    }
                    return messages::read_messages(held, stream, messages).await;
                }
                if prefix.starts_with(&point_to_point::POINT_TO_POINT_MAGIC) {
                    if rx.point_to_point_stream.swap(true, Ordering::Relaxed) {
                        return fail(&conn, &ended, "a second point-to-point stream".into());
                    }
                    return messages::read_messages(held, stream, point_to_point).await;
                }
                if prefix.len() < wire::PREFIX_LEN {
                    continue;
                }
                match (wire::layout_of(&prefix), wire::head_len(&prefix)) {
                    (Some(id), Ok(_)) => *layout.insert(id),
                    (_, Err(e)) => return fail(&conn, &ended, format!("malformed segment: {e}")),
                    (None, Ok(_)) => {
                        return fail(&conn, &ended, "malformed segment: no prefix".into())
                    }
                }
            }
        };
        // The first time: the held pieces (this read's among them).
        let first = std::mem::take(&mut held);
        let input: &[Bytes] = match first.is_empty() {
            true => &pieces[..n],
            false => &first,
        };
        let mut round_end = None;
        let fed = {
            let mut receivers = lock(&rx.reassembler);
            let reassembler = receivers.route(id);
            input.iter().try_for_each(|piece| {
                let out = decoder.feed(reassembler, piece)?;
                round_end = round_end.or(out.completed);
                Ok::<_, ReassemblyError>(())
            })
        };
        drop(first);
        if let Err(e) = fed {
            return fail(&conn, &ended, format!("{e}"));
        }
        // Let quinn reuse the buffers now, not when the slots are refilled.
        pieces[..n].fill(Bytes::new());
        // A round's lossy part may come on a stream too (`LossyCarrier`):
        // a round waiting for it counts its grace from the last byte.
        rx.progress.notify_waiters();
        if let Some(r) = round_end {
            let arrived = Instant::now();
            tracing::debug!(round = r, "round end arrived");
            if control.confirm(r).await.is_err() {
                return;
            }
            let _ = ended.send(Ok((r, id, arrived)));
        }
    }
}

fn fail(
    conn: &Connection,
    ended: &mpsc::UnboundedSender<Result<(u32, LayoutId, Instant), String>>,
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
pub(super) async fn datagram_reader(conn: Connection, rx: Arc<RxShared>) {
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
            let mut receivers = lock(&rx.reassembler);
            for d in &batch {
                let layout = wire::layout_of(d).unwrap_or(0);
                if let Err(e) = receivers.route(layout).push(d, Channel::Lossy) {
                    tracing::debug!(%e, "dropped a malformed datagram");
                }
            }
            // Counted once placed, under the same lock: a round waiting on
            // this count must find the datagrams in the reassembler, and
            // whoever saw them placed (a delivered round) sees them
            // counted, not as dropped by quinn (counted after the lock, a
            // check right after delivery found up to a batch missing).
            rx.datagrams_read
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
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
