//! One rank's [`ViewKeeper`]: the members, the epoch and the calls, and
//! the steps of a collective or an admission as a machine.

use super::KeeperError;
use crate::group::agreement::{Agreement, Outcome, Seat};
use crate::group::{admission, CallFate, OnRankFailure, ViewDecision, ViewOutcome};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

/// What the driver makes of a failed exchange (the collective's or its
/// `Done`): the shell maps its transport errors to these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The link to the rank at this place of the view failed: it is lost.
    Lost(usize),
    /// The rank at this place began an agreement: its proposal's bytes.
    Alarm(usize, Vec<u8>),
    /// A member closed this rank's link saying it was removed.
    Removed(String),
    /// Not about membership (a bad argument, a malformed message): the
    /// driver's error stands, and the keeper's state does not change.
    Fatal,
}

/// What the driver does next ([`ViewKeeper::poll`]).
#[derive(Debug)]
pub enum Action {
    /// Run the collective's exchange among the view's members; from its
    /// input as it came where `rerun` (an earlier attempt may have
    /// written the buffer), with a fresh deadline.
    Exchange {
        /// An earlier attempt failed and the view changed since.
        rerun: bool,
    },
    /// End the collective: exchange `Done` with every member, each
    /// naming the ranks waiting at it to rejoin.
    Done,
    /// Agree on the next view: drive this machine to its outcome and hand
    /// it in ([`Event::Agreed`]). The collective's deadline pauses.
    Agree(Box<Agreement>),
    /// Tell the ranks being admitted their view (its decision, and with
    /// it who else it admits), then form its mesh ([`Action::FormMesh`]
    /// follows).
    Admit {
        /// The view that takes them in.
        decision: ViewDecision,
        /// The ranks it admits and where each listens, by rank.
        joiners: Vec<(usize, SocketAddr)>,
    },
    /// Form the mesh of the view `decision` decided among its members
    /// (closing the links to the ranks it leaves out), and say which
    /// members did not link up ([`Event::MeshFormed`]).
    FormMesh(ViewDecision),
    /// The collective's result stands: return it.
    Return,
    /// The admission is over: these ranks joined (those of its joiners
    /// still members once a mesh was whole).
    Admitted(Vec<usize>),
    /// The collective (or admission) failed with this error; where it
    /// removed this rank, every later call fails with it too.
    Fail(KeeperError),
}

/// What happened to the driver's last [`Action`].
#[derive(Debug)]
pub enum Event {
    /// The exchange of [`Action::Exchange`] completed: this rank holds
    /// the result.
    Exchanged,
    /// The `Done` exchange completed: these ranks wait to rejoin, as
    /// every member's message named them.
    DoneExchanged(Vec<(usize, SocketAddr)>),
    /// The exchange (or the `Done` after it) failed.
    ExchangeFailed(Failure),
    /// The agreement's outcome.
    Agreed(Outcome),
    /// The mesh formed, but for the members at these places of the new
    /// view (no link to them formed).
    MeshFormed {
        /// Their places in the new view.
        unlinked: Vec<usize>,
    },
    /// The driver could not carry out the action (the agreement had no
    /// link left, the mesh failed): this rank is out of the group.
    Stopped(String),
}

/// Where the call or admission in hand stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stage {
    /// Between calls.
    Idle,
    /// In a collective's exchange.
    Exchange,
    /// In its `Done` exchange, holding the result.
    Done,
    /// Agreeing on the next view.
    Agree,
    /// Forming the mesh of this decision's view.
    Form(ViewDecision),
}

/// What the stage is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// Collective `call`; whether this rank held its result when the
    /// exchange failed.
    Call { call: u64, held: bool },
    /// Admitting ranks between collectives; these joined.
    Admission,
}

/// A deliberate fault in the keeper, for a simulation (`gradlane-sim`)
/// to find; only with the `flaws` feature, never in a build that runs a
/// group.
#[cfg(any(test, feature = "flaws"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeeperFlaw {
    /// Returns a collective's result once its exchange completes, without
    /// the `Done` round: a rank may then return a result the others run
    /// again.
    NoDone,
    /// The agreement's own flaw, in every agreement this keeper starts.
    Agreement(crate::group::agreement::Flaw),
}

