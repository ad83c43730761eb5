//! The survivors' agreement on the next view of a group that lost a rank
//! (docs/DESIGN.md §4.1), as a state machine with no socket and no
//! clock: the shell (`gradlane::Group`) drives it over its links, and
//! the simulator (the `gradlane-sim` crate) drives many at once over a
//! seeded model of a network that cuts, partitions, kills and freezes.
//!
//! Every survivor proposes (whom it lost, which collective it is in,
//! whether it holds its result) to every rank it still reaches; the
//! lowest place a survivor has not lost is its coordinator, which decides
//! once it has a proposal from every place it has not lost, by a pure
//! rule ([`decide`]); every rank passes the decision it takes on.
//!
//! - [`Seat`]: what one rank brings (its place, the view, its collective).
//! - [`Agreement`]: one rank's machine ([`Event`] in, [`Transmit`] out,
//!   then its [`Outcome`]).
//! - [`decide`], [`is_quorum`], [`outcome`]: the coordinator's rule.

mod error;
mod machine;
mod rule;
mod seat;

#[cfg(test)]
mod tests;

pub use error::AgreementError;
#[cfg(any(test, feature = "flaws"))]
pub use machine::Flaw;
pub use machine::{Agreement, Event, MessageKind, Outcome, Transmit};
pub use rule::{decide, is_quorum, outcome, Decided};
pub use seat::Seat;
