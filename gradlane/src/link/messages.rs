//! Exact messages beside the rounds: bytes that arrive whole, exact and in
//! order, each with a tag the receiver checks. The collectives of a group
//! (broadcast, allgather, the exact half of an allreduce) travel this way.
//!
//! Each end opens one unidirectional stream for the messages it sends; it
//! starts with [`MESSAGE_MAGIC`], which no round stream starts with (a
//! segment's third byte is its version, 2), so the receiver tells the two
//! apart by their first bytes. A message is `[u64 tag][u32 length][body]`,
//! little-endian. The
//! receiver reads each body as it arrives, so memory follows what the peer
//! really sent, not the length it claims, and hands whole messages to
//! [`LinkReceiver::recv_message`] through a short queue: a receiver that
//! falls behind holds the sender back through QUIC's flow control.

use super::*;
use bytes::BytesMut;

/// Bytes before a message's body: its tag and length.
const MESSAGE_HEAD: usize = 8 + 4;

/// The first bytes of a message stream.
pub(super) const MESSAGE_MAGIC: [u8; 4] = *b"GLm1";

/// Whole messages read ahead of [`LinkReceiver::recv_message`].
const QUEUED_MESSAGES: usize = 2;

/// The largest message body (a u32 length).
pub const MAX_MESSAGE_BYTES: usize = u32::MAX as usize;

/// What the message reader hands over: a tag and a body, or why the
/// messages ended.
pub(super) type Message = Result<(u64, MessageBody), LinkError>;

/// A message's body as it came: quinn's chunks in order, not yet copied
/// together. Point-to-point receives copy it once, straight into the
/// receiver's buffer ([`copy_to`](Self::copy_to)); the collectives take
/// it as one buffer ([`into_bytes`](Self::into_bytes)).
#[derive(Debug, Clone, Default)]
pub struct MessageBody {
    chunks: Vec<Bytes>,
    len: usize,
}

impl MessageBody {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies it into `out`, which must be exactly [`len`](Self::len)
    /// bytes long; returns false (and copies nothing) where it is not.
    pub fn copy_to(&self, out: &mut [u8]) -> bool {
        if out.len() != self.len {
            return false;
        }
        let mut at = 0;
        for chunk in &self.chunks {
            out[at..at + chunk.len()].copy_from_slice(chunk);
            at += chunk.len();
        }
        true
    }

    /// As one buffer: the chunk itself where there is one, else one copy.
    pub fn into_bytes(mut self) -> Bytes {
        if self.chunks.len() <= 1 {
            return self.chunks.pop().unwrap_or_default();
        }
        let mut body = BytesMut::with_capacity(self.len);
        for chunk in &self.chunks {
            body.extend_from_slice(chunk);
        }
        body.freeze()
    }
}

impl From<Bytes> for MessageBody {
    fn from(b: Bytes) -> Self {
        Self {
            len: b.len(),
            chunks: vec![b],
        }
    }
}

pub(super) fn queue() -> (mpsc::Sender<Message>, mpsc::Receiver<Message>) {
    mpsc::channel(QUEUED_MESSAGES)
}

impl LinkSender {
    /// Sends one message: `body` arrives whole, exact and in order with
    /// this end's other messages, tagged with `tag` for the receiver to
    /// check. Returns once quinn holds all of it. Fails for a body over
    /// [`MAX_MESSAGE_BYTES`].
    pub async fn send_message(&mut self, tag: u64, body: Bytes) -> Result<(), LinkError> {
        self.send_message_chunks(tag, vec![body]).await
    }

    /// Sends one message whose body is `chunks` one after the other,
    /// without copying them together first.
    pub(crate) async fn send_message_chunks(
        &mut self,
        tag: u64,
        body: Vec<Bytes>,
    ) -> Result<(), LinkError> {
        write_message(&self.control.messages, &self.conn, MESSAGE_MAGIC, tag, body).await
    }
}

