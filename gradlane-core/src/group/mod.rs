//! The messages ranks of a group send each other outside the rounds:
//! who they are while the mesh forms, which further paths they offer, the
//! shapes of a sparse allgather and an owner's summed shard, and the next
//! view of the group when a rank is lost or rejoins.
//!
//! They live here, beside the link's own messages, so that every decoder
//! of a peer's bytes is in the core, bounded before it allocates and
//! fuzzed (`fuzz/fuzz_targets/group_messages.rs` and `reduced_shard.rs`).
//! The shell (`gradlane::Group`) only sends and receives them, and drives
//! the machine of the agreement on a new view ([`agreement`]).
//!
//! - [`MeshHello`] and [`AddressTable`]: the rendezvous; [`judge_hello`]
//!   what a rank forming a mesh does with a hello, and [`MeshForming`]
//!   one rank forming a mesh (whom it dials, whose hello it takes, who
//!   is missing) as a machine.
//! - [`PathOffer`] and [`PathHello`]: the further paths between two ranks;
//!   [`plan_paths`] which ones a rank makes from the offers.
//! - [`SparseShape`]: what each rank gathers in a sparse allgather.
//! - [`ReducedShard`]: an owner's sum in a differentiated allreduce.
//! - [`ViewProposal`], [`ViewDecision`], [`JoinRequest`] and [`Joiners`]:
//!   elastic membership, the next view after a rank is lost and the ranks
//!   that ask to rejoin.
//! - [`agreement`]: the survivors' agreement on that next view, as a
//!   state machine.
//! - [`admission`]: which ranks asking to rejoin a member refuses, and the
//!   view that takes the others in.
//! - [`OnRankFailure`]: the failure policy, every decision it makes.
//! - [`view_keeper`]: a rank's view across collectives under `Continue`
//!   (exchange, `Done`, agreement, new mesh, admission) as a machine. The
//!   `gradlane-sim` crate runs N ranks of both through seeded faults.

pub mod admission;
pub mod agreement;
mod error;
mod failure_policy;
mod mesh;
mod mesh_forming;
mod path_messages;
mod path_plan;
mod reduced_shard;
mod return_report;
mod sparse_shape;
pub mod view_keeper;
mod view_messages;

pub use error::GroupMessageError;
pub use failure_policy::{OnRankFailure, OnTimeout};
pub use mesh::{
    judge_hello, view_digest, AddressTable, HelloVerdict, MeshHello, MeshMark, MeshRefusal,
    MAX_WORLD,
};
pub use mesh_forming::{DialFailed, Dials, MeshForming};
pub use path_messages::{PathHello, PathOffer, MAX_SOCKETS};
pub use path_plan::{paths_per_peer, plan_paths, socket_of, PathPlanError, PlannedPath};
pub use reduced_shard::{encode_reduced_shard, ReducedShard, NO_LOSSY_RETURN};
pub use return_report::{encode_return_report, missed_by_any, ReturnReport};
pub use sparse_shape::SparseShape;
pub use view_messages::{CallFate, JoinRequest, Joiners, ViewDecision, ViewOutcome, ViewProposal};

/// The words of a text message: the first names its kind and version.
fn words<'a>(
    body: &'a [u8],
    message: &'static str,
    kind: &'static str,
    max_bytes: usize,
) -> Result<std::str::Split<'a, char>, GroupMessageError> {
    if body.len() > max_bytes {
        return Err(GroupMessageError::TooLong {
            message,
            len: body.len(),
            max: max_bytes,
        });
    }
    let text = std::str::from_utf8(body).map_err(|_| GroupMessageError::NotText { message })?;
    let mut words = text.split(' ');
    match words.next() {
        Some(k) if k == kind => Ok(words),
        _ => Err(GroupMessageError::WrongKind {
            message,
            expected: kind,
        }),
    }
}

/// The next word as a number or an address.
fn field<T: std::str::FromStr>(
    words: &mut std::str::Split<'_, char>,
    message: &'static str,
    field: &'static str,
) -> Result<T, GroupMessageError> {
    words
        .next()
        .and_then(|w| w.parse().ok())
        .ok_or(GroupMessageError::BadField { message, field })
}

/// Nothing after the last field.
fn end(
    words: &mut std::str::Split<'_, char>,
    message: &'static str,
) -> Result<(), GroupMessageError> {
    match words.next() {
        None => Ok(()),
        Some(_) => Err(GroupMessageError::Trailing { message }),
    }
}
