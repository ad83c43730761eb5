//! Which further paths a rank makes with each peer once the mesh is
//! formed, from the offers the two exchanged: a pair uses the fewer of
//! the two ranks' paths, so ranks configured differently still agree;
//! the higher rank dials each further path on the socket the lower one
//! said. Pure: both ends plan the same pairs from the same offers.

use super::{GroupMessageError, PathOffer};

/// Connections a rank with `sockets` sockets offers each peer in a group
/// of `world`: its sockets shared among its peers, at least one each
/// (`ceil(sockets / (world - 1))`, at most `sockets`).
pub fn paths_per_peer(sockets: usize, world: usize) -> usize {
    let sockets = sockets.max(1);
    match world.saturating_sub(1) {
        0 => 1,
        peers => sockets.div_ceil(peers).clamp(1, sockets),
    }
}

/// The socket (of `sockets`) that carries path `path` (1 or more) to
/// `peer`: paths beyond the first go round the sockets beyond the first,
/// starting at a place that differs by peer.
pub fn socket_of(sockets: usize, peer: usize, path: usize) -> usize {
    match sockets {
        0 | 1 => 0,
        _ => 1 + (path - 1 + peer) % (sockets - 1),
    }
}

/// One further path to make with a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedPath {
    /// The peer (place in the view).
    pub peer: usize,
    /// Which path (1 or more; path 0 is the mesh's link).
    pub path: usize,
    /// This rank's socket for it (index among its sockets).
    pub socket: usize,
    /// The peer's port to dial, where this rank dials (it is the higher
    /// of the two); `None` where it accepts.
    pub dial_port: Option<u16>,
}

/// Why a peer's offer cannot be planned with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PathPlanError {
    /// Its offer does not decode.
    #[error("rank {peer} sent no valid offer of paths: {source}")]
    BadOffer {
        /// The peer.
        peer: usize,
        /// Why.
        source: GroupMessageError,
    },
    /// A path would go to a socket it did not offer.
    #[error("rank {peer}: path {path} on a socket it did not offer")]
    Unoffered {
        /// The peer.
        peer: usize,
        /// The path.
        path: usize,
    },
}

impl PathPlanError {
    /// The peer whose offer it is.
    pub fn peer(&self) -> usize {
        match *self {
            PathPlanError::BadOffer { peer, .. } | PathPlanError::Unoffered { peer, .. } => peer,
        }
    }
}

/// The further paths the rank at place `me`, with `sockets` sockets and
/// `offered` paths a peer, makes with each peer whose offer came
/// (`offers[p]`, the bytes as they came; `None` for itself or a peer
/// with no link).
pub fn plan_paths<B: AsRef<[u8]>>(
    me: usize,
    sockets: usize,
    offered: usize,
    offers: &[Option<B>],
) -> Result<Vec<PlannedPath>, PathPlanError> {
    let mut planned = Vec::new();
    for (peer, body) in offers.iter().enumerate() {
        let Some(body) = body else { continue };
        let theirs = PathOffer::decode(body.as_ref())
            .map_err(|source| PathPlanError::BadOffer { peer, source })?;
        let paths = offered.min(theirs.paths);
        for path in 1..paths {
            let dial_port = match me > peer {
                true => {
                    let theirs_at = socket_of(theirs.ports.len() + 1, me, path);
                    let port = theirs
                        .ports
                        .get(theirs_at - 1)
                        .ok_or(PathPlanError::Unoffered { peer, path })?;
                    Some(*port)
                }
                false => None,
            };
            planned.push(PlannedPath {
                peer,
                path,
                socket: socket_of(sockets, peer, path),
                dial_port,
            });
        }
    }
    Ok(planned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_share_the_sockets_among_the_peers() {
        assert_eq!(paths_per_peer(4, 1), 1);
        assert_eq!(paths_per_peer(4, 2), 4);
        assert_eq!(paths_per_peer(4, 4), 2);
        assert_eq!(paths_per_peer(4, 5), 1);
        assert_eq!(paths_per_peer(4, 32), 1);
        assert_eq!(paths_per_peer(1, 2), 1);
        assert_eq!(paths_per_peer(0, 2), 1);
        // Connections per rank stay under sockets + world.
        for sockets in 1..=8 {
            for world in 2..=40 {
                let conns = paths_per_peer(sockets, world) * (world - 1);
                assert!(conns < sockets + world, "{sockets} sockets, {world} ranks");
            }
        }
        // Paths beyond the first use the sockets beyond the first, and a
        // rank's peers start at different ones.
        assert_eq!(socket_of(4, 0, 1), 1);
        assert_eq!(socket_of(4, 1, 1), 2);
        assert_eq!(socket_of(4, 3, 1), 1);
        assert_eq!(socket_of(4, 0, 3), 3);
        for peer in 0..10 {
            for path in 1..4 {
                assert!((1..4).contains(&socket_of(4, peer, path)));
            }
        }
    }

    fn offer(paths: usize, ports: &[u16]) -> Option<Vec<u8>> {
        Some(
            PathOffer {
                paths,
                ports: ports.to_vec(),
            }
            .encode(),
        )
    }

    #[test]
    fn both_ends_of_a_pair_plan_the_same_paths_and_only_the_higher_dials() {
        // Rank 0 with 3 sockets, rank 1 with 2: the pair uses 2 paths.
        let at_0 = plan_paths(0, 3, 3, &[None, offer(2, &[7001])]).unwrap();
        let at_1 = plan_paths(1, 2, 2, &[offer(3, &[6001, 6002]), None]).unwrap();
        assert_eq!(at_0.len(), 1);
        assert_eq!(at_1.len(), 1);
        assert_eq!(
            (at_0[0].peer, at_0[0].path, at_0[0].dial_port),
            (1, 1, None)
        );
        assert_eq!((at_1[0].peer, at_1[0].path), (0, 1));
        // Rank 1 dials rank 0's socket for peer 1's path 1, which rank 0
        // accepts on that same socket.
        let port = at_1[0].dial_port.unwrap();
        assert_eq!(port, [6001, 6002][at_0[0].socket - 1]);
        assert_eq!(
            plan_paths(1, 1, 1, &[offer(3, &[6001, 6002]), None]).unwrap(),
            []
        );
    }

    #[test]
    fn a_bad_offer_names_its_peer() {
        let e = plan_paths(1, 2, 2, &[Some(b"nonsense".to_vec()), None]).unwrap_err();
        assert!(matches!(e, PathPlanError::BadOffer { peer: 0, .. }), "{e}");
        // An offer of more paths than the sockets it names fails its
        // decoding already.
        let e = plan_paths(1, 4, 4, &[offer(4, &[]), None]).unwrap_err();
        assert!(matches!(e, PathPlanError::BadOffer { peer: 0, .. }), "{e}");
        assert_eq!(e.peer(), 0);
    }
}
