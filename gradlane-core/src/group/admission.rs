//! Admission of ranks that ask to rejoin a group that went on without
//! them: which requests a member refuses and why, and the view that takes
//! the others in. Pure: every member decides the same from the same
//! announcements, and the shell (`gradlane`'s `group/rejoin.rs`) only
//! carries the messages.

use super::{JoinRequest, ViewDecision, ViewOutcome};
use std::net::SocketAddr;

/// Why a member refuses a rank asking to rejoin; the rank is told this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It asks for a group of another size.
    #[error("rank {rank} asks to rejoin a group of {asked}, this one has {world}")]
    OtherWorld {
        /// Its rank.
        rank: usize,
        /// The size it asked for.
        asked: usize,
        /// This group's.
        world: usize,
    },
    /// Its rank is a member still.
    #[error("rank {rank} is a member of the group: two processes with one rank?")]
    StillMember {
        /// Its rank.
        rank: usize,
    },
    /// It comes back with the state of a view it was removed from: it
    /// must start afresh, or it would train on with stale state.
    #[error(
        "rank {rank} comes back with its state of view {epoch}, which went on without it: \
         restart it to rejoin afresh"
    )]
    Stale {
        /// Its rank.
        rank: usize,
        /// The last view it was a member of.
        epoch: u64,
    },
}

/// Whether a member of a group of `world` ranks, whose view has
/// `members` (ranks as they joined), may admit `request`.
pub fn screen(request: &JoinRequest, members: &[usize], world: usize) -> Result<(), Refusal> {
    let rank = request.rank;
    if request.world != world {
        return Err(Refusal::OtherWorld {
            rank,
            asked: request.world,
            world,
        });
    }
    if members.contains(&rank) {
        return Err(Refusal::StillMember { rank });
    }
    match request.member_of {
        Some(epoch) => Err(Refusal::Stale { rank, epoch }),
        None => Ok(()),
    }
}

/// The view that admits the ranks `announced` waiting (as every member's
/// `Done` named them) into view `epoch` of `members`, between collectives
/// (`calls` of them so far, all complete): `None` where none of them is
/// outside the view. Returns the decision and the ranks it admits, with
/// where each listens, by rank.
pub fn admitting_view(
    members: &[usize],
    epoch: u64,
    calls: u64,
    announced: &[(usize, SocketAddr)],
) -> Option<(ViewDecision, Vec<(usize, SocketAddr)>)> {
    let mut joiners: Vec<(usize, SocketAddr)> = announced
        .iter()
        .copied()
        .filter(|(r, _)| !members.contains(r))
        .collect();
    joiners.sort_unstable_by_key(|j| j.0);
    joiners.dedup_by_key(|j| j.0);
    if joiners.is_empty() {
        return None;
    }
    let mut next: Vec<usize> = members.to_vec();
    next.extend(joiners.iter().map(|j| j.0));
    next.sort_unstable();
    let decision = ViewDecision {
        epoch: epoch + 1,
        outcome: ViewOutcome::Complete { call: calls },
        members: next,
    };
    Some((decision, joiners))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(rank: usize, world: usize, member_of: Option<u64>) -> JoinRequest {
        JoinRequest {
            rank,
            world,
            listen: "10.0.0.9:4000".parse().unwrap(),
            member_of,
        }
    }

    #[test]
    fn a_fresh_rank_outside_the_view_is_taken_and_the_others_refused_with_the_reason() {
        let members = [0, 1, 3];
        assert_eq!(screen(&request(2, 4, None), &members, 4), Ok(()));
        assert_eq!(
            screen(&request(2, 5, None), &members, 4),
            Err(Refusal::OtherWorld {
                rank: 2,
                asked: 5,
                world: 4
            })
        );
        assert_eq!(
            screen(&request(1, 4, None), &members, 4),
            Err(Refusal::StillMember { rank: 1 })
        );
        let stale = screen(&request(2, 4, Some(3)), &members, 4).unwrap_err();
        assert_eq!(stale, Refusal::Stale { rank: 2, epoch: 3 });
        assert!(stale.to_string().contains("restart it"), "{stale}");
    }

    #[test]
    fn the_admitting_view_takes_each_waiting_rank_once_in_order() {
        let a: SocketAddr = "10.0.0.3:1".parse().unwrap();
        let b: SocketAddr = "10.0.0.5:1".parse().unwrap();
        let announced = [(4, b), (2, a), (4, b), (1, a)];
        let (decision, joiners) = admitting_view(&[0, 1, 3], 6, 41, &announced).unwrap();
        assert_eq!(decision.epoch, 7);
        assert_eq!(decision.members, vec![0, 1, 2, 3, 4]);
        assert_eq!(decision.outcome, ViewOutcome::Complete { call: 41 });
        assert_eq!(joiners, vec![(2, a), (4, b)], "rank 1 is a member already");
        assert_eq!(admitting_view(&[0, 1, 3], 6, 41, &[(1, a)]), None);
        assert_eq!(admitting_view(&[0, 1, 3], 6, 41, &[]), None);
    }
}
