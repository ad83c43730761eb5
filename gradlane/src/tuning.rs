//! Socket and QUIC transport tuning for bulk gradient rounds.
//!
//! Two things measured on the target hosts (DESIGN 6) shape this module:
//! the kernel's default 208 KB UDP receive buffer drops packets at quinn's
//! rates, so sockets are made here with large buffers before quinn sees them;
//! and quinn's default flow-control windows cap throughput as soon as
//! bandwidth x RTT exceeds about 1.25 MB. The congestion controller matters
//! most under random loss (Cubic collapses, BBR does not) and on shared
//! paths (quinn's BBR fills every queue), so it is a field, not a constant.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::congestion::capped_bbr::CappedBbrConfig;
use crate::congestion::queue_gated_cubic::QueueGatedCubicConfig;
use quinn::congestion::{BbrConfig, CubicConfig, NewRenoConfig};
use quinn::{AsyncUdpSocket, IdleTimeout, Runtime, VarInt};
use socket2::{Domain, Protocol, Socket, Type};

use crate::socket::faults::{Faults, FaultySocket, FaultySocketError};
use crate::socket::gso_cap::GsoCappedSocket;
#[cfg(target_os = "linux")]
use crate::socket::marking::MarkingSocket;
use crate::socket::marking::{DscpMarks, MarkRegistry};

const MIB: u64 = 1 << 20;

/// The UDP payload of a 9000-byte jumbo frame under IPv6 (the tighter of the
/// two families): 9000 - 40 - 8.
pub const JUMBO_UDP_PAYLOAD: u16 = 8952;

/// The UDP payload of a 1500-byte Ethernet frame under IPv6: quinn's
/// default upper bound of MTU discovery.
pub const ETHERNET_UDP_PAYLOAD: u16 = 1452;

/// The smallest UDP payload QUIC allows (RFC 9000, 14).
pub const MIN_UDP_PAYLOAD: u16 = 1200;

/// The largest UDP payload there is (IPv6).
pub(crate) const MAX_UDP_PAYLOAD: u16 = 65_527;

/// The congestion controller of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Congestion {
    /// CUBIC (quinn's default): loss-based; collapses under random loss.
    Cubic,
    /// quinn's BBR: model-based; holds its rate under random loss. quinn
    /// 0.11's version never bounds its window (it grew to 380 MB over five
    /// ResNet-50 rounds on loopback): behind a 1 Gbit/s link with a 1 MB
    /// queue it overran the queue all run, and lossy datagrams dropped
    /// there are zero-filled (README, `scripts/bottleneck_bench.sh`).
    Bbr,
    /// quinn's BBR with its window capped at a gain times the measured
    /// bandwidth-delay product (`congestion/capped_bbr.rs`): BBR's
    /// rate under random loss without filling every queue on the way. The
    /// default: behind the shaped 1 Gbit/s link it zero-filled only what
    /// the injected loss took (BBR: up to 12.7 MB of a round's 20 MB lossy
    /// part), and with the datagrams released as soon as the important
    /// stream is sent, the important data arrived about as soon as without
    /// them (BBR: up to 1.17x later there, 1.30x on loopback).
    #[default]
    CappedBbr,
    /// NewReno: the conservative reference.
    NewReno,
    /// Cubic told of a loss only when the RTT shows a standing queue or the
    /// loss rate is high (`congestion/queue_gated_cubic.rs`): keeps its rate
    /// under random loss like BBR, backs off when a queue fills. Behind a
    /// shaped 1 Gbit/s link it lost no more lossy data than the random loss
    /// took, where BBR's queue overruns lost up to 8 MB of a ResNet-50
    /// round's 20 MB. On a CPU-bound host the host's own delay reads as a
    /// queue, and gradlane rounds under random loss ran 1.5-3x slower than
    /// with BBR (README).
    QueueGatedCubic,
}

