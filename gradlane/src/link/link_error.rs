//! Why a link operation failed ([`LinkError`]), and quinn's errors as
//! the link's.

#[cfg(doc)]
use super::{Link, MAX_MESSAGE_BYTES};
use gradlane_core::control::{codes, HandshakeError};
use gradlane_core::encode::EncodeError;
use gradlane_core::reassembly::ReassemblyError;
use quinn::ConnectionError;
use std::time::Duration;
use thiserror::Error;

/// Why a link operation failed.
#[derive(Debug, Error)]
pub enum LinkError {
    /// The connection is gone (closed by either side, timed out, reset).
    #[error("connection: {0}")]
    Connection(#[from] ConnectionError),
    /// [`Endpoint::connect`](crate::Endpoint::connect) got no link to
    /// `addr` within [`Config::connect_timeout`](crate::Config::connect_timeout):
    /// no handshake it started there finished (no server there, or
    /// nothing got through), or the server did not welcome the one that
    /// did in time.
    #[error("no link to {addr} within {waited:?} ({attempts} handshakes tried)")]
    ConnectTimeout {
        /// The server's address.
        addr: std::net::SocketAddr,
        /// How long the connect tried: the connect timeout.
        waited: Duration,
        /// How many QUIC handshakes it started.
        attempts: usize,
    },
    /// The peer closed the link in order ([`Link::close`], or dropped it).
    /// With `round`: before that round's important part was complete there,
    /// so the round was not delivered (a round the peer had is never
    /// reported this way, even if it closed at once after taking it).
    #[error("{}", peer_closed_message(*.round))]
    PeerClosed {
        /// The round this end was sending, if it was sending one.
        round: Option<u32>,
    },
    /// [`Link::close`] closed the link without the peer's acknowledgement:
    /// the peer did not answer within the wait (gone, or the path lost
    /// everything), so it may not have read this end's last confirmations.
    #[error("the peer did not acknowledge the close within {waited:?}; closed anyway")]
    CloseUnacknowledged {
        /// How long the close waited.
        waited: Duration,
    },
    /// The peer closed the connection with a gradlane error code.
    #[error("peer closed the link (code {code:#x}): {reason}")]
    Rejected {
        /// The application error code (see [`codes`]).
        code: u64,
        /// The peer's reason.
        reason: String,
    },
    /// Writing to a stream failed (not because the connection closed: that
    /// is [`LinkError::Rejected`], [`LinkError::PeerClosed`] or
    /// [`LinkError::Connection`]).
    #[error("write: {0}")]
    Write(quinn::WriteError),
    /// Reading a stream failed (not because the connection closed, as for
    /// [`LinkError::Write`]).
    #[error("read: {0}")]
    Read(quinn::ReadError),
    /// A round of a layout this end never registered; nothing was sent.
    #[error("layout {0} is not registered on this link")]
    UnknownLayout(u16),
    /// A message body over [`MAX_MESSAGE_BYTES`]; nothing was sent.
    #[error("a message of {0} bytes is over the limit of 4 GiB")]
    MessageTooLarge(usize),
    /// The round could not be encoded (bad gradients, bad config).
    #[error("encode: {0}")]
    Encode(#[from] EncodeError),
    /// The received data broke the protocol; the connection was closed.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A local reassembly request failed.
    #[error("reassembly: {0}")]
    Reassembly(#[from] ReassemblyError),
    /// The handshake could not be decoded.
    #[error("handshake: {0}")]
    Handshake(#[from] HandshakeError),
    /// The peer does not accept QUIC datagrams.
    #[error("peer does not accept datagrams")]
    NoDatagrams,
    /// A datagram could not be sent.
    #[error("datagram: {0}")]
    Datagram(#[from] quinn::SendDatagramError),
    /// A task of the link failed (panicked or was cancelled).
    #[error("internal: {0}")]
    Internal(String),
    /// A round index that does not follow the last one sent on this link.
    /// The peer keeps what it received of a round under its index (and
    /// has delivered it, or will): a second round under the same or an
    /// older index would be refused by it as a protocol error, dropped as
    /// stale, or mixed with what the first attempt sent. Nothing was sent.
    #[error("round {round} does not follow round {last} (indexes must increase)")]
    RoundOrder {
        /// The index asked for.
        round: u32,
        /// The last index whose data may have reached the peer.
        last: u32,
    },
}

fn peer_closed_message(round: Option<u32>) -> String {
    match round {
        Some(r) => {
            format!("the peer closed the link before round {r}'s important part was complete")
        }
        None => "the peer closed the link".into(),
    }
}

/// A stream error caused by the connection's close says why the
/// connection closed, whichever stream saw it first.
impl From<quinn::WriteError> for LinkError {
    fn from(e: quinn::WriteError) -> Self {
        write_error(e)
    }
}

impl From<quinn::ReadError> for LinkError {
    fn from(e: quinn::ReadError) -> Self {
        read_error(e)
    }
}

impl LinkError {
    /// Maps a connection error that carries a gradlane close code to
    /// [`LinkError::PeerClosed`] (an orderly close) or
    /// [`LinkError::Rejected`] (any other code).
    pub(crate) fn from_conn(e: ConnectionError) -> Self {
        match e {
            ConnectionError::ApplicationClosed(c)
                if c.error_code.into_inner() == u64::from(codes::CLOSED) =>
            {
                LinkError::PeerClosed { round: None }
            }
            ConnectionError::ApplicationClosed(c) => LinkError::Rejected {
                code: c.error_code.into_inner(),
                reason: String::from_utf8_lossy(&c.reason).into_owned(),
            },
            e => LinkError::Connection(e),
        }
    }
}

pub(crate) fn read_error(e: quinn::ReadError) -> LinkError {
    match e {
        quinn::ReadError::ConnectionLost(c) => LinkError::from_conn(c),
        e => LinkError::Read(e),
    }
}

pub(crate) fn write_error(e: quinn::WriteError) -> LinkError {
    match e {
        quinn::WriteError::ConnectionLost(c) => LinkError::from_conn(c),
        e => LinkError::Write(e),
    }
}
