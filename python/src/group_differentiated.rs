//! The Group's differentiated allreduce (its buckets) and sparse
//! allgather: the collectives that are gradlane's own, beside the exact
//! ones.

use crate::buffer::{bits_as, Bits16, InBuf, OutBuf};
use crate::errors::CallError;
use crate::group::{bytes_of, PyGroup};
use crate::group_arguments::{bucket_layout, loss_recovery, reduce_op};
use crate::group_report::report_dict;
use crate::group_state::Bucket;
use crate::settings::Settings;
use gradlane::{bf16, f16, BucketOptions, ReduceOp, SparseAllgather, SparseRows, ValueFormat};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyTuple};
use std::time::Instant;

#[pymethods]
impl PyGroup {
    /// Registers a gradient bucket for allreduce_differentiated: a flat
    /// buffer holding the tensors `shapes` describes, in order. Each is
    /// (name, shape, kind): kind "conv2d" for a convolution weight of shape
    /// [out, in, kh, kw] (chunked per kernel) or "dense" for any other shape
    /// (chunked in blocks of 256 values); names are unique within the
    /// bucket. `recovery` says what becomes of a lossy chunk that did not
    /// arrive: "zero_fill" (counted as zero; late chunks added into the
    /// next call), "rescale" (each value's sum scaled up to all ranks from
    /// those whose part arrived), "error_feedback" (the rank keeps what
    /// it lost and adds it into its next gradient of this bucket) or
    /// "drop" (counted as zero, late chunks dropped: for a compressor with
    /// error feedback of its own, such as PowerSGD's factors).
    ///
    /// dtype: what the buffer holds, "float32" (default), "bfloat16" or
    /// "float16"; a 16-bit bucket travels as itself.
    ///
    /// settings: a gradlane.Settings (by default the Group's), or its knobs
    /// as keywords here, which change the Group's: recovery (unless given
    /// above), important_format and lossy_format (how the important chunks
    /// and the lossy levels travel: "f32", "bf16", "f16", or "log8", lossy
    /// only, a byte a value within 4.9% and a scale per chunk),
    /// lossy_return (the owner sends back the least important chunks of
    /// the sum, loss_tolerance of each tensor's, in the lossy format),
    /// compression_feedback (keep what rounding took from this rank's
    /// values and add it into its next gradient; None: on for log8),
    /// deadline and deadline_factor. deadline bounds each half of a call,
    /// from its start: None (wait for the lossy parts as the links' timing
    /// says), "adaptive" (deadline_factor times the median of the half's
    /// last 16 calls, after 3 calls without) or a number of seconds. Lossy
    /// chunks of the first half still on their way at the deadline count
    /// as missing, for `recovery` to handle ("error_feedback" delays them a
    /// step instead of losing them). With a deadline the return is bounded
    /// too: the least important chunks of each summed shard
    /// (loss_tolerance of each tensor's) travel lossy, a chunk any rank
    /// missed is zero at every rank and its owner adds it into its next
    /// call, so every rank keeps the same bits. The important chunks are
    /// never cut.
    ///
    /// gather: an allgather bucket for allgather_differentiated: `shapes`
    /// holds one tensor per rank, each rank's own (see there).
    ///
    /// This is a collective: every rank registers the same buckets, with
    /// the same settings, in the same order. Returns the bucket's id (0,
    /// 1, ... in registration order).
    #[pyo3(signature = (
        shapes,
        recovery = None,
        *,
        dtype = "float32",
        settings = None,
        gather = false,
        **knobs,
    ))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn register_bucket(
        &self,
        py: Python<'_>,
        shapes: Vec<(String, Vec<i64>, String)>,
        recovery: Option<&str>,
        dtype: &str,
        settings: Option<PyRef<'_, Settings>>,
        gather: bool,
        knobs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<usize> {
        let recovery = recovery.map(loss_recovery).transpose()?;
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
        let options = BucketOptions {
            gather,
            ..settings
                .as_deref()
                .unwrap_or(&self.settings)
                .replace(knobs)?
                .bucket(dtype, recovery)?
        };
        let layout = bucket_layout(shapes)?;
        let values = usize::try_from(layout.total_values())
            .map_err(|_| PyValueError::new_err("bucket too large for this machine"))?;
        self.with_state(py, |s, rt| {
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
    /// - return_lossy_bytes, return_missed_values, return_budget_ns,
    ///   return_at_deadline: with a deadline, the return's lossy part
    ///   sent, the values of the sum some rank missed (zero at every
    ///   rank, carried into the owners' next call), the return's budget
    ///   and whether it ran to it;
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
        timed_report_dict(py, &report, took)
    }

    /// Gathers every rank's tensor of an allgather bucket (registered with
    /// gather=True, float32) into `buf`, in place: this rank's own tensor
    /// goes to every other rank, its least important chunks (loss_tolerance
    /// of them) lossy and, with the bucket's deadline, cut at it; a chunk
    /// any rank missed is zero at every rank, the sender's copy included,
    /// so every rank ends with the same bits. Returns the statistics
    /// allreduce_differentiated does (the return's keys count here).
    #[pyo3(signature = (bucket, buf))]
    fn allgather_differentiated<'py>(
        &self,
        py: Python<'py>,
        bucket: usize,
        buf: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let id = self.with_state(py, |s, _| {
            s.buckets.get(bucket).map(|b| b.id).ok_or_else(|| {
                CallError::Value(format!(
                    "no bucket {bucket}: {} registered",
                    s.buckets.len()
                ))
            })
        })?;
        let mut out = OutBuf::<f32>::get(buf, "buf", "float32")?;
        let values = out.as_mut_slice();
        let (report, took) = self.with_state(py, |s, rt| {
            let started = Instant::now();
            let report = rt.block_on(s.group.allgather_differentiated(id, values))?;
            Ok((report, started.elapsed()))
        })?;
        timed_report_dict(py, &report, took)
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
}

/// A call's report as the dict Python gets, with `network_ns`: how long
/// the Rust call took.
fn timed_report_dict<'py>(
    py: Python<'py>,
    report: &gradlane::AllreduceReport,
    took: std::time::Duration,
) -> PyResult<Bound<'py, PyDict>> {
    let out = report_dict(py, report)?;
    out.set_item(
        "network_ns",
        u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
    )?;
    Ok(out)
}
