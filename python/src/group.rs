//! The `Group` class: one rank of a gradlane group, and its collectives on
//! Python buffers.

use crate::buffer::{bits_as, bits_as_ref, disjoint, Bits16, InBuf, OutBuf};
use crate::errors::CallError;
use crate::runtime;
use gradlane::{
    bf16, f16, AllreduceReport, BucketId, BucketOptions, ClassFormats, Config, DscpMarks, Faults,
    Group, GroupConfig, Layout, LossRecovery, LossyCarrier, Packets, ReduceOp, Rendezvous,
    SparseAllgather, SparseRows, TensorSpec, ValueFormat,
};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyTypeError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyTuple};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// The environment variable naming the certificate directory when
/// `cert_dir` is not given.
const CERT_DIR_ENV: &str = "GRADLANE_CERT_DIR";

/// The environment variable that sets a group's sockets when the
/// constructor is not told.
const SOCKETS_ENV: &str = "GRADLANE_SOCKETS";

/// The environment variable that confines a group's ports to a range.
const PORT_RANGE_ENV: &str = "GRADLANE_PORT_RANGE";

/// A group's port range: `asked`, else `GRADLANE_PORT_RANGE`, else none
/// (any free port).
fn group_port_range(asked: Option<&str>) -> Result<Option<gradlane::PortRange>, CallError> {
    let (text, from) = match asked {
        Some(text) => (text.to_string(), "port_range"),
        None => match std::env::var(PORT_RANGE_ENV) {
            Ok(text) if !text.trim().is_empty() => (text, PORT_RANGE_ENV),
            _ => return Ok(None),
        },
    };
    text.parse()
        .map(Some)
        .map_err(|e: gradlane::PortRangeError| CallError::Value(format!("{from}: {e}")))
}

/// A group's sockets: `asked`, else `GRADLANE_SOCKETS`, else the
/// library's default ([`gradlane::default_sockets`]).
fn group_sockets(asked: Option<i64>) -> Result<usize, CallError> {
    let valid = |n: i64, from: &str| match usize::try_from(n) {
        Ok(n) if (1..=gradlane::MAX_SOCKETS).contains(&n) => Ok(n),
        _ => Err(CallError::Value(format!(
            "{from} {n} is not a socket count in 1..={}",
            gradlane::MAX_SOCKETS
        ))),
    };
    if let Some(n) = asked {
        return valid(n, "sockets");
    }
    if let Ok(text) = std::env::var(SOCKETS_ENV) {
        let n = text.trim().parse::<i64>().map_err(|_| {
            CallError::Value(format!("{SOCKETS_ENV}={text:?} is not a socket count"))
        })?;
        return valid(n, SOCKETS_ENV);
    }
    Ok(gradlane::default_sockets())
}

