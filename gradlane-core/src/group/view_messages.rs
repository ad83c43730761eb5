//! Elastic membership: when a rank is lost, each survivor proposes the
//! next view of the group (whom it cannot reach, where its collective
//! stands) and a coordinator decides it; a restarted rank asks to rejoin,
//! and members announce it until a view takes it in.
//!
//! Text, like the rendezvous: a view changes rarely, and a person reading
//! a capture should see who was dropped. Every list of ranks is strictly
//! increasing, so a message has one spelling, and every bound comes from
//! the group's size before a word is read.

use super::mesh::{check_world, MAX_ADDRESS_BYTES};
use super::{end, field, words, GroupMessageError};
use std::net::SocketAddr;
use std::str::Split;

/// The kind and version word every view message starts with.
const KIND: &str = "gradlane-view/1";

/// Each message's first two words: the kind and which message.
const PROPOSAL: &str = "gradlane-view/1 propose";
const DECISION: &str = "gradlane-view/1 decide";
const JOIN: &str = "gradlane-view/1 join";
const JOINERS: &str = "gradlane-view/1 joiners";

/// The longest text of a `u64`.
const NUMBER_BYTES: usize = 20;

/// The longest text of a rank below [`MAX_WORLD`](super::MAX_WORLD).
const RANK_BYTES: usize = 5;

/// A proposal's longest text before its suspects: the kind, the epoch,
/// the call and whether it holds the result.
const PROPOSAL_HEAD_BYTES: usize = PROPOSAL.len() + 2 * (1 + NUMBER_BYTES) + " false".len();

/// A decision's longest text before its members: the kind, the epoch and
/// the outcome with its call.
const DECISION_HEAD_BYTES: usize =
    DECISION.len() + 1 + NUMBER_BYTES + " complete".len() + 1 + NUMBER_BYTES;

/// A join request's longest text: the kind, two numbers, an address and
/// an epoch.
const MAX_JOIN_BYTES: usize =
    JOIN.len() + 2 * (1 + NUMBER_BYTES) + 1 + MAX_ADDRESS_BYTES + 1 + NUMBER_BYTES;

/// A survivor's proposal for the next view, sent to the coordinator once
/// it has lost a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewProposal {
    /// The view being formed.
    pub epoch: u64,
    /// This rank's collective call in flight.
    pub call: u64,
    /// Whether it already holds that call's whole result.
    pub has_result: bool,
    /// The ranks (their original numbers) it cannot reach, strictly
    /// increasing.
    pub suspects: Vec<usize>,
}

impl ViewProposal {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut text = format!(
            "{PROPOSAL} {} {} {}",
            self.epoch, self.call, self.has_result
        );
        push_ranks(&mut text, &self.suspects);
        text.into_bytes()
    }

    /// The proposal in `body` from a rank of a group of `world` (1 to
    /// [`MAX_WORLD`](super::MAX_WORLD)): at most `world - 1` suspects,
    /// each below `world`, strictly increasing. Its length is checked
    /// against `world` before any word is read.
    pub fn decode(body: &[u8], world: usize) -> Result<Self, GroupMessageError> {
        const MESSAGE: &str = "view proposal";
        check_world(world)?;
        let max = PROPOSAL_HEAD_BYTES + (world - 1) * (1 + RANK_BYTES);
        let mut words = words(body, MESSAGE, KIND, max)?;
        which(&mut words, MESSAGE, PROPOSAL)?;
        let epoch = field(&mut words, MESSAGE, "epoch")?;
        let call = field(&mut words, MESSAGE, "call")?;
        let has_result = field(&mut words, MESSAGE, "has result")?;
        let suspects = ranks(words, MESSAGE, "suspects", world, world - 1)?;
        Ok(Self {
            epoch,
            call,
            has_result,
            suspects,
        })
    }
}

/// What becomes of the collective call the survivors were in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewOutcome {
    /// A member holds the call's whole result: the new view completes it
    /// from there.
    Complete {
        /// The call.
        call: u64,
    },
    /// No member holds the result: the new view runs the call again.
    Rerun {
        /// The call.
        call: u64,
    },
    /// Too few ranks were reached to form a view.
    NoQuorum,
}

/// What a rank does with the collective it is in once a view decided
/// its [`ViewOutcome`] ([`ViewOutcome::for_call`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFate {
    /// Return the result it holds: the view completed this call.
    Return,
    /// Run the call again among the new view's members: the view reruns
    /// it, or completed the one before it.
    Rerun,
    /// The outcome is about another call: this rank is out of step.
    OutOfStep,
}

