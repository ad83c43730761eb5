//! Why a rank's part in an agreement could not be set up: the shell
//! handed the machine a view that cannot be (a setup error, never a
//! peer's doing).

use thiserror::Error;

/// Why a [`Seat`](super::Seat) was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AgreementError {
    /// The group was formed with no ranks, or more than
    /// [`MAX_WORLD`](crate::group::MAX_WORLD).
    #[error("a group of {world} ranks (at most {max})")]
    World {
        /// The size it was formed with.
        world: usize,
        /// The most a group may have.
        max: usize,
    },
    /// The view's members are not strictly increasing ranks below the
    /// group's size, or there are none.
    #[error("view members {members:?} are not strictly increasing ranks below {world}")]
    Members {
        /// The members given.
        members: Vec<usize>,
        /// The size the group was formed with.
        world: usize,
    },
    /// This rank's place is outside the view.
    #[error("place {place} outside a view of {size} ranks")]
    Place {
        /// The place given.
        place: usize,
        /// The view's size.
        size: usize,
    },
}
