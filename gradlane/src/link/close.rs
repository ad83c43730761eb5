//! Closing a link: in order ([`Link::close`]), at once
//! ([`Link::close_now`]), or by dropping it (in order, in the background).
//! Why closing goes through the control stream, and when a close is
//! acknowledged, is the core's [`CloseInOrder`]'s to decide; this file
//! carries it out over quinn.

use super::*;
use gradlane_core::protocol::{
    already_closed, CloseInOrder, CloseOutcome, ClosedBy, Confirmations,
};

/// How long [`Link::close`] and a dropped link wait for the peer to
/// acknowledge the close before closing anyway: long enough for quinn to
/// resend a lost confirmation a few times over a lossy path.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// This end's control stream and what it has confirmed on it.
pub(super) struct ControlTx {
    /// The stream (held across a whole message's write).
    pub(super) stream: tokio::sync::Mutex<SendStream>,
    confirmations: Mutex<Confirmations>,
    /// The stream of this end's messages, once the first is sent (see
    /// `messages`): closing in order flushes it too.
    pub(super) messages: tokio::sync::Mutex<Option<SendStream>>,
    /// The stream of this end's point-to-point messages, once the first
    /// is sent (see `point_to_point`): flushed on close as `messages` is.
    pub(super) point_to_point: tokio::sync::Mutex<Option<SendStream>>,
}

pub(super) type SharedControl = Arc<ControlTx>;

impl ControlTx {
    pub(super) fn new(stream: SendStream) -> SharedControl {
        Arc::new(Self {
            stream: tokio::sync::Mutex::new(stream),
            confirmations: Mutex::new(Confirmations::default()),
            messages: tokio::sync::Mutex::new(None),
            point_to_point: tokio::sync::Mutex::new(None),
        })
    }

    /// Confirms that `round`'s important part is complete, unless a close
    /// began. Checked under the stream's lock, so a confirmation is either
    /// written ahead of a close's finish or not at all.
    pub(super) async fn confirm(&self, round: u32) -> Result<(), LinkError> {
        let mut stream = self.stream.lock().await;
        if !lock(&self.confirmations).complete(round) {
            tracing::debug!(round, "not confirmed: the link is closing");
            return Ok(());
        }
        write_control(&mut stream, Control::ImportantReceived(round)).await
    }

    /// Stops confirming; returns the last round confirmed.
    fn begin_close(&self) -> Option<u32> {
        lock(&self.confirmations).begin_close()
    }

    /// Finishes the stream after what is written (a second finish, or one
    /// on a lost connection, fails harmlessly), and stops confirming.
    pub(super) async fn finish(&self) -> Option<u32> {
        let mut stream = self.stream.lock().await;
        let last = self.begin_close();
        let _ = stream.finish();
        last
    }
}

/// Closes the connection at once, with the note.
pub(super) fn close_now(conn: &Connection, control: &ControlTx, tx: &TxShared) {
    let note = CloseNote {
        last_confirmed: control.begin_close(),
        read_all: *tx.peer_finished.borrow(),
    };
    conn.close(VarInt::from_u32(codes::CLOSED), &note.encode());
}