impl ViewOutcome {
    /// What a rank in collective `call` does with this outcome, `held`
    /// saying whether it holds that call's result.
    pub fn for_call(&self, call: u64, held: bool) -> CallFate {
        match *self {
            ViewOutcome::Complete { call: c } if c == call && held => CallFate::Return,
            ViewOutcome::Complete { call: c } if c + 1 == call => CallFate::Rerun,
            ViewOutcome::Rerun { call: c } if c == call => CallFate::Rerun,
            _ => CallFate::OutOfStep,
        }
    }
}

/// The coordinator's decision on the next view, sent to every rank it
/// reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewDecision {
    /// The view formed (or, for [`ViewOutcome::NoQuorum`], not formed).
    pub epoch: u64,
    /// What becomes of the call in flight.
    pub outcome: ViewOutcome,
    /// The new view's ranks (original numbers), strictly increasing and
    /// never empty; for [`ViewOutcome::NoQuorum`], the ranks the
    /// coordinator reached, which may be none.
    pub members: Vec<usize>,
}

impl ViewDecision {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let outcome = match self.outcome {
            ViewOutcome::Complete { call } => format!("complete {call}"),
            ViewOutcome::Rerun { call } => format!("rerun {call}"),
            ViewOutcome::NoQuorum => "no-quorum".into(),
        };
        let mut text = format!("{DECISION} {} {outcome}", self.epoch);
        push_ranks(&mut text, &self.members);
        text.into_bytes()
    }

    /// The decision in `body` for a group of `world` (1 to
    /// [`MAX_WORLD`](super::MAX_WORLD)): members below `world`, strictly
    /// increasing, and some unless there is no quorum. Its length is
    /// checked against `world` before any word is read.
    pub fn decode(body: &[u8], world: usize) -> Result<Self, GroupMessageError> {
        const MESSAGE: &str = "view decision";
        check_world(world)?;
        let max = DECISION_HEAD_BYTES + world * (1 + RANK_BYTES);
        let mut words = words(body, MESSAGE, KIND, max)?;
        which(&mut words, MESSAGE, DECISION)?;
        let epoch = field(&mut words, MESSAGE, "epoch")?;
        let outcome = match words.next() {
            Some("complete") => ViewOutcome::Complete {
                call: field(&mut words, MESSAGE, "call")?,
            },
            Some("rerun") => ViewOutcome::Rerun {
                call: field(&mut words, MESSAGE, "call")?,
            },
            Some("no-quorum") => ViewOutcome::NoQuorum,
            _ => {
                return Err(GroupMessageError::BadField {
                    message: MESSAGE,
                    field: "outcome",
                })
            }
        };
        let members = ranks(words, MESSAGE, "members", world, world)?;
        if members.is_empty() && outcome != ViewOutcome::NoQuorum {
            return Err(GroupMessageError::BadField {
                message: MESSAGE,
                field: "members",
            });
        }
        Ok(Self {
            epoch,
            outcome,
            members,
        })
    }
}

/// A restarted rank asking to rejoin its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinRequest {
    /// The rank it takes back.
    pub rank: usize,
    /// The size of the group it rejoins.
    pub world: usize,
    /// Where it listens.
    pub listen: SocketAddr,
    /// The last view (epoch) it was a member of; `None` for a fresh
    /// process.
    pub member_of: Option<u64>,
}

impl JoinRequest {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let member_of = self
            .member_of
            .map(|e| e.to_string())
            .unwrap_or_else(|| "-".into());
        format!(
            "{JOIN} {} {} {} {member_of}",
            self.rank, self.world, self.listen
        )
        .into_bytes()
    }

    /// The request in `body`: a rank inside a group of 1 to
    /// [`MAX_WORLD`](super::MAX_WORLD).
    pub fn decode(body: &[u8]) -> Result<Self, GroupMessageError> {
        const MESSAGE: &str = "join request";
        let mut words = words(body, MESSAGE, KIND, MAX_JOIN_BYTES)?;
        which(&mut words, MESSAGE, JOIN)?;
        let rank = field(&mut words, MESSAGE, "rank")?;
        let world = field(&mut words, MESSAGE, "world")?;
        let listen = field(&mut words, MESSAGE, "listening address")?;
        let member_of = match words.next() {
            Some("-") => None,
            Some(e) => Some(e.parse().map_err(|_| GroupMessageError::BadField {
                message: MESSAGE,
                field: "member of",
            })?),
            None => {
                return Err(GroupMessageError::BadField {
                    message: MESSAGE,
                    field: "member of",
                })
            }
        };
        end(&mut words, MESSAGE)?;
        check_world(world)?;
        if rank >= world {
            return Err(GroupMessageError::Rank { rank, world });
        }
        Ok(Self {
            rank,
            world,
            listen,
            member_of,
        })
    }
}