/// Transport settings for a gradlane connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    /// Per-stream receive window in bytes.
    pub stream_receive_window: u64,
    /// Connection-wide receive window in bytes.
    pub receive_window: u64,
    /// Bytes quinn buffers for sending across all streams.
    pub send_window: u64,
    /// Bytes of received datagrams buffered before the oldest are dropped.
    pub datagram_receive_buffer: usize,
    /// Bytes of outgoing datagrams quinn queues. The link waits for room
    /// rather than have quinn drop the oldest; the size also bounds what a
    /// fall of the path MTU discards of datagrams framed at the path's size
    /// (see
    /// [`SendReport::lossy_dropped_by_quinn`](crate::SendReport)).
    pub datagram_send_buffer: usize,
    /// Keep-alive interval (`None`: off). Rounds can be seconds apart; a
    /// keep-alive keeps NAT bindings and the idle timer from closing the link.
    pub keep_alive: Option<Duration>,
    /// Close the connection after this long without traffic (`None`: never).
    pub max_idle_timeout: Option<Duration>,
    /// Congestion controller.
    pub congestion: Congestion,
    /// Requested UDP socket send and receive buffer size in bytes.
    pub socket_buffer: usize,
    /// The UDP payload size the path is known to carry end to end. quinn
    /// starts at this size (`initial_mtu`) and never falls below it
    /// (`min_mtu`): losses of packets this size never read as an MTU black
    /// hole, and the lossy datagrams are framed to fit it
    /// ([`DatagramSize::MtuFloor`](crate::DatagramSize)). The
    /// default is QUIC's floor, 1200, safe on any path; set it higher only
    /// where the network is known to carry it (see [`Tuning::jumbo`]): a
    /// path that does not carry it fails the handshake.
    pub min_udp_payload: u16,
    /// The largest UDP payload a packet may have: the upper bound of quinn's
    /// path MTU discovery, and the largest this endpoint accepts (the
    /// `max_udp_payload_size` transport parameter). Discovery probes up
    /// from `min_udp_payload`; both ends must allow a size for it to be
    /// used. The default is quinn's 1452, an Ethernet frame: discovering a
    /// larger MTU on a lossy path without raising `min_udp_payload` with it
    /// does harm, as quinn then takes random losses of the lossy datagrams'
    /// packets (smaller than the stream's) for a black hole and falls to
    /// 1200 bytes for a minute (README).
    pub max_udp_payload: u16,
    /// Mark every packet with the DSCP of the class its link is sending
    /// (`None`, the default: quinn's own socket, TOS from ECN alone). For
    /// networks with priority queues on the DSCP; see [`DscpMarks`] for
    /// how packets are classed and what a link with marks does
    /// differently. Linux only.
    pub dscp: Option<DscpMarks>,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            // quinn-proto keeps at most 1024 out-of-order pieces per stream
            // and closes the connection beyond that ("too many gaps in stream
            // buffer"): at 20% loss a 16 MiB window overflows it. 4 MiB
            // holds at 20% loss and is above loopback's bandwidth-delay
            // product; raise it for long paths with little loss.
            stream_receive_window: 4 * MIB,
            // Room for the important stream at full window plus other streams.
            receive_window: 64 * MIB,
            send_window: 64 * MIB,
            // A ~100 MB round sends most bytes as datagrams; a few MiB absorbs
            // a burst of several milliseconds at 10 Gbit/s.
            // quinn drops the oldest received datagrams when this fills: on
            // 2 shared cores the link's reader fell more than 8 MiB behind
            // (6000 datagrams dropped per ResNet-50 round at 0% loss), so
            // hold a whole round's lossy part (about 20 MB for ResNet-50).
            datagram_receive_buffer: 32 * MIB as usize,
            // Short: with datagrams at the path's size
            // (`DatagramSize::Path`), quinn discards the queued ones a path
            // MTU fall makes too large, and this bounds that loss. 1 MiB is
            // 2 ms at 4 Gbit/s; 256 KiB and 8 MiB measured the same on
            // loopback.
            datagram_send_buffer: MIB as usize,
            keep_alive: Some(Duration::from_secs(5)),
            max_idle_timeout: Some(Duration::from_secs(30)),
            congestion: Congestion::default(),
            socket_buffer: 4 * MIB as usize,
            min_udp_payload: MIN_UDP_PAYLOAD,
            max_udp_payload: ETHERNET_UDP_PAYLOAD,
            dscp: None,
        }
    }
}

