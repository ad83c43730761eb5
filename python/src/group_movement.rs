//! The arguments of the Group's data movement and typed reductions, and
//! the copies of what they received into the caller's buffers.

use crate::buffer::{disjoint, overlaps, InBuf, OutBuf};
use crate::errors::CallError;
use crate::group::PyGroup;
use crate::group_arguments::seconds;
// The methods' parameters are named as torch's (inputs, outputs).
use self::{inputs as movement_inputs, outputs as movement_outputs};
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

#[pymethods]
impl PyGroup {
    // ---- data movement and typed reductions (group/movement.rs). Every
    // buffer is bytes (a uint8 view of a contiguous tensor or array).

    /// Reduces `buf` (the bytes of native-endian values of `dtype`:
    /// "float32", "bfloat16", "float16", "float64", "int8", "int16",
    /// "int32", "int64", "uint8", "bool") across the ranks in place. op:
    /// "sum", "avg" (floats), "product", "min", "max", "band", "bor",
    /// "bxor" (integers and bool). Each value is combined in rank order in
    /// its own type (integers wrap, float64 in float64; the 16- and
    /// 32-bit floats in float32, as allreduce), so every rank ends with the
    /// same bits. An op that does not apply to the dtype is a ValueError.
    #[pyo3(signature = (buf, dtype, op = "sum"))]
    fn allreduce_typed(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dtype: &str,
        op: &str,
    ) -> PyResult<()> {
        let (dtype, op) = typed_args(dtype, op)?;
        let mut buf = OutBuf::<u8>::get(buf, "buf", "uint8")?;
        let bytes = buf.as_mut_slice();
        self.with_state(py, |s, rt| {
            Ok(rt.block_on(s.group.allreduce_typed(bytes, dtype, op))?)
        })
    }

    /// As allreduce_typed, but only rank `root`'s `buf` receives the
    /// result; every other rank's is left as it was.
    #[pyo3(signature = (root, buf, dtype, op = "sum"))]
    fn reduce(
        &self,
        py: Python<'_>,
        root: i64,
        buf: &Bound<'_, PyAny>,
        dtype: &str,
        op: &str,
    ) -> PyResult<()> {
        let root = root_arg(root, self.world)?;
        let (dtype, op) = typed_args(dtype, op)?;
        let mut buf = OutBuf::<u8>::get(buf, "buf", "uint8")?;
        let bytes = buf.as_mut_slice();
        self.with_state(py, |s, rt| {
            Ok(rt.block_on(s.group.reduce(root, bytes, dtype, op))?)
        })
    }

    /// reduce_scatter over bytes of any dtype and op, as allreduce_typed
    /// combines them: `input` holds world parts of output's length.
    #[pyo3(signature = (input, output, dtype, op = "sum"))]
    fn reduce_scatter_typed(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        dtype: &str,
        op: &str,
    ) -> PyResult<()> {
        let (dtype, op) = typed_args(dtype, op)?;
        let input = InBuf::<u8>::get(input, "input", "uint8")?;
        let mut output = OutBuf::<u8>::get(output, "output", "uint8")?;
        disjoint(&input, &output)?;
        let (i, o) = (input.as_slice(), output.as_mut_slice());
        self.with_state(py, |s, rt| {
            Ok(rt.block_on(s.group.reduce_scatter_typed(i, o, dtype, op))?)
        })
    }

