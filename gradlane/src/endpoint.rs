//! gradlane's [`Endpoint`]: where links come from.
//!
//! A server endpoint listens with a certificate and key read from files; a
//! client endpoint trusts the CA in a file; a peer endpoint does both. Each
//! sits on a QUIC stack ([`Stack`]) and gives each connection the transport
//! settings of its route. The client's `connect` runs the gradlane
//! handshake: the layout and chunk options travel to the server, which
//! accepts them, or refuses them when it was told which layout to expect.

use crate::config::{Config, ConfigError};
use crate::link::{read_control, write_control, Carrier, Link, LinkError};
use crate::socket::batching::BatchCounts;
use crate::socket::faults::FaultStats;
#[cfg(target_os = "linux")]
use crate::socket::marking::MarkedCounts;
use crate::socket::marking::{ConnectionMark, MarkRegistry};
use crate::stack::{EndpointError, Stack};
use crate::tls::{self, ClientConfigError, PeerCertError, Refusal, ServerConfigError};
use crate::tuning::Tuning;
use gradlane_core::control::{codes, framed, Control, HandshakeError, Hello};
use gradlane_core::layout::Layout;
use quinn::VarInt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use thiserror::Error;

/// Why an endpoint could not be made.
#[derive(Debug, Error)]
pub enum SetupError {
    /// Certificate or key files.
    #[error(transparent)]
    Server(#[from] ServerConfigError),
    /// The CA file.
    #[error(transparent)]
    Client(#[from] ClientConfigError),
    /// The socket or the QUIC stack on it.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// A setting is out of its range.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// A QUIC endpoint that makes gradlane links.
#[derive(Debug)]
pub struct Endpoint {
    /// quinn's endpoint and the socket layers under it.
    stack: Stack,
    config: Config,
    /// The job its certificate names (peer endpoints).
    job: Option<String>,
    /// The server certificate its client refused last (peer endpoints).
    refusal: Option<Refusal>,
    /// Its TLS configurations, from which each connection's own is made
    /// (MTU discovery up to what the route to that peer carries).
    per_peer: PerPeer,
}

/// An endpoint's TLS configurations and transport settings, from which
/// each connection gets a configuration of its own.
#[derive(Debug, Clone)]
struct PerPeer {
    tuning: Tuning,
    server: Option<quinn::ServerConfig>,
    client: Option<quinn::ClientConfig>,
}

impl PerPeer {
    /// The server configuration for a client at `peer`, where the MTU
    /// ceiling depends on the peer (else the endpoint's own applies).
    fn server_for(&self, peer: SocketAddr) -> Option<Arc<quinn::ServerConfig>> {
        let mut server = self.server.clone().filter(|_| self.tuning.route_ceiling)?;
        let transport = self.tuning.transport_config_to(peer).ok()?;
        server.transport_config(Arc::new(transport));
        Some(Arc::new(server))
    }

    /// The client configuration for a server at `peer`, if this endpoint
    /// connects.
    fn client_for(&self, peer: SocketAddr) -> Result<Option<quinn::ClientConfig>, ConfigError> {
        let Some(mut client) = self.client.clone() else {
            return Ok(None);
        };
        client.transport_config(Arc::new(self.tuning.transport_config_to(peer)?));
        Ok(Some(client))
    }
}

impl Endpoint {
    /// A server listening on `addr` with a certificate chain and key from PEM files.
    pub fn server(
        addr: SocketAddr,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
        config: Config,
    ) -> Result<Self, SetupError> {
        config.validate()?;
        let server = tls::server_config(cert.as_ref(), key.as_ref())?;
        let per_peer = PerPeer {
            tuning: config.tuning(),
            server: Some(server.clone()),
            client: None,
        };
        let stack = Stack::bind(addr, Some(server), &per_peer.tuning, config.faults)?;
        Ok(Self::on_stack(stack, config, per_peer))
    }

    /// An endpoint that both listens on `addr` and connects, for the ranks
    /// of a group: it presents the certificate chain in `cert` (key in
    /// `key`) either way, and requires the other end's to be signed by the
    /// CA in `ca` (mutual TLS). The files [`generate_certs`](crate::generate_certs)
    /// writes serve every rank of a job.
    ///
    /// When `cert` names a job ([`generate_job_certs`](crate::generate_job_certs)),
    /// the other end's certificate must name the same job: a client it
    /// accepts is checked here, and a server it connects to is checked
    /// against the name [`connect`](Self::connect) is given (the job's,
    /// [`job_server_name`](crate::job_server_name), whatever the address).
    pub fn peer(
        addr: SocketAddr,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
        ca: impl AsRef<Path>,
        config: Config,
    ) -> Result<Self, SetupError> {
        config.validate()?;
        let (cert, key, ca) = (cert.as_ref(), key.as_ref(), ca.as_ref());
        let tuning = config.tuning();
        let job = tls::cert_job_name(cert).map_err(ServerConfigError::from)?;
        let refusal = Refusal::default();
        let server = tls::mutual_server_config(cert, key, ca, job.as_deref())?;
        let client = tls::mutual_client_config(ca, cert, key, refusal.clone())?;
        let per_peer = PerPeer {
            tuning: tuning.clone(),
            server: Some(server.clone()),
            client: Some(client.clone()),
        };
        let client = tuning.client_config(client)?;
        let mut stack = Stack::bind(addr, Some(server), &tuning, config.faults)?;
        stack.quinn.set_default_client_config(client);
        let mut endpoint = Self::on_stack(stack, config, per_peer);
        endpoint.job = job;
        endpoint.refusal = Some(refusal);
        Ok(endpoint)
    }

    /// The job this endpoint's certificate names, if it is a peer endpoint
    /// with a job's certificate.
    pub fn job(&self) -> Option<&str> {
        self.job.as_deref()
    }

    /// Takes the reason the last server certificate was refused for, if a
    /// peer endpoint refused one since the last call (a group connects to
    /// one rank at a time, so after a failed connect it is that one's).
    pub(crate) fn take_refusal(&self) -> Option<PeerCertError> {
        self.refusal.as_ref()?.lock().ok()?.take()
    }

    /// A client that trusts only the CA certificate in `ca` (PEM).
    pub fn client(ca: impl AsRef<Path>, config: Config) -> Result<Self, SetupError> {
        Self::client_bound(SocketAddr::from(([0, 0, 0, 0], 0)), ca, config)
    }

    /// A client bound to a given local address.
    pub fn client_bound(
        local: SocketAddr,
        ca: impl AsRef<Path>,
        config: Config,
    ) -> Result<Self, SetupError> {
        config.validate()?;
        let tuning = config.tuning();
        let client = tls::client_config(ca.as_ref())?;
        let per_peer = PerPeer {
            tuning: tuning.clone(),
            server: None,
            client: Some(client.clone()),
        };
        let client = tuning.client_config(client)?;
        let mut stack = Stack::bind(local, None, &tuning, config.faults)?;
        stack.quinn.set_default_client_config(client);
        Ok(Self::on_stack(stack, config, per_peer))
    }

    fn on_stack(stack: Stack, config: Config, per_peer: PerPeer) -> Self {
        Self {
            stack,
            config,
            job: None,
            refusal: None,
            per_peer,
        }
    }

    /// The local address (useful after binding port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.stack.quinn.local_addr()
    }

    /// Packets per send and per receive so far: whether GSO and GRO batch
    /// on this host, and how often a batch had to be split.
    pub fn batch_counts(&self) -> BatchCounts {
        self.stack.batching.counts()
    }

    /// Drops every datagram this endpoint sends or receives from now on
    /// (`true`), or lets them through again (`false`): a fault to test
    /// with, as a pulled cable, a partition or a process killed before it
    /// could close. Needs the fault injector ([`Config::faults`] set, even
    /// to no loss); returns whether there was one.
    pub fn sever(&self, severed: bool) -> bool {
        match &self.stack.faults {
            Some(f) => {
                f.sever(severed);
                true
            }
            None => false,
        }
    }

    /// What the fault injector did so far, if one is attached.
    pub fn fault_stats(&self) -> Option<FaultStats> {
        self.stack.faults.as_ref().map(|f| f.stats())
    }

    /// Packets sent so far by DSCP, if [`Config::dscp`] is set.
    #[cfg(target_os = "linux")]
    pub fn marked_counts(&self) -> Option<MarkedCounts> {
        self.stack.marking.as_ref().map(|m| m.counts())
    }

    /// Connects to a server and runs the handshake with `layout`.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        server_name: &str,
        layout: &Layout,
    ) -> Result<Link, LinkError> {
        let own = self
            .per_peer
            .client_for(addr)
            .map_err(|e| LinkError::Protocol(format!("connect: {e}")))?;
        let connecting = match own {
            Some(client) => self.stack.quinn.connect_with(client, addr, server_name),
            None => self.stack.quinn.connect(addr, server_name),
        }
        .map_err(|e| LinkError::Protocol(format!("connect: {e}")))?;
        let conn = connecting.await.map_err(LinkError::from_conn)?;
        let (mut send, mut recv) = conn.open_bi().await.map_err(LinkError::from_conn)?;
        let hello = Hello {
            layout: layout.clone(),
            chunking: self.config.scoring.chunking,
        };
        send.write_all(&framed(&hello.encode())).await?;
        match read_control(&mut recv).await? {
            Some(body) if Control::decode(&body)? == Control::Welcome => {}
            // The server closes with a reason when it refuses us.
            _ => return Err(LinkError::from_conn(conn.closed().await)),
        }
        tracing::info!(remote = %addr, tensors = layout.len(), "link up");
        let mark = connection_mark(&self.stack.marks, &self.config, &conn);
        let carrier = Carrier {
            conn,
            control: (send, recv),
            floor_mtu: self.config.packets.bounds().0,
            mark,
        };
        Link::start(carrier, layout.clone(), hello.chunking, &self.config)
    }

    /// Accepts the next link. Returns `None` once the endpoint is closed.
    ///
    /// Handshakes run one after the other here; a server that must not let
    /// one slow client hold up the next uses [`Endpoint::incoming`] and
    /// finishes each [`Incoming`] in its own task.
    pub async fn accept(&self) -> Option<Result<Link, LinkError>> {
        loop {
            match self.incoming().await?.finish().await {
                Err(IncomingError::Quic(e)) => {
                    // A failed QUIC handshake (wrong CA, a scan) is that
                    // peer's problem; keep listening.
                    tracing::info!(%e, "incoming connection failed");
                }
                Err(IncomingError::Link(e)) => return Some(Err(e)),
                Ok(link) => return Some(Ok(link)),
            }
        }
    }

    /// The next client knocking, before any handshake. Returns `None` once
    /// the endpoint is closed.
    pub async fn incoming(&self) -> Option<Incoming> {
        let incoming = self.stack.quinn.accept().await?;
        let server = self.per_peer.server_for(incoming.remote_address());
        Some(Incoming {
            incoming,
            server,
            config: self.config.clone(),
            marks: self.stack.marks.clone(),
        })
    }

    /// Closes every connection and stops listening.
    pub fn close(&self) {
        self.stack
            .quinn
            .close(VarInt::from_u32(codes::CLOSED), b"endpoint closed");
    }

    /// Waits until every connection of this endpoint is closed.
    pub async fn wait_idle(&self) {
        self.stack.quinn.wait_idle().await;
    }
}

/// Says where two layouts first differ, for the close reason.
fn layout_difference(expected: &Layout, got: &Layout) -> String {
    if expected.len() != got.len() {
        return format!(
            "layout mismatch: expected {} tensors, got {}",
            expected.len(),
            got.len()
        );
    }
    for (i, (a, b)) in expected.tensors().iter().zip(got.tensors()).enumerate() {
        if a != b {
            return format!(
                "layout mismatch at tensor {i}: expected {} {:?}, got {} {:?}",
                a.name, a.shape, b.name, b.shape
            );
        }
    }
    "layout mismatch".into()
}

/// A client that reached the endpoint and has not been through the QUIC
/// and gradlane handshakes yet (see [`Endpoint::incoming`]).
#[derive(Debug)]
pub struct Incoming {
    incoming: quinn::Incoming,
    /// Its own server configuration, if it differs from the endpoint's.
    server: Option<Arc<quinn::ServerConfig>>,
    config: Config,
    marks: Option<Arc<MarkRegistry>>,
}

/// Why an incoming client did not become a link.
#[derive(Debug, Error)]
pub enum IncomingError {
    /// The QUIC/TLS handshake failed.
    #[error("quic handshake: {0}")]
    Quic(quinn::ConnectionError),
    /// The gradlane handshake failed (bad hello, layout mismatch, no hello
    /// in time).
    #[error(transparent)]
    Link(#[from] LinkError),
}

impl Incoming {
    /// Where the client is.
    pub fn remote_address(&self) -> SocketAddr {
        self.incoming.remote_address()
    }