/// One rank of a gradlane group: a QUIC link to every other rank, and the
/// collectives among them.
///
/// Group(rank, world, *, root=None, addresses=None, listen="0.0.0.0:0",
///       cert_dir=None, server_name=None, join_timeout=60.0,
///       loss_tolerance=0.2, injected_loss=0.0, seed=0, idle_timeout=None,
///       dscp=False, lossy_carrier="adaptive", important_format="f32",
///       lossy_format="f32", sockets=None, port_range=None)
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
/// join_timeout (seconds): how long forming the group may take before the
/// ranks that never came are a JoinTimeoutError. loss_tolerance: the share
/// of each tensor's chunks (the least important) that the differentiated
/// allreduce sends lossy, in [0, 1]. injected_loss and seed: drop that
/// share of this rank's outgoing packets, seeded (for tests and demos; it
/// stands for a lossy path between hosts, so packets then stay Ethernet-
/// sized, as on such a path, rather than growing to what loopback carries).
/// idle_timeout (seconds): a link silent this long fails, which is how a
/// rank that died is noticed (default 30 s; None keeps the default).
/// dscp: mark packets by class (the important class DSCP 56, the lossy
/// levels below it), for networks whose queues serve the important class
/// first; Linux only. lossy_carrier: what carries the differentiated
/// allreduce's lossy part, "adaptive" (low-priority streams while the path
/// loses nothing, datagrams after a loss; cheapest in CPU) or "datagrams"
/// (always: lossy data is never retransmitted, not even before the first
/// loss is seen, at more CPU). important_format and lossy_format: how the
/// differentiated allreduce's classes travel, unless a bucket says
/// otherwise (register_bucket): "f32" (exact), "bf16" (half the bytes, 8
/// bits of precision), "f16", or for the lossy levels "log8" (a byte a
/// value, within 4.9%). sockets: UDP sockets this rank spreads its
/// traffic over, each pair of ranks getting a share of them as paths
/// that the exact collectives stripe large messages over (more cores
/// seal and open packets); by default the environment variable
/// GRADLANE_SOCKETS, else one per core of this rank's share of the host
/// (torchrun's LOCAL_WORLD_SIZE ranks share it) where it has at least 4,
/// at most 4, and 1 where it has fewer. Tune it on a fast path where a
/// rank's cores sit idle; leave it on a slow link. port_range: "lo-hi",
/// the UDP ports this rank's sockets take (by default the environment
/// variable GRADLANE_PORT_RANGE, else any free port), so that a firewall
/// can pass exactly them; a given listen port must lie in it, and a range
/// with no free port left is a GroupSetupError naming it.
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
/// (16-bit integers with dtype="bfloat16"). A buffer that a call writes
/// must be writable. A wrong element type is a TypeError; a strided view,
/// a read-only output, a wrong size, an unknown option a ValueError.
///
/// A Group is a context manager: leaving the with block closes it.
#[pyclass(module = "gradlane", name = "Group", frozen)]
pub(crate) struct PyGroup {
    rank: usize,
    world: usize,
    /// `None` once closed. A mutex, not a RefCell: calls from several
    /// Python threads wait for each other (with the GIL released).
    state: Mutex<Option<State>>,
    /// Bytes sent when the group was closed, for `bytes_sent` afterwards.
    bytes_at_close: AtomicU64,
}

/// A joined group and what was registered with it.
struct State {
    group: Group,
    /// The registered buckets, by the index Python knows them by.
    buckets: Vec<Bucket>,
    /// The Group's formats, which a bucket's own complete.
    formats: ClassFormats,
}

/// A registered bucket.
struct Bucket {
    id: BucketId,
    /// The values its flat buffer holds.
    values: usize,
    /// Their type.
    dtype: ValueFormat,
}

/// How a reduction combines the ranks' values, from Python's string.
fn reduce_op(op: &str) -> PyResult<ReduceOp> {
    match op {
        "sum" => Ok(ReduceOp::Sum),
        "mean" => Ok(ReduceOp::Mean),
        "max" => Ok(ReduceOp::Max),
        "min" => Ok(ReduceOp::Min),
        _ => Err(PyValueError::new_err(format!(
            "unknown op {op:?}: expected \"sum\", \"mean\", \"max\" or \"min\""
        ))),
    }
}

/// The element type a buffer holds, from Python's `dtype` ("float32",
/// "bfloat16", "float16") or, when none is given, from the buffer's own
/// format (numpy float32 or float16; bfloat16 must be named, as numpy has
/// none).
fn value_dtype(obj: &Bound<'_, PyAny>, what: &str, dtype: Option<&str>) -> PyResult<ValueFormat> {
    if let Some(d) = dtype {
        return match d {
            "float32" | "f32" => Ok(ValueFormat::F32),
            "bfloat16" | "bf16" => Ok(ValueFormat::Bf16),
            "float16" | "f16" | "half" => Ok(ValueFormat::F16),
            _ => Err(PyValueError::new_err(format!(
                "unknown dtype {d:?}: expected \"float32\", \"bfloat16\" or \"float16\""
            ))),
        };
    }
    let raw = PyUntypedBuffer::get(obj)?;
    let format = raw.format().to_string_lossy().into_owned();
    match (format.trim_start_matches(['@', '=', '<']), raw.item_size()) {
        ("f", 4) => Ok(ValueFormat::F32),
        ("e", 2) => Ok(ValueFormat::F16),
        _ => Err(PyTypeError::new_err(format!(
            "{what} has format {format:?} ({} bytes per item): gradlane reduces float32 and \
             float16 buffers, and bfloat16 ones passed as 16-bit integers with \
             dtype=\"bfloat16\" (tensor.view(torch.int16).numpy())",
            raw.item_size()
        ))),
    }
}

