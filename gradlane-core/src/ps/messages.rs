//! The messages of a parameter-server request stream: pure encoding and
//! decoding, no sockets.
//!
//! A worker opens one bidirectional QUIC stream on its link and sends
//! [`Request`]s; the server answers each with one [`Reply`]. The first
//! request is a [`Request::Hello`] naming the worker, and the server's
//! [`Reply::Welcome`] carries what the application wants every worker to
//! know before it starts (the dataset seed, say). Every message is a u32 little-endian length and a body whose
//! first byte is a tag. Parameters travel here, reliably and exactly, as raw
//! little-endian f32; gradients travel either as a gradlane round on the
//! same link (the request only names the round) or, compressed, as a codec
//! frame inside the request.
//!
//! Decoding never panics; lengths are checked against caps the caller
//! derives from the model size, so a peer cannot make us allocate more than
//! a model's worth of memory.

use crate::bytes::{frame, prefix, Reader, Short, LEN_PREFIX};
use crate::ps::Disposition;
use thiserror::Error;

const TAG_PULL: u8 = 1;
const TAG_PUSH_ROUND: u8 = 2;
const TAG_PUSH_CODEC: u8 = 3;
const TAG_HELLO: u8 = 4;

const TAG_PARAMS: u8 = 1;
const TAG_REFUSED: u8 = 2;
const TAG_WELCOME: u8 = 3;

const DISP_NONE: u8 = 0;
const DISP_APPLIED: u8 = 1;
const DISP_DROPPED: u8 = 2;
const DISP_BUFFERED: u8 = 3;

/// Bytes of a [`Reply::Params`] body before the values: tag, index, steps,
/// disposition kind, staleness.
pub const PARAMS_HEADER_LEN: usize = 1 + 8 + 8 + 1 + 8;

/// Longest worker name accepted in a [`Request::Hello`], in bytes.
pub const MAX_NAME: usize = 256;

/// Longest welcome accepted in a [`Reply::Welcome`], in bytes.
pub const MAX_WELCOME: usize = 4096;

/// What a worker asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Here I am, under this name; tell me what I need to know.
    Hello {
        /// The worker's name, for the server's messages (at most
        /// [`MAX_NAME`] bytes of UTF-8).
        name: String,
    },
    /// Hand me parameters and a ticket index.
    Pull,
    /// My gradient for ticket `index` is gradlane round `round` on this link.
    PushRound {
        /// The ticket index the gradient was computed for.
        index: u64,
        /// The link round carrying it.
        round: u32,
    },
    /// My gradient for ticket `index`, as a codec frame (see [`crate::codec`]).
    PushCodec {
        /// The ticket index the gradient was computed for.
        index: u64,
        /// The encoded sparse gradient.
        frame: Vec<u8>,
    },
}

/// The head of a [`Reply::Params`]; the values follow it on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamsHeader {
    /// The ticket index to push back with the next gradient.
    pub index: u64,
    /// The server's step count when the parameters were copied.
    pub steps: u64,
    /// What happened to the push this answers (`None` for a pull).
    pub disposition: Option<Disposition>,
}

/// What the server answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Fresh parameters and the ticket that goes with them.
    Params {
        /// Index, steps and disposition.
        header: ParamsHeader,
        /// The parameters, flat, in layout order.
        values: Vec<f32>,
    },
    /// The request was refused (bad index, gradient rejected, no slot); the
    /// worker's ticket, if it had one, is unchanged.
    Refused(String),
    /// The answer to a hello: the application's bytes for every worker (at
    /// most [`MAX_WELCOME`]).
    Welcome(Vec<u8>),
}

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MessageError {
    /// An empty body.
    #[error("empty message")]
    Empty,
    /// A tag this version does not know.
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    /// The body is shorter than its fields.
    #[error("message truncated")]
    Truncated,
    /// Bytes after the last field.
    #[error("trailing bytes after message")]
    Trailing,
    /// The announced length is above what this model can need.
    #[error("message of {len} bytes exceeds the cap of {cap}")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// Largest accepted.
        cap: usize,
    },
    /// The values of a params reply are not whole f32s, or not the model's
    /// length.
    #[error("params of {got} bytes, expected {expected}")]
    ParamsLength {
        /// Bytes expected (4 x the model's parameter count).
        expected: usize,
        /// Bytes received.
        got: usize,
    },
    /// A disposition kind this version does not know.
    #[error("unknown disposition {0}")]
    UnknownDisposition(u8),
    /// A refusal reason that is not UTF-8.
    #[error("refusal reason is not utf-8")]
    BadReason,
    /// A worker name that is not UTF-8 or longer than [`MAX_NAME`].
    #[error("worker name is not utf-8 of at most {MAX_NAME} bytes")]
    BadName,
}