/// The ranks waiting to rejoin that a member announces, with where each
/// listens: ranks strictly increasing. Sent after every collective, so
/// none is the empty message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joiners(pub Vec<(usize, SocketAddr)>);

impl Joiners {
    /// The message's bytes: none when no rank waits.
    pub fn encode(&self) -> Vec<u8> {
        if self.0.is_empty() {
            return Vec::new();
        }
        let mut text = JOINERS.to_string();
        for (rank, listen) in &self.0 {
            text.push_str(&format!(" {rank} {listen}"));
        }
        text.into_bytes()
    }

    /// The joiners in `body` for a group of `world` (1 to
    /// [`MAX_WORLD`](super::MAX_WORLD)): an empty body is none; otherwise
    /// at least one, ranks below `world` and strictly increasing. Its
    /// length is checked against `world` before any word is read.
    pub fn decode(body: &[u8], world: usize) -> Result<Self, GroupMessageError> {
        const MESSAGE: &str = "joiners";
        check_world(world)?;
        if body.is_empty() {
            return Ok(Self(Vec::new()));
        }
        let max = JOINERS.len() + world * (1 + RANK_BYTES + 1 + MAX_ADDRESS_BYTES);
        let mut words = words(body, MESSAGE, KIND, max)?;
        which(&mut words, MESSAGE, JOINERS)?;
        // Ranks in order below `world`: at most `world` entries are kept.
        let mut joiners: Vec<(usize, SocketAddr)> = Vec::new();
        loop {
            let rank = field(&mut words, MESSAGE, "rank")?;
            next_rank(joiners.last().map(|j| j.0), rank, MESSAGE, "ranks", world)?;
            let listen = field(&mut words, MESSAGE, "address")?;
            joiners.push((rank, listen));
            if words.clone().next().is_none() {
                return Ok(Self(joiners));
            }
        }
    }
}

/// The second word, naming which of the view's messages this is
/// (`expected` is the kind, a space and that word).
fn which(
    words: &mut Split<'_, char>,
    message: &'static str,
    expected: &'static str,
) -> Result<(), GroupMessageError> {
    match words.next() {
        Some(w) if Some(w) == expected.strip_prefix(KIND).map(str::trim_start) => Ok(()),
        _ => Err(GroupMessageError::WrongKind { message, expected }),
    }
}

/// The rest of the words as ranks: at most `max` of them, each below
/// `world`, strictly increasing. They are counted before any is read.
fn ranks(
    mut words: Split<'_, char>,
    message: &'static str,
    name: &'static str,
    world: usize,
    max: usize,
) -> Result<Vec<usize>, GroupMessageError> {
    let got = words.clone().count();
    if got > max {
        return Err(GroupMessageError::TooMany {
            message,
            field: name,
            got,
            max,
        });
    }
    let mut list = Vec::with_capacity(got);
    for _ in 0..got {
        let rank = field(&mut words, message, name)?;
        next_rank(list.last().copied(), rank, message, name, world)?;
        list.push(rank);
    }
    Ok(list)
}

/// Whether `rank` may follow `last` in a list: below `world` and above
/// `last`.
fn next_rank(
    last: Option<usize>,
    rank: usize,
    message: &'static str,
    name: &'static str,
    world: usize,
) -> Result<(), GroupMessageError> {
    if rank >= world {
        return Err(GroupMessageError::Rank { rank, world });
    }
    if last.is_some_and(|last| rank <= last) {
        return Err(GroupMessageError::Unordered {
            message,
            field: name,
            rank,
        });
    }
    Ok(())
}

/// Each rank as a word after `text`.
fn push_ranks(text: &mut String, ranks: &[usize]) {
    for rank in ranks {
        text.push(' ');
        text.push_str(&rank.to_string());
    }
}

#[cfg(test)]
mod tests;
