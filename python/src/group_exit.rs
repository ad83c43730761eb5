//! Closing this process's groups as it exits.
//!
//! A rank that returns from its last collective may still hold that
//! collective's last messages to its peers: QUIC's send buffers live in
//! this process, not in the kernel as TCP's do, so they die with it, and
//! a peer still reading them waits until its timeout. The package calls
//! [`close_groups_at_exit`] from `atexit` (a script's end) and from
//! multiprocessing's finalizers (its children end with `os._exit`, which
//! skips `atexit`): every live group closes in order, which flushes what
//! it sent, as `Group.close()` does. A group dropped without `close()`
//! closes in the same order in the background ([`close_in_background`]),
//! and the exit waits for those closes too.

use crate::group_state::{lock_point_to_point, GroupState, PointToPointSlot};
use crate::runtime;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex, TryLockError, Weak};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// The groups of this process not yet dropped, with their point-to-point
/// messages.
static LIVE: Mutex<Vec<(Weak<GroupState>, Weak<PointToPointSlot>)>> = Mutex::new(Vec::new());

/// The closes of dropped groups, still running or not yet waited for.
static CLOSING: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// How long the exit waits for a call that another thread is making on a
/// group (a collective of the torch backend's issue thread, stuck on a
/// peer that is gone) before leaving that group as it is: an exit must
/// not wait out a collective's timeout.
const CALL_WAIT: Duration = Duration::from_secs(1);

/// Keeps `state` and its `point_to_point` for the exit to close.
pub(crate) fn register(state: &Arc<GroupState>, point_to_point: &Arc<PointToPointSlot>) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|(g, _)| g.strong_count() > 0);
    live.push((Arc::downgrade(state), Arc::downgrade(point_to_point)));
}

/// Closes `group`, dropped without `close()`, on the runtime `rt`: its
/// links in order, as `close()` does, without holding up the thread that
/// dropped it.
pub(crate) fn close_in_background(rt: &Runtime, group: gradlane::Group) {
    let handle = rt.spawn(group.close());
    let mut closing = CLOSING.lock().unwrap_or_else(|e| e.into_inner());
    closing.retain(|h| !h.is_finished());
    closing.push(handle);
}

/// Closes every group of this process that is still open, each link in
/// order (its messages flushed, the peer given a few seconds to confirm),
/// all at once, and waits for the closes of dropped groups. Called as the
/// process exits; does nothing in a process forked from the one that made
/// the groups.
#[pyfunction]
pub(crate) fn close_groups_at_exit(py: Python<'_>) {
    py.detach(|| {
        let live = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
        let states: Vec<Arc<GroupState>> = live.iter().filter_map(|(s, _)| s.upgrade()).collect();
        let dropped = std::mem::take(&mut *CLOSING.lock().unwrap_or_else(|e| e.into_inner()));
        if states.is_empty() && dropped.is_empty() {
            return;
        }
        // A forked child: the runtime's threads are not here.
        let Ok(rt) = runtime() else { return };
        // The point-to-point messages hold the links: dropped first, so
        // that each close finds its socket free at once.
        for slot in live.iter().filter_map(|(_, p)| p.upgrade()) {
            lock_point_to_point(&slot).take();
        }
        for group in states.iter().filter_map(|s| take_when_free(s)) {
            close_in_background(rt, group);
        }
        let closing = std::mem::take(&mut *CLOSING.lock().unwrap_or_else(|e| e.into_inner()));
        rt.block_on(async {
            for handle in dropped.into_iter().chain(closing) {
                let _ = handle.await;
            }
        });
    })
}

/// The group out of `state`, once no call holds it (at most
/// [`CALL_WAIT`]); `None` if it is closed or still busy.
fn take_when_free(state: &GroupState) -> Option<gradlane::Group> {
    let started = Instant::now();
    loop {
        match state.try_lock() {
            Ok(mut s) => return s.take().map(|s| s.group),
            Err(TryLockError::Poisoned(p)) => return p.into_inner().take().map(|s| s.group),
            Err(TryLockError::WouldBlock) if started.elapsed() < CALL_WAIT => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(TryLockError::WouldBlock) => {
                tracing::warn!(
                    "a call on a gradlane group still runs as the process exits: \
                     its links are dropped without flushing"
                );
                return None;
            }
        }
    }
}
