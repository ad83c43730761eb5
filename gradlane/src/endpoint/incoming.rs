//! A client knocking at an [`Endpoint`] ([`Incoming`]),
//! and the server's half of the gradlane handshake that makes it a link.

#[cfg(doc)]
use super::Endpoint;
use super::{before, connection_mark, NO_HELLO};
use crate::config::Config;
use crate::link::{read_control, write_control, Carrier, Link, LinkError};
use crate::socket::marking::MarkRegistry;
use gradlane_core::control::{codes, Control, HandshakeError, Hello};
use gradlane_core::layout::Layout;
use quinn::VarInt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::time::Instant;

/// A client that reached the endpoint and has not been through the QUIC
/// and gradlane handshakes yet (see [`Endpoint::incoming`]).
#[derive(Debug)]
pub struct Incoming {
    pub(super) incoming: quinn::Incoming,
    /// Its own server configuration, if it differs from the endpoint's.
    pub(super) server: Option<Arc<quinn::ServerConfig>>,
    pub(super) config: Config,
    pub(super) marks: Option<Arc<MarkRegistry>>,
}

/// Why an incoming client did not become a link.
#[derive(Debug, Error)]
pub enum IncomingError {
    /// The QUIC/TLS handshake failed, or the client went away before it
    /// began the gradlane handshake.
    #[error("quic handshake: {0}")]
    Quic(quinn::ConnectionError),
    /// The client opened no control stream within
    /// [`Config::hello_timeout`] after the QUIC handshake: it never began
    /// the gradlane handshake (a stray QUIC client, or a connect's attempt
    /// whose close was lost). The connection was closed.
    #[error("no gradlane handshake begun within {waited:?}")]
    Silent {
        /// The hello timeout.
        waited: Duration,
    },
    /// The gradlane handshake failed (bad hello, layout mismatch, no hello
    /// in time).
    #[error(transparent)]
    Link(#[from] LinkError),
}

impl Incoming {
    /// Where the client is.
    pub fn remote_address(&self) -> SocketAddr {
        self.incoming.remote_address()
    }

    /// Runs both handshakes; the client has [`Config::hello_timeout`] after
    /// the QUIC handshake to send its hello (one that has not even opened
    /// its control stream by then is [`IncomingError::Silent`]).
    pub async fn finish(self) -> Result<Link, IncomingError> {
        let connecting = match self.server {
            Some(server) => self.incoming.accept_with(server),
            None => self.incoming.accept(),
        };
        let conn = connecting
            .map_err(IncomingError::Quic)?
            .await
            .map_err(IncomingError::Quic)?;
        let config = self.config;
        let waited = config.hello_timeout;
        let close = |why: &str| conn.close(VarInt::from_u32(codes::BAD_HELLO), why.as_bytes());
        let deadline = Instant::now().checked_add(waited);
        // A client that goes away before it opens the control stream
        // never began the gradlane handshake (a connect that gave up on
        // this attempt for another): the connection failed, as a QUIC
        // handshake does.
        let control = match before(deadline, conn.accept_bi()).await {
            Some(control) => control.map_err(IncomingError::Quic)?,
            None => {
                close(&format!("{NO_HELLO} {waited:?}"));
                return Err(IncomingError::Silent { waited });
            }
        };
        let welcome = welcome(&config, &self.marks, conn.clone(), control);
        match before(deadline, welcome).await {
            Some(r) => Ok(r?),
            None => {
                close(&format!("{NO_HELLO} {waited:?}"));
                Err(LinkError::Handshake(HandshakeError::Timeout).into())
            }
        }
    }
}

/// The server's half of the gradlane handshake on `conn`, whose client
/// opened `control`: its hello read and checked, then the welcome.
async fn welcome(
    config: &Config,
    marks: &Option<Arc<MarkRegistry>>,
    conn: quinn::Connection,
    control: (quinn::SendStream, quinn::RecvStream),
) -> Result<Link, LinkError> {
    let (mut send, mut recv) = control;
    let hello = match read_control(&mut recv).await {
        Ok(Some(body)) => Hello::decode(&body),
        Ok(None) => Err(gradlane_core::control::HandshakeError::Truncated),
        Err(LinkError::Handshake(e)) => Err(e),
        Err(e) => return Err(e),
    };
    let hello = match hello {
        Ok(h) => h,
        Err(e) => {
            let why = format!("bad hello: {e}");
            conn.close(VarInt::from_u32(codes::BAD_HELLO), why.as_bytes());
            return Err(e.into());
        }
    };
    if let Some(expected) = &config.expect_layout {
        if expected != &hello.layout {
            let why = layout_difference(expected, &hello.layout);
            conn.close(VarInt::from_u32(codes::LAYOUT_MISMATCH), why.as_bytes());
            return Err(LinkError::Rejected {
                code: codes::LAYOUT_MISMATCH as u64,
                reason: why,
            });
        }
    }
    write_control(&mut send, Control::Welcome).await?;
    tracing::info!(remote = %conn.remote_address(), tensors = hello.layout.len(), "link up");
    let mark = connection_mark(marks, config, &conn);
    let carrier = Carrier {
        conn,
        control: (send, recv),
        floor_mtu: config.packets.bounds().0,
        mark,
    };
    Link::start(carrier, hello.layout, hello.chunking, config)
}

/// Says where two layouts first differ, for the close reason.
fn layout_difference(expected: &Layout, got: &Layout) -> String {
    if expected.len() != got.len() {
        return format!(
            "layout mismatch: expected {} tensors, got {}",
            expected.len(),
            got.len()
        );
    }
    for (i, (a, b)) in expected.tensors().iter().zip(got.tensors()).enumerate() {
        if a != b {
            return format!(
                "layout mismatch at tensor {i}: expected {} {:?}, got {} {:?}",
                a.name, a.shape, b.name, b.shape
            );
        }
    }
    "layout mismatch".into()
}