/// Why a [`Tuning`] could not become a transport configuration.
#[derive(Debug, thiserror::Error)]
pub enum TuningError {
    /// A window does not fit QUIC's variable-length integer (2^62).
    #[error("{name} {value} is too large for quic")]
    TooLarge {
        /// Which setting.
        name: &'static str,
        /// Its value.
        value: u64,
    },
    /// The idle timeout does not fit QUIC's encoding.
    #[error("max idle timeout {0:?} is too large for quic")]
    IdleTimeout(Duration),
    /// The UDP payload bounds are outside what QUIC allows, or crossed.
    #[error("udp payload bounds {min}..={max} must be ordered and within 1200..=65527")]
    UdpPayload {
        /// `min_udp_payload`.
        min: u16,
        /// `max_udp_payload`.
        max: u16,
    },
    /// A DSCP mark does not fit six bits.
    #[error("dscp {0} is not in 0..=63")]
    Dscp(u8),
    /// DSCP marks were asked for on a system where gradlane cannot write them.
    #[error("dscp marks need linux")]
    DscpUnsupported,
}

impl Tuning {
    /// The default tuning for a network known to carry 9000-byte (jumbo) frames
    /// end to end, such as a datacenter fabric set up for them, and for
    /// loopback: every packet 8952 bytes from the first. Per-packet work
    /// is what bounds quinn on a busy host; on loopback ResNet-50 rounds
    /// ran 1.7-1.8x faster than in 1452-byte packets lossless, 2x at 5%
    /// loss (README). On a path with a smaller MTU the handshake fails.
    pub fn jumbo() -> Self {
        Self {
            min_udp_payload: JUMBO_UDP_PAYLOAD,
            max_udp_payload: JUMBO_UDP_PAYLOAD,
            ..Self::default()
        }
    }

    /// `(min_udp_payload, max_udp_payload)`, if QUIC allows them.
    fn udp_payload(&self) -> Result<(u16, u16), TuningError> {
        let (min, max) = (self.min_udp_payload, self.max_udp_payload);
        if MIN_UDP_PAYLOAD <= min && min <= max && max <= MAX_UDP_PAYLOAD {
            Ok((min, max))
        } else {
            Err(TuningError::UdpPayload { min, max })
        }
    }