/// Largest request a server accepts for a model of `params` values: a codec
/// frame keeps at most every value, at well under 16 bytes each.
pub fn request_cap(params: usize) -> usize {
    params.saturating_mul(16).saturating_add(1024)
}

impl Request {
    /// The framed message (length prefix included).
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        match self {
            Request::Hello { name } => {
                body.push(TAG_HELLO);
                body.extend_from_slice(name.as_bytes());
            }
            Request::Pull => body.push(TAG_PULL),
            Request::PushRound { index, round } => {
                body.push(TAG_PUSH_ROUND);
                body.extend_from_slice(&index.to_le_bytes());
                body.extend_from_slice(&round.to_le_bytes());
            }
            Request::PushCodec { index, frame } => {
                body.reserve(9 + frame.len());
                body.push(TAG_PUSH_CODEC);
                body.extend_from_slice(&index.to_le_bytes());
                body.extend_from_slice(frame);
            }
        }
        prefixed(body)
    }

    /// Decodes a body (without the length prefix).
    pub fn decode(body: &[u8]) -> Result<Self, MessageError> {
        let (&tag, rest) = body.split_first().ok_or(MessageError::Empty)?;
        let mut r = Reader::new(rest);
        let req = match tag {
            TAG_HELLO => {
                let name = r.rest();
                if name.len() > MAX_NAME {
                    return Err(MessageError::BadName);
                }
                let name = std::str::from_utf8(name).map_err(|_| MessageError::BadName)?;
                Request::Hello {
                    name: name.to_owned(),
                }
            }
            TAG_PULL => Request::Pull,
            TAG_PUSH_ROUND => Request::PushRound {
                index: r.u64()?,
                round: r.u32()?,
            },
            TAG_PUSH_CODEC => {
                let index = r.u64()?;
                let frame = r.rest().to_vec();
                Request::PushCodec { index, frame }
            }
            t => return Err(MessageError::UnknownTag(t)),
        };
        r.finish()?;
        Ok(req)
    }
}

impl ParamsHeader {
    /// The framed head of a params reply carrying `values` f32s; the values'
    /// little-endian bytes must follow it.
    pub fn encode(&self, values: usize) -> Vec<u8> {
        let len = PARAMS_HEADER_LEN + values * 4;
        let mut out = Vec::with_capacity(LEN_PREFIX + PARAMS_HEADER_LEN);
        // The caller bounds `values` by the model size, which the handshake
        // already limited far below 4 GiB; saturate rather than wrap anyway.
        out.extend_from_slice(&prefix(len));
        out.push(TAG_PARAMS);
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&self.steps.to_le_bytes());
        let (kind, staleness) = match self.disposition {
            None => (DISP_NONE, 0),
            Some(Disposition::Applied { staleness }) => (DISP_APPLIED, staleness),
            Some(Disposition::Dropped { staleness }) => (DISP_DROPPED, staleness),
            Some(Disposition::Buffered) => (DISP_BUFFERED, 0),
        };
        out.push(kind);
        out.extend_from_slice(&staleness.to_le_bytes());
        out
    }

    /// Decodes the head of a params body (`PARAMS_HEADER_LEN` bytes, tag
    /// included).
    pub fn decode(head: &[u8]) -> Result<Self, MessageError> {
        let (&tag, rest) = head.split_first().ok_or(MessageError::Empty)?;
        if tag != TAG_PARAMS {
            return Err(MessageError::UnknownTag(tag));
        }
        let mut r = Reader::new(rest);
        let index = r.u64()?;
        let steps = r.u64()?;
        let kind = r.u8()?;
        let staleness = r.u64()?;
        r.finish()?;
        let disposition = match kind {
            DISP_NONE => None,
            DISP_APPLIED => Some(Disposition::Applied { staleness }),
            DISP_DROPPED => Some(Disposition::Dropped { staleness }),
            DISP_BUFFERED => Some(Disposition::Buffered),
            k => return Err(MessageError::UnknownDisposition(k)),
        };
        Ok(Self {
            index,
            steps,
            disposition,
        })
    }
}

