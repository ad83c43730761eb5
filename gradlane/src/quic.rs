//! Plain quinn endpoints built the way gradlane builds its own: the same
//! TLS (certificate files, gradlane's ALPN, no way to skip verification),
//! the same socket stack (large kernel buffers, the GSO cap, the faults
//! and marks of the [`Config`]) and the same transport settings. For
//! measuring gradlane against raw quinn on equal terms, and for carrying
//! other traffic beside it.

use crate::config::Config;
use crate::endpoint::SetupError;
use crate::socket;
use crate::tls;
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
    let (endpoint, _) = socket::endpoint(addr, Some(tls), &config.tuning(), config.faults)?;
    Ok(endpoint)
}

/// A quinn client endpoint on gradlane's socket stack, trusting only the CA
/// in `ca`, with `config`'s transport settings in its default client
/// configuration. Must run inside a tokio runtime.
pub fn client(addr: SocketAddr, ca: &Path, config: &Config) -> Result<quinn::Endpoint, SetupError> {
    config.validate()?;
    let tuning = config.tuning();
    let tls = socket::tuned_client(tls::client_config(ca)?, &tuning)?;
    let (mut endpoint, _) = socket::endpoint(addr, None, &tuning, config.faults)?;
    endpoint.set_default_client_config(tls);
    Ok(endpoint)
}