/// One rank's view of its group across collectives, under
/// [`OnRankFailure::Continue`]: a machine with no socket and no clock.
/// The shell (`gradlane::Group`) and the simulator (`gradlane-sim`)
/// drive it the same way: begin a collective ([`begin_call`]) or an
/// admission ([`admit`]), then carry out each [`Action`] it polls and
/// hand in the [`Event`] it ends in, until it polls [`Action::Return`],
/// [`Action::Admitted`] or [`Action::Fail`].
///
/// [`begin_call`]: Self::begin_call
/// [`admit`]: Self::admit
#[derive(Debug)]
pub struct ViewKeeper {
    rank: usize,
    world: usize,
    members: Vec<usize>,
    epoch: u64,
    calls: u64,
    contributors: usize,
    /// The view size the last exchange ran in.
    attempt_size: usize,
    removed: Option<(u64, String)>,
    announced: Vec<(usize, SocketAddr)>,
    joiners: Vec<usize>,
    joined: Vec<usize>,
    lost: BTreeSet<usize>,
    alarms: BTreeMap<usize, Vec<u8>>,
    /// Whether the view now agreed on holds the call's result, for the
    /// next agreement if its mesh is not whole.
    has_result: bool,
    stage: Stage,
    purpose: Purpose,
    next: Option<Action>,
    #[cfg(any(test, feature = "flaws"))]
    flaw: Option<KeeperFlaw>,
}

impl ViewKeeper {
    /// Rank `rank` of a group formed with `world` ranks, all of them
    /// members (view 0).
    pub fn new(rank: usize, world: usize) -> Self {
        Self::in_view(rank, world, (0..world).collect(), 0, 0)
    }

    /// A rank that rejoined: admitted to `decision`'s view, which
    /// `joiners` entered with it.
    pub fn admitted(
        rank: usize,
        world: usize,
        decision: &ViewDecision,
        joiners: Vec<usize>,
    ) -> Self {
        let calls = match decision.outcome {
            ViewOutcome::Complete { call } | ViewOutcome::Rerun { call } => call,
            ViewOutcome::NoQuorum => 0,
        };
        let mut keeper =
            Self::in_view(rank, world, decision.members.clone(), decision.epoch, calls);
        keeper.joined = joiners;
        keeper
    }

    fn in_view(rank: usize, world: usize, members: Vec<usize>, epoch: u64, calls: u64) -> Self {
        Self {
            rank,
            world,
            contributors: members.len(),
            attempt_size: members.len(),
            members,
            epoch,
            calls,
            removed: None,
            announced: Vec::new(),
            joiners: Vec::new(),
            joined: Vec::new(),
            lost: BTreeSet::new(),
            alarms: BTreeMap::new(),
            has_result: false,
            stage: Stage::Idle,
            purpose: Purpose::Admission,
            next: None,
            #[cfg(any(test, feature = "flaws"))]
            flaw: None,
        }
    }

    /// The same keeper with a deliberate fault.
    #[cfg(any(test, feature = "flaws"))]
    pub fn with_flaw(mut self, flaw: Option<KeeperFlaw>) -> Self {
        self.flaw = flaw;
        self
    }

    /// The members of the current view, by the ranks they joined as,
    /// increasing: member `i` is the view's place `i`.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// The current view's number.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Collectives begun so far: the one in flight is this number.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// How many ranks took part in the last collective returned.
    pub fn contributors(&self) -> usize {
        self.contributors
    }

    /// The ranks waiting to rejoin, as the last `Done` exchange said.
    pub fn announced(&self) -> &[(usize, SocketAddr)] {
        &self.announced
    }

    /// The ranks the last admission brought in.
    pub fn joined(&self) -> &[usize] {
        &self.joined
    }

    /// Why this rank is out of the group (the view it was in, and why),
    /// if it is.
    pub fn removed(&self) -> Option<(u64, &str)> {
        self.removed.as_ref().map(|(e, w)| (*e, w.as_str()))
    }

    /// This rank's place in the current view.
    pub fn place(&self) -> Option<usize> {
        self.members.binary_search(&self.rank).ok()
    }

    /// Notes a rank (place in the view) whose link failed in the
    /// exchange, besides the failure the exchange ends with: the next
    /// agreement suspects it.
    pub fn note_lost(&mut self, place: usize) {
        self.lost.insert(place);
    }

    /// Notes a proposal that came during the exchange from the rank at
    /// `place`: the next agreement begins with it.
    pub fn note_alarm(&mut self, place: usize, body: Vec<u8>) {
        self.alarms.insert(place, body);
    }

