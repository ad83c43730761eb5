//! Why a collective or an admission failed, as the keeper knows it.

/// A collective's or an admission's failure ([`super::Action::Fail`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeeperError {
    /// This rank is out of the group (removed by the others, or stopped
    /// where it could not install a view): every later call fails too.
    #[error("rank {rank} was removed from the group in view {epoch}: {why}")]
    Removed {
        /// This rank (as it joined).
        rank: usize,
        /// The view it was removed in.
        epoch: u64,
        /// Why.
        why: String,
    },
    /// Too few ranks were reached to form a view.
    #[error("rank {rank} reached only ranks {reached:?} of view {members:?}: no quorum")]
    NoQuorum {
        /// This rank.
        rank: usize,
        /// The ranks it reached.
        reached: Vec<usize>,
        /// The view's members.
        members: Vec<usize>,
    },
    /// The view decided something about another collective than this
    /// rank's: it is out of step with the others.
    #[error("rank {rank} is out of step: {what}")]
    OutOfStep {
        /// This rank.
        rank: usize,
        /// What showed it.
        what: String,
    },
    /// The driver's own error stands ([`super::Failure::Fatal`]).
    #[error("the exchange failed for a reason other than membership")]
    Fatal,
}
