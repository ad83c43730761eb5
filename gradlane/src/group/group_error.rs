//! Why a group operation failed ([`GroupError`]), and what a failure
//! means for the core's view keeper and its errors for the group.

#[cfg(doc)]
use super::{GroupConfig, OnRankFailure};
use crate::endpoint::SetupError;
use crate::handshake_failure::HandshakeFailure;
use crate::link::LinkError;
use crate::tls::PeerCertError;
use bytes::Bytes;
use gradlane_core::control::codes;
use gradlane_core::group::view_keeper::{Failure, KeeperError};
use std::net::SocketAddr;
use std::time::Duration;
use thiserror::Error;

/// Why a group operation failed.
#[derive(Debug, Error)]
pub enum GroupError {
    /// The rank, world or addresses do not make a group.
    #[error("group setup: {0}")]
    Setup(String),
    /// The endpoint could not be made.
    #[error(transparent)]
    Endpoint(#[from] SetupError),
    /// Some ranks did not join in time.
    #[error(
        "ranks {missing:?} did not join within {waited:?}{}",
        failed_note(failed)
    )]
    Missing {
        /// The ranks this rank never heard from.
        missing: Vec<usize>,
        /// How long it waited.
        waited: Duration,
        /// The connections to this rank that failed their handshake
        /// meanwhile, by address, and why (a certificate of another CA or
        /// job refused): the likely reason a rank is missing.
        failed: Vec<(SocketAddr, HandshakeFailure)>,
    },
    /// A rank presented a certificate this rank refuses: nothing was
    /// exchanged with it.
    #[error("rank {rank} at {addr} refused: {reason}")]
    Refused {
        /// The other rank.
        rank: usize,
        /// Its address.
        addr: SocketAddr,
        /// Why its certificate was refused.
        reason: PeerCertError,
    },
    /// The link to a rank failed: that rank is gone, closed, or broke the
    /// protocol.
    #[error("rank {rank}: {source}")]
    Rank {
        /// The other rank.
        rank: usize,
        /// What its link reported.
        source: LinkError,
    },
    /// A rank sent something other than what this collective expects: it
    /// called another collective, or with another size.
    #[error("rank {rank} is out of step: {what}")]
    OutOfStep {
        /// The other rank.
        rank: usize,
        /// What differed.
        what: String,
    },
    /// A buffer's size does not fit the collective.
    #[error("{0}")]
    Size(String),
    /// A collective asked of something it does not do (a max over the
    /// differentiated allreduce, a buffer of another type than its
    /// bucket's).
    #[error("{0}")]
    Unsupported(String),
    /// Another rank began to agree on the group's members (it lost a
    /// rank) while this one waited in a collective. With
    /// [`OnRankFailure::Continue`] the group takes part and goes on; with
    /// `Fail` this is the error.
    #[error("rank {rank} is changing the group's members (it lost a rank)")]
    MembersChanging {
        /// The rank that began it.
        rank: usize,
        /// Its proposal, as it came.
        proposal: Bytes,
    },
    /// This rank is no longer a member: the others went on without it (it
    /// was silent past the failure timeout, or cut off from them). It
    /// must not go on with its old state: restart it to rejoin.
    #[error("rank {rank} was removed from the group in view {epoch}: {why}; restart it to rejoin")]
    Removed {
        /// This rank.
        rank: usize,
        /// The view that left it out.
        epoch: u64,
        /// What it saw.
        why: String,
    },
    /// A collective waited past the group's
    /// [`collective_timeout`](GroupConfig::collective_timeout) (a
    /// monitored barrier past its own) for ranks whose links are alive.
    /// With [`OnRankFailure::Fail`] every later collective returns this
    /// error again: the group is unusable.
    #[error(
        "{op} waited past its timeout ({waited:?}) for ranks {missing:?}, \
         whose links are alive; the group is unusable"
    )]
    Timeout {
        /// The collective.
        op: &'static str,
        /// The sequence number of the message it waited for, as the
        /// links number them (several a collective).
        collective: u64,
        /// The ranks it did not hear from, by the ranks they joined as.
        missing: Vec<usize>,
        /// The timeout.
        waited: Duration,
    },
    /// An earlier collective on this rank was cancelled before it ended
    /// (its future dropped, say by a timeout around it): its messages may
    /// be half sent or unread, so the links are out of step with the
    /// other ranks. Close the group and join a new one.
    #[error(
        "an earlier {op} was cancelled before it ended: the links are out of step; close the \
         group and join a new one"
    )]
    Interrupted {
        /// The collective that was cancelled.
        op: &'static str,
    },
    /// Too few ranks are left to go on without risking a split group: the
    /// ranks this one still reaches are not a majority of the last view
    /// (or exactly half without its lowest rank).
    #[error("rank {rank} reaches only ranks {reached:?} of {members:?}: not a quorum, so it stops (the others may go on without it)")]
    NoQuorum {
        /// This rank.
        rank: usize,
        /// The ranks it reached, itself included.
        reached: Vec<usize>,
        /// The members of the last view.
        members: Vec<usize>,
    },
}

