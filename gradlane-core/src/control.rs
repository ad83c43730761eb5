//! The messages of a link's control stream: the layout in the handshake and
//! per-round acknowledgements.
//!
//! The client opens one bidirectional stream and sends a [`Hello`] carrying
//! the model layout and chunk options, so the server need not know the model
//! in advance. The server answers [`Control::Welcome`] or closes the
//! connection with [`codes::LAYOUT_MISMATCH`]. Afterwards each side sends
//! [`Control::ImportantReceived`] when a round's important data is complete:
//! the peer's sender waits for it before it releases the lossy datagrams, so
//! datagrams (which QUIC puts ahead of stream data in every packet) never
//! delay important bytes.
//!
//! Every message is length-prefixed (u32, little-endian) and bounded by
//! [`MAX_MESSAGE`]; decoding never panics.

use crate::bytes::{Reader, Short};
use crate::layout::{ChunkOptions, ConvChunking, Layout, LayoutError, TensorKind, TensorSpec};
use thiserror::Error;

/// Application error codes used when gradlane closes a connection.
pub mod codes {
    /// Orderly close.
    pub const CLOSED: u32 = 0;
    /// The peer broke the gradlane protocol (malformed stream data).
    pub const PROTOCOL: u32 = 0x4701;
    /// The layouts of the two ends differ.
    pub const LAYOUT_MISMATCH: u32 = 0x4702;
    /// The handshake could not be read.
    pub const BAD_HELLO: u32 = 0x4703;
    /// Stream reset: the sender gave up on a round before its end.
    pub const ROUND_ABANDONED: u32 = 0x4704;
    /// The server gave up on the session for a reason it states (a
    /// parameter server whose synchronous round cannot fill, say).
    pub const ABORTED: u32 = 0x4705;
    /// A group went on without this rank (it was silent past the failure
    /// timeout, or cut off): it must rejoin, not go on with its state.
    pub const REMOVED: u32 = 0x4706;
}

/// Largest control message accepted (a layout of ~100k tensors fits).
pub const MAX_MESSAGE: usize = 16 << 20;

/// The largest layout a peer may announce, in `f32` bytes: its receiver
/// holds each open round of it in memory, so a hello that claims more is
/// refused before any buffer is sized for it.
pub const MAX_LAYOUT_BYTES: u64 = 1 << 36;

/// The longest tensor name a hello may carry.
pub const MAX_NAME_BYTES: usize = 4096;

/// "GLH" and the protocol version: 2 since segments carry a value format.
const HELLO_MAGIC: &[u8; 4] = b"GLH2";

/// The protocol version this build speaks (the segment format's,
/// [`wire::VERSION`](crate::wire::VERSION)).
pub const PROTOCOL_VERSION: u8 = crate::wire::VERSION;
const TAG_WELCOME: u8 = 1;
const TAG_IMPORTANT: u8 = 2;
const TAG_LOSSY_SENT: u8 = 3;
const TAG_LAYOUT: u8 = 4;
const TAG_LAYOUT_READY: u8 = 5;

/// Why a control message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HandshakeError {
    /// Not a gradlane hello.
    #[error("not a gradlane hello")]
    BadMagic,
    /// A gradlane hello of another protocol version: the two ends run
    /// different gradlane releases.
    #[error(
        "the peer speaks gradlane protocol {peer} and this end {ours}: run the same gradlane \
         release on every end (protocol 2 added value formats to every segment)"
    )]
    Version {
        /// The peer's version.
        peer: u8,
        /// This build's.
        ours: u8,
    },
    /// The message ended early.
    #[error("hello truncated")]
    Truncated,
    /// A tensor name is not UTF-8.
    #[error("tensor name is not utf-8")]
    BadName,
    /// An unknown tensor kind or conv chunking.
    #[error("unknown enum value {0}")]
    BadEnum(u8),
    /// Bytes after the end of the message.
    #[error("trailing bytes after hello")]
    Trailing,
    /// The layout in the hello is invalid.
    #[error("layout: {0}")]
    Layout(#[from] LayoutError),
    /// A control message of an unknown kind.
    #[error("unknown control message {0}")]
    UnknownControl(u8),
    /// The client sent no hello in time.
    #[error("no hello in time")]
    Timeout,
    /// The message is longer than [`MAX_MESSAGE`].
    #[error("control message of {0} bytes is too large")]
    TooLarge(usize),
    /// A tensor name longer than [`MAX_NAME_BYTES`].
    #[error("a tensor name of {0} bytes (at most {MAX_NAME_BYTES})")]
    NameTooLong(usize),
    /// A layout larger than [`MAX_LAYOUT_BYTES`] in all.
    #[error("a layout of {0} bytes in all (at most {MAX_LAYOUT_BYTES})")]
    LayoutTooLarge(u64),
}

