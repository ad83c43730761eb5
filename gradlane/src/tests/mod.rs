//! Tests of the shell's internals over real QUIC on loopback (the public
//! API's tests are in `tests/`).

mod capped_window;
mod transport_shell;

use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::link::Link;
use crate::socket::faults::Faults;
use crate::tls::generate_certs;
use gradlane_core::layout::Layout;

/// A server and a connected client link with the default configuration;
/// the client's socket carries `faults`.
async fn link_pair(
    tag: &str,
    layout: &Layout,
    faults: Option<Faults>,
) -> (Endpoint, Link, Endpoint, Link) {
    let dir = std::env::temp_dir().join(format!("gradlane-unit-{tag}-{}", std::process::id()));
    generate_certs(&dir, &["localhost"]).unwrap();
    let config = Config::default();
    let server = Endpoint::server(
        "127.0.0.1:0".parse().unwrap(),
        dir.join("server.pem"),
        dir.join("server.key"),
        config.clone(),
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    let client = Endpoint::client(dir.join("ca.pem"), Config { faults, ..config }).unwrap();
    let (s, c) = tokio::join!(server.accept(), client.connect(addr, "localhost", layout));
    (server, s.unwrap().unwrap(), client, c.unwrap())
}
