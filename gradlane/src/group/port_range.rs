//! A rank's UDP ports from a range that a firewall passes
//! ([`GroupConfig::port_range`](super::GroupConfig::port_range); Python's
//! `GRADLANE_PORT_RANGE`), instead of any free port: under torchrun every
//! process of a host shares one environment, so without a range a host's
//! firewall would have to pass all of UDP.

use super::GroupError;
use crate::endpoint::{Endpoint, SetupError};
use crate::stack::EndpointError;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// An inclusive range of UDP ports, `lo-hi`, 1 to 65535.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    lo: u16,
    hi: u16,
}

/// A port range that is not `lo-hi` with 1 <= lo <= hi <= 65535.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a port range lo-hi with 1 <= lo <= hi <= 65535 (such as 50000-50100)")]
pub struct PortRangeError(pub String);

impl PortRange {
    /// The ports `lo` to `hi`, both included.
    pub fn new(lo: u16, hi: u16) -> Result<Self, PortRangeError> {
        match 1 <= lo && lo <= hi {
            true => Ok(Self { lo, hi }),
            false => Err(PortRangeError(format!("{lo}-{hi}"))),
        }
    }

    /// The first port.
    pub fn lo(&self) -> u16 {
        self.lo
    }

    /// The last port.
    pub fn hi(&self) -> u16 {
        self.hi
    }

    /// Whether `port` is in the range.
    pub fn contains(&self, port: u16) -> bool {
        (self.lo..=self.hi).contains(&port)
    }
}

impl FromStr for PortRange {
    type Err = PortRangeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PortRangeError(s.to_string());
        let (lo, hi) = s.trim().split_once('-').ok_or_else(bad)?;
        let port = |p: &str| p.trim().parse::<u16>().map_err(|_| bad());
        Self::new(port(lo)?, port(hi)?).map_err(|_| bad())
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.lo, self.hi)
    }
}

/// Opens an endpoint at `addr` with `open`. Where `addr` asks for any
/// port (0) and a range is given, the first port of the range that is
/// free on `addr`'s IP; a given port must lie in the range.
pub(super) fn open_in(
    range: Option<PortRange>,
    addr: SocketAddr,
    mut open: impl FnMut(SocketAddr) -> Result<Endpoint, SetupError>,
) -> Result<Endpoint, GroupError> {
    let Some(range) = range else {
        return Ok(open(addr)?);
    };
    if addr.port() != 0 {
        if !range.contains(addr.port()) {
            return Err(GroupError::Setup(format!(
                "{addr} is outside the port range {range} (GRADLANE_PORT_RANGE)"
            )));
        }
        return Ok(open(addr)?);
    }
    for port in range.lo..=range.hi {
        match open(SocketAddr::new(addr.ip(), port)) {
            Ok(endpoint) => return Ok(endpoint),
            Err(SetupError::Endpoint(EndpointError::Bind(e)))
                if e.source.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(GroupError::Setup(format!(
        "no free UDP port on {} in the port range {range} (GRADLANE_PORT_RANGE): \
         every port of it is in use; widen it (a rank takes one port per socket)",
        addr.ip()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_bad_ones_are_errors() {
        let r: PortRange = "50000-50100".parse().unwrap();
        assert_eq!((r.lo(), r.hi()), (50000, 50100));
        assert!(r.contains(50000) && r.contains(50100) && !r.contains(50101));
        assert_eq!(r.to_string(), "50000-50100");
        assert_eq!(
            " 7 - 7 ".parse::<PortRange>().unwrap(),
            PortRange::new(7, 7).unwrap()
        );
        for bad in ["", "50000", "0-10", "10-5", "1-65536", "a-b", "1-2-3", "-5"] {
            let e = bad.parse::<PortRange>().unwrap_err();
            assert!(e.to_string().contains("is not a port range"), "{bad}: {e}");
        }
    }
}