/// Closes in order as [`CloseInOrder`] says: finishes the control stream,
/// waits up to `wait` for the peer's finish in reply (the peer has then
/// read every confirmation this end sent) and for the peer to have
/// acknowledged this end's messages, then closes the connection with the
/// note.
pub(super) async fn close_in_order(
    conn: &Connection,
    control: &ControlTx,
    tx: &TxShared,
    wait: Duration,
) -> Result<(), LinkError> {
    if let Some(e) = conn.close_reason() {
        return close_result(already_closed(closed_by(&e)), e);
    }
    let mut finished = tx.peer_finished.subscribe();
    let last_confirmed = control.finish().await;
    // Held until the close ends: a message sent meanwhile would open a
    // second message stream.
    let mut messages = control.messages.lock().await;
    let mut point_to_point = control.point_to_point.lock().await;
    let pending = messages.is_some() || point_to_point.is_some();
    let mut close = CloseInOrder::new(Instant::now(), wait, last_confirmed, pending);
    // The messages this end sent must all be in too: quinn acknowledges
    // a finished stream's data before `stopped` returns.
    let flushed = async {
        for send in [messages.as_mut(), point_to_point.as_mut()]
            .into_iter()
            .flatten()
        {
            let _ = send.finish();
            let _ = send.stopped().await;
        }
    };
    tokio::pin!(flushed);
    let mut flushing = pending;
    let mut closed_with = None;
    let mut peer_finished = false;
    while close.outcome().is_none() {
        if !peer_finished && *finished.borrow_and_update() {
            peer_finished = true;
            close.peer_finished();
            continue;
        }
        let deadline = close.poll_timeout().unwrap_or_else(Instant::now);
        tokio::select! {
            _ = &mut flushed, if flushing => {
                flushing = false;
                close.messages_flushed();
            }
            _ = finished.changed(), if !peer_finished => {}
            e = conn.closed() => {
                close.connection_closed(closed_by(&e));
                closed_with = Some(e);
            }
            _ = tokio::time::sleep_until(deadline.into()) => close.handle_timeout(Instant::now()),
        }
    }
    let mut note = close.note();
    // The peer may have finished while this end was closing.
    note.read_all |= *tx.peer_finished.borrow();
    conn.close(VarInt::from_u32(codes::CLOSED), &note.encode());
    match (close.outcome(), closed_with) {
        (Some(outcome), Some(e)) => close_result(outcome, e),
        (Some(CloseOutcome::Unacknowledged { waited }), _) => {
            Err(LinkError::CloseUnacknowledged { waited })
        }
        _ => Ok(()),
    }
}

/// How the connection's end reads to a close.
fn closed_by(e: &ConnectionError) -> ClosedBy {
    match e {
        ConnectionError::LocallyClosed => ClosedBy::Locally,
        e => match close_note(e) {
            Some(note) => ClosedBy::PeerInOrder(Some(note)),
            None => ClosedBy::Other,
        },
    }
}

/// A close's outcome once the connection ended with `e`.
fn close_result(outcome: CloseOutcome, e: ConnectionError) -> Result<(), LinkError> {
    match outcome {
        CloseOutcome::Acknowledged => Ok(()),
        CloseOutcome::Unacknowledged { waited } => Err(LinkError::CloseUnacknowledged { waited }),
        CloseOutcome::Closed(_) => Err(LinkError::from_conn(e)),
    }
}

/// The note in a connection's error, if the peer closed it in order with
/// one.
pub(super) fn close_note(e: &ConnectionError) -> Option<CloseNote> {
    match e {
        ConnectionError::ApplicationClosed(c)
            if c.error_code.into_inner() == u64::from(codes::CLOSED) =>
        {
            CloseNote::decode(&c.reason)
        }
        _ => None,
    }
}

/// Held by both halves of a link: when the last goes, the link closes in
/// order in the background (if a tokio runtime is there to run it; at once
/// otherwise), and the link's tasks stop once it has.
pub(super) struct Linger {
    conn: Connection,
    control: SharedControl,
    tx: Arc<TxShared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Linger {
    pub(super) fn new(
        conn: Connection,
        control: SharedControl,
        tx: Arc<TxShared>,
        tasks: Vec<JoinHandle<()>>,
    ) -> Self {
        Self {
            conn,
            control,
            tx,
            tasks,
        }
    }

    pub(super) async fn close(&self, wait: Duration) -> Result<(), LinkError> {
        close_in_order(&self.conn, &self.control, &self.tx, wait).await
    }

    pub(super) fn close_now(&self) {
        close_now(&self.conn, &self.control, &self.tx);
    }
}

impl Drop for Linger {
    fn drop(&mut self) {
        let tasks = std::mem::take(&mut self.tasks);
        let abort = move || tasks.iter().for_each(JoinHandle::abort);
        if self.conn.close_reason().is_some() {
            return abort();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.close_now();
            return abort();
        };
        let (conn, control, tx) = (self.conn.clone(), self.control.clone(), self.tx.clone());
        runtime.spawn(async move {
            if let Err(e) = close_in_order(&conn, &control, &tx, CLOSE_WAIT).await {
                tracing::debug!(%e, "dropped link closed");
            }
            abort();
        });
    }
}
