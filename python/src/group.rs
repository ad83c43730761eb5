//! The `Group` class: one rank of a gradlane group, and its collectives on
//! Python buffers.

use crate::buffer::{bits_as, bits_as_ref, disjoint, Bits16, InBuf, OutBuf};
use crate::environment::cert_dir as group_cert_dir;
use crate::errors::CallError;
use crate::group_arguments::{reduce_op, resolve, route_to, value_dtype};
use crate::group_state::{lock_point_to_point, GroupState, PointToPointSlot, State};
use crate::runtime;
use crate::settings::Settings;
use gradlane::{bf16, f16, Group, GroupConfig, PointToPoint, Rendezvous, ValueFormat};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::runtime::Runtime;

/// One rank of a gradlane group: a QUIC link to every other rank, and the
/// collectives among them.
///
/// Group(rank, world, *, root=None, addresses=None, listen="0.0.0.0:0",
///       cert_dir=None, server_name=None, rejoin=False, settings=None,
///       **knobs)
///
/// The constructor joins the group (the GIL is released while it waits)
/// and returns once this rank has a link to every other rank. Give exactly
/// one of:
/// - root: "host:port" of rank 0, which listens there; every other rank
///   listens on `listen` (port 0 picks a free one; on 0.0.0.0 it listens
///   on the address it reaches rank 0 from) and learns the others' addresses
///   from rank 0 (torchrun's MASTER_ADDR:MASTER_PORT model);
/// - addresses: every rank's "host:port", indexed by rank; each listens on
///   its own.
///
/// cert_dir holds ca.pem, server.pem and server.key (generate_certs makes
/// them; every rank uses the same files, mutual TLS); by default the
/// directory named by the environment variable GRADLANE_CERT_DIR.
/// server_name is the name peers' certificates must be valid for (by
/// default the job's name when server.pem names a job, as
/// generate_job_certs makes, else the peer's IP address).
///
/// settings: a gradlane.Settings, or its knobs as keywords here (not
/// both): loss_tolerance, the share of each tensor's chunks (the least
/// important) that the differentiated allreduce sends lossy;
/// join_timeout (seconds), how long forming the group may take before the
/// ranks that never came are a JoinTimeoutError; injected_loss,
/// injected_delay and seed, faults on this rank's outgoing packets (for
/// tests and demos; with loss, packets stay Ethernet-sized, as on the
/// lossy path between hosts they stand for); idle_timeout (seconds), how
/// long a silent link lasts, which is how a dead rank is noticed; dscp,
/// marks by class for priority queues (Linux); lossy_carrier, "adaptive"
/// or "datagrams"; important_format and lossy_format, the classes' wire
/// formats unless a bucket says otherwise; sockets, the UDP sockets this
/// rank spreads its traffic over (by default GRADLANE_SOCKETS, else one
/// per core of this rank's share of the host where it has at least 4, at
/// most 4); port_range, "lo-hi", the UDP ports its sockets take (by
/// default GRADLANE_PORT_RANGE, else any free port; a range with no free
/// port left is a GroupSetupError naming it); on_rank_failure, "fail" (a
/// dead rank fails the others' collectives) or "continue" (the rest agree
/// on who is left and go on: members, epoch, contributors);
/// collective_timeout (seconds), how long one collective may wait for the
/// other ranks before a CollectiveTimeoutError naming those it did not
/// hear from (`missing`). Settings' own docs say more of each, and its
/// defaults are the library's. rejoin=True starts a replacement for a
/// rank the others went on without, returning once they admit() it.
///
/// Every rank must call the same collectives in the same order, as in any
/// process group; a rank that calls something else, or dies, makes the
/// others raise a GroupError naming it. Calls from several Python threads
/// on one Group are serialized (a lock around the group): a collective
/// is never interleaved with another on the same group. Do not touch a
/// buffer from another thread while a call uses it.
///
/// Buffers: any object with a C-contiguous float32 buffer (numpy arrays,
/// `tensor.numpy()` of a CPU tensor, array.array("f")), used in place
/// without copying; the reductions also take float16 (numpy) and bfloat16
/// (16-bit integers with dtype="bfloat16"). The typed reductions
/// (allreduce_typed, reduce, reduce_scatter_typed) and the data movement
/// (gather, scatter, all_to_all) take C-contiguous uint8 buffers, the
/// bytes of values of any type. A buffer that a call writes must be
/// writable. A wrong element type is a TypeError; a strided view,
/// a read-only output, a wrong size, an unknown option a ValueError.
///
/// A Group is a context manager: leaving the with block closes it.
#[pyclass(module = "gradlane", name = "Group", frozen)]
pub(crate) struct PyGroup {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// What it was made with; a bucket's settings unless it is given its
    /// own.
    pub(crate) settings: Settings,
    /// `None` once closed. A mutex, not a RefCell: calls from several
    /// Python threads wait for each other (with the GIL released).
    /// Shared with the exit's registry ([`crate::group_exit`]).
    state: Arc<GroupState>,
    /// Bytes sent when the group was closed, for `bytes_sent` afterwards.
    bytes_at_close: AtomicU64,
    /// The current view's point-to-point messages, outside `state`'s lock:
    /// a send or a receive never waits for a collective to end. Shared with
    /// the exit's registry, which drops it before the close: it holds the
    /// links, and with them the socket the close waits for.
    point_to_point: Arc<PointToPointSlot>,
}

