//! What the route to a peer carries: the MTU of the interface the kernel
//! sends its packets through, as the ceiling of a connection's MTU
//! discovery ([`Packets::Route`](crate::Packets::Route)).
//!
//! A connected UDP socket sends nothing; connecting it makes the kernel
//! pick the route, and `IP_MTU` then reads that route's MTU (loopback's
//! 65,536, a jumbo fabric's 9000, Ethernet's 1500). quinn's discovery
//! still probes up to it, so a narrower hop further on only stops the
//! search lower.

use std::net::{IpAddr, SocketAddr};

/// IPv4 and UDP headers.
const IPV4_UDP_HEADERS: u32 = 20 + 8;
/// IPv6 and UDP headers.
const IPV6_UDP_HEADERS: u32 = 40 + 8;

/// The largest UDP payload the interface towards `peer` carries, if the
/// kernel says.
pub(crate) fn route_udp_payload(peer: SocketAddr) -> Option<u32> {
    let ip = peer.ip().to_canonical();
    match ip {
        IpAddr::V4(_) => ipv4_route_mtu(SocketAddr::new(ip, peer.port()))
            .map(|mtu| mtu.saturating_sub(IPV4_UDP_HEADERS)),
        // No portable IPV6_MTU read here: loopback's is the `lo`
        // interface's; beyond it the caller's fallback holds.
        IpAddr::V6(v6) if v6.is_loopback() => {
            loopback_mtu().map(|mtu| mtu.saturating_sub(IPV6_UDP_HEADERS))
        }
        IpAddr::V6(_) => None,
    }
}

#[cfg(target_os = "linux")]
fn ipv4_route_mtu(peer: SocketAddr) -> Option<u32> {
    use nix::sys::socket::{getsockopt, sockopt::IpMtu};
    let probe = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    probe.connect(peer).ok()?;
    let mtu = getsockopt(&probe, IpMtu).ok()?;
    u32::try_from(mtu).ok()
}

#[cfg(not(target_os = "linux"))]
fn ipv4_route_mtu(_peer: SocketAddr) -> Option<u32> {
    None
}

fn loopback_mtu() -> Option<u32> {
    std::fs::read_to_string("/sys/class/net/lo/mtu")
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn loopback_routes_carry_the_lo_interfaces_mtu() {
        let lo = loopback_mtu().expect("lo has an mtu");
        let v4 = route_udp_payload("127.0.0.1:9".parse().unwrap());
        // An IPv4 packet is at most 65,535 bytes, whatever the interface.
        assert_eq!(v4, Some(lo.min(65_535) - IPV4_UDP_HEADERS));
        let v6 = route_udp_payload("[::1]:9".parse().unwrap());
        assert_eq!(v6, Some(lo - IPV6_UDP_HEADERS));
        // A v4-mapped address is routed as IPv4.
        let mapped = route_udp_payload("[::ffff:127.0.0.1]:9".parse().unwrap());
        assert_eq!(mapped, v4);
    }
}
