//! Forming the mesh: every pair of ranks gets one link, the higher rank
//! connecting to the lower; each connecting rank says who it is in its
//! first message.

use super::port_range::open_in;
use super::{server_name, tag, Group, GroupConfig, GroupError, Kind};
use crate::attempts::{self, Windows};
use crate::endpoint::{Endpoint, IncomingError};
use crate::handshake_failure::HandshakeFailure;
use crate::link::{Link, LinkError};
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use gradlane_core::group::view_keeper::ViewKeeper;
use gradlane_core::group::{
    view_digest, AddressTable, Dials, HelloVerdict, MeshForming, MeshHello, MeshMark, MeshRefusal,
};
use gradlane_core::layout::{Layout, TensorSpec};
use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// Where the ranks of a group find each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// Every rank's address, indexed by rank: each listens on its own.
    Addresses(Vec<SocketAddr>),
    /// Rank 0 listens at `root`; every other rank listens at `listen`
    /// (port 0 picks one; an unspecified IP is replaced by the one it
    /// reaches rank 0 from), tells rank 0, and learns every rank's address
    /// from it (torchrun's `MASTER_ADDR` model).
    Root {
        /// Rank 0's address.
        root: SocketAddr,
        /// Where this rank listens (ignored on rank 0).
        listen: SocketAddr,
    },
}

/// The handshake layout of a group's links: their rounds register their
/// own layouts; this one only opens the link.
fn link_layout() -> Result<Layout, GroupError> {
    Layout::new(vec![TensorSpec::dense("group", [1])]).map_err(|e| GroupError::Setup(e.to_string()))
}

