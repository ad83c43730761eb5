//! One rank forming a mesh, as a machine with no socket and no clock:
//! which ranks it dials, which hellos it takes, and what is missing when
//! the shell's wait ends. Every pair gets one link, the higher rank
//! dialing the lower and saying who it is in a [`MeshHello`].

use super::{judge_hello, HelloVerdict, MeshHello, MeshMark};

/// How a rank dials the lower ranks of a mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dials {
    /// One after the other, the first failure failing the mesh: the
    /// join, where every rank must come and a refusal names its reason.
    InTurn,
    /// All at once, a failure leaving that rank's link out: a new view,
    /// where a member that died since the agreement must not keep this
    /// rank from linking up with the others.
    EachAlone,
}

/// A dial that failed where [`Dials::InTurn`] allows none: the mesh
/// cannot form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no link to rank {place}: the mesh needs every rank")]
pub struct DialFailed {
    /// The rank (place in the mesh) it could not link to.
    pub place: usize,
}

/// Where one peer's link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// This rank.
    Me,
    /// Not linked yet (a lower rank not dialed yet, or a higher one whose
    /// hello has not come).
    Waiting,
    /// Being dialed.
    Dialing,
    /// Linked.
    Linked,
    /// A lower rank whose dial failed, left out.
    LeftOut,
}

/// One rank forming the mesh `mark` of `world` ranks at `place`: the
/// shell dials what [`poll_dial`](Self::poll_dial) says and reports
/// each with [`dialed`](Self::dialed), hands in every hello that comes
/// ([`hello`](Self::hello)), and stops once [`is_settled`] or its wait
/// ends, taking [`missing`](Self::missing).
///
/// [`is_settled`]: Self::is_settled
#[derive(Debug, Clone)]
pub struct MeshForming {
    place: usize,
    world: usize,
    mark: MeshMark,
    dials: Dials,
    peers: Vec<Peer>,
}

impl MeshForming {
    /// A rank at `place` (below `world`) forming mesh `mark`. A place
    /// outside the mesh (the shell never gives one) makes every rank a
    /// lower one, to dial: never a panic.
    pub fn new(place: usize, world: usize, mark: MeshMark, dials: Dials) -> Self {
        let peers = (0..world)
            .map(|p| if p == place { Peer::Me } else { Peer::Waiting })
            .collect();
        Self {
            place,
            world,
            mark,
            dials,
            peers,
        }
    }

    /// The mesh it forms.
    pub fn mark(&self) -> MeshMark {
        self.mark
    }

    /// How it dials.
    pub fn dials(&self) -> Dials {
        self.dials
    }

    /// Notes a link the shell made outside the machine (the root's, which
    /// told it where this rank listens).
    pub fn linked(&mut self, place: usize) {
        if let Some(p) = self.peers.get_mut(place) {
            if *p != Peer::Me {
                *p = Peer::Linked;
            }
        }
    }

    /// The next lower rank to dial: every one at once with
    /// [`Dials::EachAlone`], the next once the last linked with
    /// [`Dials::InTurn`].
    pub fn poll_dial(&mut self) -> Option<usize> {
        let split = self.place.min(self.peers.len());
        let lower = &mut self.peers[..split];
        if self.dials == Dials::InTurn && lower.contains(&Peer::Dialing) {
            return None;
        }
        let p = lower.iter().position(|&p| p == Peer::Waiting)?;
        lower[p] = Peer::Dialing;
        Some(p)
    }

    /// The dial of `place` ended, linked or not; an error where the mesh
    /// cannot form without it.
    pub fn dialed(&mut self, place: usize, linked: bool) -> Result<(), DialFailed> {
        let Some(p) = self.peers.get_mut(place).filter(|p| **p == Peer::Dialing) else {
            return Ok(());
        };
        *p = match linked {
            true => Peer::Linked,
            false => Peer::LeftOut,
        };
        match (linked, self.dials) {
            (false, Dials::InTurn) => Err(DialFailed { place }),
            _ => Ok(()),
        }
    }

    /// What to do with a hello that came on an accepted connection: take
    /// it (its rank is a higher one not linked yet, now linked), drop it
    /// (another view's), or stop.
    pub fn hello(&mut self, hello: &MeshHello) -> HelloVerdict {
        let (place, peers) = (self.place, &self.peers);
        let awaited = |r: usize| r > place && peers.get(r) == Some(&Peer::Waiting);
        let verdict = judge_hello(hello, self.mark, self.place, self.world, awaited);
        if verdict == HelloVerdict::Take {
            self.peers[hello.rank] = Peer::Linked;
        }
        verdict
    }

    /// Whether a higher rank's hello is still to come.
    pub fn awaits_hellos(&self) -> bool {
        self.peers
            .iter()
            .skip(self.place + 1)
            .any(|&p| p == Peer::Waiting)
    }

