//! What one rank brings to an agreement: its place in the view that lost
//! a rank, that view's members, and where its collective stands.

use super::AgreementError;
use crate::group::MAX_WORLD;

/// One rank's part in the agreement on the next view: checked when made,
/// so that the machine and the rule never index outside the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seat {
    place: usize,
    members: Vec<usize>,
    world: usize,
    epoch: u64,
    call: u64,
    has_result: bool,
}

impl Seat {
    /// The rank at `place` of a view whose members are `members` (the
    /// ranks they joined as, strictly increasing, below `world`, the size
    /// the group was formed with), agreeing on view `epoch`, in
    /// collective `call`, holding that call's result or not.
    pub fn new(
        place: usize,
        members: Vec<usize>,
        world: usize,
        epoch: u64,
        call: u64,
        has_result: bool,
    ) -> Result<Self, AgreementError> {
        if !(1..=MAX_WORLD).contains(&world) {
            return Err(AgreementError::World {
                world,
                max: MAX_WORLD,
            });
        }
        let increasing = members.windows(2).all(|w| w[0] < w[1]);
        if members.is_empty() || !increasing || members.last().is_some_and(|&m| m >= world) {
            return Err(AgreementError::Members { members, world });
        }
        if place >= members.len() {
            return Err(AgreementError::Place {
                place,
                size: members.len(),
            });
        }
        Ok(Self {
            place,
            members,
            world,
            epoch,
            call,
            has_result,
        })
    }

    /// This rank's place in the view.
    pub fn place(&self) -> usize {
        self.place
    }

    /// The view's members, by the ranks they joined as: member `p` is
    /// place `p`.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// The view's size.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The rank this one joined as.
    pub fn joined(&self) -> usize {
        self.members[self.place]
    }

    /// The size the group was formed with: the bound on every rank a
    /// view message names.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The view being agreed on.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The collective this rank is in.
    pub fn call(&self) -> u64 {
        self.call
    }

    /// Whether this rank holds that collective's result.
    pub fn has_result(&self) -> bool {
        self.has_result
    }

    /// The place of the rank that joined as `rank`, if it is a member.
    pub fn place_of(&self, rank: usize) -> Option<usize> {
        self.members.binary_search(&rank).ok()
    }
}