/// What the client announces: the layout and how it is chunked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The model's tensors.
    pub layout: Layout,
    /// The chunk plan both ends use.
    pub chunking: ChunkOptions,
}

/// A message on the control stream after the hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// The server accepted the hello.
    Welcome,
    /// Every important chunk of this round arrived.
    ImportantReceived(u32),
    /// Every datagram of this round was handed to QUIC. quinn sends queued
    /// datagrams ahead of any stream data, so the datagrams were sent before
    /// this message: once it is read, the receiver need not wait out its
    /// grace period for datagrams that were lost.
    LossySent(u32),
    /// The sender registers another layout for its rounds under `id` (the
    /// next one in order).
    Layout {
        /// The layout's id in the sender's segments.
        id: u16,
        /// Whether the receiver adds lossy data that comes after its round
        /// was delivered into the next round (otherwise it drops it,
        /// counted: the sender resends what was lost by other means).
        merge_late: bool,
        /// The layout and its chunking.
        hello: Hello,
    },
    /// The receiver is ready for rounds of layout `id`.
    LayoutReady(u16),
}

impl From<Short> for HandshakeError {
    fn from(s: Short) -> Self {
        match s {
            Short::Truncated => HandshakeError::Truncated,
            Short::Trailing => HandshakeError::Trailing,
        }
    }
}

impl Hello {
    /// The message body (without the length prefix).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.layout.len() * 48);
        out.extend_from_slice(HELLO_MAGIC);
        out.extend_from_slice(&self.chunking.block_values.to_le_bytes());
        out.push(match self.chunking.conv {
            ConvChunking::PerKernel => 0,
            ConvChunking::PerSlice => 1,
        });
        out.extend_from_slice(&(self.layout.len() as u32).to_le_bytes());
        for t in self.layout.tensors() {
            out.push(match t.kind {
                TensorKind::Dense => 0,
                TensorKind::Conv2d => 1,
            });
            out.extend_from_slice(&(t.name.len() as u32).to_le_bytes());
            out.extend_from_slice(t.name.as_bytes());
            out.push(t.shape.len() as u8);
            for &d in &t.shape {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
        }
        out
    }

    /// Decodes and validates a hello body.
    pub fn decode(buf: &[u8]) -> Result<Self, HandshakeError> {
        let mut r = Reader::new(buf);
        let magic = r.take(4)?;
        if magic != HELLO_MAGIC {
            return Err(match magic {
                [b'G', b'L', b'H', v @ b'0'..=b'9'] => HandshakeError::Version {
                    peer: v - b'0',
                    ours: PROTOCOL_VERSION,
                },
                _ => HandshakeError::BadMagic,
            });
        }
        let block_values = r.u32()?;
        let conv = match r.u8()? {
            0 => ConvChunking::PerKernel,
            1 => ConvChunking::PerSlice,
            x => return Err(HandshakeError::BadEnum(x)),
        };
        let n = r.u32()? as usize;
        // Each tensor takes at least 6 bytes: bound the allocation by the input.
        if n > r.remaining() / 6 {
            return Err(HandshakeError::Truncated);
        }
        let mut tensors = Vec::with_capacity(n);
        for _ in 0..n {
            let kind = match r.u8()? {
                0 => TensorKind::Dense,
                1 => TensorKind::Conv2d,
                x => return Err(HandshakeError::BadEnum(x)),
            };
            let len = r.u32()? as usize;
            if len > MAX_NAME_BYTES {
                return Err(HandshakeError::NameTooLong(len));
            }
            let name = std::str::from_utf8(r.take(len)?).map_err(|_| HandshakeError::BadName)?;
            let dims = r.u8()? as usize;
            let mut shape = Vec::with_capacity(dims);
            for _ in 0..dims {
                shape.push(usize::try_from(r.u64()?).unwrap_or(usize::MAX));
            }
            tensors.push(TensorSpec {
                name: name.to_string(),
                shape,
                kind,
            });
        }
        r.finish()?;
        let bytes = tensors.iter().fold(0u64, |sum, t| {
            let len = t.checked_len().map_or(u64::MAX, |n| n as u64);
            sum.saturating_add(len.saturating_mul(4))
        });
        if bytes > MAX_LAYOUT_BYTES {
            return Err(HandshakeError::LayoutTooLarge(bytes));
        }
        let layout = Layout::new(tensors)?;
        let chunking = ChunkOptions { block_values, conv };
        // Refuse options the plan cannot be made with before anyone relies on them.
        layout.plan(chunking)?;
        Ok(Self { layout, chunking })
    }
}