/// A value format from Python's name ("f32", "bf16", "f16", "log8").
fn value_format(what: &str, name: &str) -> PyResult<ValueFormat> {
    name.parse()
        .map_err(|e: gradlane::FormatError| PyValueError::new_err(format!("{what}: {e}")))
}

/// Runs `$body` with `$v` bound to `$obj`'s values as a mutable slice of
/// the element type `$dtype` names (the buffer held until it returns).
macro_rules! with_values_mut {
    ($obj:expr, $what:expr, $dtype:expr, |$v:ident| $body:expr) => {
        match $dtype {
            ValueFormat::F32 => {
                let mut held = OutBuf::<f32>::get($obj, $what, "float32")?;
                let $v = held.as_mut_slice();
                $body
            }
            ValueFormat::Bf16 => {
                let mut held = OutBuf::<Bits16>::get($obj, $what, "bfloat16 (as 16-bit integers)")?;
                let $v = bits_as::<bf16>(held.as_mut_slice());
                $body
            }
            ValueFormat::F16 | ValueFormat::Log8 => {
                let mut held = OutBuf::<Bits16>::get($obj, $what, "float16")?;
                let $v = bits_as::<f16>(held.as_mut_slice());
                $body
            }
        }
    };
}

/// Runs `$body` with `$i` and `$o` bound to an input and an output buffer
/// of the element type `$dtype` names, checked not to share memory.
macro_rules! with_in_out {
    ($input:expr, $output:expr, $dtype:expr, |$i:ident, $o:ident| $body:expr) => {
        match $dtype {
            ValueFormat::F32 => {
                let input = InBuf::<f32>::get($input, "input", "float32")?;
                let mut output = OutBuf::<f32>::get($output, "output", "float32")?;
                disjoint(&input, &output)?;
                let ($i, $o) = (input.as_slice(), output.as_mut_slice());
                $body
            }
            ValueFormat::Bf16 => {
                let input = InBuf::<Bits16>::get($input, "input", "bfloat16 (as 16-bit integers)")?;
                let mut output =
                    OutBuf::<Bits16>::get($output, "output", "bfloat16 (as 16-bit integers)")?;
                disjoint(&input, &output)?;
                let ($i, $o) = (
                    bits_as_ref::<bf16>(input.as_slice()),
                    bits_as::<bf16>(output.as_mut_slice()),
                );
                $body
            }
            ValueFormat::F16 | ValueFormat::Log8 => {
                let input = InBuf::<Bits16>::get($input, "input", "float16")?;
                let mut output = OutBuf::<Bits16>::get($output, "output", "float16")?;
                disjoint(&input, &output)?;
                let ($i, $o) = (
                    bits_as_ref::<f16>(input.as_slice()),
                    bits_as::<f16>(output.as_mut_slice()),
                );
                $body
            }
        }
    };
}

/// A bucket's loss recovery, from Python's string.
fn loss_recovery(recovery: &str) -> PyResult<LossRecovery> {
    match recovery {
        "zero_fill" => Ok(LossRecovery::ZeroFill),
        "rescale" => Ok(LossRecovery::Rescale),
        "error_feedback" => Ok(LossRecovery::ErrorFeedback),
        _ => Err(PyValueError::new_err(format!(
            "unknown recovery {recovery:?}: expected \"zero_fill\", \"rescale\" or \
             \"error_feedback\""
        ))),
    }
}

