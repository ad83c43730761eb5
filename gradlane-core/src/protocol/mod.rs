//! The round protocol as state machines: when a round's lossy part is
//! released and reported, when a receiver confirms and delivers a round,
//! how a link closes in order.
//!
//! Like the rest of the core they read no clock (time is an argument),
//! own no socket and never wait: a driver feeds events in and carries the
//! actions out. The `gradlane` crate's link drives them over quinn; this
//! module's tests drive a pair of them over a simulated path (loss, delay,
//! jitter, reordering, a rate), thousands of rounds a second.
//!
//! - [`RoundSend`]: one round's sender, from the first important byte to
//!   the peer's confirmation ([`SendEvent`] in, [`SendAction`] out).
//! - [`DeliveryWait`]: one round's receiver, from its important part to
//!   its delivery; [`Confirmations`] and [`LossyReports`]: what a
//!   receiver confirmed and what the sender told it.
//! - [`CloseInOrder`]: an orderly close.
//! - [`RoundTiming`]: the settings they follow.
//! - [`DeadlineTracker`]: the budget of a collective's lossy part, from
//!   recent steps ([`StepDeadline`]).

mod close;
mod receive;
mod send;
mod step_deadline;
mod timing;

#[cfg(test)]
mod tests;

pub use close::{already_closed, CloseInOrder, CloseOutcome, ClosedBy};
pub use receive::{
    still_to_deliver, Confirmations, Delivery, DeliveryWait, LossyProgress, LossyReports,
    LOSSY_TAIL,
};
pub use send::{Counter, RoundSend, SendAction, SendEvent, SendFailure, SendPlan, DRAIN_GIVE_UP};
pub use step_deadline::{AdaptiveDeadline, DeadlineTracker, StepDeadline, StepDeadlineError};
pub use timing::{DatagramSize, LossyCarrier, LossyRelease, RoundTiming};
