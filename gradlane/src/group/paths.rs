//! More than one connection between a pair of ranks, over more than one
//! socket, and the exact messages striped over them.
//!
//! quinn drives each connection from one task: its packets are sealed,
//! opened and acknowledged there, and each endpoint's socket is read by
//! one task too. One connection per pair therefore keeps a rank's
//! traffic to about one core per peer, and to one receiving task in all.
//! A rank with `sockets` endpoints gives each peer [`paths_per_peer`]
//! connections, the first being the one the rendezvous made; a pair uses
//! the fewer of the two ranks' numbers, so ranks configured differently
//! still agree.
//!
//! Peers are spread over the endpoints rather than every peer getting
//! every endpoint: the connections per rank stay under `sockets + world`
//! however large the group grows, and with many peers every endpoint
//! carries some of them.
//!
//! A message of at least [`STRIPE_PIECE`] bytes per path is cut into
//! pieces of about equal size, one per path, sent at once; the first
//! path's piece opens with the number of pieces, so the receiver knows
//! how many to wait for without knowing the length in advance. Each piece
//! is an exact message on its own connection (its own stream, checked
//! tag): the message is whole and exact, or the collective fails with the
//! rank's error, as on one path. Small messages stay on the first path,
//! where one round trip is all they cost.
//!
//! The differentiated allreduce's rounds stay on the first path: its
//! promises (important part exact, zero fill, late merge) are a round's
//! on one link.

use super::port_range::open_in;
use super::{describe, server_name, tag, Group, GroupConfig, GroupError, Kind};
use crate::endpoint::Endpoint;
use crate::link::{LinkError, LinkReceiver, LinkSender};
use bytes::{Bytes, BytesMut};
use futures_util::future::try_join_all;
use gradlane_core::group::{plan_paths, PathHello, PathOffer};
use gradlane_core::layout::{Layout, TensorSpec};
use std::net::SocketAddr;
use tokio::time::Instant;

/// The smallest piece a message is cut into: below it, a further path
/// costs more than it carries.
pub(super) const STRIPE_PIECE: usize = 64 << 10;

pub use gradlane_core::group::MAX_SOCKETS;

/// This process's share of the host's cores: the cores over the
/// `local_ranks` that share the host (torchrun's `LOCAL_WORLD_SIZE`:
/// [`environment::local_world_size`](crate::environment::local_world_size)
/// reads it; 0 counts as 1).
pub fn core_share(local_ranks: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / local_ranks.max(1)).max(1)
}

/// Sockets per rank by default, with `local_ranks` on the host: a rank
/// with at least 4 cores to itself ([`core_share`]) gets one per core, at
/// most 4; with fewer, one: more sockets pay where idle cores can take
/// their packets (docs/RESULTS.md, "Fast paths"), and only add work where
/// the cores are busy already.
pub fn default_sockets(local_ranks: usize) -> usize {
    match core_share(local_ranks) {
        share if share >= 4 => share.min(4),
        _ => 1,
    }
}

pub use gradlane_core::group::paths_per_peer;

/// One path beyond the first to a peer: both halves of its link.
pub(super) struct Path {
    pub(super) sender: LinkSender,
    pub(super) receiver: LinkReceiver,
}

/// The sending and receiving halves of `paths`, apart.
pub(super) fn halves(paths: &mut [Path]) -> (Vec<&mut LinkSender>, Vec<&mut LinkReceiver>) {
    paths
        .iter_mut()
        .map(|p| (&mut p.sender, &mut p.receiver))
        .unzip()
}

/// Sends `body` with `tag` to one rank: on `first` alone when there are no
/// further paths, else in as many pieces as it fills (at least
/// [`STRIPE_PIECE`] bytes each), the first on `first` behind a byte that
/// counts the pieces.
pub(super) async fn send_striped(
    first: &mut LinkSender,
    more: &mut [&mut LinkSender],
    tag: u64,
    body: Bytes,
) -> Result<(), LinkError> {
    if more.is_empty() {
        return first.send_message(tag, body).await;
    }
    let pieces = (body.len() / STRIPE_PIECE).clamp(1, more.len() + 1);
    let cut = |i: usize| body.len() * i / pieces;
    let head = Bytes::copy_from_slice(&[pieces as u8]);
    let opening = first.send_message_chunks(tag, vec![head, body.slice(..cut(1))]);
    let rest = more
        .iter_mut()
        .take(pieces - 1)
        .enumerate()
        .map(|(i, s)| s.send_message(tag, body.slice(cut(i + 1)..cut(i + 2))));
    let (opened, sent) = tokio::join!(opening, try_join_all(rest));
    opened.and(sent.map(drop))
}

