//! The Group's arguments: Python's words into gradlane's types, each
//! refused with a ValueError that names it (its knobs are `settings`'s,
//! the environment's variables `environment`'s).

use crate::errors::CallError;
use gradlane::{Layout, LossRecovery, ReduceOp, TensorSpec, ValueFormat};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// How a reduction combines the ranks' values, from Python's string.
pub(crate) fn reduce_op(op: &str) -> PyResult<ReduceOp> {
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
pub(crate) fn value_dtype(
    obj: &Bound<'_, PyAny>,
    what: &str,
    dtype: Option<&str>,
) -> PyResult<ValueFormat> {
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

/// A bucket's loss recovery, from Python's string.
pub(crate) fn loss_recovery(recovery: &str) -> PyResult<LossRecovery> {
    match recovery {
        "zero_fill" => Ok(LossRecovery::ZeroFill),
        "rescale" => Ok(LossRecovery::Rescale),
        "error_feedback" => Ok(LossRecovery::ErrorFeedback),
        "drop" => Ok(LossRecovery::Drop),
        _ => Err(PyValueError::new_err(format!(
            "unknown recovery {recovery:?}: expected \"zero_fill\", \"rescale\", \
             \"error_feedback\" or \"drop\""
        ))),
    }
}

/// A duration in seconds from Python: finite and positive.
pub(crate) fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    match Duration::try_from_secs_f64(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds, not {s}"
        ))),
    }
}

/// Resolves "host:port" (an IP address or a host name) to its first
/// address. Runs with the GIL released: a name lookup may wait.
pub(crate) fn resolve(what: &str, addr: &str) -> Result<SocketAddr, CallError> {
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
pub(crate) fn route_to(root: SocketAddr, listen: SocketAddr) -> SocketAddr {
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
pub(crate) fn bucket_layout(shapes: Vec<(String, Vec<i64>, String)>) -> PyResult<Layout> {
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
