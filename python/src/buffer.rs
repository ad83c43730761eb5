//! Python buffers (numpy arrays, `tensor.numpy()` of CPU tensors, `array`,
//! `bytearray`, memoryviews) as Rust slices, without copying them.
//!
//! Every check that Python input can fail happens here, before anything is
//! sent, and becomes the exception a Python user expects: a wrong element
//! type is a `TypeError`; a strided view, a read-only buffer where the call
//! writes, or a misaligned one is a `ValueError`. A multi-dimensional
//! C-contiguous buffer is taken as its flat values.
//!
//! # Safety argument
//!
//! A slice is made from the pointer and item count of a `Py_buffer` that
//! this module requested from the object and holds until the slice is gone
//! (the slice borrows the holder). While a buffer is exported:
//! - the exporter keeps the memory alive and in place (numpy, `bytearray`
//!   and `array` refuse to resize while exported; the `Py_buffer` also
//!   holds a reference to the object, so it cannot be freed, even with the
//!   GIL released);
//! - the memory is `item_count * itemsize` contiguous bytes, because only
//!   C-contiguous buffers are accepted, of the element type asked for
//!   (checked from the format and the item size) and aligned for it
//!   (checked by pyo3's `into_typed`);
//! - a mutable slice is only made from a buffer exported writable;
//! - within one call no two slices overlap where one is mutable: the
//!   caller checks [`overlaps`] for every pair of buffers it takes.
//!
//! What Rust cannot see: another Python thread writing to the same memory
//! while a call runs with the GIL released. That is a data race exactly as
//! with numpy's own GIL-releasing operations, and the package documents it:
//! do not touch a buffer from another thread while a collective uses it.

use pyo3::buffer::{Element, PyBuffer, PyUntypedBuffer};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::ops::Range;
use std::ptr::NonNull;

/// A held buffer export and its checked pointer.
struct Exported<T: Element> {
    /// Keeps the export (and so the memory) alive; released on drop.
    _buffer: PyBuffer<T>,
    /// The first element; dangling (but aligned) for an empty buffer, as
    /// slices require a non-null pointer even for no elements.
    ptr: NonNull<T>,
    /// Elements in the buffer.
    len: usize,
}

impl<T: Element> Exported<T> {
    /// Exports `obj`'s buffer and checks it; `what` names the argument in
    /// errors, `dtype` the element type Python users know it by.
    fn get(obj: &Bound<'_, PyAny>, what: &str, dtype: &str, writable: bool) -> PyResult<Self> {
        // An object without the buffer protocol fails here with Python's
        // own TypeError ("a bytes-like object is required").
        let raw = PyUntypedBuffer::get(obj)?;
        let format = raw.format().to_string_lossy().into_owned();
        if raw.item_size() != std::mem::size_of::<T>() || !T::is_compatible_format(raw.format()) {
            return Err(PyTypeError::new_err(format!(
                "{what} must hold {dtype} values; its buffer has format {format:?} \
                 ({} bytes per item)",
                raw.item_size()
            )));
        }
        if !raw.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{what} is not C-contiguous (a strided or transposed view): pass a \
                 contiguous one (numpy.ascontiguousarray, tensor.contiguous())"
            )));
        }
        if writable && raw.readonly() {
            return Err(PyValueError::new_err(format!(
                "{what} is read-only, but this call writes its result into it"
            )));
        }
        let len = raw.item_count();
        let buffer = raw
            .into_typed::<T>()
            .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
        let ptr = match len {
            0 => NonNull::dangling(),
            _ => NonNull::new(buffer.buf_ptr().cast::<T>()).ok_or_else(|| {
                PyValueError::new_err(format!("{what} has {len} items but no memory"))
            })?,
        };
        Ok(Self {
            _buffer: buffer,
            ptr,
            len,
        })
    }

    /// The addresses the buffer spans.
    fn addresses(&self) -> Range<usize> {
        let start = self.ptr.as_ptr() as usize;
        start..start + self.len * std::mem::size_of::<T>()
    }
}

