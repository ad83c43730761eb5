//! Reading and writing length-prefixed messages on a request stream.

use crate::LinkError;
use bytes::Bytes;
use gradlane_core::ps::messages::{MessageError, LEN_PREFIX};
use quinn::{ReadExactError, RecvStream, SendStream};
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

fn read_error(e: quinn::ReadError) -> StreamError {
    match e {
        quinn::ReadError::ConnectionLost(c) => StreamError::Link(LinkError::from_conn(c)),
        e => StreamError::Link(LinkError::Read(e)),
    }
}

fn exact_error(e: ReadExactError) -> StreamError {
    match e {
        ReadExactError::FinishedEarly(_) => StreamError::Truncated,
        ReadExactError::ReadError(e) => read_error(e),
    }
}

/// Reads a length prefix; `None` if the stream ended cleanly before it.
pub(super) async fn read_len(recv: &mut RecvStream) -> Result<Option<usize>, StreamError> {
    let mut len = [0u8; LEN_PREFIX];
    match recv.read_exact(&mut len).await {
        Ok(()) => Ok(Some(u32::from_le_bytes(len) as usize)),
        Err(ReadExactError::FinishedEarly(0)) => Ok(None),
        Err(e) => Err(exact_error(e)),
    }
}

/// Reads exactly `buf.len()` bytes.
pub(super) async fn read_into(recv: &mut RecvStream, buf: &mut [u8]) -> Result<(), StreamError> {
    recv.read_exact(buf).await.map_err(exact_error)
}

/// Reads one message body of at most `cap` bytes; `None` at a clean end.
pub(super) async fn read_body(
    recv: &mut RecvStream,
    cap: usize,
) -> Result<Option<Vec<u8>>, StreamError> {
    let Some(len) = read_len(recv).await? else {
        return Ok(None);
    };
    if len > cap {
        return Err(MessageError::TooLarge { len, cap }.into());
    }
    let mut body = vec![0u8; len];
    read_into(recv, &mut body).await?;
    Ok(Some(body))
}

/// Writes a whole framed message.
pub(super) async fn write_bytes(send: &mut SendStream, bytes: Bytes) -> Result<(), StreamError> {
    send.write_chunk(bytes)
        .await
        .map_err(|e| StreamError::Link(write_error(e)))
}

fn write_error(e: quinn::WriteError) -> LinkError {
    match e {
        quinn::WriteError::ConnectionLost(c) => LinkError::from_conn(c),
        e => LinkError::Write(e),
    }
}
