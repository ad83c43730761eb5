//! gradlane's [`Endpoint`]: where links come from.
//!
//! A server endpoint listens with a certificate and key read from files; a
//! client endpoint trusts the CA in a file; a peer endpoint does both. Each
//! sits on a QUIC stack ([`Stack`]) and gives each connection the transport
//! settings of its route. The client's `connect` runs the gradlane
//! handshake: the layout and chunk options travel to the server, which
//! accepts them, or refuses them when it was told which layout to expect.

use crate::attempts::{self, Windows};
use crate::config::{Config, ConfigError};
use crate::link::{read_control, Carrier, Link, LinkError};
use crate::socket::batching::BatchCounts;
use crate::socket::faults::FaultStats;
#[cfg(target_os = "linux")]
use crate::socket::marking::MarkedCounts;
use crate::socket::marking::{ConnectionMark, MarkRegistry};
use crate::stack::{EndpointError, Stack};
use crate::tls::{self, ClientConfigError, PeerCertError, Refusal, ServerConfigError};
use crate::tuning::Tuning;
use gradlane_core::control::{codes, framed, Control, Hello};
use gradlane_core::layout::Layout;
use quinn::VarInt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio::time::Instant;

mod incoming;

pub use incoming::{Incoming, IncomingError};

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
    /// The handshakes [`accept`](Self::accept) started that it has not
    /// returned yet. Dropped with the endpoint, which ends them.
    handshakes: Mutex<JoinSet<Result<Link, IncomingError>>>,
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
            handshakes: Mutex::new(JoinSet::new()),
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

    /// Connects to the server at `addr` and runs the gradlane handshake
    /// with `layout`, within [`Config::connect_timeout`].
    ///
    /// Under heavy loss one QUIC handshake can stall past the idle
    /// timeout: quinn doubles its retransmission timeout on every loss.
    /// So a new handshake starts beside the earlier ones when none has
    /// got through after 2 s, then after 4 s, 8 s and every 16 s; the
    /// earlier ones go on, since one that is getting through may still
    /// finish first. The first to get through carries the gradlane
    /// handshake and is the link. The others are closed at once, before
    /// any hello, so the server sees one gradlane handshake per connect
    /// (its [`accept`](Self::accept) runs handshakes side by side and
    /// skips the abandoned ones). A handshake that needed retransmissions
    /// has got through only once the server shows that its side is done
    /// too: the client's side can end with quinn's retransmission timer
    /// backed off past any timeout, and its last packet lost. If the
    /// server gives up waiting for the hello ([`Config::hello_timeout`]),
    /// it made no link, and the handshakes start again.
    ///
    /// Where none gets through (no server at `addr`, a path that drops
    /// everything) the error is [`LinkError::ConnectTimeout`], at the
    /// timeout. A refusal (another CA, a layout the server does not
    /// take) ends the connect at once.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        server_name: &str,
        layout: &Layout,
    ) -> Result<Link, LinkError> {
        let waited = self.config.connect_timeout;
        // A timeout too long to add is no timeout.
        let deadline = Instant::now().checked_add(waited);
        let own = self.own_client_config(addr)?;
        let attempts = AtomicUsize::new(0);
        let race = || {
            attempts::overlapping(
                Windows::HANDSHAKE,
                || {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    self.handshake_through(own.clone(), addr, server_name)
                },
                |e| match e {
                    LinkError::Connection(quinn::ConnectionError::TimedOut) => None,
                    e => Some(e),
                },
                |window, running| {
                    tracing::info!(%addr, ?window, running, "no handshake through yet; starting another");
                },
            )
        };
        let handshakes = race();
        tokio::pin!(handshakes);
        let timed_out = || LinkError::ConnectTimeout {
            addr,
            waited,
            attempts: attempts.load(Ordering::Relaxed),
        };
        loop {
            let conn = before(deadline, &mut handshakes)
                .await
                .ok_or_else(timed_out)??;
            match before(deadline, self.greet(conn, layout)).await {
                None => return Err(timed_out()),
                // The server gave up on this connection before our hello
                // reached it (quinn's recovery of a handshake's end under
                // loss can stall that long): it made no link of it, so
                // another handshake may.
                Some(Err(LinkError::Rejected { code, reason }))
                    if code == u64::from(codes::BAD_HELLO) && reason.starts_with(NO_HELLO) =>
                {
                    tracing::info!(%addr, %reason, "the server gave up waiting for our hello; connecting again");
                    handshakes.set(race());
                }
                Some(r) => return r,
            }
        }
    }

    /// One QUIC handshake and the gradlane handshake on it, with no
    /// retry and no timeout but the idle timeout: for the group, whose
    /// dial retries on its own ([`attempts`]) and whose further paths are
    /// accepted one at a time, within the join's timeout.
    pub(crate) async fn connect_once(
        &self,
        addr: SocketAddr,
        server_name: &str,
        layout: &Layout,
    ) -> Result<Link, LinkError> {
        let own = self.own_client_config(addr)?;
        let conn = self.handshake(own, addr, server_name).await?;
        self.greet(conn, layout).await
    }

    /// This endpoint's client configuration for a server at `addr`, if it
    /// has its own for it (else quinn's default client configuration
    /// applies).
    fn own_client_config(
        &self,
        addr: SocketAddr,
    ) -> Result<Option<quinn::ClientConfig>, LinkError> {
        self.per_peer
            .client_for(addr)
            .map_err(|e| LinkError::Protocol(format!("connect: {e}")))
    }

    /// One QUIC handshake with the server at `addr`.
    async fn handshake(
        &self,
        own: Option<quinn::ClientConfig>,
        addr: SocketAddr,
        server_name: &str,
    ) -> Result<quinn::Connection, LinkError> {
        let connecting = match own {
            Some(client) => self.stack.quinn.connect_with(client, addr, server_name),
            None => self.stack.quinn.connect(addr, server_name),
        }
        .map_err(|e| LinkError::Protocol(format!("connect: {e}")))?;
        connecting.await.map_err(LinkError::from_conn)
    }

    /// One QUIC handshake that got through: its connection, once the
    /// client's side is done and, if that needed retransmissions, the
    /// server has shown that its side is done too. An attempt the server
    /// shows nothing of within [`CONFIRM_WITHIN`] is given up (closed, no
    /// hello sent on it) as timed out, so that another can win.
    ///
    /// Why: quinn backs its probe timer off on every probe of a handshake
    /// and, until the server has acknowledged one of the client's later
    /// packets, never resets it. A handshake that took several probes
    /// ends, on the client, with that timer backed off to minutes; if the
    /// client's Finished is then lost, neither side sends anything more
    /// (the server waits for the Finished and drops the client's other
    /// packets) until the idle timeout.
    async fn handshake_through(
        &self,
        own: Option<quinn::ClientConfig>,
        addr: SocketAddr,
        server_name: &str,
    ) -> Result<quinn::Connection, LinkError> {
        let start = Instant::now();
        let conn = self.handshake(own, addr, server_name).await?;
        if start.elapsed() < PROBED_HANDSHAKE {
            return Ok(conn);
        }
        // At least a few round trips, however long this path's are.
        let within = CONFIRM_WITHIN.max(conn.rtt() * 3);
        match server_done(&conn, within).await {
            Ok(true) => Ok(conn),
            Ok(false) => {
                tracing::info!(%addr, "the server showed nothing of a slow handshake; giving it up");
                conn.close(VarInt::from_u32(codes::CLOSED), b"handshake given up");
                Err(LinkError::Connection(quinn::ConnectionError::TimedOut))
            }
            Err(e) => Err(LinkError::from_conn(e)),
        }
    }

    /// The gradlane handshake on `conn`: the hello with `layout`, then the
    /// server's welcome.
    async fn greet(&self, conn: quinn::Connection, layout: &Layout) -> Result<Link, LinkError> {
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
        tracing::info!(remote = %conn.remote_address(), tensors = layout.len(), "link up");
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
    /// The handshakes of the clients knocking run side by side, each in a
    /// task of its own, and the first to finish is the link: a slow or
    /// abandoned one (a [`connect`](Self::connect)'s earlier attempt,
    /// given up for another that finished first) holds up no other.
    /// Those still running when it returns go on, and a later call
    /// returns them. A client that never began the gradlane handshake (a
    /// failed QUIC handshake, a client gone or silent before its hello:
    /// [`IncomingError::Quic`], [`IncomingError::Silent`]) is skipped; a
    /// client that breaks the gradlane handshake (a bad hello, a layout
    /// the server does not take, a hello begun and not finished within
    /// [`Config::hello_timeout`]) is an error. Take clients
    /// with this or with [`incoming`](Self::incoming), not both: the
    /// handshakes this started are only ever returned by it.
    pub async fn accept(&self) -> Option<Result<Link, LinkError>> {
        let mut handshakes = self.handshakes.lock().await;
        loop {
            tokio::select! {
                biased;
                Some(done) = handshakes.join_next(), if !handshakes.is_empty() => match done {
                    Ok(Ok(link)) => return Some(Ok(link)),
                    Ok(Err(IncomingError::Link(e))) => return Some(Err(e)),
                    Ok(Err(e)) => {
                        // A client that never began the gradlane handshake
                        // (wrong CA, a scan, an attempt its client gave up
                        // on) is that peer's problem; keep listening.
                        tracing::info!(%e, "incoming connection failed");
                    }
                    Err(e) => return Some(Err(LinkError::Internal(format!("handshake task: {e}")))),
                },
                incoming = self.incoming() => {
                    handshakes.spawn(incoming?.finish());
                }
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

/// How the reason of a server's close begins when the client's hello did
/// not come within [`Config::hello_timeout`] (its code is
/// [`codes::BAD_HELLO`], which a malformed hello shares).
const NO_HELLO: &str = "no hello within";

/// A client handshake that took this long probed at least once (quinn's
/// first probe comes about a second after the first flight): its probe
/// timer may be backed off, and the server's side is waited for.
const PROBED_HANDSHAKE: Duration = Duration::from_millis(500);

/// How long a probed handshake may wait for the server to show its side
/// is done before [`Endpoint::connect`] gives it up for another.
const CONFIRM_WITHIN: Duration = Duration::from_secs(3);

/// How often [`server_done`] looks: quinn raises no event for it.
const CONFIRM_POLL: Duration = Duration::from_millis(10);

/// Whether the server shows, within `within`, that it finished its side of
/// `conn`'s handshake: a HANDSHAKE_DONE frame, or an acknowledgement of a
/// packet sent after the client's side was done (it also resets quinn's
/// probe timer). The connection's error if it closes first.
async fn server_done(
    conn: &quinn::Connection,
    within: Duration,
) -> Result<bool, quinn::ConnectionError> {
    let acks = conn.stats().frame_rx.acks;
    let until = Instant::now() + within;
    loop {
        if let Some(e) = conn.close_reason() {
            return Err(e);
        }
        let rx = conn.stats().frame_rx;
        if rx.handshake_done > 0 || rx.acks > acks {
            return Ok(true);
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        tokio::time::sleep(CONFIRM_POLL).await;
    }
}

/// `work`'s output, if it comes before `deadline` (always, with none).
async fn before<F: std::future::Future>(deadline: Option<Instant>, work: F) -> Option<F::Output> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, work).await.ok(),
        None => Some(work.await),
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
