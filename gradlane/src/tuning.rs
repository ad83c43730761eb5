//! The quinn transport configuration of an endpoint, from a [`Config`]'s
//! transport settings, and the packet sizes those settings name.
//!
//! quinn's default flow-control windows cap throughput as soon as bandwidth
//! x RTT exceeds about 1.25 MB, and its default congestion controller
//! collapses under random loss: both are set here.
//!
//! [`Config`]: crate::Config

use crate::config_error::{ConfigError, MAX_UDP_PAYLOAD, MIN_UDP_PAYLOAD};
use crate::congestion::Congestion;
use crate::socket::marking::DscpMarks;
use crate::socket::route_mtu::route_udp_payload;
use quinn::{IdleTimeout, VarInt};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// The UDP payload of a 1500-byte Ethernet frame under IPv6.
pub const ETHERNET_UDP_PAYLOAD: u16 = 1452;

/// The UDP payload of a 9000-byte jumbo frame under IPv6 (the tighter of
/// the two families): 9000 - 40 - 8.
pub const JUMBO_UDP_PAYLOAD: u16 = 8952;

/// Everything an endpoint's socket and QUIC stack are made with
/// (`Config::tuning` gathers it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tuning {
    pub(crate) stream_receive_window: u64,
    pub(crate) receive_window: u64,
    pub(crate) send_window: u64,
    pub(crate) datagram_receive_buffer: usize,
    pub(crate) datagram_send_buffer: usize,
    pub(crate) keep_alive: Option<Duration>,
    pub(crate) max_idle_timeout: Option<Duration>,
    pub(crate) congestion: Congestion,
    pub(crate) socket_buffer: usize,
    /// The UDP payload the path is known to carry: quinn starts at it and
    /// never falls below it, and lossy datagrams are framed to fit it.
    pub(crate) min_udp_payload: u16,
    /// Where MTU discovery stops, and the largest payload accepted.
    pub(crate) max_udp_payload: u16,
    /// Each connection's discovery stops at what the route to its peer
    /// carries instead ([`Packets::Route`](crate::Packets::Route)).
    pub(crate) route_ceiling: bool,
    pub(crate) dscp: Option<DscpMarks>,
}

#[cfg(test)]
impl Default for Tuning {
    fn default() -> Self {
        crate::config::Config::default().tuning()
    }
}

impl Tuning {
    /// `(min_udp_payload, max_udp_payload)`, if QUIC allows them.
    pub(crate) fn udp_payload(&self) -> Result<(u16, u16), ConfigError> {
        let (min, max) = (self.min_udp_payload, self.max_udp_payload);
        if MIN_UDP_PAYLOAD <= min && min <= max && max <= MAX_UDP_PAYLOAD {
            Ok((min, max))
        } else {
            Err(ConfigError::Packets { min, max })
        }
    }

    /// Where a connection to `peer` stops its MTU discovery: the route's
    /// ceiling where [`route_ceiling`](Self::route_ceiling) is set (an
    /// Ethernet frame where the route is unknown: no peer, or the kernel
    /// does not say), else `max_udp_payload`.
    pub(crate) fn mtu_ceiling(&self, peer: Option<SocketAddr>) -> u16 {
        let (min, max) = (self.min_udp_payload, self.max_udp_payload);
        if !self.route_ceiling {
            return max;
        }
        let route = peer.and_then(route_udp_payload);
        let ceiling = route.unwrap_or(u32::from(ETHERNET_UDP_PAYLOAD));
        // Not `clamp`: settings with min above max reach here before
        // `udp_payload` refuses them, and must not panic.
        u16::try_from(ceiling).unwrap_or(u16::MAX).max(min).min(max)
    }

    /// The quinn transport configuration of a connection to `peer`: the
    /// endpoint's, with MTU discovery up to what the route carries.
    pub(crate) fn transport_config_to(
        &self,
        peer: SocketAddr,
    ) -> Result<quinn::TransportConfig, ConfigError> {
        self.transport_config_with(self.mtu_ceiling(Some(peer)))
    }

    /// `tls` with these transport settings: a client's default
    /// configuration, for a peer not known yet.
    pub(crate) fn client_config(
        &self,
        mut tls: quinn::ClientConfig,
    ) -> Result<quinn::ClientConfig, ConfigError> {
        tls.transport_config(Arc::new(self.transport_config()?));
        Ok(tls)
    }

    /// The quinn transport configuration for these settings, for a peer
    /// not known yet (an endpoint's defaults).
    pub(crate) fn transport_config(&self) -> Result<quinn::TransportConfig, ConfigError> {
        self.transport_config_with(self.mtu_ceiling(None))
    }

    fn transport_config_with(&self, ceiling: u16) -> Result<quinn::TransportConfig, ConfigError> {
        let varint = |name, value| {
            VarInt::from_u64(value).map_err(|_| ConfigError::TooLarge { name, value })
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
            Some(d) => Some(IdleTimeout::try_from(d).map_err(|_| ConfigError::IdleTimeout(d))?),
            None => None,
        };
        config.max_idle_timeout(idle);
        let (min, _) = self.udp_payload()?;
        let mut discovery = quinn::MtuDiscoveryConfig::default();
        discovery.upper_bound(ceiling);
        config
            .initial_mtu(min)
            .min_mtu(min)
            .mtu_discovery_config(Some(discovery));
        config.congestion_controller_factory(self.congestion.factory());
        Ok(config)
    }
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
            Err(ConfigError::TooLarge { .. })
        ));
        let idle = Tuning {
            max_idle_timeout: Some(Duration::from_secs(u64::MAX / 2)),
            ..Tuning::default()
        };
        assert!(matches!(
            idle.transport_config(),
            Err(ConfigError::IdleTimeout(_))
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
                    Err(ConfigError::Packets { min: a, max: b }) if (a, b) == (min, max)
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
    }
}
