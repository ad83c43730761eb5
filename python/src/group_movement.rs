//! The arguments of the Group's data movement and typed reductions, and
//! the copies of what they received into the caller's buffers.

use crate::buffer::{overlaps, InBuf, OutBuf};
use crate::errors::CallError;
use gradlane::{Dtype, GroupError, TypedOp};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A typed reduction's dtype and op from their Python names.
pub(crate) fn typed_args(dtype: &str, op: &str) -> PyResult<(Dtype, TypedOp)> {
    let d = Dtype::parse(dtype).ok_or_else(|| {
        let names: Vec<&str> = Dtype::ALL.iter().map(|d| d.name()).collect();
        PyValueError::new_err(format!("unknown dtype {dtype:?}: one of {names:?}"))
    })?;
    let o = TypedOp::parse(op).ok_or_else(|| {
        let names: Vec<&str> = TypedOp::ALL.iter().map(|o| o.name()).collect();
        PyValueError::new_err(format!("unknown op {op:?}: one of {names:?}"))
    })?;
    Ok((d, o))
}

/// A root in `0..world`.
pub(crate) fn root_arg(root: i64, world: usize) -> PyResult<usize> {
    usize::try_from(root)
        .ok()
        .filter(|&r| r < world)
        .ok_or_else(|| PyValueError::new_err(format!("root {root} is not in 0..{world}")))
}

/// Byte buffers to read, one per rank.
pub(crate) fn inputs(list: &[Bound<'_, PyAny>], what: &str) -> PyResult<Vec<InBuf<u8>>> {
    list.iter()
        .enumerate()
        .map(|(i, b)| InBuf::get(b, &format!("{what}[{i}]"), "uint8"))
        .collect()
}

/// Byte buffers to write, one per rank, none sharing memory with another
/// or with `reads`.
pub(crate) fn outputs(
    list: &[Bound<'_, PyAny>],
    what: &str,
    reads: &[&InBuf<u8>],
) -> PyResult<Vec<OutBuf<u8>>> {
    let outs: Vec<OutBuf<u8>> = list
        .iter()
        .enumerate()
        .map(|(i, b)| OutBuf::get(b, &format!("{what}[{i}]"), "uint8"))
        .collect::<PyResult<_>>()?;
    for (i, o) in outs.iter().enumerate() {
        let clash = reads.iter().any(|r| overlaps(r.addresses(), o.addresses()))
            || outs[..i]
                .iter()
                .any(|p| overlaps(p.addresses(), o.addresses()));
        if clash {
            return Err(PyValueError::new_err(format!(
                "{what}[{i}] shares memory with another buffer of the call: pass separate ones"
            )));
        }
    }
    Ok(outs)
}

/// Copies what came from each rank into its output, which it must fill
/// exactly: another length means the ranks disagree on the sizes.
pub(crate) fn fill<B: AsRef<[u8]>>(
    got: &[B],
    outs: &mut [&mut [u8]],
    what: &str,
) -> Result<(), CallError> {
    if got.len() != outs.len() {
        return Err(CallError::Value(format!(
            "{what}: {} parts came for {} outputs",
            got.len(),
            outs.len()
        )));
    }
    for (rank, (body, out)) in got.iter().zip(outs.iter_mut()).enumerate() {
        let body = body.as_ref();
        if body.len() != out.len() {
            return Err(GroupError::OutOfStep {
                rank,
                what: format!("{what} of {} bytes into {} bytes", body.len(), out.len()),
            }
            .into());
        }
        out.copy_from_slice(body);
    }
    Ok(())
}
