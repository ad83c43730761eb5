//! The deterministic simulator of gradlane's control plane: N ranks (2 to
//! 16) with the real machines of `gradlane-core`, over a seeded model of
//! their links, with the faults a group meets. One seed, one schedule; no
//! clock, no socket, thousands of schedules a second, each checked
//! against the invariants ([`Violation`] says each) once it ran.
//!
//! It runs in one of two [`Mode`]s, in one world (`world.rs`: events in
//! simulated time, links as queues in order each way, failures noticed a
//! while after they happen), from one kind of schedule (`plan.rs`: the
//! faults by time, how fast the network and the failure detector are),
//! held against the invariants at one place (`simulate.rs`):
//! - [`Mode::Agreement`]: the survivors of a view that lost a rank agree
//!   on the next with the real `Agreement`s. The failure that began it
//!   (ranks dead, links cut) is noticed by some ranks first; a rank still
//!   in its collective begins when the first proposal or loss reaches it;
//!   where each rank's collective stands is drawn as a real group can be.
//!   Faults come in the middle of it: a link cut, a partition, a rank
//!   killed or frozen. Of what was on a failed link, a prefix arrives; a
//!   send on one fails where the rank knows it failed, sometimes where it
//!   does not yet. A rank that decided may close its old links a while
//!   later. Two coordinators may each decide a view; a member of one view
//!   installing another ([`Violation::Disagreement`]) fails, and the
//!   tally counts it apart too, so that a flawed machine's count shows.
//! - [`Mode::Group`]: every rank runs C collectives (2 to 5) with the
//!   real `ViewKeeper`s, calling `admit` after each one it returns, as a
//!   training step's boundary does; a call's result is a fold over the
//!   view's members and their inputs, so equal bits mean the same members
//!   and call. A rank reads, in an exchange or its `Done`, the one message
//!   due from each member, as the shell does; a failed exchange starts an
//!   agreement; a decided view's mesh forms with the core's `MeshForming`
//!   (hellos judged by epoch and `view_digest`); a killed or removed rank
//!   may come back as a fresh process, ask a contact, wait to be named in
//!   a `Done`, be admitted and run the calls left. Faults: kills
//!   (restarted or not), freezes, cuts, partitions that heal, slow links.
//!
//! After the last fault the network is quiet and the run goes on until
//! nothing is left to happen. A failing seed replays alone: [`trace`]
//! runs it with every event written out, and [`replay_command`] says how.
//! The soak example runs either mode for as many schedules as asked.

mod agreement;
mod group;
mod plan;
mod report;
mod settings;
mod simulate;
mod soak;
mod violation;
mod world;

#[cfg(test)]
mod tests;

pub use report::{Counts, Report};
pub use settings::{Mode, Settings};
pub use simulate::{run, trace};
pub use soak::{replay_command, schedule_seed, soak, soak_threads, summary, Tally};
pub use violation::Violation;
