//! Plain quinn endpoints built the way gradlane builds its own: the same
//! TLS (certificate files, gradlane's ALPN, no way to skip verification),
//! the same socket stack (large kernel buffers, the GSO cap, optional
//! faults) and the same [`Tuning`]. For measuring gradlane against raw
//! quinn on equal terms, and for carrying other traffic beside it.

use crate::endpoint::SetupError;
use crate::socket::faults::Faults;
use crate::tls;
use crate::tuning::{self, Tuning};
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

/// A quinn server endpoint on gradlane's socket stack with `tuning`'s
/// transport settings; `faults` injects loss and delay under it. Must run
/// inside a tokio runtime.
pub fn server(
    addr: SocketAddr,
    cert: &Path,
    key: &Path,
    tuning: &Tuning,
    faults: Option<Faults>,
) -> Result<quinn::Endpoint, SetupError> {
    let config = tls::server_config(cert, key)?;
    let (endpoint, _) = tuning::endpoint(addr, Some(config), tuning, faults)?;
    Ok(endpoint)
}

/// A quinn client endpoint on gradlane's socket stack, trusting only the CA
/// in `ca`, with `tuning`'s transport settings as its default client
/// configuration. Must run inside a tokio runtime.
pub fn client(
    addr: SocketAddr,
    ca: &Path,
    tuning: &Tuning,
    faults: Option<Faults>,
) -> Result<quinn::Endpoint, SetupError> {
    let config = tuning::tuned_client(tls::client_config(ca)?, tuning)?;
    let (mut endpoint, _) = tuning::endpoint(addr, None, tuning, faults)?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}