/// A duration in seconds from Python: finite and positive.
fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    match Duration::try_from_secs_f64(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds, not {s}"
        ))),
    }
}

/// Resolves "host:port" (an IP address or a host name) to its first
/// address. Runs with the GIL released: a name lookup may wait.
fn resolve(what: &str, addr: &str) -> Result<SocketAddr, CallError> {
    if let Ok(a) = addr.parse() {
        return Ok(a);
    }
    let bad = |why: String| CallError::Value(format!("{what} {addr:?}: {why}"));
    addr.to_socket_addrs()
        .map_err(|e| bad(format!("not host:port or not found ({e})")))?
        .next()
        .ok_or_else(|| bad("the name has no address".into()))
}

/// `listen` with an unspecified IP (0.0.0.0, ::) replaced by the address
/// this host reaches `root` from, which is what the other ranks will be
/// told to connect to. gradlane's own replacement asks the QUIC connection
/// for its local IP, which these sockets do not report: without this, a
/// rank would advertise 0.0.0.0. Finding the route sends nothing (a UDP
/// connect only picks it); where it fails, `listen` is left as it was.
fn route_to(root: SocketAddr, listen: SocketAddr) -> SocketAddr {
    if !listen.ip().is_unspecified() {
        return listen;
    }
    let any: SocketAddr = match root {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let local = std::net::UdpSocket::bind(any).and_then(|s| {
        s.connect(root)?;
        s.local_addr()
    });
    match local {
        Ok(local) => SocketAddr::new(local.ip(), listen.port()),
        Err(_) => listen,
    }
}

/// The Rust layout of a bucket from Python's `(name, shape, kind)` tuples.
fn bucket_layout(shapes: Vec<(String, Vec<i64>, String)>) -> PyResult<Layout> {
    let mut tensors = Vec::with_capacity(shapes.len());
    for (name, shape, kind) in shapes {
        let dims: Vec<usize> = shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<_, _>>()
            .map_err(|_| {
                PyValueError::new_err(format!("tensor {name:?}: negative dimension in {shape:?}"))
            })?;
        let spec = match kind.as_str() {
            "conv2d" => match <[usize; 4]>::try_from(dims.as_slice()) {
                Ok(dims) => TensorSpec::conv2d(name, dims),
                Err(_) => {
                    return Err(PyValueError::new_err(format!(
                        "tensor {name:?} is conv2d but has shape {shape:?}, not \
                         [out, in, kh, kw]"
                    )))
                }
            },
            "dense" => TensorSpec::dense(name, dims),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "tensor {name:?}: unknown kind {kind:?}: expected \"conv2d\" or \"dense\""
                )))
            }
        };
        tensors.push(spec);
    }
    Layout::new(tensors).map_err(|e| PyValueError::new_err(format!("bucket: {e}")))
}

