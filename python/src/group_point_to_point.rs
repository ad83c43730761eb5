//! The Group's point-to-point messages (torch's send and recv): beside
//! the collectives, on the current view's mailboxes, never behind the
//! group's lock.

use crate::buffer::{InBuf, OutBuf};
use crate::errors::CallError;
use crate::group::PyGroup;
use crate::runtime;
use gradlane::BufferPool;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::{Arc, OnceLock};

/// Free send buffers kept for reuse, at most, per process: a sent buffer
/// stays with quinn until the peer acknowledged it, and a fresh one for
/// every large send costs a page fault per 4 KiB.
const SEND_POOL_BYTES: usize = 512 << 20;

/// The buffers sends copy into (a send returns before quinn is done with
/// its bytes, and the caller may reuse its tensor then).
fn send_pool() -> &'static Arc<BufferPool> {
    static POOL: OnceLock<Arc<BufferPool>> = OnceLock::new();
    POOL.get_or_init(|| BufferPool::new(SEND_POOL_BYTES))
}

#[pymethods]
impl PyGroup {
    /// Sends the bytes of `buf` (any C-contiguous buffer) to rank `peer`
    /// with `tag` (a non-negative integer): they arrive whole, in order
    /// with this rank's other sends to `peer`, beside the collectives (a
    /// send never waits for one, nor holds one up). Returns once the
    /// bytes are handed to the link, not once `peer` received them. Any
    /// thread may call it while another runs a collective.
    #[pyo3(signature = (peer, tag, buf))]
    fn send(&self, py: Python<'_>, peer: i64, tag: i64, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        let (peer, tag) = (rank_arg("peer", peer)?, tag_arg(tag)?);
        let body = InBuf::<u8>::get(buf, "buf", "uint8")?;
        let body = send_pool().copy_of(body.as_slice());
        let p2p = self.point_to_point_now()?;
        py.detach(|| Ok(runtime()?.block_on(p2p.send(peer, tag, body))?))
            .map_err(|e: CallError| e.into_py(py))
    }

    /// Receives the oldest message with `tag` from rank `source` (None:
    /// from whichever rank has one) into `buf`, which must be writable and
    /// exactly the message's size (else a ValueError, and the message is
    /// lost); returns the rank it came from. Waits at most the group's
    /// collective_timeout (CollectiveTimeoutError); a source that died is
    /// a RankFailedError. Any thread may call it while another runs a
    /// collective.
    #[pyo3(signature = (source, tag, buf))]
    fn recv(
        &self,
        py: Python<'_>,
        source: Option<i64>,
        tag: i64,
        buf: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let source = source.map(|s| rank_arg("source", s)).transpose()?;
        let tag = tag_arg(tag)?;
        let mut out = OutBuf::<u8>::get(buf, "buf", "uint8")?;
        let p2p = self.point_to_point_now()?;
        let (from, body) = py
            .detach(|| Ok(runtime()?.block_on(p2p.recv(source, tag))?))
            .map_err(|e: CallError| e.into_py(py))?;
        let out = out.as_mut_slice();
        if !body.copy_to(out) {
            return Err(PyValueError::new_err(format!(
                "recv: rank {from} sent {} bytes with tag {tag}; buf holds {}",
                body.len(),
                out.len()
            )));
        }
        Ok(from)
    }
}

/// A rank argument (the group checks that it is another member).
fn rank_arg(what: &str, rank: i64) -> PyResult<usize> {
    usize::try_from(rank).map_err(|_| PyValueError::new_err(format!("{what} {rank} is not a rank")))
}

/// A point-to-point tag: a non-negative integer, as torch's.
fn tag_arg(tag: i64) -> PyResult<u64> {
    u64::try_from(tag).map_err(|_| PyValueError::new_err(format!("tag {tag} is negative")))
}
