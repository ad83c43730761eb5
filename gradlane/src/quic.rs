//! Baselines: plain quinn, set up the way gradlane sets up its own
//! connections, for measuring gradlane against raw quinn on equal terms
//! and for carrying other traffic beside it. Each function returns a
//! [`quinn::Endpoint`] with gradlane's TLS (certificate files, gradlane's
//! ALPN, no way to skip verification), its QUIC stack (large kernel
//! buffers, GSO batches split to fit, the faults and marks of the
//! [`Config`]) and its transport settings.

use crate::config::Config;
use crate::endpoint::SetupError;
use crate::stack::Stack;
use crate::tls;
use crate::tuning::Tuning;
use std::net::SocketAddr;
use std::path::Path;

/// quinn's server configuration from a certificate chain and key in PEM
/// files, with quinn's default transport settings.
pub fn server_config(cert: &Path, key: &Path) -> Result<quinn::ServerConfig, SetupError> {
    Ok(tls::server_config(cert, key)?)
}

/// quinn's client configuration trusting only the CA in `ca` (PEM), with
/// quinn's default transport settings.
pub fn client_config(ca: &Path) -> Result<quinn::ClientConfig, SetupError> {
    Ok(tls::client_config(ca)?)
}

/// `config`'s transport settings for a baseline bound to `addr`. Plain
/// quinn has one transport configuration for every peer, so with
/// [`Packets::Route`](crate::Packets::Route) its MTU discovery stops at
/// what the route to its own address carries (loopback's MTU on loopback,
/// where the benchmarks run), or at an Ethernet frame when bound to an
/// unspecified address.
fn baseline_tuning(config: &Config, addr: SocketAddr) -> Tuning {
    let mut tuning = config.tuning();
    if !addr.ip().is_unspecified() {
        tuning.max_udp_payload = tuning.mtu_ceiling(Some(addr));
        tuning.route_ceiling = false;
    }
    tuning
}

/// A baseline server: quinn on gradlane's QUIC stack with `config`'s
/// transport settings. Must run inside a tokio runtime.
pub fn server(
    addr: SocketAddr,
    cert: &Path,
    key: &Path,
    config: &Config,
) -> Result<quinn::Endpoint, SetupError> {
    config.validate()?;
    let tls = tls::server_config(cert, key)?;
    let tuning = baseline_tuning(config, addr);
    Ok(Stack::bind(addr, Some(tls), &tuning, config.faults)?.quinn)
}

/// A baseline client: quinn on gradlane's QUIC stack, trusting only the
/// CA in `ca`, with `config`'s transport settings in its default client
/// configuration. Must run inside a tokio runtime.
pub fn client(addr: SocketAddr, ca: &Path, config: &Config) -> Result<quinn::Endpoint, SetupError> {
    config.validate()?;
    let tuning = baseline_tuning(config, addr);
    let tls = tuning.client_config(tls::client_config(ca)?)?;
    let mut quinn = Stack::bind(addr, None, &tuning, config.faults)?.quinn;
    quinn.set_default_client_config(tls);
    Ok(quinn)
}
