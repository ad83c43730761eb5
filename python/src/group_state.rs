//! A Group's joined state, behind the locks that its Python object and the
//! exit's registry (`group_exit`) share: what both hold, so that neither
//! reaches into the other.

use gradlane::{BucketId, Group, PointToPoint, ValueFormat};
use std::sync::{Arc, Mutex, MutexGuard};

/// A Group's point-to-point messages, `None` once closed.
pub(crate) type PointToPointSlot = Mutex<Option<Arc<PointToPoint>>>;

/// A Group's joined state, `None` once closed.
pub(crate) type GroupState = Mutex<Option<State>>;

/// A joined group and what was registered with it.
pub(crate) struct State {
    pub(crate) group: Group,
    /// The registered buckets, by the index Python knows them by.
    pub(crate) buckets: Vec<Bucket>,
}

/// A registered bucket.
pub(crate) struct Bucket {
    pub(crate) id: BucketId,
    /// The values its flat buffer holds.
    pub(crate) values: usize,
    /// Their type.
    pub(crate) dtype: ValueFormat,
}

/// The point-to-point slot's guard, through a poisoned lock (a panic
/// elsewhere leaves the slot as valid as it was).
pub(crate) fn lock_point_to_point(
    m: &PointToPointSlot,
) -> MutexGuard<'_, Option<Arc<PointToPoint>>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