/// Writes one message on the stream `stream` holds, opening it (with
/// `magic` first) if this is the first: the collectives' messages and the
/// point-to-point ones are framed alike, each on a stream of its own.
pub(super) async fn write_message(
    stream: &tokio::sync::Mutex<Option<SendStream>>,
    conn: &Connection,
    magic: [u8; 4],
    tag: u64,
    body: Vec<Bytes>,
) -> Result<(), LinkError> {
    let len: usize = body.iter().map(Bytes::len).sum();
    if len > MAX_MESSAGE_BYTES {
        return Err(LinkError::MessageTooLarge(len));
    }
    let mut head = [0u8; MESSAGE_HEAD];
    head[..8].copy_from_slice(&tag.to_le_bytes());
    head[8..].copy_from_slice(&(len as u32).to_le_bytes());
    let mut stream = stream.lock().await;
    let (send, magic) = match &mut *stream {
        Some(send) => (send, Bytes::new()),
        None => {
            let send = conn.open_uni().await.map_err(LinkError::from_conn)?;
            (stream.insert(send), Bytes::copy_from_slice(&magic))
        }
    };
    let mut chunks = Vec::with_capacity(body.len() + 2);
    chunks.push(magic);
    chunks.push(Bytes::copy_from_slice(&head));
    chunks.extend(body);
    send.write_all_chunks(&mut chunks)
        .await
        .map_err(write_error)
}

impl LinkReceiver {
    /// Receives the peer's next message: its tag and body.
    pub async fn recv_message(&mut self) -> Result<(u64, Bytes), LinkError> {
        match self.messages.recv().await {
            Some(m) => m.map(|(tag, body)| (tag, body.into_bytes())),
            None => Err(self.closed_error(self.conn.closed().await)),
        }
    }
}

/// Reads the peer's message stream to its end, one whole message at a
/// time into `out`; `held` are its first bytes, read already (the magic
/// among them).
pub(super) async fn read_messages(held: Vec<Bytes>, recv: RecvStream, out: mpsc::Sender<Message>) {
    let mut held: BytesMut = held.iter().flat_map(|b| b.iter().copied()).collect();
    let _ = held.split_to(MESSAGE_MAGIC.len().min(held.len()));
    let mut stream = Prefixed { held, recv };
    loop {
        let message = read_message(&mut stream).await;
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

/// A stream whose first bytes were read already.
struct Prefixed {
    held: BytesMut,
    recv: RecvStream,
}

impl Prefixed {
    /// Fills `buf`; `Ok(false)` if the stream ended cleanly before its
    /// first byte.
    async fn read_exact(&mut self, buf: &mut [u8]) -> Result<bool, LinkError> {
        let from_held = buf.len().min(self.held.len());
        buf[..from_held].copy_from_slice(&self.held.split_to(from_held));
        if from_held == buf.len() {
            return Ok(true);
        }
        match self.recv.read_exact(&mut buf[from_held..]).await {
            Ok(()) => Ok(true),
            Err(quinn::ReadExactError::FinishedEarly(0)) if from_held == 0 => Ok(false),
            Err(quinn::ReadExactError::FinishedEarly(_)) => Err(truncated()),
            Err(quinn::ReadExactError::ReadError(e)) => Err(read_error(e)),
        }
    }

    /// Up to `max` more bytes.
    async fn read_chunk(&mut self, max: usize) -> Result<Bytes, LinkError> {
        if !self.held.is_empty() {
            let n = max.min(self.held.len());
            return Ok(self.held.split_to(n).freeze());
        }
        match self.recv.read_chunk(max, true).await {
            Ok(Some(chunk)) => Ok(chunk.bytes),
            Ok(None) => Err(truncated()),
            Err(e) => Err(read_error(e)),
        }
    }
}

fn truncated() -> LinkError {
    LinkError::Protocol("message stream ends inside a message".into())
}

/// One message, or `None` at a clean end of the stream.
async fn read_message(stream: &mut Prefixed) -> Result<Option<(u64, MessageBody)>, LinkError> {
    let mut head = [0u8; MESSAGE_HEAD];
    if !stream.read_exact(&mut head).await? {
        return Ok(None);
    }
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&head[..8]);
    let mut len = [0u8; 4];
    len.copy_from_slice(&head[8..]);
    let (tag, len) = (u64::from_le_bytes(tag), u32::from_le_bytes(len) as usize);
    // quinn's chunks as they come: a length alone reserves nothing, and
    // the body is copied once, where it is wanted.
    let mut chunks = Vec::new();
    let mut got = 0;
    while got < len {
        let chunk = stream.read_chunk(len - got).await?;
        got += chunk.len();
        chunks.push(chunk);
    }
    Ok(Some((tag, MessageBody { chunks, len })))
}