/// The statistics of a differentiated allreduce, as Python sees them.
fn report_dict<'py>(py: Python<'py>, report: &AllreduceReport) -> PyResult<Bound<'py, PyDict>> {
    let sent = report.sent.iter().flatten();
    let sent_important: u64 = sent.clone().map(|s| s.important_bytes).sum();
    let lossy_of = |s: &gradlane::SendReport| s.lossy_bytes.iter().sum::<u64>();
    let sent_lossy: u64 = sent.clone().map(lossy_of).sum();
    let on_stream: u64 = sent.filter(|s| s.lossy_on_stream).map(lossy_of).sum();
    let received: Vec<_> = report.received.iter().flatten().collect();
    let important = |f: fn(&gradlane::ClassStats) -> u64| -> u64 {
        received.iter().map(|r| f(&r.classes[0])).sum()
    };
    let lossy = |f: fn(&gradlane::ClassStats) -> u64| -> u64 {
        received.iter().map(|r| f(&r.lossy())).sum()
    };
    let out = PyDict::new(py);
    out.set_item("sent_important_bytes", sent_important)?;
    out.set_item("sent_lossy_bytes", sent_lossy)?;
    out.set_item("sent_lossy_on_stream_bytes", on_stream)?;
    out.set_item("received_important_bytes", important(|c| c.received_bytes))?;
    out.set_item("received_lossy_bytes", lossy(|c| c.received_bytes))?;
    out.set_item(
        "zero_filled_important_bytes",
        important(|c| c.zero_filled_bytes),
    )?;
    out.set_item("zero_filled_lossy_bytes", lossy(|c| c.zero_filled_bytes))?;
    out.set_item("late_important_bytes", important(|c| c.late_merged_bytes))?;
    out.set_item("late_lossy_bytes", lossy(|c| c.late_merged_bytes))?;
    let missing = report.missing.iter().flatten();
    out.set_item("missing_ranges", missing.clone().count())?;
    out.set_item("missing_values", missing.map(|r| r.len()).sum::<usize>())?;
    out.set_item("lost_ranges", report.lost.len())?;
    out.set_item(
        "lost_values",
        report.lost.iter().map(|r| r.len()).sum::<usize>(),
    )?;
    let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    out.set_item("return_bytes", report.return_bytes)?;
    out.set_item("reduce_ns", ns(report.reduce_time))?;
    out.set_item("return_ns", ns(report.return_time))?;
    Ok(out)
}