impl Control {
    /// The message body (without the length prefix).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Control::Welcome => vec![TAG_WELCOME],
            Control::ImportantReceived(r) => {
                let mut v = vec![TAG_IMPORTANT];
                v.extend_from_slice(&r.to_le_bytes());
                v
            }
            Control::LossySent(r) => {
                let mut v = vec![TAG_LOSSY_SENT];
                v.extend_from_slice(&r.to_le_bytes());
                v
            }
            Control::Layout {
                id,
                merge_late,
                hello,
            } => {
                let mut v = vec![TAG_LAYOUT];
                v.extend_from_slice(&id.to_le_bytes());
                v.push(u8::from(*merge_late));
                v.extend_from_slice(&hello.encode());
                v
            }
            Control::LayoutReady(id) => {
                let mut v = vec![TAG_LAYOUT_READY];
                v.extend_from_slice(&id.to_le_bytes());
                v
            }
        }
    }

    /// Decodes a control body.
    pub fn decode(buf: &[u8]) -> Result<Self, HandshakeError> {
        let mut r = Reader::new(buf);
        let msg = match r.u8()? {
            TAG_WELCOME => Control::Welcome,
            TAG_IMPORTANT => Control::ImportantReceived(r.u32()?),
            TAG_LOSSY_SENT => Control::LossySent(r.u32()?),
            TAG_LAYOUT => {
                let id = u16::from_le_bytes(r.array()?);
                let merge_late = match r.u8()? {
                    0 => false,
                    1 => true,
                    x => return Err(HandshakeError::BadEnum(x)),
                };
                let hello = Hello::decode(r.rest())?;
                Control::Layout {
                    id,
                    merge_late,
                    hello,
                }
            }
            TAG_LAYOUT_READY => Control::LayoutReady(u16::from_le_bytes(r.array()?)),
            x => return Err(HandshakeError::UnknownControl(x)),
        };
        r.finish()?;
        Ok(msg)
    }
}

/// What a link tells its peer in the reason of its CONNECTION_CLOSE (code
/// [`codes::CLOSED`]).
///
/// quinn discards whatever stream data is unsent or unacknowledged when a
/// connection closes, a confirmation of the last round among it; the close
/// frame itself is what the peer is sure to see last (quinn resends it in
/// answer to every packet from the peer while the connection is closing).
/// So it says again which round this end confirmed last: a sender whose
/// round the peer had, but whose confirmation was cut off by the close,
/// still learns that the round arrived.
///
/// Written as text (`done confirmed=17 read_all`) so it stays legible in a
/// packet capture or a log; words it does not know are skipped, so later
/// versions can add some.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CloseNote {
    /// The last round whose important part this end confirmed; rounds
    /// completed after the close began are not confirmed.
    pub last_confirmed: Option<u32>,
    /// This end read the peer's control stream to its end: every
    /// confirmation the peer sent was processed before the close.
    pub read_all: bool,
}

impl CloseNote {
    /// The reason bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = String::from("done");
        if let Some(r) = self.last_confirmed {
            out.push_str(&format!(" confirmed={r}"));
        }
        if self.read_all {
            out.push_str(" read_all");
        }
        out.into_bytes()
    }

    /// Reads a reason written by [`encode`](Self::encode); `None` for any
    /// other reason (not text, not starting with `done`).
    pub fn decode(reason: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(reason).ok()?;
        let mut words = text.split(' ');
        if words.next() != Some("done") {
            return None;
        }
        let mut note = Self::default();
        for word in words {
            if word == "read_all" {
                note.read_all = true;
            } else if let Some(r) = word.strip_prefix("confirmed=") {
                note.last_confirmed = Some(r.parse().ok()?);
            }
        }
        Some(note)
    }
}