/// What [`GroupError::Timeout`] says, kept to say it again.
#[derive(Debug, Clone)]
pub(super) struct TimedOut {
    pub(super) op: &'static str,
    pub(super) collective: u64,
    pub(super) missing: Vec<usize>,
    pub(super) waited: Duration,
}

impl TimedOut {
    pub(super) fn error(&self) -> GroupError {
        GroupError::Timeout {
            op: self.op,
            collective: self.collective,
            missing: self.missing.clone(),
            waited: self.waited,
        }
    }
}

/// The failed handshakes of a [`GroupError::Missing`], for its message.
fn failed_note(failed: &[(SocketAddr, HandshakeFailure)]) -> String {
    let each: Vec<String> = failed
        .iter()
        .map(|(a, why)| format!("{a}: {why}"))
        .collect();
    match each.is_empty() {
        true => String::new(),
        false => format!("; failed handshakes: {}", each.join("; ")),
    }
}

/// What a failed exchange means for the keeper, and the error that stands
/// where it is not about membership.
pub(super) fn classify(e: GroupError) -> (Failure, Option<GroupError>) {
    match e {
        GroupError::Rank {
            rank,
            source: LinkError::Rejected { code, reason },
        } if code == u64::from(codes::REMOVED) => (
            Failure::Removed(format!("rank {rank} closed its link: {reason}")),
            None,
        ),
        GroupError::Rank { rank, source } => match source {
            LinkError::Connection(_)
            | LinkError::PeerClosed { .. }
            | LinkError::Rejected { .. }
            | LinkError::CloseUnacknowledged { .. }
            | LinkError::Write(_)
            | LinkError::Read(_) => (Failure::Lost(rank), None),
            source => (Failure::Fatal, Some(GroupError::Rank { rank, source })),
        },
        GroupError::MembersChanging { rank, proposal } => {
            (Failure::Alarm(rank, proposal.to_vec()), None)
        }
        e => (Failure::Fatal, Some(e)),
    }
}

/// The group's error for the keeper's.
pub(super) fn group_error(e: KeeperError, stands: Option<GroupError>) -> GroupError {
    match (e, stands) {
        (_, Some(e)) => e,
        (KeeperError::Removed { rank, epoch, why }, None) => {
            GroupError::Removed { rank, epoch, why }
        }
        (
            KeeperError::NoQuorum {
                rank,
                reached,
                members,
            },
            None,
        ) => GroupError::NoQuorum {
            rank,
            reached,
            members,
        },
        (KeeperError::OutOfStep { rank, what }, None) => GroupError::OutOfStep { rank, what },
        (e @ KeeperError::Fatal, None) => GroupError::Setup(e.to_string()),
    }
}