/// A 16-bit value as its bits: a bfloat16 or IEEE half. Taken from a
/// buffer of numpy float16 (format "e") or of 16-bit integers ("h", "H"),
/// which is how a torch bfloat16 tensor crosses
/// (`tensor.view(torch.int16).numpy()`): numpy has no bfloat16.
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub(crate) struct Bits16(u16);

// SAFETY: a plain u16 (every bit pattern valid, no padding), and only
// buffers of 2-byte items in a native-order format are compatible.
unsafe impl Element for Bits16 {
    fn is_compatible_format(format: &std::ffi::CStr) -> bool {
        let f = format.to_bytes();
        let f = match f.first() {
            Some(b'@' | b'=') => &f[1..],
            Some(b'<') if cfg!(target_endian = "little") => &f[1..],
            _ => f,
        };
        matches!(f, b"e" | b"h" | b"H")
    }
}

/// Slices of [`Bits16`] as the element type gradlane reduces.
pub(crate) fn bits_as<T: bytemuck::Pod>(values: &mut [Bits16]) -> &mut [T] {
    const { assert!(std::mem::size_of::<T>() == 2, "a 16-bit type") };
    // SAFETY: Bits16 is a transparent u16; `T` is Pod of the same size and
    // alignment at most 2 (checked by bytemuck below on the u16 view).
    let raw: &mut [u16] =
        unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u16>(), values.len()) };
    bytemuck::cast_slice_mut(raw)
}

/// Read-only [`bits_as`].
pub(crate) fn bits_as_ref<T: bytemuck::Pod>(values: &[Bits16]) -> &[T] {
    const { assert!(std::mem::size_of::<T>() == 2, "a 16-bit type") };
    // SAFETY: as for `bits_as`.
    let raw: &[u16] =
        unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u16>(), values.len()) };
    bytemuck::cast_slice(raw)
}

/// A buffer a call only reads.
pub(crate) struct InBuf<T: Element>(Exported<T>);

impl<T: Element> InBuf<T> {
    /// Exports `obj`'s buffer for reading; see the module docs for the
    /// checks.
    pub(crate) fn get(obj: &Bound<'_, PyAny>, what: &str, dtype: &str) -> PyResult<Self> {
        Exported::get(obj, what, dtype, false).map(Self)
    }

    /// The values.
    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: see the module docs: the held export keeps `len`
        // contiguous, aligned, initialised `T`s at `ptr` for as long as
        // `self`, which this borrow cannot outlive.
        unsafe { std::slice::from_raw_parts(self.0.ptr.as_ptr(), self.0.len) }
    }

    /// The addresses the buffer spans (for [`overlaps`]).
    pub(crate) fn addresses(&self) -> Range<usize> {
        self.0.addresses()
    }
}

/// A buffer a call writes its result into.
pub(crate) struct OutBuf<T: Element>(Exported<T>);

impl<T: Element> OutBuf<T> {
    /// Exports `obj`'s buffer for writing; a read-only buffer is a
    /// `ValueError`.
    pub(crate) fn get(obj: &Bound<'_, PyAny>, what: &str, dtype: &str) -> PyResult<Self> {
        Exported::get(obj, what, dtype, true).map(Self)
    }

    /// The values, to write.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as for `InBuf::as_slice`, and the export was requested
        // and checked writable; `&mut self` makes this the only slice of
        // this holder, and callers check with `overlaps` that no other
        // buffer of the same call shares its memory.
        unsafe { std::slice::from_raw_parts_mut(self.0.ptr.as_ptr(), self.0.len) }
    }

    /// The addresses the buffer spans (for [`overlaps`]).
    pub(crate) fn addresses(&self) -> Range<usize> {
        self.0.addresses()
    }
}

/// Whether two address ranges share a byte (empty ones never do).
pub(crate) fn overlaps(a: Range<usize>, b: Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Refuses an output that shares memory with an input of the same call: a
/// Rust slice being written may not alias one being read.
pub(crate) fn disjoint<T: Element, U: Element>(
    input: &InBuf<T>,
    output: &OutBuf<U>,
) -> PyResult<()> {
    if overlaps(input.addresses(), output.addresses()) {
        return Err(PyValueError::new_err(
            "input and output share memory: pass separate buffers",
        ));
    }
    Ok(())
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