    /// Begins the next collective: an error at once where this rank was
    /// removed; then [`poll`](Self::poll) says [`Action::Exchange`].
    pub fn begin_call(&mut self) -> Result<(), KeeperError> {
        self.removed_error()?;
        debug_assert_eq!(self.stage, Stage::Idle, "a call begun inside another");
        self.calls += 1;
        self.purpose = Purpose::Call {
            call: self.calls,
            held: false,
        };
        self.attempt_size = self.members.len();
        self.stage = Stage::Exchange;
        self.next = Some(Action::Exchange { rerun: false });
        Ok(())
    }

    /// Begins an admission of the ranks the last `Done` named waiting,
    /// between collectives, as every member does at the same point:
    /// `false` (nothing to do, and no message) where `policy` admits none
    /// or none waits outside the view; else [`poll`](Self::poll) says
    /// [`Action::Admit`].
    pub fn admit(&mut self, policy: OnRankFailure) -> Result<bool, KeeperError> {
        self.joined.clear();
        if !policy.admits_rejoiners() || self.announced.is_empty() {
            return Ok(false);
        }
        self.removed_error()?;
        let announced = std::mem::take(&mut self.announced);
        let Some((decision, joiners)) =
            admission::admitting_view(&self.members, self.epoch, self.calls, &announced)
        else {
            return Ok(false);
        };
        self.epoch = decision.epoch;
        self.joiners = joiners.iter().map(|j| j.0).collect();
        self.purpose = Purpose::Admission;
        self.has_result = true;
        self.stage = Stage::Form(decision.clone());
        self.next = Some(Action::Admit { decision, joiners });
        Ok(true)
    }

    /// The next thing the driver does, once per event handed in.
    pub fn poll(&mut self) -> Option<Action> {
        if let Some(Action::Admit { decision, .. }) = &self.next {
            // The mesh forms right after the joiners hear.
            let form = Action::FormMesh(decision.clone());
            return self.next.replace(form);
        }
        self.next.take()
    }

    /// What happened to the last action.
    pub fn handle(&mut self, event: Event) {
        let next = match (std::mem::replace(&mut self.stage, Stage::Idle), event) {
            #[cfg(any(test, feature = "flaws"))]
            (Stage::Exchange, Event::Exchanged) if self.flaw == Some(KeeperFlaw::NoDone) => {
                self.contributors = self.attempt_size;
                Action::Return
            }
            (Stage::Exchange, Event::Exchanged) => {
                self.stage = Stage::Done;
                Action::Done
            }
            (Stage::Done, Event::DoneExchanged(mut announced)) => {
                announced.sort_unstable_by_key(|j| j.0);
                announced.dedup_by_key(|j| j.0);
                self.announced = announced;
                self.contributors = self.attempt_size;
                Action::Return
            }
            (stage @ (Stage::Exchange | Stage::Done), Event::ExchangeFailed(failure)) => {
                let held = stage == Stage::Done;
                self.recover(failure, held)
            }
            (Stage::Agree, Event::Agreed(outcome)) => self.take_outcome(outcome),
            (Stage::Form(decision), Event::MeshFormed { unlinked }) => {
                self.formed(decision, unlinked)
            }
            (_, Event::Stopped(why)) => self.stop(why),
            (stage, event) => {
                // A driver out of step with its keeper: a bug in the driver,
                // never a peer's doing; the rank cannot go on safely.
                self.stop(format!("{event:?} in stage {stage:?}"))
            }
        };
        self.next = Some(next);
    }

    /// After a failed exchange: agree on the next view without the ranks
    /// lost, or fail.
    fn recover(&mut self, failure: Failure, held: bool) -> Action {
        match failure {
            Failure::Lost(place) => {
                self.lost.insert(place);
            }
            Failure::Alarm(place, body) => {
                self.alarms.insert(place, body);
            }
            Failure::Removed(why) => {
                self.removed = Some((self.epoch, why.clone()));
                return Action::Fail(KeeperError::Removed {
                    rank: self.rank,
                    epoch: self.epoch,
                    why,
                });
            }
            Failure::Fatal => {
                self.lost.clear();
                self.alarms.clear();
                return Action::Fail(KeeperError::Fatal);
            }
        }
        if let Purpose::Call { call, .. } = self.purpose {
            self.purpose = Purpose::Call { call, held };
        }
        // Who waits to rejoin is announced again after the next collective
        // of the new view: the last one's may not have reached everyone.
        self.announced.clear();
        self.has_result = held;
        let suspects = std::mem::take(&mut self.lost);
        let alarms = std::mem::take(&mut self.alarms);
        self.agree(suspects, alarms)
    }