/// Receives one message with `tag` from `rank`, striped as
/// [`send_striped`] sends it, and puts it back together.
pub(super) async fn recv_striped(
    rank: usize,
    first: &mut LinkReceiver,
    more: &mut [&mut LinkReceiver],
    tag: u64,
) -> Result<Bytes, GroupError> {
    let failed = |source| GroupError::Rank { rank, source };
    let check = |got: u64| match got == tag {
        true => Ok(()),
        false => Err(GroupError::OutOfStep {
            rank,
            what: format!("message {} where {} was due", describe(got), describe(tag)),
        }),
    };
    let (got, mut body) = first.recv_message().await.map_err(failed)?;
    if got & 0xff == Kind::ViewProposal as u64 {
        return Err(GroupError::MembersChanging {
            rank,
            proposal: body,
        });
    }
    check(got)?;
    if more.is_empty() {
        return Ok(body);
    }
    let pieces = match body.first() {
        Some(&n) if (1..=more.len() + 1).contains(&usize::from(n)) => usize::from(n),
        other => {
            return Err(GroupError::OutOfStep {
                rank,
                what: format!(
                    "a striped message in {other:?} pieces over {} paths",
                    more.len() + 1
                ),
            })
        }
    };
    let _ = body.split_to(1);
    if pieces == 1 {
        return Ok(body);
    }
    let rest = more
        .iter_mut()
        .take(pieces - 1)
        .map(|r| async { r.recv_message().await.map_err(failed) });
    let rest = try_join_all(rest).await?;
    let total = body.len() + rest.iter().map(|(_, b)| b.len()).sum::<usize>();
    let mut whole = BytesMut::with_capacity(total);
    whole.extend_from_slice(&body);
    for (got, piece) in rest {
        check(got)?;
        whole.extend_from_slice(&piece);
    }
    Ok(whole.freeze())
}

/// One further connection to make or take: with `peer`, path `path`, on
/// this rank's endpoint `local` (index among its sockets); the peer's
/// socket is at `remote` when this rank connects.
#[derive(Debug, Clone, Copy)]
struct Planned {
    peer: usize,
    path: usize,
    local: usize,
    remote: Option<SocketAddr>,
}

impl Group {
    /// After the mesh is formed, at the join and after each view change:
    /// tells every peer what this rank offers, opens the further sockets
    /// (once), and connects or accepts the further paths, before
    /// `deadline`.
    pub(super) async fn form_paths(
        &mut self,
        config: &GroupConfig,
        deadline: Instant,
    ) -> Result<(), GroupError> {
        let sockets = config.sockets.clamp(1, MAX_SOCKETS);
        let offered = paths_per_peer(sockets, self.world);
        if self.world < 2 {
            return Ok(());
        }
        // Sockets beyond the first, only where this rank offers more
        // paths: on the first one's address, any port.
        let local = self
            .endpoint
            .local_addr()
            .map_err(|e| GroupError::Setup(e.to_string()))?;
        // After a view change the sockets of the join are used again: the
        // old paths on them closed with the old view.
        let mut extra = std::mem::take(&mut self.extra_endpoints);
        if offered > 1 && extra.is_empty() {
            for _ in 1..sockets {
                let endpoint = open_in(config.port_range, SocketAddr::new(local.ip(), 0), |a| {
                    Endpoint::peer(
                        a,
                        &config.cert,
                        &config.key,
                        &config.ca,
                        config.link.clone(),
                    )
                })?;
                extra.push(endpoint);
            }
        }
        let ports = extra
            .iter()
            .map(|e| e.local_addr().map(|a| a.port()))
            .collect::<Result<Vec<u16>, _>>()
            .map_err(|e| GroupError::Setup(e.to_string()))?;
        let offer = PathOffer {
            paths: offered,
            ports,
        };
        let t = tag(0, Kind::Paths);
        let body = Bytes::from(offer.encode());
        let got = self.exchange_with_all(t, &body).await?;
        // What each pair uses: the core's plan from the two offers.
        let plan =
            plan_paths(self.rank, sockets, offered, &got).map_err(|e| GroupError::OutOfStep {
                rank: e.peer(),
                what: e.to_string(),
            })?;
        let planned: Vec<Planned> = plan
            .into_iter()
            .map(|p| Planned {
                peer: p.peer,
                path: p.path,
                local: p.socket,
                remote: p.dial_port.map(|port| {
                    let ip = self.senders[p.peer]
                        .as_ref()
                        .map(|s| s.connection().remote_address().ip());
                    SocketAddr::new(ip.unwrap_or(local.ip()), port)
                }),
            })
            .collect();
        let made = tokio::time::timeout_at(deadline, connect_paths(config, &extra, &planned)).await;
        let made = made.map_err(|_| GroupError::Missing {
            missing: planned.iter().map(|p| p.peer).collect(),
            waited: config.join_timeout,
            failed: Vec::new(),
        })??;
        for (peer, path, link) in made {
            let (sender, receiver) = link.split();
            let stripes = &mut self.stripes[peer];
            stripes.push(Path { sender, receiver });
            debug_assert_eq!(stripes.len(), path);
        }
        self.extra_endpoints = extra;
        Ok(())
    }
}

