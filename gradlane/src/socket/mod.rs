//! The UDP socket under quinn, and the layers over it; the QUIC stack
//! ([`crate::stack`]) puts them together.
//!
//! The kernel's default UDP receive buffer drops packets at quinn's rates,
//! so the socket is made with large buffers before quinn sees it
//! ([`bind_udp`]). quinn then reads and writes it through:
//!
//! - [`marking`], in place of quinn's own socket when DSCP marks are set:
//!   it receives as quinn's does and writes the DSCP of the class a link is
//!   sending into every packet (quinn-udp writes only ECN).
//! - [`batching`], a [`layer`]: splits quinn's GSO batches to fit one UDP
//!   send (which jumbo and loopback packets need), bounds quinn's receive
//!   buffers, and counts packets per send and per receive (GSO and GRO at
//!   work).
//! - [`faults`], a [`layer`]: seeded loss, delay and jitter, for tests,
//!   examples and benchmarks (this kind of host has no `netem`).
//!
//! [`route_mtu`] asks the kernel what the interface towards a peer
//! carries: the ceiling of that connection's MTU discovery.

pub(crate) mod batching;
pub(crate) mod faults;
pub(crate) mod layer;
pub(crate) mod marking;
pub(crate) mod route_mtu;

use socket2::{Domain, Protocol, Socket, Type};
use std::net::SocketAddr;

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