    /// The agreement on view `epoch + 1`, as a machine for the driver.
    fn agree(&mut self, suspects: BTreeSet<usize>, alarms: BTreeMap<usize, Vec<u8>>) -> Action {
        let epoch = self.epoch + 1;
        let Some(place) = self.place() else {
            return self.stop(format!("rank {} is not in view {}", self.rank, self.epoch));
        };
        let seat = Seat::new(
            place,
            self.members.clone(),
            self.world,
            epoch,
            self.calls,
            self.has_result,
        );
        match seat {
            Ok(seat) => {
                self.stage = Stage::Agree;
                let agreement = Agreement::new(seat, suspects, alarms);
                #[cfg(any(test, feature = "flaws"))]
                let agreement = agreement.with_flaw(match self.flaw {
                    Some(KeeperFlaw::Agreement(f)) => Some(f),
                    _ => None,
                });
                Action::Agree(Box::new(agreement))
            }
            Err(e) => self.stop(format!("agreeing on view {epoch}: {e}")),
        }
    }

    /// Takes the agreement's outcome: the next view's mesh to form, or
    /// why this rank has none.
    fn take_outcome(&mut self, outcome: Outcome) -> Action {
        self.epoch = outcome.decision().epoch;
        let rank = self.rank;
        let error = match outcome {
            Outcome::Member { decision, .. } => {
                self.stage = Stage::Form(decision.clone());
                return Action::FormMesh(decision);
            }
            Outcome::NoQuorum { decision, .. } => KeeperError::NoQuorum {
                rank,
                reached: decision.members,
                members: self.members.clone(),
            },
            Outcome::Abandoned { decision, from } => KeeperError::Removed {
                rank,
                epoch: decision.epoch,
                why: format!(
                    "it accepted view {:?} but rank {from} showed that not every member \
                     can install it",
                    decision.members
                ),
            },
            Outcome::Removed { decision, from } => KeeperError::Removed {
                rank,
                epoch: decision.epoch,
                why: format!(
                    "rank {from} decided the view without it (members {:?})",
                    decision.members
                ),
            },
        };
        let why = match &error {
            KeeperError::Removed { why, .. } => why.clone(),
            e => e.to_string(),
        };
        self.removed = Some((self.epoch, why));
        Action::Fail(error)
    }

    /// The mesh of `decision`'s view formed but for `unlinked`: the view
    /// is installed; where a member is missing, the next view goes on
    /// without it; else the call's fate (or the admission's end).
    fn formed(&mut self, decision: ViewDecision, unlinked: Vec<usize>) -> Action {
        self.members = decision.members.clone();
        self.epoch = decision.epoch;
        if !unlinked.is_empty() {
            // Still this call: a result held is still held where the view
            // completed it, and to be run again where it did not.
            self.has_result =
                decision.outcome.for_call(self.calls, self.has_result) == CallFate::Return;
            return self.agree(unlinked.into_iter().collect(), BTreeMap::new());
        }
        match self.purpose {
            Purpose::Admission => {
                let joined: Vec<usize> = std::mem::take(&mut self.joiners)
                    .into_iter()
                    .filter(|r| self.members.binary_search(r).is_ok())
                    .collect();
                self.joined = joined.clone();
                Action::Admitted(joined)
            }
            Purpose::Call { call, held } => match decision.outcome.for_call(call, held) {
                CallFate::Return if held => {
                    self.contributors = self.attempt_size;
                    Action::Return
                }
                CallFate::Rerun => {
                    self.attempt_size = self.members.len();
                    self.stage = Stage::Exchange;
                    Action::Exchange { rerun: true }
                }
                _ => Action::Fail(KeeperError::OutOfStep {
                    rank: self.rank,
                    what: format!(
                        "view {} decided {:?} in collective {call}",
                        self.epoch, decision.outcome
                    ),
                }),
            },
        }
    }

    /// Out of the group: whatever stopped the agreement or the new mesh,
    /// this rank must not go on with its old state.
    fn stop(&mut self, why: String) -> Action {
        self.removed = Some((self.epoch, why.clone()));
        Action::Fail(KeeperError::Removed {
            rank: self.rank,
            epoch: self.epoch,
            why,
        })
    }

    fn removed_error(&self) -> Result<(), KeeperError> {
        match &self.removed {
            Some((epoch, why)) => Err(KeeperError::Removed {
                rank: self.rank,
                epoch: *epoch,
                why: why.clone(),
            }),
            None => Ok(()),
        }
    }
}
