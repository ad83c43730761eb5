//! Exact messages beside the rounds: bytes that arrive whole, exact and in
//! order, each with a tag the receiver checks. The collectives of a group
//! (broadcast, allgather, the exact half of an allreduce) travel this way.
//!
//! Each end opens one bidirectional stream for the messages it sends, the
//! first bidirectional stream after the handshake's; only its sending half
//! is used. A message is `[u64 tag][u32 length][body]`, little-endian. The
//! receiver reads each body as it arrives, so memory follows what the peer
//! really sent, not the length it claims, and hands whole messages to
//! [`LinkReceiver::recv_message`] through a short queue: a receiver that
//! falls behind holds the sender back through QUIC's flow control.

use super::*;
use bytes::BytesMut;

/// Bytes before a message's body: its tag and length.
const MESSAGE_HEAD: usize = 8 + 4;

/// Whole messages read ahead of [`LinkReceiver::recv_message`].
const QUEUED_MESSAGES: usize = 2;

/// The largest message body (a u32 length).
pub const MAX_MESSAGE_BYTES: usize = u32::MAX as usize;

/// What the message reader hands over: a tag and a body, or why the
/// messages ended.
pub(super) type Message = Result<(u64, Bytes), LinkError>;

pub(super) fn queue() -> (mpsc::Sender<Message>, mpsc::Receiver<Message>) {
    mpsc::channel(QUEUED_MESSAGES)
}

impl LinkSender {
    /// Sends one message: `body` arrives whole, exact and in order with
    /// this end's other messages, tagged with `tag` for the receiver to
    /// check. Returns once quinn holds all of it. Fails for a body over
    /// [`MAX_MESSAGE_BYTES`].
    pub async fn send_message(&mut self, tag: u64, body: Bytes) -> Result<(), LinkError> {
        if body.len() > MAX_MESSAGE_BYTES {
            return Err(LinkError::MessageTooLarge(body.len()));
        }
        let mut head = [0u8; MESSAGE_HEAD];
        head[..8].copy_from_slice(&tag.to_le_bytes());
        head[8..].copy_from_slice(&(body.len() as u32).to_le_bytes());
        let mut stream = self.control.messages.lock().await;
        let send = match &mut *stream {
            Some(send) => send,
            None => {
                let (send, recv) = self.conn.open_bi().await.map_err(LinkError::from_conn)?;
                // Only the sending half carries anything.
                drop(recv);
                stream.insert(send)
            }
        };
        let mut chunks = [Bytes::copy_from_slice(&head), body];
        send.write_all_chunks(&mut chunks)
            .await
            .map_err(write_error)
    }
}

impl LinkReceiver {
    /// Receives the peer's next message: its tag and body.
    pub async fn recv_message(&mut self) -> Result<(u64, Bytes), LinkError> {
        match self.messages.recv().await {
            Some(m) => m,
            None => Err(self.closed_error(self.conn.closed().await)),
        }
    }
}

/// Accepts the peer's message stream and reads it to its end, one whole
/// message at a time into `out`.
pub(super) async fn message_reader(conn: Connection, out: mpsc::Sender<Message>) {
    let (send, mut recv) = match conn.accept_bi().await {
        Ok(pair) => pair,
        Err(e) => {
            let _ = out.send(Err(LinkError::from_conn(e))).await;
            return;
        }
    };
    drop(send);
    loop {
        let message = read_message(&mut recv).await;
        let end = !matches!(message, Ok(Some(_)));
        let item = match message {
            Ok(Some(m)) => Ok(m),
            Ok(None) => return,
            Err(e) => Err(e),
        };
        if out.send(item).await.is_err() || end {
            return;
        }
    }
}

/// One message, or `None` at a clean end of the stream.
async fn read_message(recv: &mut RecvStream) -> Result<Option<(u64, Bytes)>, LinkError> {
    let mut head = [0u8; MESSAGE_HEAD];
    match recv.read_exact(&mut head).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(quinn::ReadExactError::FinishedEarly(_)) => {
            return Err(LinkError::Protocol(
                "message stream ends inside a message".into(),
            ))
        }
        Err(quinn::ReadExactError::ReadError(e)) => return Err(read_error(e)),
    }
    let tag = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
    let len = u32::from_le_bytes(head[8..].try_into().unwrap_or_default()) as usize;
    // Grown as the body arrives: a length alone reserves at most 16 MiB.
    let mut body = BytesMut::with_capacity(len.min(16 << 20));
    while body.len() < len {
        match recv.read_chunk(len - body.len(), true).await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(LinkError::Protocol(
                    "message stream ends inside a message".into(),
                ))
            }
            Err(e) => return Err(read_error(e)),
        }
    }
    Ok(Some((tag, body.freeze())))
}
