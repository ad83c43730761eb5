//! The QUIC stack under an endpoint: quinn's `Endpoint` on gradlane's
//! socket layers ([`socket`](crate::socket)), configured from a
//! [`Tuning`]. gradlane's [`Endpoint`](crate::Endpoint) and the plain
//! quinn baselines of [`quic`](crate::quic) are both built on it.
//!
//! Layers, from quinn down: the fault injector (if faults are given), the
//! batching layer, and the UDP socket itself, which is quinn's own or, with
//! DSCP marks, the marking socket.

use crate::config::ConfigError;
use crate::socket::batching::BatchingSocket;
use crate::socket::bind_udp;
use crate::socket::faults::{Faults, FaultySocket, FaultySocketError};
use crate::socket::marking::MarkRegistry;
#[cfg(target_os = "linux")]
use crate::socket::marking::MarkingSocket;
use crate::socket::BindError;
use crate::tuning::Tuning;
use quinn::{AsyncUdpSocket, Runtime};
use std::net::SocketAddr;
use std::sync::Arc;

/// Why an endpoint could not be started.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The socket could not be made.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// quinn could not take the socket.
    #[error("cannot start quic endpoint on {addr}: {source}")]
    Endpoint {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The fault-injection wrapper could not be made.
    #[error(transparent)]
    Faults(#[from] FaultySocketError),
    /// The transport settings are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// A quinn endpoint and the layers under it that report on their work.
#[derive(Debug)]
pub(crate) struct Stack {
    /// quinn's endpoint, on top.
    pub quinn: quinn::Endpoint,
    /// The fault injector, if faults were given.
    pub faults: Option<Arc<FaultySocket>>,
    /// The layer that counts packets per send and per receive.
    pub batching: Arc<BatchingSocket>,
    /// Where links register the class their packets are marked with, if
    /// [`Tuning::dscp`] is set.
    pub marks: Option<Arc<MarkRegistry>>,
    /// The socket that writes the marks (its counts by DSCP), if
    /// [`Tuning::dscp`] is set.
    #[cfg(target_os = "linux")]
    pub marking: Option<Arc<MarkingSocket>>,
}

impl Stack {
    /// The stack on a tuned socket bound to `addr`, behind a
    /// [`FaultySocket`] if `faults` are given.
    ///
    /// `server` makes it accept connections, with `tuning`'s transport
    /// configuration installed; clients set a default client configuration
    /// on [`quinn`](Self::quinn) (see [`Tuning::client_config`]). Must run
    /// inside a tokio runtime.
    pub(crate) fn bind(
        addr: SocketAddr,
        server: Option<quinn::ServerConfig>,
        tuning: &Tuning,
        faults: Option<Faults>,
    ) -> Result<Self, EndpointError> {
        let (_, max_udp_payload) = tuning.udp_payload()?;
        if let Some(bad) = tuning.dscp.and_then(|m| m.invalid()) {
            return Err(ConfigError::Dscp(bad).into());
        }
        let (socket, _) = bind_udp(addr, tuning.socket_buffer)?;
        let server = match server {
            Some(mut s) => {
                s.transport_config(Arc::new(tuning.transport_config()?));
                Some(s)
            }
            None => None,
        };
        let runtime: Arc<dyn Runtime> = Arc::new(quinn::TokioRuntime);
        let endpoint_err = |source| EndpointError::Endpoint { addr, source };
        let marks = tuning.dscp.map(|m| MarkRegistry::new(m.important));
        #[cfg(target_os = "linux")]
        let (base, marking): (Arc<dyn AsyncUdpSocket>, _) = match &marks {
            Some(registry) => {
                let marking = MarkingSocket::new(socket, registry.clone()).map_err(endpoint_err)?;
                (marking.clone(), Some(marking))
            }
            None => (runtime.wrap_udp_socket(socket).map_err(endpoint_err)?, None),
        };
        #[cfg(not(target_os = "linux"))]
        let base: Arc<dyn AsyncUdpSocket> = match &marks {
            Some(_) => return Err(ConfigError::DscpUnsupported.into()),
            None => runtime.wrap_udp_socket(socket).map_err(endpoint_err)?,
        };
        let batching = BatchingSocket::new(base, max_udp_payload);
        let real: Arc<dyn AsyncUdpSocket> = batching.clone();
        let (abstract_socket, faulty): (Arc<dyn AsyncUdpSocket>, _) = match faults {
            Some(f) => {
                let faulty = FaultySocket::new(real, f)?;
                (faulty.clone(), Some(faulty))
            }
            None => (real, None),
        };
        let mut endpoint_config = quinn::EndpointConfig::default();
        endpoint_config
            .max_udp_payload_size(max_udp_payload)
            .map_err(|_| ConfigError::Packets {
                min: tuning.min_udp_payload,
                max: max_udp_payload,
            })?;
        let quinn = quinn::Endpoint::new_with_abstract_socket(
            endpoint_config,
            server,
            abstract_socket,
            runtime,
        )
        .map_err(endpoint_err)?;
        Ok(Self {
            quinn,
            faults: faulty,
            batching,
            marks,
            #[cfg(target_os = "linux")]
            marking,
        })
    }
}