/// Prefixes a body with its length ([`bytes::frame`](crate::bytes::frame)).
pub fn framed(body: &[u8]) -> Vec<u8> {
    crate::bytes::frame(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    #[test]
    fn hello_round_trips() {
        let h = Hello {
            layout: presets::resnet50(),
            chunking: ChunkOptions {
                block_values: 128,
                conv: ConvChunking::PerSlice,
            },
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        for c in [
            Control::Welcome,
            Control::ImportantReceived(7),
            Control::LossySent(9),
            Control::Layout {
                id: 3,
                merge_late: false,
                hello: h.clone(),
            },
            Control::LayoutReady(65535),
        ] {
            assert_eq!(Control::decode(&c.encode()).unwrap(), c);
        }
    }

    #[test]
    fn close_notes_round_trip_and_bad_ones_are_none() {
        for note in [
            CloseNote::default(),
            CloseNote {
                last_confirmed: Some(0),
                read_all: false,
            },
            CloseNote {
                last_confirmed: Some(u32::MAX),
                read_all: true,
            },
        ] {
            assert_eq!(CloseNote::decode(&note.encode()), Some(note));
        }
        assert_eq!(CloseNote::decode(b"done"), Some(CloseNote::default()));
        // Words a later version may add are skipped.
        assert_eq!(
            CloseNote::decode(b"done flushed confirmed=3"),
            Some(CloseNote {
                last_confirmed: Some(3),
                read_all: false
            })
        );
        for bad in [
            &b""[..],
            b"endpoint closed",
            b"done confirmed=x",
            b"done confirmed=4294967296",
            b"\xff\xfe",
        ] {
            assert_eq!(CloseNote::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bad_hellos_are_errors() {
        let h = Hello {
            layout: presets::tiny(),
            chunking: ChunkOptions::default(),
        }
        .encode();
        for cut in 0..h.len() {
            assert!(Hello::decode(&h[..cut]).is_err());
        }
        let mut bad = h.clone();
        bad[0] = b'X';
        assert_eq!(Hello::decode(&bad), Err(HandshakeError::BadMagic));
        // A peer of the f32-only protocol is told so, not misread.
        let mut old = h.clone();
        old[3] = b'1';
        let err = Hello::decode(&old).unwrap_err();
        assert_eq!(err, HandshakeError::Version { peer: 1, ours: 2 });
        assert!(err.to_string().contains("same gradlane release"));
        let mut zero_block = h.clone();
        zero_block[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            Hello::decode(&zero_block),
            Err(HandshakeError::Layout(LayoutError::ZeroBlock))
        );
        let mut long = h;
        long.push(0);
        assert_eq!(Hello::decode(&long), Err(HandshakeError::Trailing));
    }

    /// A hello of `count` dense tensors of `shape`, named `name` and then
    /// `t1`, `t2`, ...
    fn hello_of(count: usize, name: &str, shape: &[usize]) -> Vec<u8> {
        let tensors = (0..count)
            .map(|i| match i {
                0 => TensorSpec::dense(name, shape.to_vec()),
                i => TensorSpec::dense(format!("t{i}"), shape.to_vec()),
            })
            .collect();
        Hello {
            layout: Layout::new(tensors).unwrap(),
            chunking: ChunkOptions::default(),
        }
        .encode()
    }

    #[test]
    fn oversized_hellos_are_refused_before_their_layout_is_made() {
        // 33 tensors of 2 GiB each: every one valid, 66 GiB in all.
        let big = [1usize << 29];
        assert_eq!(
            Hello::decode(&hello_of(33, "a", &big)),
            Err(HandshakeError::LayoutTooLarge(33 << 31))
        );
        let name = "n".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(
            Hello::decode(&hello_of(1, &name, &[1])),
            Err(HandshakeError::NameTooLong(MAX_NAME_BYTES + 1))
        );
        // A count of tensors the message cannot hold: refused by its
        // length, before a tensor is allocated.
        let mut many = hello_of(1, "a", &[1]);
        many[9..13].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Hello::decode(&many), Err(HandshakeError::Truncated));
    }
}
