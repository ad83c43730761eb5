//! The sparse log-quantized codec (gradlane-core's `codec`, docs/DESIGN.md
//! §3) for Python: a sparse gradient to a frame and back.
//!
//! A frame is self-describing and checked before anything it claims is
//! allocated; a bad one is a `ValueError` naming what is wrong.

use crate::buffer::{InBuf, OutBuf};
use gradlane::codec::{self, SparseGradient};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

/// Encodes a sparse gradient of length `dim`: `keys` (a uint32 buffer,
/// strictly ascending, each below `dim`) and `values` (float32, finite,
/// one per key) become one frame (bytes) of the codec: keys as
/// bit-packed deltas, each value as a sign and a level `q` with
/// `|v| ~ S / base^(q - 1/2)`, `S` the sum of the magnitudes.
/// `base` (default 1.25) sets the error: within +11.8% / -10.6%.
#[pyfunction]
#[pyo3(signature = (keys, values, dim, base = codec::DEFAULT_BASE))]
pub(crate) fn codec_encode<'py>(
    py: Python<'py>,
    keys: &Bound<'py, PyAny>,
    values: &Bound<'py, PyAny>,
    dim: u64,
    base: f64,
) -> PyResult<Bound<'py, PyBytes>> {
    let keys = InBuf::<u32>::get(keys, "keys", "uint32")?;
    let values = InBuf::<f32>::get(values, "values", "float32")?;
    let grad = SparseGradient::new(dim, keys.as_slice().to_vec(), values.as_slice().to_vec())
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let frame = py
        .detach(|| codec::encode(&grad, base))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(PyBytes::new(py, &frame))
}

/// Decodes a frame: returns (keys, values, dim), the keys as a bytearray
/// of native-endian uint32 and the decoded values as one of float32
/// (`numpy.frombuffer` reads them).
#[pyfunction]
pub(crate) fn codec_decode<'py>(
    py: Python<'py>,
    frame: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let frame = InBuf::<u8>::get(frame, "frame", "uint8")?;
    let grad = codec::decode(frame.as_slice()).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let (dim, keys, values) = grad.into_parts();
    let keys = pyo3::types::PyByteArray::new(py, &crate::group::bytes_of(&keys, u32::to_ne_bytes));
    let values =
        pyo3::types::PyByteArray::new(py, &crate::group::bytes_of(&values, f32::to_ne_bytes));
    (keys, values, dim).into_pyobject(py)
}

/// Adds a frame's decoded values into `acc` (a writable float32 buffer of
/// the frame's dimension) at their keys; returns the frame's header.
#[pyfunction]
pub(crate) fn codec_decode_add<'py>(
    py: Python<'py>,
    frame: &Bound<'py, PyAny>,
    acc: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let frame = InBuf::<u8>::get(frame, "frame", "uint8")?;
    let mut acc = OutBuf::<f32>::get(acc, "acc", "float32")?;
    let header = codec::decode_add_into(frame.as_slice(), acc.as_mut_slice())
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    header_dict(py, &header)
}

/// A frame's header, checked, as a dict: dim, count, sum, base, q_min,
/// q_width, flag_bits and widths (the key-delta widths the flags pick).
#[pyfunction]
pub(crate) fn codec_header<'py>(
    py: Python<'py>,
    frame: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let frame = InBuf::<u8>::get(frame, "frame", "uint8")?;
    let header =
        codec::validate(frame.as_slice()).map_err(|e| PyValueError::new_err(e.to_string()))?;
    header_dict(py, &header)
}

fn header_dict<'py>(py: Python<'py>, h: &codec::FrameHeader) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("dim", h.dim)?;
    out.set_item("count", h.count)?;
    out.set_item("sum", h.sum)?;
    out.set_item("base", h.base)?;
    out.set_item("q_min", h.q_min)?;
    out.set_item("q_width", h.q_width)?;
    out.set_item("flag_bits", h.scheme.flag_bits())?;
    out.set_item("widths", h.scheme.widths().to_vec())?;
    Ok(out)
}