pub(super) async fn join(mut config: GroupConfig) -> Result<Group, GroupError> {
    let (rank, world) = (config.rank, config.world);
    apply_failure_timeout(&mut config);
    if world == 0 || rank >= world {
        return Err(GroupError::Setup(format!(
            "rank {rank} is not in a group of {world}"
        )));
    }
    let listen = match &config.rendezvous {
        Rendezvous::Addresses(addrs) if addrs.len() != world => {
            return Err(GroupError::Setup(format!(
                "{} addresses for a group of {world}",
                addrs.len()
            )))
        }
        Rendezvous::Addresses(addrs) => addrs[rank],
        Rendezvous::Root { root, .. } if rank == 0 => *root,
        Rendezvous::Root { listen, .. } => *listen,
    };
    let endpoint = open_endpoint(&config, listen)?;
    let deadline = Instant::now() + config.join_timeout;
    let mut links: Vec<Option<Link>> = (0..world).map(|_| None).collect();
    let mut failed = Vec::new();
    let first = MeshMark {
        epoch: 0,
        digest: None,
    };
    let mesh = RefCell::new(MeshForming::new(rank, world, first, Dials::InTurn));
    let forming = form(&config, &endpoint, &mut links, &mut failed, &mesh);
    let formed = tokio::time::timeout_at(deadline, forming).await;
    match formed {
        Ok(Ok(table)) => {
            let keeper = ViewKeeper::new(rank, world);
            let mut group = Group::assemble(rank, config.clone(), table, keeper, links, endpoint);
            group.form_paths(&config, deadline).await?;
            Ok(group)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(GroupError::Missing {
            missing: mesh.into_inner().missing(),
            waited: config.join_timeout,
            failed,
        }),
    }
}

/// The links' idle timeout and keep-alives from the group's failure
/// timeout, where it gives one.
pub(super) fn apply_failure_timeout(config: &mut GroupConfig) {
    if let Some(t) = config.failure_timeout {
        config.link.quic.fail_silent_peer_within(t);
    }
}

/// This rank's endpoint at `listen` (in the port range, if any), with the
/// job's certificates.
pub(super) fn open_endpoint(
    config: &GroupConfig,
    listen: SocketAddr,
) -> Result<Endpoint, GroupError> {
    open_in(config.port_range, listen, |addr| {
        Endpoint::peer(
            addr,
            &config.cert,
            &config.key,
            &config.ca,
            config.link.clone(),
        )
    })
}

/// The mesh of a new view as it stood when forming it ended: a link to
/// each member that came, `None` at this rank's place and at each of
/// `missing`'s.
pub(super) struct ViewMesh {
    pub(super) links: Vec<Option<Link>>,
    /// The places of the members no link to which formed in time: dead
    /// since the agreement, or unreachable from this rank.
    pub(super) missing: Vec<usize>,
    /// How long forming it waited.
    pub(super) waited: Duration,
    /// The accepted connections that failed their handshake.
    pub(super) failed: Vec<(SocketAddr, HandshakeFailure)>,
}

impl ViewMesh {
    /// Every link, or the error naming the members that did not come.
    pub(super) fn whole(self) -> Result<Vec<Option<Link>>, GroupError> {
        match self.missing.is_empty() {
            true => Ok(self.links),
            false => Err(GroupError::Missing {
                missing: self.missing,
                waited: self.waited,
                failed: self.failed,
            }),
        }
    }
}

/// Forms the mesh of view `epoch` among the ranks of `table` (where each
/// listens), this rank being `place` among them, on `endpoint`, within
/// `wait`: a new view's links after the group lost a rank. A member that
/// does not come within `wait` (it died after the agreement) or cannot be
/// reached is `missing`, not an error: the caller agrees on the next view
/// without it. A member forming the same view with other members is an
/// error.
pub(super) async fn form_view(
    config: &GroupConfig,
    endpoint: &Endpoint,
    place: usize,
    table: Vec<SocketAddr>,
    epoch: u64,
    members: &[usize],
    wait: Duration,
) -> Result<ViewMesh, GroupError> {
    let mark = MeshMark {
        epoch,
        digest: Some(view_digest(epoch, members)),
    };
    let view = GroupConfig {
        rank: place,
        world: table.len(),
        rendezvous: Rendezvous::Addresses(table),
        ..config.clone()
    };
    let mut links: Vec<Option<Link>> = (0..view.world).map(|_| None).collect();
    let mut failed = Vec::new();
    let mesh = RefCell::new(MeshForming::new(place, view.world, mark, Dials::EachAlone));
    let forming = form(&view, endpoint, &mut links, &mut failed, &mesh);
    if let Ok(Err(e)) = tokio::time::timeout(wait, forming).await {
        return Err(e);
    }
    let missing = mesh.into_inner().missing();
    Ok(ViewMesh {
        links,
        missing,
        waited: wait,
        failed,
    })
}

/// Fills `links` with a link to every other rank of the mesh `mesh`
/// forms, as it says whom to dial and whose hello to take, and returns
/// where each rank listens; `failed` collects the accepted connections
/// that failed their handshake.
async fn form(
    config: &GroupConfig,
    endpoint: &Endpoint,
    links: &mut [Option<Link>],
    failed: &mut Vec<(SocketAddr, HandshakeFailure)>,
    mesh: &RefCell<MeshForming>,
) -> Result<Vec<SocketAddr>, GroupError> {
    let (rank, world) = (config.rank, config.world);
    let mark = mesh.borrow().mark();
    let table = match &config.rendezvous {
        Rendezvous::Addresses(addrs) => addrs.clone(),
        Rendezvous::Root { root, .. } if rank == 0 => {
            // Every other rank connects here first and says where it
            // listens; the table goes back to each once all are in.
            let mut table = vec![*root; world];
            let mut learn = |hello: &MeshHello| {
                if let Some(addr) = hello.listen {
                    table[hello.rank] = addr;
                }
            };
            accept_into(config, endpoint, mesh, links, 0, &mut learn, failed).await?;
            let body = Bytes::from(AddressTable(table.clone()).encode());
            for (r, link) in links.iter_mut().enumerate() {
                if let Some(link) = link {
                    link.sender()
                        .send_message(tag(0, Kind::Hello), body.clone())
                        .await
                        .map_err(|source| GroupError::Rank { rank: r, source })?;
                }
            }
            table
        }
        Rendezvous::Root { root, .. } => {
            let link = connect_to(config, endpoint, 0, *root, true, mark).await?;
            mesh.borrow_mut().linked(0);
            let link = links[0].insert(link);
            let failed = |source| GroupError::Rank { rank: 0, source };
            let (got, body) = link.receiver().recv_message().await.map_err(failed)?;
            match AddressTable::decode(&body, world) {
                Ok(table) if got == tag(0, Kind::Hello) => table.0,
                Ok(_) => {
                    return Err(GroupError::OutOfStep {
                        rank: 0,
                        what: "no address table from rank 0".into(),
                    })
                }
                Err(e) => {
                    return Err(GroupError::OutOfStep {
                        rank: 0,
                        what: format!("no address table from rank 0: {e}"),
                    })
                }
            }
        }
    };
    // The rest of the mesh: dial the lower ranks the machine says, accept
    // every higher one, at the same time.
    let (lower, rest) = links.split_at_mut(rank);
    let higher = &mut rest[1..];
    let dials = mesh.borrow().dials();
    let connect = async {
        let table = &table;
        let mut dialing = FuturesUnordered::new();
        loop {
            let next = mesh.borrow_mut().poll_dial();
            if let Some(r) = next {
                dialing.push(async move {
                    (
                        r,
                        connect_to(config, endpoint, r, table[r], false, mark).await,
                    )
                });
                continue;
            }
            let Some((r, dialed)) = dialing.next().await else {
                return Ok::<_, GroupError>(());
            };
            let ended = mesh.borrow_mut().dialed(r, dialed.is_ok());
            match dialed {
                Ok(link) => lower[r] = Some(link),
                Err(e) if ended.is_err() || dials == Dials::InTurn => return Err(e),
                Err(e) => tracing::info!(rank = r, %e, "no link to a member of the new view"),
            }
        }
    };
    let accept = async {
        let hello = &mut |_: &MeshHello| {};
        accept_into(config, endpoint, mesh, higher, rank + 1, hello, failed).await
    };
    let (c, a) = tokio::join!(connect, accept);
    c.and(a).map(|()| table)
}

/// Connects to `rank` at `addr` and says who this rank is (and, to the
/// root, where it listens).
async fn connect_to(
    config: &GroupConfig,
    endpoint: &Endpoint,
    rank: usize,
    addr: SocketAddr,
    tell_listen: bool,
    mark: MeshMark,
) -> Result<Link, GroupError> {
    let failed = |source| GroupError::Rank { rank, source };
    let mut link = dial(config, endpoint, rank, addr).await?;
    let listen = match tell_listen {
        true => Some(listen_address(endpoint, &link, addr)?),
        false => None,
    };
    let hello = MeshHello {
        rank: config.rank,
        world: config.world,
        listen,
        epoch: mark.epoch,
        view: mark.digest,
    };
    link.sender()
        .send_message(tag(0, Kind::Hello), hello.encode().into())
        .await
        .map_err(failed)?;
    Ok(link)
}

/// A link to `rank` at `addr`, tried until the caller's timeout.
pub(super) async fn dial(
    config: &GroupConfig,
    endpoint: &Endpoint,
    rank: usize,
    addr: SocketAddr,
) -> Result<Link, GroupError> {
    let failed = |source| GroupError::Rank { rank, source };
    let name = server_name(config, endpoint, addr);
    let layout = link_layout()?;
    // A rank may start after this one: a new attempt each window, each
    // window twice as long as the last, until the join's own timeout says
    // that rank is missing. Earlier attempts go on beside it (each ends at
    // the handshake's idle timeout), because under heavy loss a handshake
    // that is getting through is worth more than a fresh one, which would
    // start its retransmission backoff again.
    // A refusal left by an earlier dial is not this one's.
    endpoint.take_refusal();
    attempts::overlapping(
        Windows::HANDSHAKE,
        || endpoint.connect_once(addr, &name, &layout),
        |e| match e {
            LinkError::Connection(quinn::ConnectionError::TimedOut) => None,
            // Its certificate was refused in the handshake, before any
            // message: say why, in the error's type.
            e => Some(match endpoint.take_refusal() {
                Some(reason) => GroupError::Refused { rank, addr, reason },
                None => failed(e),
            }),
        },
        |attempt_for, attempts| {
            tracing::info!(rank, %addr, ?attempt_for, attempts, "no answer yet; trying again");
        },
    )
    .await
}

/// Where this rank listens, as the peer at `addr` reaches it over `link`:
/// the endpoint's address, its unspecified IP replaced by the one the
/// link (or the route to `addr`) goes out from.
pub(super) fn listen_address(
    endpoint: &Endpoint,
    link: &Link,
    addr: SocketAddr,
) -> Result<SocketAddr, GroupError> {
    let local = endpoint
        .local_addr()
        .map_err(|e| GroupError::Setup(e.to_string()))?;
    let ip = match local.ip().is_unspecified() {
        true => match link.connection().local_ip() {
            Some(ip) => ip,
            None => route_to(addr).map_err(|e| {
                GroupError::Setup(format!("no local address routes to {addr}: {e}"))
            })?,
        },
        false => local.ip(),
    };
    Ok(SocketAddr::new(ip, local.port()))
}

/// The local address this host sends from to reach `peer`: quinn knows a
/// connection's local IP only on sockets that report it per packet, so
/// ask the kernel's routing table with a connected UDP socket (a connect
/// sends nothing).
fn route_to(peer: SocketAddr) -> std::io::Result<std::net::IpAddr> {
    let any: SocketAddr = match peer {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let probe = std::net::UdpSocket::bind(any)?;
    probe.connect(peer)?;
    Ok(probe.local_addr()?.ip())
}

/// Accepts links and reads each one's hello until every rank in
/// `expected` has a link in `links` (indexed by rank less `offset`; each
/// is stored as soon as it is in, so a timeout sees who came). `on_hello`
/// sees each hello. Hellos are read side by side: a connection whose
/// hello is slow (a lost packet, a peer that gave up on this attempt and
/// is trying again) holds up no other. A client that fails its handshake
/// or sends no hello is skipped (a stray scanner, a rank of another job,
/// an abandoned attempt), and noted in `failed` with its address and
/// reason (a refused certificate names its CA or job) for the error that
/// says who is missing; a rank that is not expected, or says it belongs
/// to a group of another size, is an error; a rank forming another view
/// than `epoch` is skipped.
#[allow(clippy::too_many_arguments)]
async fn accept_into(
    config: &GroupConfig,
    endpoint: &Endpoint,
    mesh: &RefCell<MeshForming>,
    links: &mut [Option<Link>],
    offset: usize,
    on_hello: &mut dyn FnMut(&MeshHello),
    failed: &mut Vec<(SocketAddr, HandshakeFailure)>,
) -> Result<(), GroupError> {
    let mut greeting = FuturesUnordered::new();
    let mut accepting = true;
    let mark = mesh.borrow().mark();
    while mesh.borrow().awaits_hellos() {
        let (link, got) = tokio::select! {
            incoming = endpoint.incoming(), if accepting => {
                match incoming {
                    Some(incoming) => greeting.push(async move {
                        let remote = incoming.remote_address();
                        let mut link = incoming.finish().await.map_err(|e| (remote, e))?;
                        let got = link.receiver().recv_message().await;
                        Ok::<_, (SocketAddr, IncomingError)>((link, got))
                    }),
                    None => accepting = false,
                }
                continue;
            }
            Some(greeted) = greeting.next(), if !greeting.is_empty() => match greeted {
                Ok(greeted) => greeted,
                Err((remote, e)) => {
                    let why = match &e {
                        IncomingError::Quic(e) => HandshakeFailure::of(e),
                        e => HandshakeFailure::Other(e.to_string()),
                    };
                    // A few say why; a scan of the port must not grow it,
                    // nor fill the log.
                    if failed.len() < 16 {
                        if why.is_refusal() {
                            // At once: the rank it refused will not come,
                            // and the join would otherwise wait in silence.
                            tracing::warn!(%remote, reason = %why, "rank {}: a connection to the group was refused", config.rank);
                        } else {
                            tracing::info!(%remote, reason = %why, "a connection to the group failed its handshake");
                        }
                        failed.push((remote, why));
                    }
                    continue;
                }
            },
            else => return Err(GroupError::Setup("the endpoint closed".into())),
        };
        let remote = link.connection().remote_address();
        let (got, body) = match got {
            Ok(m) => m,
            Err(e) => {
                tracing::info!(%e, %remote, "a connection to the group said nothing");
                continue;
            }
        };
        let hello = match MeshHello::decode(&body) {
            Ok(h) if got == tag(0, Kind::Hello) => h,
            Ok(_) => {
                tracing::info!(%remote, "a connection to the group sent no hello");
                continue;
            }
            Err(e) => {
                tracing::info!(%remote, %e, "a connection to the group sent no valid hello");
                continue;
            }
        };
        let verdict = mesh.borrow_mut().hello(&hello);
        match verdict {
            HelloVerdict::Take => {}
            HelloVerdict::OtherView => {
                // A rank forming another view (an agreement that went on
                // without this one): not a member of this mesh.
                tracing::info!(%remote, theirs = hello.epoch, ours = mark.epoch, "a connection for another view of the group");
                continue;
            }
            HelloVerdict::Refuse(why @ MeshRefusal::Unexpected { .. }) => {
                return Err(GroupError::Setup(why.to_string()))
            }
            HelloVerdict::Refuse(why) => {
                return Err(GroupError::OutOfStep {
                    rank: hello.rank,
                    what: why.to_string(),
                })
            }
        }
        let Some(slot) = hello
            .rank
            .checked_sub(offset)
            .and_then(|i| links.get_mut(i))
        else {
            continue;
        };
        on_hello(&hello);
        *slot = Some(link);
    }
    Ok(())
}