    /// The quinn transport configuration for these settings.
    pub fn transport_config(&self) -> Result<quinn::TransportConfig, TuningError> {
        let varint = |name, value| {
            VarInt::from_u64(value).map_err(|_| TuningError::TooLarge { name, value })
        };
        let mut config = quinn::TransportConfig::default();
        config
            .stream_receive_window(varint("stream receive window", self.stream_receive_window)?)
            .receive_window(varint("receive window", self.receive_window)?)
            .send_window(self.send_window)
            .datagram_receive_buffer_size(Some(self.datagram_receive_buffer))
            .datagram_send_buffer_size(self.datagram_send_buffer)
            .keep_alive_interval(self.keep_alive);
        let idle = match self.max_idle_timeout {
            Some(d) => Some(IdleTimeout::try_from(d).map_err(|_| TuningError::IdleTimeout(d))?),
            None => None,
        };
        config.max_idle_timeout(idle);
        let (min, max) = self.udp_payload()?;
        let mut discovery = quinn::MtuDiscoveryConfig::default();
        discovery.upper_bound(max);
        config
            .initial_mtu(min)
            .min_mtu(min)
            .mtu_discovery_config(Some(discovery));
        match self.congestion {
            Congestion::Cubic => {
                config.congestion_controller_factory(Arc::new(CubicConfig::default()))
            }
            Congestion::Bbr => config.congestion_controller_factory(Arc::new(BbrConfig::default())),
            Congestion::CappedBbr => {
                config.congestion_controller_factory(Arc::new(CappedBbrConfig::default()))
            }
            Congestion::NewReno => {
                config.congestion_controller_factory(Arc::new(NewRenoConfig::default()))
            }
            Congestion::QueueGatedCubic => {
                config.congestion_controller_factory(Arc::new(QueueGatedCubicConfig::default()))
            }
        };
        Ok(config)
    }
}

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
    Tuning(#[from] TuningError),
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
    if granted.recv < buffer_bytes {
        tracing::warn!(
            "udp receive buffer is {} < {buffer_bytes} requested; raise net.core.rmem_max",
            granted.recv
        );
    }
    socket.bind(&addr.into()).map_err(err)?;
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
        return Err(TuningError::Dscp(bad).into());
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
        Some(_) => return Err(TuningError::DscpUnsupported.into()),
        None => runtime.wrap_udp_socket(socket).map_err(endpoint_err)?,
    };
    let real: Arc<dyn AsyncUdpSocket> = GsoCappedSocket::new(base, max_udp_payload);
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
        .map_err(|_| TuningError::UdpPayload {
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
        marks,
        #[cfg(target_os = "linux")]
        marking,
    })
}

/// A client configuration from `tls` with `tuning`'s transport settings.
pub(crate) fn tuned_client(
    mut tls: quinn::ClientConfig,
    tuning: &Tuning,
) -> Result<quinn::ClientConfig, TuningError> {
    tls.transport_config(Arc::new(tuning.transport_config()?));
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_congestion_controller_builds() {
        for congestion in [
            Congestion::Cubic,
            Congestion::Bbr,
            Congestion::CappedBbr,
            Congestion::NewReno,
            Congestion::QueueGatedCubic,
        ] {
            let tuning = Tuning {
                congestion,
                ..Tuning::default()
            };
            assert!(tuning.transport_config().is_ok(), "{congestion:?}");
        }
        assert_eq!(Tuning::default().congestion, Congestion::CappedBbr);
    }

    #[test]
    fn out_of_range_settings_are_errors() {
        let too_big = Tuning {
            stream_receive_window: u64::MAX,
            ..Tuning::default()
        };
        assert!(matches!(
            too_big.transport_config(),
            Err(TuningError::TooLarge { .. })
        ));
        let idle = Tuning {
            max_idle_timeout: Some(Duration::from_secs(u64::MAX / 2)),
            ..Tuning::default()
        };
        assert!(matches!(
            idle.transport_config(),
            Err(TuningError::IdleTimeout(_))
        ));
        // Out of QUIC's range, or min above max.
        for (min, max) in [
            (0, 1452),
            (1199, 1452),
            (1200, 1199),
            (1200, 65_528),
            (1200, u16::MAX),
            (9000, 8952),
        ] {
            let tuning = Tuning {
                min_udp_payload: min,
                max_udp_payload: max,
                ..Tuning::default()
            };
            assert!(
                matches!(
                    tuning.transport_config(),
                    Err(TuningError::UdpPayload { min: a, max: b }) if (a, b) == (min, max)
                ),
                "{min}..={max}"
            );
        }
        for (min, max) in [(1200, 1200), (1200, 65_527), (65_527, 65_527)] {
            let tuning = Tuning {
                min_udp_payload: min,
                max_udp_payload: max,
                ..Tuning::default()
            };
            assert!(tuning.transport_config().is_ok(), "{min}..={max}");
        }
        assert!(Tuning::jumbo().transport_config().is_ok());
    }

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