/// Makes every planned path: connects those with a remote socket, accepts
/// the others on their endpoints, all at once. Returns them in path order.
async fn connect_paths(
    config: &GroupConfig,
    extra: &[Endpoint],
    planned: &[Planned],
) -> Result<Vec<(usize, usize, crate::link::Link)>, GroupError> {
    let layout = Layout::new(vec![TensorSpec::dense("group", [1])])
        .map_err(|e| GroupError::Setup(e.to_string()))?;
    let socket = |i: usize| {
        extra
            .get(i.wrapping_sub(1))
            .ok_or_else(|| GroupError::Setup(format!("no socket {i}")))
    };
    let connects = planned.iter().filter_map(|p| {
        let remote = p.remote?;
        let layout = &layout;
        Some(async move {
            let endpoint = socket(p.local)?;
            let failed = |source| GroupError::Rank {
                rank: p.peer,
                source,
            };
            let name = server_name(config, endpoint, remote);
            // One handshake, as every path's accepting rank takes them one
            // at a time; the join's deadline bounds it.
            let mut link = endpoint
                .connect_once(remote, &name, layout)
                .await
                .map_err(failed)?;
            let hello = PathHello {
                rank: config.rank,
                path: p.path,
            };
            link.sender()
                .send_message(tag(0, Kind::Paths), hello.encode().into())
                .await
                .map_err(failed)?;
            Ok::<_, GroupError>((p.peer, p.path, link))
        })
    });
    let accepts = (1..=extra.len()).map(|i| {
        let expected: Vec<(usize, usize)> = planned
            .iter()
            .filter(|p| p.remote.is_none() && p.local == i)
            .map(|p| (p.peer, p.path))
            .collect();
        async move { accept_paths(socket(i)?, expected).await }
    });
    let (connected, accepted) = tokio::join!(try_join_all(connects), try_join_all(accepts));
    let mut all: Vec<_> = connected?;
    all.extend(accepted?.into_iter().flatten());
    all.sort_by_key(|&(peer, path, _)| (peer, path));
    Ok(all)
}

/// Accepts on `endpoint` until every `(peer, path)` in `expected` has
/// connected and said so; a connection that fails or says something else
/// is skipped (a stray client, an abandoned attempt).
async fn accept_paths(
    endpoint: &Endpoint,
    mut expected: Vec<(usize, usize)>,
) -> Result<Vec<(usize, usize, crate::link::Link)>, GroupError> {
    let mut got = Vec::new();
    while !expected.is_empty() {
        let Some(incoming) = endpoint.incoming().await else {
            return Err(GroupError::Setup("a path's endpoint closed".into()));
        };
        let remote = incoming.remote_address();
        let mut link = match incoming.finish().await {
            Ok(link) => link,
            Err(e) => {
                tracing::info!(%e, %remote, "a path to this rank failed its handshake");
                continue;
            }
        };
        let said = match link.receiver().recv_message().await {
            Ok((t, body)) if t == tag(0, Kind::Paths) => {
                PathHello::decode(&body).map(|h| (h.rank, h.path)).ok()
            }
            _ => None,
        };
        match said.and_then(|s| expected.iter().position(|&e| e == s)) {
            Some(i) => {
                let (peer, path) = expected.swap_remove(i);
                got.push((peer, path, link));
            }
            None => tracing::info!(%remote, "a connection to a path socket said no path hello"),
        }
    }
    Ok(got)
}
