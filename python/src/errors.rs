//! The Python exceptions of the package, and how gradlane's Rust errors
//! become them.
//!
//! Failures of the group (a rank gone, out of step, never joined) are
//! [`GroupError`] or one of its subclasses, with the Rust message and the
//! rank the Rust error names as the attribute `rank`. Bad input from Python
//! is never a `GroupError`: it is a `ValueError` or `TypeError`, raised
//! before anything is sent.

use gradlane::{GenerateCertsError, GroupError as RustGroupError};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use thiserror::Error;

// The first argument is the module Python shows: the classes are re-exported
// as `gradlane.GroupError` etc. (python/gradlane/__init__.py), which is also
// where pickle finds them when an error crosses a process boundary.
create_exception!(
    gradlane,
    GroupError,
    PyException,
    "A group operation failed (the message is gradlane's). `rank` is the \
     rank the failure names, or None."
);
create_exception!(
    gradlane,
    GroupSetupError,
    GroupError,
    "The group could not be set up: certificate files, the socket, or a \
     rank/world/address table that does not make a group."
);
create_exception!(
    gradlane,
    JoinTimeoutError,
    GroupError,
    "Some ranks did not join within join_timeout. `missing` lists them; \
     `rank` is the first."
);
create_exception!(
    gradlane,
    RankFailedError,
    GroupError,
    "The link to `rank` failed: that rank is gone (killed, exited, silent \
     for longer than idle_timeout), closed, or broke the protocol."
);
create_exception!(
    gradlane,
    OutOfStepError,
    GroupError,
    "`rank` sent something other than what this collective expects: it \
     called another collective, or with another size or shape."
);
create_exception!(
    gradlane,
    RemovedError,
    GroupError,
    "This rank is out of the group (on_rank_failure=\"continue\"): the \
     others went on without it (it was silent past idle_timeout, or cut \
     off from them), or too few ranks are left for a quorum. It must not \
     go on with its state: restart it to rejoin."
);
create_exception!(
    gradlane,
    CollectiveTimeoutError,
    GroupError,
    "A collective waited past the group's timeout (collective_timeout; \
     torch's process group timeout), or a monitored barrier past its own, \
     for ranks whose links are alive. \
     `missing` lists the ranks it did not hear from; `rank` is the first. \
     With on_rank_failure=\"fail\" the group is unusable afterwards."
);
create_exception!(
    gradlane,
    GroupClosedError,
    GroupError,
    "The group was closed (close() or the end of a with block)."
);

/// Registers the exception classes in the module, with the class-level
/// defaults of their attributes (so `err.rank` is `None`, never an
/// `AttributeError`, where the Rust error names no rank).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let base = py.get_type::<GroupError>();
    base.setattr("rank", py.None())?;
    base.setattr("missing", py.None())?;
    m.add("GroupError", base)?;
    m.add("GroupSetupError", py.get_type::<GroupSetupError>())?;
    m.add("JoinTimeoutError", py.get_type::<JoinTimeoutError>())?;
    m.add("RankFailedError", py.get_type::<RankFailedError>())?;
    m.add("OutOfStepError", py.get_type::<OutOfStepError>())?;
    m.add("GroupClosedError", py.get_type::<GroupClosedError>())?;
    m.add("RemovedError", py.get_type::<RemovedError>())?;
    m.add(
        "CollectiveTimeoutError",
        py.get_type::<CollectiveTimeoutError>(),
    )?;
    Ok(())
}

/// Why a call into a group failed, before it becomes a Python exception
/// (which needs the interpreter: this is what crosses the released-GIL
/// boundary).
#[derive(Debug, Error)]
pub(crate) enum CallError {
    /// The group reported an error.
    #[error(transparent)]
    Group(#[from] RustGroupError),
    /// The group was closed before this call.
    #[error("the group is closed")]
    Closed,
    /// The process's runtime could not be made, or was made by the parent
    /// of a fork.
    #[error("{0}")]
    Runtime(String),
    /// An earlier call panicked while it held the group: its state is
    /// unknown.
    #[error("an earlier call failed inside the group; close it and join a new one")]
    Poisoned,
    /// An argument that is only checked where it is used (an address that
    /// does not resolve).
    #[error("{0}")]
    Value(String),
}

impl CallError {
    /// The Python exception for this error: the right class, the Rust
    /// message, and `rank` (and `missing`) where the Rust error has them.
    pub(crate) fn into_py(self, py: Python<'_>) -> PyErr {
        let message = self.to_string();
        let (err, rank, missing) = match self {
            CallError::Group(e) => match e {
                // A buffer that does not fit the collective: bad input.
                RustGroupError::Size(_) | RustGroupError::Unsupported(_) => {
                    return PyValueError::new_err(message)
                }
                RustGroupError::Setup(_) | RustGroupError::Endpoint(_) => {
                    (GroupSetupError::new_err(message), None, None)
                }
                RustGroupError::Missing { missing, .. } => (
                    JoinTimeoutError::new_err(message),
                    missing.first().copied(),
                    Some(missing),
                ),
                RustGroupError::Rank { rank, .. } | RustGroupError::Refused { rank, .. } => {
                    (RankFailedError::new_err(message), Some(rank), None)
                }
                RustGroupError::Interrupted { .. } => (GroupError::new_err(message), None, None),
                RustGroupError::Timeout { missing, .. } => (
                    CollectiveTimeoutError::new_err(message),
                    missing.first().copied(),
                    Some(missing),
                ),
                RustGroupError::OutOfStep { rank, .. } => {
                    (OutOfStepError::new_err(message), Some(rank), None)
                }
                RustGroupError::MembersChanging { rank, .. } => {
                    (RankFailedError::new_err(message), Some(rank), None)
                }
                RustGroupError::Removed { rank, .. } | RustGroupError::NoQuorum { rank, .. } => {
                    (RemovedError::new_err(message), Some(rank), None)
                }
            },
            CallError::Closed => (GroupClosedError::new_err(message), None, None),
            CallError::Runtime(_) | CallError::Poisoned => {
                (GroupError::new_err(message), None, None)
            }
            CallError::Value(_) => return PyValueError::new_err(message),
        };
        let value = err.value(py);
        // Setting an attribute on a fresh exception instance cannot fail
        // short of memory exhaustion; if it does, the exception still
        // carries its message and class, which is what matters.
        if let Some(rank) = rank {
            let _ = value.setattr("rank", rank);
        }
        if let Some(missing) = missing {
            let _ = value.setattr("missing", missing);
        }
        err
    }
}

/// The Python exception for a failure of `generate_certs`: bad names are
/// bad input (`ValueError`), files that cannot be written are `OSError`.
pub(crate) fn certs_error(e: GenerateCertsError) -> PyErr {
    let message = e.to_string();
    match e {
        GenerateCertsError::BadName(_)
        | GenerateCertsError::NoNames
        | GenerateCertsError::BadJobName(_) => PyValueError::new_err(message),
        GenerateCertsError::CreateDir { .. }
        | GenerateCertsError::Write { .. }
        | GenerateCertsError::ReadCa { .. } => PyOSError::new_err(message),
        GenerateCertsError::Rcgen(_) => PyRuntimeError::new_err(message),
    }
}