impl PyGroup {
    /// The current view's point-to-point messages; GroupClosedError once
    /// closed.
    pub(crate) fn point_to_point_now(&self) -> Result<Arc<PointToPoint>, PyErr> {
        lock_point_to_point(&self.point_to_point)
            .clone()
            .ok_or_else(|| Python::attach(|py| CallError::Closed.into_py(py)))
    }

    /// Runs `f` on the joined group with the GIL released, holding the
    /// group's lock; a closed group is a GroupClosedError.
    pub(crate) fn with_state<T, F>(&self, py: Python<'_>, f: F) -> PyResult<T>
    where
        F: FnOnce(&mut State, &'static Runtime) -> Result<T, CallError> + Send,
        T: Send,
    {
        py.detach(|| {
            let rt = runtime()?;
            let mut guard = self.state.lock().map_err(|_| CallError::Poisoned)?;
            let state = guard.as_mut().ok_or(CallError::Closed)?;
            let out = f(state, rt);
            // A collective may have changed the view, and with it the links.
            let current = state.group.point_to_point();
            *lock_point_to_point(&self.point_to_point) = Some(current);
            out
        })
        .map_err(|e| e.into_py(py))
    }

    /// `f` of the group's state (`None` once closed) with the GIL released:
    /// the getters, which work on a closed group and through a poisoned
    /// lock.
    fn peek<T: Send>(&self, py: Python<'_>, f: impl FnOnce(Option<&State>) -> T + Send) -> T {
        py.detach(|| {
            let guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
            f(guard.as_ref())
        })
    }
}

#[pymethods]
impl PyGroup {
    #[new]
    #[pyo3(signature = (
        rank,
        world,
        *,
        root = None,
        addresses = None,
        listen = "0.0.0.0:0",
        cert_dir = None,
        server_name = None,
        rejoin = false,
        settings = None,
        **knobs,
    ))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        py: Python<'_>,
        rank: i64,
        world: i64,
        root: Option<String>,
        addresses: Option<Vec<String>>,
        listen: &str,
        cert_dir: Option<PathBuf>,
        server_name: Option<String>,
        rejoin: bool,
        settings: Option<PyRef<'_, Settings>>,
        knobs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let settings = match (settings, knobs.filter(|k| !k.is_empty())) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(
                    "give settings= or its knobs as keywords, not both (settings.replace(...) \
                     changes some)",
                ))
            }
            (Some(s), None) => s.clone(),
            (None, knobs) => Settings::new(knobs)?,
        };
        let world = usize::try_from(world)
            .ok()
            .filter(|&w| w > 0)
            .ok_or_else(|| {
                PyValueError::new_err(format!("world must be at least 1, not {world}"))
            })?;
        let rank = usize::try_from(rank)
            .ok()
            .filter(|&r| r < world)
            .ok_or_else(|| PyValueError::new_err(format!("rank {rank} is not in 0..{world}")))?;
        if root.is_some() == addresses.is_some() {
            return Err(PyValueError::new_err(
                "give exactly one of root (rank 0's host:port) and addresses (every rank's)",
            ));
        }
        if let Some(a) = &addresses {
            if a.len() != world {
                return Err(PyValueError::new_err(format!(
                    "{} addresses for a group of {world}",
                    a.len()
                )));
            }
        }
        let cert_dir = group_cert_dir(cert_dir).map_err(|e| e.into_py(py))?;
        let template = settings.group_config(GroupConfig::new(
            rank,
            world,
            Rendezvous::Addresses(Vec::new()),
            cert_dir.join("server.pem"),
            cert_dir.join("server.key"),
            cert_dir.join("ca.pem"),
        ))?;
        let listen = listen.to_owned();
        let joined = py.detach(move || {
            let rendezvous = match (root, addresses) {
                (Some(root), _) => {
                    let root = resolve("root", &root)?;
                    Rendezvous::Root {
                        root,
                        listen: route_to(root, resolve("listen", &listen)?),
                    }
                }
                (None, Some(addresses)) => Rendezvous::Addresses(
                    addresses
                        .iter()
                        .map(|a| resolve("address", a))
                        .collect::<Result<_, _>>()?,
                ),
                (None, None) => return Err(CallError::Value("no rendezvous".into())),
            };
            let config = GroupConfig {
                rendezvous,
                server_name,
                ..template
            };
            match rejoin {
                true => Ok(runtime()?.block_on(Group::rejoin(config))?),
                false => Ok(runtime()?.block_on(Group::join(config))?),
            }
        });
        let group = joined.map_err(|e| e.into_py(py))?;
        let point_to_point = Arc::new(Mutex::new(Some(group.point_to_point())));
        let state = Arc::new(Mutex::new(Some(State {
            group,
            buckets: Vec::new(),
        })));
        crate::group_exit::register(&state, &point_to_point);
        Ok(Self {
            rank,
            world,
            settings,
            state,
            bytes_at_close: AtomicU64::new(0),
            point_to_point,
        })
    }

    /// The UDP ports this rank's sockets are bound to (the first is the
    /// one the others reached it at), for a firewall's rules; empty once
    /// closed.
    fn local_ports(&self, py: Python<'_>) -> Vec<u16> {
        self.peek(py, |state| {
            state.map_or_else(Vec::new, |s| {
                s.group
                    .endpoints()
                    .filter_map(|e| e.local_addr().ok().map(|a| a.port()))
                    .collect()
            })
        })
    }

    /// The settings the group was made with (gradlane.Settings).
    #[getter]
    fn settings(&self) -> Settings {
        self.settings.clone()
    }

    /// This rank, in 0..world.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the group has.
    #[getter]
    fn world(&self) -> usize {
        self.world
    }

    /// Bytes this rank has sent on all its links so far (UDP payload, from
    /// QUIC's counters: data, headers, retransmissions, acknowledgements).
    /// After close(): the count at closing. Waits for a collective that
    /// another thread is running on this group.
    #[getter]
    fn bytes_sent(&self, py: Python<'_>) -> u64 {
        self.peek(py, |state| match state {
            Some(state) => state.group.bytes_sent(),
            None => self.bytes_at_close.load(Ordering::Relaxed),
        })
    }

    /// The ranks of the group's current view (all of them until one dies
    /// with on_rank_failure="continue"); empty once closed. Waits for a
    /// collective that another thread is running on this group.
    #[getter]
    fn members(&self, py: Python<'_>) -> Vec<usize> {
        self.peek(py, |s| {
            s.map_or_else(Vec::new, |s| s.group.members().to_vec())
        })
    }

    /// The current view's number: 0 as joined, one more each time the
    /// members change.
    #[getter]
    fn epoch(&self, py: Python<'_>) -> u64 {
        self.peek(py, |s| s.map_or(0, |s| s.group.epoch()))
    }

    /// How many ranks took part in the last collective (fewer than world
    /// once ranks died with on_rank_failure="continue": a "sum" is theirs).
    #[getter]
    fn contributors(&self, py: Python<'_>) -> usize {
        self.peek(py, |s| s.map_or(self.world, |s| s.group.contributors()))
    }

    /// Whether close() was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        self.peek(py, |s| s.is_none())
    }

    /// Admits the ranks waiting to rejoin (with on_rank_failure="continue"):
    /// every member calls it at the same point, the end of a training step
    /// say. Returns the ranks admitted; empty, without a word on the
    /// network, where none waits. Hand them the state next
    /// (gradlane.torch.elastic does both).
    fn admit(&self, py: Python<'_>) -> PyResult<Vec<usize>> {
        self.with_state(py, |s, rt| Ok(rt.block_on(s.group.admit())?))
    }

    /// The ranks the last admit() brought in (on a rank that rejoined: the
    /// ranks admitted with it, itself included).
    #[getter]
    fn joined(&self, py: Python<'_>) -> Vec<usize> {
        self.peek(py, |s| {
            s.map_or_else(Vec::new, |s| s.group.joined().to_vec())
        })
    }

    /// Where every rank listens ("ip:port"), by the rank it joined as, as
    /// this rank knows it: the addresses= a restarted rank may rejoin
    /// through (any member that answers admits it); empty once closed.
    #[getter]
    fn addresses(&self, py: Python<'_>) -> Vec<String> {
        self.peek(py, |s| {
            s.map_or_else(Vec::new, |s| {
                s.group.addresses().iter().map(|a| a.to_string()).collect()
            })
        })
    }

    /// Returns once every rank has called barrier().
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.with_state(py, |s, rt| Ok(rt.block_on(s.group.barrier())?))
    }

    /// Makes `buf` on every rank equal to `buf` on rank `root`, bit for bit.
    /// Every rank's buf has the same length; it is written on every rank
    /// but root, and must be writable on every rank.
    #[pyo3(signature = (root, buf))]
    fn broadcast(&self, py: Python<'_>, root: i64, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        let root = usize::try_from(root)
            .ok()
            .filter(|&r| r < self.world)
            .ok_or_else(|| {
                PyValueError::new_err(format!("root {root} is not in 0..{}", self.world))
            })?;
        let mut buf = OutBuf::<f32>::get(buf, "buf", "float32")?;
        let values = buf.as_mut_slice();
        self.with_state(
            py,
            |s, rt| Ok(rt.block_on(s.group.broadcast(root, values))?),
        )
    }

    /// Reduces `buf` across the ranks in place: op "sum", "mean" (the sum
    /// divided by world), "max" or "min" (NaN if any rank's value is NaN).
    /// Each value is combined in rank order by one rank, in float32, rounded
    /// once to the buffer's type and sent back exactly, so every rank ends
    /// with the same bits. `buf` holds float32 or float16 values (numpy), or
    /// bfloat16 ones as 16-bit integers with dtype="bfloat16"; a 16-bit
    /// buffer travels as itself, two bytes a value.
    #[pyo3(signature = (buf, op = "sum", dtype = None))]
    fn allreduce(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let op = reduce_op(op)?;
        let dtype = value_dtype(buf, "buf", dtype)?;
        with_values_mut!(buf, "buf", dtype, |values| self
            .with_state(py, |s, rt| Ok(rt.block_on(s.group.allreduce(values, op))?)))
    }

    /// Gathers every rank's `input` into `output` in rank order: `output`
    /// holds world times input's values, rank r's at [r*n, (r+1)*n). The
    /// two must not share memory.
    #[pyo3(signature = (input, output))]
    fn allgather(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let input = InBuf::<f32>::get(input, "input", "float32")?;
        let mut output = OutBuf::<f32>::get(output, "output", "float32")?;
        disjoint(&input, &output)?;
        let (input, output) = (input.as_slice(), output.as_mut_slice());
        self.with_state(py, |s, rt| {
            Ok(rt.block_on(s.group.allgather(input, output))?)
        })
    }

    /// `input` holds world parts of output's length, part r for rank r;
    /// `output` on rank r becomes the reduction ("sum", "mean", "max" or
    /// "min") of every rank's part r, combined in rank order in float32 and
    /// rounded once. Both hold the same type (dtype as for allreduce). The
    /// two must not share memory.
    #[pyo3(signature = (input, output, op = "sum", dtype = None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let op = reduce_op(op)?;
        let dtype = value_dtype(output, "output", dtype)?;
        with_in_out!(input, output, dtype, |i, o| self.with_state(py, |s, rt| {
            Ok(rt.block_on(s.group.reduce_scatter(i, o, op))?)
        }))
    }

    /// Closes every link in order (each waits for its peer to confirm, at
    /// most a few seconds) and releases the socket. Calling it again does
    /// nothing; every other call afterwards raises GroupClosedError.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let taken = match self.state.lock() {
                Ok(mut g) => g.take(),
                Err(poisoned) => poisoned.into_inner().take(),
            };
            lock_point_to_point(&self.point_to_point).take();
            let Some(state) = taken else {
                return Ok(());
            };
            self.bytes_at_close
                .store(state.group.bytes_sent(), Ordering::Relaxed);
            runtime()?.block_on(state.group.close());
            Ok(())
        })
        .map_err(|e: CallError| e.into_py(py))
    }

    /// Returns the group itself.
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the group; exceptions propagate.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let closed = if self.closed(py) { ", closed" } else { "" };
        format!("Group(rank={}, world={}{closed})", self.rank, self.world)
    }
}

impl Drop for PyGroup {
    /// A group dropped without close() closes in the background, as
    /// close() would (its last messages may still be on their way); the
    /// process's exit waits for that.
    fn drop(&mut self) {
        let state = match self.state.lock() {
            Ok(mut s) => s.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        let Some(state) = state else { return };
        match runtime() {
            Ok(rt) => {
                let _entered = rt.enter();
                crate::group_exit::close_in_background(rt, state.group);
            }
            // A forked child: the runtime's threads are not here, and
            // dropping what belongs to them could wait forever.
            Err(_) => std::mem::forget(state),
        }
    }
}

/// The values as native-endian bytes.
pub(crate) fn bytes_of<T: Copy, const N: usize>(
    values: &[T],
    to_bytes: fn(T) -> [u8; N],
) -> Vec<u8> {
    values.iter().flat_map(|&v| to_bytes(v)).collect()
}