    /// Runs both handshakes; the client has [`Config::hello_timeout`] after
    /// the QUIC handshake to send its hello.
    pub async fn finish(self) -> Result<Link, IncomingError> {
        let connecting = match self.server {
            Some(server) => self.incoming.accept_with(server),
            None => self.incoming.accept(),
        };
        let conn = connecting
            .map_err(IncomingError::Quic)?
            .await
            .map_err(IncomingError::Quic)?;
        let config = self.config;
        let welcome = welcome(&config, &self.marks, conn.clone());
        match tokio::time::timeout(config.hello_timeout, welcome).await {
            Ok(r) => Ok(r?),
            Err(_) => {
                let why = format!("no hello within {:?}", config.hello_timeout);
                conn.close(VarInt::from_u32(codes::BAD_HELLO), why.as_bytes());
                Err(LinkError::Handshake(HandshakeError::Timeout).into())
            }
        }
    }
}

/// The handle that sets the class `conn`'s packets are marked with, if the
/// endpoint marks them.
fn connection_mark(
    marks: &Option<Arc<MarkRegistry>>,
    config: &Config,
    conn: &quinn::Connection,
) -> Option<ConnectionMark> {
    let (registry, dscp) = (marks.as_ref()?, config.dscp?);
    Some(registry.register(conn.remote_address(), dscp))
}

async fn welcome(
    config: &Config,
    marks: &Option<Arc<MarkRegistry>>,
    conn: quinn::Connection,
) -> Result<Link, LinkError> {
    let (mut send, mut recv) = conn.accept_bi().await.map_err(LinkError::from_conn)?;
    let hello = match read_control(&mut recv).await {
        Ok(Some(body)) => Hello::decode(&body),
        Ok(None) => Err(gradlane_core::control::HandshakeError::Truncated),
        Err(LinkError::Handshake(e)) => Err(e),
        Err(e) => return Err(e),
    };
    let hello = match hello {
        Ok(h) => h,
        Err(e) => {
            let why = format!("bad hello: {e}");
            conn.close(VarInt::from_u32(codes::BAD_HELLO), why.as_bytes());
            return Err(e.into());
        }
    };
    if let Some(expected) = &config.expect_layout {
        if expected != &hello.layout {
            let why = layout_difference(expected, &hello.layout);
            conn.close(VarInt::from_u32(codes::LAYOUT_MISMATCH), why.as_bytes());
            return Err(LinkError::Rejected {
                code: codes::LAYOUT_MISMATCH as u64,
                reason: why,
            });
        }
    }
    write_control(&mut send, Control::Welcome).await?;
    tracing::info!(remote = %conn.remote_address(), tensors = hello.layout.len(), "link up");
    let mark = connection_mark(marks, config, &conn);
    let carrier = Carrier {
        conn,
        control: (send, recv),
        floor_mtu: config.packets.bounds().0,
        mark,
    };
    Link::start(carrier, hello.layout, hello.chunking, config)
}