    /// Gathers every rank's `input` (bytes) on rank `root`, into
    /// `outputs` there: a list of world writable byte buffers, rank r's
    /// input into outputs[r], each of exactly its length (another length
    /// is an OutOfStepError naming the rank). Other ranks pass None.
    #[pyo3(signature = (root, input, outputs = None))]
    fn gather(
        &self,
        py: Python<'_>,
        root: i64,
        input: &Bound<'_, PyAny>,
        outputs: Option<Vec<Bound<'_, PyAny>>>,
    ) -> PyResult<()> {
        let root = root_arg(root, self.world)?;
        let input = InBuf::<u8>::get(input, "input", "uint8")?;
        let is_root = self.rank == root;
        let mut outs = match (is_root, outputs) {
            (true, Some(o)) => movement_outputs(&o, "outputs", &[&input])?,
            (true, None) => return Err(PyValueError::new_err("gather's root needs outputs")),
            (false, _) => Vec::new(),
        };
        let mut outs: Vec<&mut [u8]> = outs.iter_mut().map(OutBuf::as_mut_slice).collect();
        let input = input.as_slice();
        self.with_state(py, |s, rt| {
            let got = rt.block_on(s.group.gather(root, input))?;
            match is_root {
                true => fill(&got, &mut outs, "gather"),
                false => Ok(()),
            }
        })
    }

    /// Scatters rank `root`'s `inputs` (a list of world byte buffers; None
    /// elsewhere): rank r's `output` becomes inputs[r], which must have
    /// its length exactly.
    #[pyo3(signature = (root, inputs, output))]
    fn scatter(
        &self,
        py: Python<'_>,
        root: i64,
        inputs: Option<Vec<Bound<'_, PyAny>>>,
        output: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let root = root_arg(root, self.world)?;
        let ins = match (self.rank == root, inputs) {
            (true, Some(i)) => movement_inputs(&i, "inputs")?,
            (true, None) => return Err(PyValueError::new_err("scatter's root needs inputs")),
            (false, _) => Vec::new(),
        };
        let reads: Vec<&InBuf<u8>> = ins.iter().collect();
        let mut out = movement_outputs(std::slice::from_ref(output), "output", &reads)?;
        let ins: Vec<&[u8]> = ins.iter().map(InBuf::as_slice).collect();
        let mut outs: Vec<&mut [u8]> = out.iter_mut().map(OutBuf::as_mut_slice).collect();
        self.with_state(py, |s, rt| {
            let got = rt.block_on(s.group.scatter(root, &ins))?;
            fill(&[got], &mut outs, "scatter")
        })
    }

    /// Sends inputs[r] (byte buffers, one per rank, of any lengths) to
    /// each rank r; outputs[r] (writable, one per rank) becomes what rank
    /// r sent this one, which must have its length exactly.
    #[pyo3(signature = (inputs, outputs))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        inputs: Vec<Bound<'_, PyAny>>,
        outputs: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if inputs.len() != self.world || outputs.len() != self.world {
            return Err(PyValueError::new_err(format!(
                "all_to_all takes {} inputs and outputs, got {} and {}",
                self.world,
                inputs.len(),
                outputs.len()
            )));
        }
        let ins = movement_inputs(&inputs, "inputs")?;
        let reads: Vec<&InBuf<u8>> = ins.iter().collect();
        let mut out = movement_outputs(&outputs, "outputs", &reads)?;
        let ins: Vec<&[u8]> = ins.iter().map(InBuf::as_slice).collect();
        let mut outs: Vec<&mut [u8]> = out.iter_mut().map(OutBuf::as_mut_slice).collect();
        self.with_state(py, |s, rt| {
            let got = rt.block_on(s.group.all_to_all(&ins))?;
            fill(&got, &mut outs, "all_to_all")
        })
    }

    /// A barrier that names who did not come: rank 0 waits at most
    /// `timeout` seconds for every other rank, then releases them. A rank
    /// it did not hear from is a CollectiveTimeoutError there whose
    /// `missing` lists them all (the others' wait for rank 0 ends at the
    /// same bound); with on_rank_failure="fail" the group is then
    /// unusable, as after any timeout; with "continue" the silent ranks are
    /// removed, as dead ones are, and the barrier passes among the rest.
    #[pyo3(signature = (timeout))]
    fn monitored_barrier(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let timeout = seconds("timeout", timeout)?;
        self.with_state(py, |s, rt| {
            Ok(rt.block_on(s.group.monitored_barrier(timeout))?)
        })
    }
}
