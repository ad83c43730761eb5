//! Closing a link: in order ([`Link::close`]), at once
//! ([`Link::close_now`]), or by dropping it (in order, in the background).
//!
//! A round's sender learns that the round arrived from the receiver's
//! confirmation on the control stream. A receiver that closes the
//! connection right after taking its last round could cut that
//! confirmation off: quinn discards unsent and unacknowledged stream data
//! when a connection closes. Closing in order therefore goes through the
//! control stream first: this end stops confirming rounds, finishes its
//! control stream behind the confirmations already written, and waits for
//! the peer's link to finish its own in reply (which it does once it has
//! read everything up to this end's finish), before it closes the
//! connection. Whatever way the connection is closed, the close frame
//! carries a [`CloseNote`] with the last round this end confirmed, so a
//! confirmation cut off by a close is still learnt from the close itself.

use super::*;

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
}

/// What this end has confirmed, and whether it still confirms.
#[derive(Default)]
struct Confirmations {
    last: Option<u32>,
    /// A close began: a round completing from now on is not confirmed
    /// (no one will take it with `recv_round`).
    closing: bool,
}

pub(super) type SharedControl = Arc<ControlTx>;

impl ControlTx {
    pub(super) fn new(stream: SendStream) -> SharedControl {
        Arc::new(Self {
            stream: tokio::sync::Mutex::new(stream),
            confirmations: Mutex::new(Confirmations::default()),
            messages: tokio::sync::Mutex::new(None),
        })
    }

    /// Confirms that `round`'s important part is complete, unless a close
    /// began. Checked under the stream's lock, so a confirmation is either
    /// written ahead of a close's finish or not at all.
    pub(super) async fn confirm(&self, round: u32) -> Result<(), LinkError> {
        let mut stream = self.stream.lock().await;
        {
            let mut c = lock(&self.confirmations);
            if c.closing {
                tracing::debug!(round, "not confirmed: the link is closing");
                return Ok(());
            }
            c.last = Some(c.last.map_or(round, |last| last.max(round)));
        }
        write_control(&mut stream, Control::ImportantReceived(round)).await
    }

    /// Stops confirming; returns the last round confirmed.
    fn begin_close(&self) -> Option<u32> {
        let mut c = lock(&self.confirmations);
        c.closing = true;
        c.last
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

/// Closes in order: finishes the control stream, waits up to `wait` for the
/// peer's finish in reply (the peer has then read every confirmation this
/// end sent), then closes the connection with the note.
pub(super) async fn close_in_order(
    conn: &Connection,
    control: &ControlTx,
    tx: &TxShared,
    wait: Duration,
) -> Result<(), LinkError> {
    if let Some(e) = conn.close_reason() {
        return closed_by_peer(e);
    }
    let mut finished = tx.peer_finished.subscribe();
    let last_confirmed = control.finish().await;
    // The messages this end sent must all be in too: quinn acknowledges
    // a finished stream's data before `stopped` returns.
    let messages = async {
        if let Some(send) = control.messages.lock().await.as_mut() {
            let _ = send.finish();
            let _ = send.stopped().await;
        }
    };
    let both = async {
        let peer = async { finished.wait_for(|&f| f).await.is_ok() };
        tokio::join!(messages, peer).1
    };
    let outcome = tokio::select! {
        _ = both => Ok(()),
        e = conn.closed() => closed_by_peer(e),
        _ = tokio::time::sleep(wait) => Err(LinkError::CloseUnacknowledged { waited: wait }),
    };
    let note = CloseNote {
        last_confirmed,
        read_all: *tx.peer_finished.borrow(),
    };
    conn.close(VarInt::from_u32(codes::CLOSED), &note.encode());
    outcome
}

/// What a close finds when the connection is closed already: fine if the
/// peer closed in order after reading everything this end sent.
fn closed_by_peer(e: ConnectionError) -> Result<(), LinkError> {
    match close_note(&e) {
        Some(note) if note.read_all => Ok(()),
        _ => match e {
            // This end closed it before.
            ConnectionError::LocallyClosed => Ok(()),
            e => Err(LinkError::from_conn(e)),
        },
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