impl PyGroup {
    /// Runs `f` on the joined group with the GIL released, holding the
    /// group's lock; a closed group is a GroupClosedError.
    fn with_state<T, F>(&self, py: Python<'_>, f: F) -> PyResult<T>
    where
        F: FnOnce(&mut State, &'static Runtime) -> Result<T, CallError> + Send,
        T: Send,
    {
        py.detach(|| {
            let rt = runtime()?;
            let mut guard = self.state.lock().map_err(|_| CallError::Poisoned)?;
            let state = guard.as_mut().ok_or(CallError::Closed)?;
            f(state, rt)
        })
        .map_err(|e| e.into_py(py))
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
        join_timeout = 60.0,
        loss_tolerance = 0.2,
        injected_loss = 0.0,
        seed = 0,
        idle_timeout = None,
        dscp = false,
        lossy_carrier = "adaptive",
        important_format = "f32",
        lossy_format = "f32",
        sockets = None,
        port_range = None,
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
        join_timeout: f64,
        loss_tolerance: f64,
        injected_loss: f64,
        seed: u64,
        idle_timeout: Option<f64>,
        dscp: bool,
        lossy_carrier: &str,
        important_format: &str,
        lossy_format: &str,
        sockets: Option<i64>,
        port_range: Option<&str>,
    ) -> PyResult<Self> {
        let sockets = group_sockets(sockets).map_err(|e| e.into_py(py))?;
        let port_range = group_port_range(port_range).map_err(|e| e.into_py(py))?;
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
        let cert_dir = match cert_dir {
            Some(d) => d,
            None => std::env::var_os(CERT_DIR_ENV)
                .map(PathBuf::from)
                .ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "no cert_dir given and {CERT_DIR_ENV} is not set (gradlane.generate_certs \
                     makes the files)"
                    ))
                })?,
        };
        if !(0.0..=1.0).contains(&injected_loss) {
            return Err(PyValueError::new_err(format!(
                "injected_loss {injected_loss} is not in [0, 1]"
            )));
        }
        let join_timeout = seconds("join_timeout", join_timeout)?;
        let formats = ClassFormats {
            important: value_format("important_format", important_format)?,
            lossy: value_format("lossy_format", lossy_format)?,
        };
        let mut link = Config {
            loss_tolerance,
            formats,
            ..Config::default()
        };
        if injected_loss > 0.0 {
            // Injected loss stands for a lossy path between hosts, whose
            // packets are Ethernet-sized: a lost 64 KB loopback packet
            // would stand for 45 lost there.
            link.packets = Packets::Ethernet;
            link.faults = Some(Faults {
                loss_out: injected_loss,
                seed,
                ..Faults::default()
            });
        }
        if dscp {
            link.dscp = Some(DscpMarks::authors(link.levels));
        }
        link.timing.lossy_carrier = match lossy_carrier {
            "adaptive" => LossyCarrier::Adaptive,
            "datagrams" => LossyCarrier::Datagrams,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown lossy_carrier {other:?}; one of \"adaptive\", \"datagrams\""
                )))
            }
        };
        if let Some(idle) = idle_timeout {
            let idle = seconds("idle_timeout", idle)?;
            link.quic.max_idle_timeout = Some(idle);
            // Keep-alives must come well within the idle timeout, or a
            // quiet but healthy link (ranks between steps) would time out.
            link.quic.keep_alive = link.quic.keep_alive.map(|k| k.min(idle / 4));
        }
        link.validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
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
            let mut config = GroupConfig::new(
                rank,
                world,
                rendezvous,
                cert_dir.join("server.pem"),
                cert_dir.join("server.key"),
                cert_dir.join("ca.pem"),
            );
            config.server_name = server_name;
            config.link = link;
            config.join_timeout = join_timeout;
            config.sockets = sockets;
            config.port_range = port_range;
            Ok(runtime()?.block_on(Group::join(config))?)
        });
        let group = joined.map_err(|e| e.into_py(py))?;
        Ok(Self {
            rank,
            world,
            state: Mutex::new(Some(State {
                group,
                buckets: Vec::new(),
                formats,
            })),
            bytes_at_close: AtomicU64::new(0),
        })
    }

    /// The UDP ports this rank's sockets are bound to (the first is the
    /// one the others reached it at), for a firewall's rules; empty once
    /// closed.
    fn local_ports(&self, py: Python<'_>) -> Vec<u16> {
        py.detach(|| {
            let state = match self.state.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            state.as_ref().map_or_else(Vec::new, |s| {
                s.group
                    .endpoints()
                    .filter_map(|e| e.local_addr().ok().map(|a| a.port()))
                    .collect()
            })
        })
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
        py.detach(|| {
            let guard = match self.state.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            match guard.as_ref() {
                Some(state) => state.group.bytes_sent(),
                None => self.bytes_at_close.load(Ordering::Relaxed),
            }
        })
    }

    /// Whether close() was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| match self.state.lock() {
            Ok(g) => g.is_none(),
            Err(poisoned) => poisoned.into_inner().is_none(),
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

    /// Registers a gradient bucket for allreduce_differentiated: a flat
    /// buffer holding the tensors `shapes` describes, in order. Each is
    /// (name, shape, kind): kind "conv2d" for a convolution weight of shape
    /// [out, in, kh, kw] (chunked per kernel) or "dense" for any other shape
    /// (chunked in blocks of 256 values); names are unique within the
    /// bucket. `recovery` says what becomes of a lossy chunk that did not
    /// arrive: "zero_fill" (counted as zero; late chunks added into the
    /// next call), "rescale" (each value's sum scaled up to all ranks from
    /// those whose part arrived) or "error_feedback" (the rank keeps what
    /// it lost and adds it into its next gradient of this bucket).
    ///
    /// dtype: what the buffer holds, "float32" (default), "bfloat16" or
    /// "float16"; a 16-bit bucket travels as itself.
    /// important_format and lossy_format: how the important chunks and the
    /// lossy levels travel, "f32", "bf16", "f16" (important or lossy) or
    /// "log8" (lossy only: a byte a value within 4.9%, and a scale per
    /// chunk); by default the Group's. lossy_return: the owner sends back
    /// the least important chunks of the sum (loss_tolerance of each
    /// tensor's) in the lossy format.
    /// compression_feedback: keep what rounding took from this rank's
    /// values and add it into its next gradient (None: on for log8).
    ///
    /// This is a collective: every rank registers the same buckets, with
    /// the same settings, in the same order. Returns the bucket's id (0,
    /// 1, ... in registration order).
    #[pyo3(signature = (
        shapes,
        recovery = "zero_fill",
        *,
        dtype = "float32",
        important_format = None,
        lossy_format = None,
        lossy_return = false,
        compression_feedback = None,
    ))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn register_bucket(
        &self,
        py: Python<'_>,
        shapes: Vec<(String, Vec<i64>, String)>,
        recovery: &str,
        dtype: &str,
        important_format: Option<&str>,
        lossy_format: Option<&str>,
        lossy_return: bool,
        compression_feedback: Option<bool>,
    ) -> PyResult<usize> {
        let recovery = loss_recovery(recovery)?;
        let dtype = match dtype {
            "float32" | "f32" => ValueFormat::F32,
            "bfloat16" | "bf16" => ValueFormat::Bf16,
            "float16" | "f16" | "half" => ValueFormat::F16,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "unknown dtype {dtype:?}: expected \"float32\", \"bfloat16\" or \"float16\""
                )))
            }
        };
        let important = important_format
            .map(|f| value_format("important_format", f))
            .transpose()?;
        let lossy = lossy_format
            .map(|f| value_format("lossy_format", f))
            .transpose()?;
        let layout = bucket_layout(shapes)?;
        let values = usize::try_from(layout.total_values())
            .map_err(|_| PyValueError::new_err("bucket too large for this machine"))?;
        self.with_state(py, |s, rt| {
            let formats = match (important, lossy) {
                (None, None) => None,
                (i, l) => {
                    let base = s.formats;
                    let f = ClassFormats {
                        important: i.unwrap_or(base.important),
                        lossy: l.unwrap_or(base.lossy),
                    };
                    f.validate().map_err(|e| CallError::Value(e.to_string()))?;
                    Some(f)
                }
            };
            let options = BucketOptions {
                recovery,
                dtype,
                formats,
                lossy_return,
                compression_feedback,
            };
            let id = rt.block_on(s.group.register_bucket_with(&layout, options))?;
            s.buckets.push(Bucket { id, values, dtype });
            Ok(s.buckets.len() - 1)
        })
    }

    /// Reduces `buf`, the flat buffer of registered bucket `bucket`, across
    /// the ranks in place: each rank's important chunks exact, the rest
    /// (loss_tolerance of them) lossy, what was lost handled by the
    /// bucket's recovery. Every rank ends with the same bits. op: "mean"
    /// or "sum".
    ///
    /// Returns this rank's statistics of the call, all ints:
    /// - sent_important_bytes, sent_lossy_bytes: payload this rank sent to
    ///   the owners of the other shards, reliably and lossy;
    /// - received_important_bytes, received_lossy_bytes: payload that
    ///   reached this rank (the owner of its shard) from the other ranks in
    ///   time, summed over them;
    /// - zero_filled_important_bytes (always 0: important chunks are
    ///   exact), zero_filled_lossy_bytes: payload sent to this rank that
    ///   was not there in time;
    /// - late_important_bytes, late_lossy_bytes: bytes of earlier calls
    ///   that arrived late and were added into this one (zero_fill and
    ///   rescale only);
    /// - missing_ranges, missing_values: chunks (and their float32 values)
    ///   of other ranks' parts of this rank's shard that did not count,
    ///   whole chunks (a chunk counts whole or not at all);
    /// - lost_ranges, lost_values: chunks (values) of this rank's own
    ///   gradient that did not reach their owners in time (kept for the
    ///   next call with error_feedback);
    /// - reduce_ns, return_ns: how long the two halves took at this rank:
    ///   this rank's parts to their owners and its own shard in (waiting
    ///   for ranks that called later included), then the summed shards
    ///   back from every owner;
    /// - network_ns: how long the Rust call took, from handing the buffer
    ///   to the group to having the result in it (what the binding adds is
    ///   the caller's time less this).
    #[pyo3(signature = (bucket, buf, op = "mean"))]
    fn allreduce_differentiated<'py>(
        &self,
        py: Python<'py>,
        bucket: usize,
        buf: &Bound<'py, PyAny>,
        op: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let op = match reduce_op(op)? {
            op @ (ReduceOp::Sum | ReduceOp::Mean) => op,
            _ => {
                return Err(PyValueError::new_err(
                    "allreduce_differentiated sums: op \"mean\" or \"sum\" (max and min are \
                     allreduce's)",
                ))
            }
        };
        let registered = self.with_state(py, |s, _| {
            s.buckets
                .get(bucket)
                .map(|b| (b.id, b.values, b.dtype))
                .ok_or_else(|| {
                    CallError::Value(format!(
                        "no bucket {bucket}: {} registered",
                        s.buckets.len()
                    ))
                })
        })?;
        let (id, values, dtype) = registered;
        let report = with_values_mut!(buf, "buf", dtype, |v| {
            if v.len() != values {
                return Err(PyValueError::new_err(format!(
                    "bucket {bucket} holds {values} values, buf has {}",
                    v.len()
                )));
            }
            self.with_state(py, |s, rt| {
                let started = Instant::now();
                let report = rt.block_on(s.group.allreduce_differentiated(id, v, op))?;
                Ok((report, started.elapsed()))
            })
        })?;
        let (report, took) = report;
        let out = report_dict(py, &report)?;
        out.set_item(
            "network_ns",
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
        )?;
        Ok(out)
    }

    /// Gathers every rank's sparse rows of a height x width matrix: `rows`
    /// a uint64 buffer of row indexes (each below height), `values` a
    /// float32 buffer of len(rows) * width values, row by row. Every rank
    /// passes the same height and width. Returns every rank's rows and
    /// values in rank order, as bytearrays of native-endian uint64 and
    /// float32 (numpy.frombuffer(rows, numpy.uint64) reads them; rows that
    /// several ranks hold appear once per rank). how: "allgatherv" (every
    /// rank's rows to every other at once) or "broadcast_in_order" (one
    /// rank after the other) when the ranks' row counts differ; equal
    /// counts always take one allgather of rows and one of values.
    ///
    /// The inputs are copied once (the Rust call takes owned rows).
    #[pyo3(signature = (rows, values, height, width, how = "allgatherv"))]
    fn sparse_allgather<'py>(
        &self,
        py: Python<'py>,
        rows: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
        height: u64,
        width: usize,
        how: &str,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let how = match how {
            "allgatherv" => SparseAllgather::Allgatherv,
            "broadcast_in_order" => SparseAllgather::BroadcastInOrder,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "unknown how {how:?}: expected \"allgatherv\" or \"broadcast_in_order\""
                )))
            }
        };
        let rows = InBuf::<u64>::get(rows, "rows", "uint64")?;
        let values = InBuf::<f32>::get(values, "values", "float32")?;
        let mine = SparseRows {
            height,
            width,
            rows: rows.as_slice().to_vec(),
            values: values.as_slice().to_vec(),
        };
        // Bad shapes are bad input: refused here, before the call counts
        // as a collective.
        mine.check()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let (all, _report) = self.with_state(py, |s, rt| {
            Ok(rt.block_on(s.group.sparse_allgather(&mine, how))?)
        })?;
        let rows = PyByteArray::new(py, &bytes_of(&all.rows, u64::to_ne_bytes));
        let values = PyByteArray::new(py, &bytes_of(&all.values, f32::to_ne_bytes));
        PyTuple::new(py, [rows, values])
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
    /// A group dropped without close(): its links are dropped inside the
    /// runtime (their tasks live there) without waiting for the peers.
    fn drop(&mut self) {
        let state = match self.state.get_mut() {
            Ok(s) => s.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        let Some(state) = state else { return };
        match runtime() {
            Ok(rt) => {
                let _entered = rt.enter();
                drop(state);
            }
            // A forked child: the runtime's threads are not here, and
            // dropping what belongs to them could wait forever.
            Err(_) => std::mem::forget(state),
        }
    }
}

/// The values as native-endian bytes.
fn bytes_of<T: Copy, const N: usize>(values: &[T], to_bytes: fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to_bytes(v)).collect()
}
