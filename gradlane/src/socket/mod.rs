//! The UDP socket under quinn, and the quinn endpoint built on it.
//!
//! The kernel's default UDP receive buffer (208 KB here) drops packets at
//! quinn's rates, so the socket is made with large buffers before quinn
//! sees it ([`bind_udp`]). Above it sit layers, each a wrapper of quinn's
//! `AsyncUdpSocket` that forwards what it does not change:
//!
//! - [`batching`]: splits quinn's GSO batches to fit one UDP send (which
//!   jumbo and loopback packets need), bounds quinn's receive buffers, and
//!   counts packets per send and per receive (GSO and GRO at work).
//! - [`marking`]: writes the DSCP of the class a link is sending into every
//!   packet (quinn-udp writes only ECN).
//! - [`faults`]: seeded loss, delay and jitter, for tests, examples and
//!   benchmarks (this kind of host has no `netem`).
//!
//! [`route_mtu`] asks the kernel what the interface towards a peer
//! carries: the ceiling of that connection's MTU discovery.

pub(crate) mod batching;
pub(crate) mod faults;
pub(crate) mod layer;
pub(crate) mod marking;
pub(crate) mod route_mtu;

use crate::config::ConfigError;
use crate::tuning::Tuning;
use batching::BatchingSocket;
use faults::{Faults, FaultySocket, FaultySocketError};
use marking::MarkRegistry;
#[cfg(target_os = "linux")]
use marking::MarkingSocket;
use quinn::{AsyncUdpSocket, Runtime};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::SocketAddr;
use std::sync::Arc;

/// What the kernel granted for a socket's buffers (Linux reports twice the
/// requested size: it counts its own bookkeeping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SocketBuffers {
    /// Send buffer size as read back.
    pub send: usize,
    /// Receive buffer size as read back.
    pub recv: usize,
}

/// Why a UDP socket could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot bind udp socket to {addr}: {source}")]
pub struct BindError {
    /// The address.
    pub addr: SocketAddr,
    /// The I/O error.
    pub source: std::io::Error,
}

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

/// Make a UDP socket bound to `addr` with send and receive buffers of
/// `buffer_bytes` requested. The kernel caps the request at
/// `net.core.{r,w}mem_max` without an error, so the granted sizes are read
/// back, logged, and returned.
pub(crate) fn bind_udp(
    addr: SocketAddr,
    buffer_bytes: usize,
) -> Result<(std::net::UdpSocket, SocketBuffers), BindError> {
    let err = |source| BindError { addr, source };
    let socket =
        Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(err)?;
    if addr.is_ipv6() {
        // Dual-stack where possible, like quinn's own Endpoint::client.
        if let Err(e) = socket.set_only_v6(false) {
            tracing::debug!("cannot make {addr} dual-stack: {e}");
        }
    }
    // Bound first: a port in use (one tried of a port range) is then
    // refused before any buffer is asked for or warned about.
    socket.bind(&addr.into()).map_err(err)?;
    // Buffer requests failing is not fatal: the socket still works, slower.
    if let Err(e) = socket.set_send_buffer_size(buffer_bytes) {
        tracing::warn!("cannot set udp send buffer to {buffer_bytes}: {e}");
    }
    if let Err(e) = socket.set_recv_buffer_size(buffer_bytes) {
        tracing::warn!("cannot set udp receive buffer to {buffer_bytes}: {e}");
    }
    let granted = SocketBuffers {
        send: socket.send_buffer_size().map_err(err)?,
        recv: socket.recv_buffer_size().map_err(err)?,
    };
    tracing::info!(
        requested = buffer_bytes,
        send = granted.send,
        recv = granted.recv,
        "udp socket buffers"
    );
    // Once a process: every socket of a rank meets the same limit, and a
    // rank may open several.
    static CAPPED: std::sync::Once = std::sync::Once::new();
    if granted.recv < buffer_bytes {
        CAPPED.call_once(|| {
            tracing::warn!(
                "udp receive buffer is {} < {buffer_bytes} requested; raise net.core.rmem_max",
                granted.recv
            )
        });
    }
    Ok((socket.into(), granted))
}

/// A quinn endpoint on a tuned socket, optionally behind a [`FaultySocket`].
///
/// `server` makes it accept connections; clients set a default client
/// configuration on the returned endpoint. The transport configuration from
/// `tuning` is installed in `server`; clients put it in their
/// `ClientConfig` (see [`Tuning::transport_config`]). Returns the fault
/// wrapper, if any, to read its counters. Must run inside a tokio runtime.
pub(crate) fn endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
    tuning: &Tuning,
    faults: Option<Faults>,
) -> Result<(quinn::Endpoint, Option<Arc<FaultySocket>>), EndpointError> {
    let parts = endpoint_parts(addr, server, tuning, faults)?;
    Ok((parts.endpoint, parts.faults))
}

/// A quinn endpoint and the layers under it that report on their work.
#[derive(Debug)]
pub(crate) struct EndpointParts {
    /// The endpoint.
    pub endpoint: quinn::Endpoint,
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

/// Like [`endpoint`], with every layer returned.
pub(crate) fn endpoint_parts(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
    tuning: &Tuning,
    faults: Option<Faults>,
) -> Result<EndpointParts, EndpointError> {
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
    let endpoint = quinn::Endpoint::new_with_abstract_socket(
        endpoint_config,
        server,
        abstract_socket,
        runtime,
    )
    .map_err(endpoint_err)?;
    Ok(EndpointParts {
        endpoint,
        faults: faulty,
        batching,
        marks,
        #[cfg(target_os = "linux")]
        marking,
    })
}

/// A client configuration from `tls` with `tuning`'s transport settings.
pub(crate) fn tuned_client(
    mut tls: quinn::ClientConfig,
    tuning: &Tuning,
) -> Result<quinn::ClientConfig, ConfigError> {
    tls.transport_config(Arc::new(tuning.transport_config()?));
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel may cap the request (rmem_max); whatever it grants is
    /// reported, and a bound socket comes back.
    #[test]
    fn bind_reports_granted_buffers() {
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let (socket, granted) = bind_udp(addr, 1 << 20).expect("bind");
        assert!(socket.local_addr().expect("local addr").port() != 0);
        assert!(granted.recv > 0 && granted.send > 0, "{granted:?}");
    }
}