/// The framed refusal message.
pub fn encode_refused(reason: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(1 + reason.len());
    body.push(TAG_REFUSED);
    body.extend_from_slice(reason.as_bytes());
    prefixed(body)
}

/// The framed welcome message. Callers check `welcome` against
/// [`MAX_WELCOME`] first (a worker refuses a longer one); this keeps the
/// frame within it whatever they pass.
pub fn encode_welcome(welcome: &[u8]) -> Vec<u8> {
    let welcome = &welcome[..welcome.len().min(MAX_WELCOME)];
    let mut body = Vec::with_capacity(1 + welcome.len());
    body.push(TAG_WELCOME);
    body.extend_from_slice(welcome);
    prefixed(body)
}

/// Decodes a welcome body (tag included).
pub fn decode_welcome(body: &[u8]) -> Result<Vec<u8>, MessageError> {
    match body.split_first() {
        Some((&TAG_WELCOME, welcome)) if welcome.len() > MAX_WELCOME => {
            Err(MessageError::TooLarge {
                len: body.len(),
                cap: MAX_WELCOME + 1,
            })
        }
        Some((&TAG_WELCOME, welcome)) => Ok(welcome.to_vec()),
        Some((&t, _)) => Err(MessageError::UnknownTag(t)),
        None => Err(MessageError::Empty),
    }
}

/// What the first byte of a reply body says follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    /// A params header and values.
    Params,
    /// A refusal reason.
    Refused,
    /// The welcome that answers a hello.
    Welcome,
}

/// Classifies a reply body by its tag.
pub fn reply_kind(tag: u8) -> Result<ReplyKind, MessageError> {
    match tag {
        TAG_PARAMS => Ok(ReplyKind::Params),
        TAG_REFUSED => Ok(ReplyKind::Refused),
        TAG_WELCOME => Ok(ReplyKind::Welcome),
        t => Err(MessageError::UnknownTag(t)),
    }
}

/// Decodes a refusal body (tag included).
pub fn decode_refused(body: &[u8]) -> Result<String, MessageError> {
    match body.split_first() {
        Some((&TAG_REFUSED, reason)) => std::str::from_utf8(reason)
            .map(str::to_owned)
            .map_err(|_| MessageError::BadReason),
        Some((&t, _)) => Err(MessageError::UnknownTag(t)),
        None => Err(MessageError::Empty),
    }
}

/// Checks a reply's announced length against the model: a params reply
/// must carry exactly `params` values; a refusal and a welcome are short.
pub fn check_reply_len(kind: ReplyKind, len: usize, params: usize) -> Result<(), MessageError> {
    match kind {
        ReplyKind::Params => {
            let expected = params * 4;
            let got = len.saturating_sub(PARAMS_HEADER_LEN);
            if len < PARAMS_HEADER_LEN {
                Err(MessageError::Truncated)
            } else if got != expected {
                Err(MessageError::ParamsLength { expected, got })
            } else {
                Ok(())
            }
        }
        ReplyKind::Refused if len > MAX_REASON + 1 => Err(MessageError::TooLarge {
            len,
            cap: MAX_REASON + 1,
        }),
        ReplyKind::Refused => Ok(()),
        ReplyKind::Welcome if len > MAX_WELCOME + 1 => Err(MessageError::TooLarge {
            len,
            cap: MAX_WELCOME + 1,
        }),
        ReplyKind::Welcome => Ok(()),
    }
}

/// Longest refusal reason accepted.
pub const MAX_REASON: usize = 4096;

fn prefixed(body: Vec<u8>) -> Vec<u8> {
    frame(&body)
}

