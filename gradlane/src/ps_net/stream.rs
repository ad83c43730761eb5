//! Moving the parameter server's messages over its request stream: the
//! crate's framing, with errors in the parameter server's terms.

use crate::framing::{self, FrameError};
use crate::link::{read_error, write_error};
use crate::LinkError;
use bytes::Bytes;
use gradlane_core::ps::messages::MessageError;
use quinn::{RecvStream, SendStream};
use thiserror::Error;

/// Why a message could not be moved over the request stream.
#[derive(Debug, Error)]
pub enum StreamError {
    /// The connection is gone, or the peer closed it with a code.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The stream ended inside a message.
    #[error("stream ended inside a message")]
    Truncated,
    /// The message broke the protocol.
    #[error(transparent)]
    Message(#[from] MessageError),
}

impl From<FrameError> for StreamError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Truncated => StreamError::Truncated,
            FrameError::TooLarge { len, cap } => MessageError::TooLarge { len, cap }.into(),
            FrameError::Read(e) => StreamError::Link(read_error(e)),
        }
    }
}

/// Reads a length prefix; `None` if the stream ended cleanly before it.
pub(super) async fn read_len(recv: &mut RecvStream) -> Result<Option<usize>, StreamError> {
    Ok(framing::read_len(recv).await?)
}

/// Reads exactly `buf.len()` bytes.
pub(super) async fn read_into(recv: &mut RecvStream, buf: &mut [u8]) -> Result<(), StreamError> {
    Ok(framing::read_exact(recv, buf).await?)
}

/// Reads one message body of at most `cap` bytes; `None` at a clean end.
pub(super) async fn read_body(
    recv: &mut RecvStream,
    cap: usize,
) -> Result<Option<Vec<u8>>, StreamError> {
    Ok(framing::read_frame(recv, cap).await?)
}

/// Writes a whole framed message.
pub(super) async fn write_bytes(send: &mut SendStream, bytes: Bytes) -> Result<(), StreamError> {
    framing::write_frame(send, bytes)
        .await
        .map_err(|e| StreamError::Link(write_error(e)))
}
