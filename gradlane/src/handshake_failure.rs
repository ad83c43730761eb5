//! Why a connection a rank accepted failed its handshake, told from the
//! TLS alert in its close: quinn carries a refusal across only as that
//! code (its text stays with the side that refused). So each kind of
//! refusal sends its own alert ([`crate::tls`]), and the accepting rank,
//! which otherwise would wait in silence for a rank that will never come,
//! can say at once who knocked and why they parted.

use std::fmt;

/// TLS alerts (RFC 8446 §6) that gradlane's refusals send.
const UNKNOWN_CA: u8 = 48;
const ACCESS_DENIED: u8 = 49;
const NO_APPLICATION_PROTOCOL: u8 = 120;

/// Which side of a handshake refused the other's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refuser {
    /// This rank refused the peer's certificate.
    ThisRank,
    /// The peer refused this rank's certificate.
    Peer,
}

/// Why an accepted connection's handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeFailure {
    /// The two certificates are signed by different CAs: a rank of
    /// another job's CA, or a stranger.
    #[error("wrong CA: {}", match by {
        Refuser::ThisRank => "its certificate is not signed by this job's ca.pem",
        Refuser::Peer => "it does not trust this rank's certificate (its ca.pem is another CA's)",
    })]
    WrongCa {
        /// Who refused.
        by: Refuser,
    },
    /// The same CA, certificates of different jobs (`certs --job`).
    #[error("wrong job name: {}", match by {
        Refuser::ThisRank => "its certificate names another job, or none",
        Refuser::Peer => "it refused this rank's certificate, which names another job",
    })]
    WrongJob {
        /// Who refused.
        by: Refuser,
    },
    /// The peer speaks another version of gradlane's protocol (ALPN).
    #[error("wrong protocol version: it speaks another gradlane version than this rank's")]
    WrongProtocol {
        /// Who refused.
        by: Refuser,
    },
    /// Anything else: a timeout, an abandoned attempt, a scan; quinn's
    /// words.
    #[error("{0}")]
    Other(String),
}

impl HandshakeFailure {
    /// The failure `e` of an accepted connection's handshake.
    pub fn of(e: &quinn::ConnectionError) -> Self {
        let (code, by) = match e {
            quinn::ConnectionError::ConnectionClosed(close) => {
                (u64::from(close.error_code), Refuser::Peer)
            }
            quinn::ConnectionError::TransportError(t) => (u64::from(t.code), Refuser::ThisRank),
            other => return Self::Other(other.to_string()),
        };
        match alert_of(code) {
            Some(UNKNOWN_CA) => Self::WrongCa { by },
            Some(ACCESS_DENIED) => Self::WrongJob { by },
            Some(NO_APPLICATION_PROTOCOL) => Self::WrongProtocol { by },
            _ => Self::Other(e.to_string()),
        }
    }

    /// Whether the peer was refused (or refused this rank) for what its
    /// certificate or protocol is: a rank that will not join as it is,
    /// worth a warning, unlike a timeout or an abandoned attempt.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, Self::Other(_))
    }
}

impl fmt::Display for Refuser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ThisRank => "this rank",
            Self::Peer => "the peer",
        })
    }
}

/// The TLS alert in a QUIC CRYPTO_ERROR code (0x100 + alert), if it is one.
fn alert_of(code: u64) -> Option<u8> {
    code.checked_sub(0x100).and_then(|a| u8::try_from(a).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn::{ConnectionClose, ConnectionError, TransportErrorCode};

    fn closed_by_peer(alert: u8) -> ConnectionError {
        ConnectionError::ConnectionClosed(ConnectionClose {
            error_code: TransportErrorCode::crypto(alert),
            frame_type: None,
            reason: bytes::Bytes::new(),
        })
    }

    #[test]
    fn each_refusal_alert_is_its_reason_and_the_rest_is_other() {
        assert_eq!(
            HandshakeFailure::of(&closed_by_peer(UNKNOWN_CA)),
            HandshakeFailure::WrongCa { by: Refuser::Peer }
        );
        assert_eq!(
            HandshakeFailure::of(&closed_by_peer(ACCESS_DENIED)),
            HandshakeFailure::WrongJob { by: Refuser::Peer }
        );
        assert_eq!(
            HandshakeFailure::of(&closed_by_peer(NO_APPLICATION_PROTOCOL)),
            HandshakeFailure::WrongProtocol { by: Refuser::Peer }
        );
        // A generic handshake failure, a timeout: quinn's words.
        for e in [closed_by_peer(40), ConnectionError::TimedOut] {
            let f = HandshakeFailure::of(&e);
            assert!(!f.is_refusal(), "{f:?}");
            assert_eq!(f.to_string(), e.to_string());
        }
        let text = HandshakeFailure::WrongJob {
            by: Refuser::ThisRank,
        }
        .to_string();
        assert!(text.starts_with("wrong job name: "), "{text}");
    }
}