impl From<Short> for MessageError {
    fn from(s: Short) -> Self {
        match s {
            Short::Truncated => MessageError::Truncated,
            Short::Trailing => MessageError::Trailing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(framed: &[u8]) -> &[u8] {
        let len = u32::from_le_bytes(framed[..4].try_into().unwrap()) as usize;
        assert_eq!(framed.len(), 4 + len);
        &framed[4..]
    }

    #[test]
    fn requests_round_trip() {
        for r in [
            Request::Hello {
                name: "worker 3".into(),
            },
            Request::Hello {
                name: String::new(),
            },
            Request::Pull,
            Request::PushRound {
                index: u64::MAX,
                round: 7,
            },
            Request::PushCodec {
                index: 3,
                frame: vec![1, 2, 3],
            },
            Request::PushCodec {
                index: 0,
                frame: vec![],
            },
        ] {
            assert_eq!(Request::decode(body(&r.encode())), Ok(r));
        }
    }

    #[test]
    fn bad_requests_are_errors() {
        assert_eq!(Request::decode(&[]), Err(MessageError::Empty));
        assert_eq!(Request::decode(&[9]), Err(MessageError::UnknownTag(9)));
        assert_eq!(
            Request::decode(&[TAG_PUSH_ROUND, 1, 2]),
            Err(MessageError::Truncated)
        );
        assert_eq!(Request::decode(&[TAG_PULL, 0]), Err(MessageError::Trailing));
        assert_eq!(
            Request::decode(&[TAG_HELLO, 0xff]),
            Err(MessageError::BadName)
        );
        let mut long = vec![TAG_HELLO];
        long.resize(2 + MAX_NAME, b'a');
        assert_eq!(Request::decode(&long), Err(MessageError::BadName));
    }

    #[test]
    fn welcomes_round_trip_and_are_bounded() {
        let f = encode_welcome(b"seed 7");
        assert_eq!(reply_kind(body(&f)[0]), Ok(ReplyKind::Welcome));
        assert_eq!(decode_welcome(body(&f)), Ok(b"seed 7".to_vec()));
        assert_eq!(decode_welcome(body(&encode_welcome(&[]))), Ok(vec![]));
        let long = encode_welcome(&vec![1; MAX_WELCOME + 10]);
        assert_eq!(body(&long).len(), MAX_WELCOME + 1);
        assert!(check_reply_len(ReplyKind::Welcome, MAX_WELCOME + 2, 1).is_err());
        assert_eq!(
            check_reply_len(ReplyKind::Welcome, MAX_WELCOME + 1, 1),
            Ok(())
        );
        assert_eq!(
            decode_welcome(&[TAG_REFUSED]),
            Err(MessageError::UnknownTag(2))
        );
        assert_eq!(decode_welcome(&[]), Err(MessageError::Empty));
    }

    #[test]
    fn params_header_round_trips() {
        for d in [
            None,
            Some(Disposition::Applied { staleness: 5 }),
            Some(Disposition::Dropped { staleness: 9 }),
            Some(Disposition::Buffered),
        ] {
            let h = ParamsHeader {
                index: 11,
                steps: 12,
                disposition: d,
            };
            let framed = h.encode(3);
            let len = u32::from_le_bytes(framed[..4].try_into().unwrap()) as usize;
            assert_eq!(len, PARAMS_HEADER_LEN + 12);
            assert_eq!(ParamsHeader::decode(&framed[4..]), Ok(h));
            assert_eq!(check_reply_len(ReplyKind::Params, len, 3), Ok(()));
            assert!(check_reply_len(ReplyKind::Params, len, 4).is_err());
        }
        let mut head = ParamsHeader {
            index: 0,
            steps: 0,
            disposition: None,
        }
        .encode(0);
        head[4 + 17] = 77;
        assert_eq!(
            ParamsHeader::decode(&head[4..]),
            Err(MessageError::UnknownDisposition(77))
        );
    }

    #[test]
    fn refusals_round_trip_and_are_bounded() {
        let f = encode_refused("no slot");
        assert_eq!(decode_refused(body(&f)), Ok("no slot".to_string()));
        assert_eq!(
            decode_refused(&[TAG_REFUSED, 0xff]),
            Err(MessageError::BadReason)
        );
        assert!(check_reply_len(ReplyKind::Refused, MAX_REASON + 2, 1).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..2000 {
            let len = n % 40;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = Request::decode(&bytes);
            let _ = ParamsHeader::decode(&bytes);
            let _ = decode_refused(&bytes);
            let _ = decode_welcome(&bytes);
        }
    }
}
