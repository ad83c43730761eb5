//! A rank's view of its group across collectives under
//! [`OnRankFailure::Continue`](super::OnRankFailure::Continue), as a
//! state machine with no socket and no clock: the control plane around
//! the agreement (docs/DESIGN.md, "Elastic membership").
//!
//! A collective is an exchange among the view's members, then a `Done`
//! from each to every other, so that no rank returns before every rank
//! holds the result. A failed exchange starts an [`Agreement`] on the
//! next view (the ranks lost, whether this rank held the result); the
//! decided view's mesh forms; where a member of it does not link up, the
//! next view goes on without it, until a mesh is whole; then the call
//! returns the result it held, runs again among the new members, or is
//! out of step ([`CallFate`](super::CallFate)). Between collectives the
//! members admit the ranks their `Done` messages named waiting, forming a
//! view with them the same way.
//!
//! The shell (`gradlane::Group`) drives one [`ViewKeeper`] per rank over
//! QUIC; the simulator (the `gradlane-sim` crate) drives many over a
//! seeded model of a network with deaths, freezes, partitions and
//! restarts, and checks every schedule.
//!
//! [`Agreement`]: super::agreement::Agreement

mod error;
mod machine;

#[cfg(test)]
mod tests;

pub use error::KeeperError;
#[cfg(any(test, feature = "flaws"))]
pub use machine::KeeperFlaw;
pub use machine::{Action, Event, Failure, ViewKeeper};
