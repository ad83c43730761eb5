//! Plain quinn endpoints built the way gradlane builds its own: the same
//! TLS (certificate files, gradlane's ALPN, no way to skip verification),
//! the same socket stack (large kernel buffers, GSO batches split to fit, the faults
//! and marks of the [`Config`]) and the same transport settings. For
//! measuring gradlane against raw quinn on equal terms, and for carrying
//! other traffic beside it.

use crate::config::Config;
use crate::endpoint::SetupError;
use crate::socket;
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

/// `config`'s transport settings for an endpoint bound to `addr`. A plain
/// quinn endpoint has one transport configuration for every peer, so with
/// [`Packets::Route`](crate::Packets::Route) its MTU discovery stops at
/// what the route to its own address carries (loopback's MTU for an
/// endpoint on loopback, where the benchmarks run), or at an Ethernet
/// frame when bound to an unspecified address.
fn baseline_tuning(config: &Config, addr: SocketAddr) -> Tuning {
    let mut tuning = config.tuning();
    if !addr.ip().is_unspecified() {
        tuning.max_udp_payload = tuning.mtu_ceiling(Some(addr));
        tuning.route_ceiling = false;
    }
    tuning
}

/// A quinn server endpoint on gradlane's socket stack with `config`'s
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
    let (endpoint, _) = socket::endpoint(addr, Some(tls), &tuning, config.faults)?;
    Ok(endpoint)
}

/// A quinn client endpoint on gradlane's socket stack, trusting only the CA
/// in `ca`, with `config`'s transport settings in its default client
/// configuration. Must run inside a tokio runtime.
pub fn client(addr: SocketAddr, ca: &Path, config: &Config) -> Result<quinn::Endpoint, SetupError> {
    config.validate()?;
    let tuning = baseline_tuning(config, addr);
    let tls = socket::tuned_client(tls::client_config(ca)?, &tuning)?;
    let (mut endpoint, _) = socket::endpoint(addr, None, &tuning, config.faults)?;
    endpoint.set_default_client_config(tls);
    Ok(endpoint)
}