    /// Whether nothing is left to happen: every dial ended and every
    /// higher rank linked.
    pub fn is_settled(&self) -> bool {
        !self
            .peers
            .iter()
            .any(|&p| matches!(p, Peer::Waiting | Peer::Dialing))
    }

    /// Whether every other rank is linked.
    pub fn is_whole(&self) -> bool {
        self.peers
            .iter()
            .all(|&p| matches!(p, Peer::Me | Peer::Linked))
    }

    /// The ranks (places) no link to which formed (so far).
    pub fn missing(&self) -> Vec<usize> {
        (0..self.world)
            .filter(|&p| !matches!(self.peers[p], Peer::Me | Peer::Linked))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{view_digest, MeshRefusal};

    fn hello(rank: usize, world: usize, epoch: u64, members: &[usize]) -> MeshHello {
        MeshHello {
            view: Some(view_digest(epoch, members)),
            rank,
            world,
            listen: None,
            epoch,
        }
    }

    fn mark(epoch: u64, members: &[usize]) -> MeshMark {
        MeshMark {
            epoch,
            digest: Some(view_digest(epoch, members)),
        }
    }

    #[test]
    fn a_new_view_dials_every_lower_rank_at_once_and_leaves_out_a_failed_one() {
        let members = [0, 2, 3, 5];
        let mut m = MeshForming::new(2, 4, mark(3, &members), Dials::EachAlone);
        assert_eq!(m.poll_dial(), Some(0));
        assert_eq!(m.poll_dial(), Some(1));
        assert_eq!(m.poll_dial(), None, "only the lower ranks are dialed");
        assert_eq!(m.dialed(1, false), Ok(()));
        assert_eq!(m.dialed(0, true), Ok(()));
        assert!(m.awaits_hellos());
        assert!(!m.is_settled());
        assert_eq!(m.hello(&hello(3, 4, 3, &members)), HelloVerdict::Take);
        assert!(m.is_settled());
        assert!(!m.is_whole());
        assert_eq!(m.missing(), [1]);
    }

    #[test]
    fn the_join_dials_in_turn_and_fails_at_the_first_rank_it_cannot_reach() {
        let first = MeshMark {
            epoch: 0,
            digest: None,
        };
        let mut m = MeshForming::new(3, 4, first, Dials::InTurn);
        m.linked(0);
        assert_eq!(m.poll_dial(), Some(1));
        assert_eq!(m.poll_dial(), None, "one at a time");
        assert_eq!(m.dialed(1, true), Ok(()));
        assert_eq!(m.poll_dial(), Some(2));
        assert_eq!(m.dialed(2, false), Err(DialFailed { place: 2 }));
        assert_eq!(m.missing(), [2]);
    }

    #[test]
    fn hellos_of_other_views_twice_the_same_rank_and_lower_ranks_are_not_taken() {
        let members = [0, 1, 4];
        let mut m = MeshForming::new(0, 3, mark(2, &members), Dials::EachAlone);
        assert_eq!(m.poll_dial(), None, "rank 0 dials nobody");
        assert_eq!(m.hello(&hello(1, 3, 1, &members)), HelloVerdict::OtherView);
        let other = hello(1, 3, 2, &[0, 1, 3]);
        assert!(matches!(
            m.hello(&other),
            HelloVerdict::Refuse(MeshRefusal::OtherMembers { .. })
        ));
        assert_eq!(m.hello(&hello(2, 3, 2, &members)), HelloVerdict::Take);
        assert!(matches!(
            m.hello(&hello(2, 3, 2, &members)),
            HelloVerdict::Refuse(MeshRefusal::Unexpected { rank: 2, me: 0 })
        ));
        assert!(m.awaits_hellos());
        assert_eq!(m.hello(&hello(1, 3, 2, &members)), HelloVerdict::Take);
        assert!(m.is_whole() && m.is_settled());
        assert!(m.missing().is_empty());

        let mut m = MeshForming::new(1, 3, mark(2, &members), Dials::EachAlone);
        assert!(
            matches!(
                m.hello(&hello(0, 3, 2, &members)),
                HelloVerdict::Refuse(MeshRefusal::Unexpected { rank: 0, me: 1 })
            ),
            "a lower rank is dialed, never accepted"
        );
    }

    #[test]
    fn a_place_outside_the_mesh_dials_every_rank_and_does_not_panic() {
        let members = [0, 1];
        let mut m = MeshForming::new(5, 2, mark(1, &members), Dials::EachAlone);
        assert_eq!(m.poll_dial(), Some(0));
        assert_eq!(m.poll_dial(), Some(1));
        assert_eq!(m.poll_dial(), None);
        assert!(!m.awaits_hellos());
        assert_eq!(m.missing(), [0, 1]);
    }
}
