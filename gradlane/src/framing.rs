//! One length-prefixed message at a time over a QUIC stream (the frame of
//! `gradlane_core::bytes`): the link's control stream and the parameter
//! server's request stream both move their messages this way.

use bytes::Bytes;
use gradlane_core::bytes::LEN_PREFIX;
use quinn::{ReadExactError, RecvStream, SendStream};

/// Why a frame could not be read.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The stream ended inside a frame.
    Truncated,
    /// The length prefix is over the reader's cap.
    TooLarge { len: usize, cap: usize },
    /// Reading failed (the stream was reset, or the connection is gone).
    Read(quinn::ReadError),
}

fn exact_error(e: ReadExactError) -> FrameError {
    match e {
        ReadExactError::FinishedEarly(_) => FrameError::Truncated,
        ReadExactError::ReadError(e) => FrameError::Read(e),
    }
}

/// Reads a length prefix; `None` if the stream ended cleanly before it.
pub(crate) async fn read_len(recv: &mut RecvStream) -> Result<Option<usize>, FrameError> {
    let mut len = [0u8; LEN_PREFIX];
    match recv.read_exact(&mut len).await {
        Ok(()) => Ok(Some(u32::from_le_bytes(len) as usize)),
        Err(ReadExactError::FinishedEarly(0)) => Ok(None),
        Err(e) => Err(exact_error(e)),
    }
}

/// Reads exactly `buf.len()` bytes.
pub(crate) async fn read_exact(recv: &mut RecvStream, buf: &mut [u8]) -> Result<(), FrameError> {
    recv.read_exact(buf).await.map_err(exact_error)
}

/// Reads one frame's body of at most `cap` bytes (checked before anything
/// is allocated); `None` at a clean end of the stream.
pub(crate) async fn read_frame(
    recv: &mut RecvStream,
    cap: usize,
) -> Result<Option<Vec<u8>>, FrameError> {
    let Some(len) = read_len(recv).await? else {
        return Ok(None);
    };
    if len > cap {
        return Err(FrameError::TooLarge { len, cap });
    }
    let mut body = vec![0u8; len];
    read_exact(recv, &mut body).await?;
    Ok(Some(body))
}

/// Writes a whole frame (prefix included).
pub(crate) async fn write_frame(
    send: &mut SendStream,
    frame: Bytes,
) -> Result<(), quinn::WriteError> {
    send.write_chunk(frame).await
}
