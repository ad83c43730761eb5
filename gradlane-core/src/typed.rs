//! Reductions over every element type a process group reduces, as bytes.
//!
//! The float path of the exact collectives ([`format::widen`], an `f32`
//! accumulator, [`format::narrow`]) suits `f32`, `bf16` and `f16`; an
//! integer or an `f64` widened to `f32` would lose bits. Here each type is
//! combined in its own type: integers wrap as torch's do, `f64` adds in
//! `f64`, `bool` is a logical or/and. The parts are combined in the order
//! given (rank order), so whoever combines the same parts gets the same
//! bits. The 16-bit and 32-bit floats go through `f32` as on the float
//! path, with the same bits for the ops both have.
//!
//! Which op applies to which type follows torch's gloo backend: the
//! bitwise ops only to integers and `bool`; anything else is a
//! [`TypedError::Unsupported`] before any value is looked at.

use crate::format::{self, bf16, f16, Element};
use bytemuck::Pod;
use thiserror::Error;

/// An element type, as the bytes of a buffer hold it (native-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
    /// 64-bit float.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// A byte that is 0 (false) or not (true); results are 0 or 1.
    Bool,
}

impl Dtype {
    /// Every type, for parsing and tests.
    pub const ALL: [Dtype; 10] = [
        Dtype::F32,
        Dtype::Bf16,
        Dtype::F16,
        Dtype::F64,
        Dtype::I8,
        Dtype::I16,
        Dtype::I32,
        Dtype::I64,
        Dtype::U8,
        Dtype::Bool,
    ];

    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            Dtype::I8 | Dtype::U8 | Dtype::Bool => 1,
            Dtype::Bf16 | Dtype::F16 | Dtype::I16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }

    /// Its name as torch and numpy spell it ("float32", "int64", "bool").
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::Bf16 => "bfloat16",
            Dtype::F16 => "float16",
            Dtype::F64 => "float64",
            Dtype::I8 => "int8",
            Dtype::I16 => "int16",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
            Dtype::U8 => "uint8",
            Dtype::Bool => "bool",
        }
    }

    /// The type named `name` (as [`name`](Self::name) spells it).
    pub fn parse(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Integers and `bool`: the types the bitwise ops apply to.
    pub fn is_integral(self) -> bool {
        !matches!(self, Dtype::F32 | Dtype::Bf16 | Dtype::F16 | Dtype::F64)
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the parts are combined (torch's `ReduceOp`s that gloo has, and
/// AVG, which gradlane's float reductions had before).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// The sum (integers wrap; `bool`: or).
    Sum,
    /// The sum divided by the number of parts (floats only).
    Avg,
    /// The product (integers wrap; `bool`: and).
    Product,
    /// The smallest (NaN if any part is NaN, as `torch.minimum`).
    Min,
    /// The largest (NaN if any part is NaN).
    Max,
    /// Bitwise and (integers and `bool`).
    BAnd,
    /// Bitwise or.
    BOr,
    /// Bitwise exclusive or.
    BXor,
}

impl Op {
    /// Every op.
    pub const ALL: [Op; 8] = [
        Op::Sum,
        Op::Avg,
        Op::Product,
        Op::Min,
        Op::Max,
        Op::BAnd,
        Op::BOr,
        Op::BXor,
    ];

    /// Its name ("sum", "avg", "product", "min", "max", "band", "bor",
    /// "bxor").
    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Avg => "avg",
            Op::Product => "product",
            Op::Min => "min",
            Op::Max => "max",
            Op::BAnd => "band",
            Op::BOr => "bor",
            Op::BXor => "bxor",
        }
    }

    /// The op named `name` ("mean" too, for AVG).
    pub fn parse(name: &str) -> Option<Op> {
        match name {
            "mean" => Some(Op::Avg),
            _ => Op::ALL.into_iter().find(|o| o.name() == name),
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a typed reduction cannot run.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TypedError {
    /// The op does not apply to the type (torch's gloo refuses it too).
    #[error("ReduceOp.{} does not apply to {dtype} values: {why}", op.name().to_uppercase())]
    Unsupported {
        /// The op.
        op: Op,
        /// The type.
        dtype: Dtype,
        /// Which types it does apply to.
        why: &'static str,
    },
    /// A part's length is not a whole number of values, or not the
    /// output's.
    #[error("a part of {len} bytes for {want} bytes of {dtype} values")]
    Length {
        /// The part's bytes.
        len: usize,
        /// The bytes expected.
        want: usize,
        /// The type.
        dtype: Dtype,
    },
}

/// Whether `op` applies to `dtype`: the bitwise ops to integers and
/// `bool` only, AVG to floats only (an integer mean would round, and gloo
/// has no AVG at all).
pub fn check(dtype: Dtype, op: Op) -> Result<(), TypedError> {
    let why = match op {
        Op::BAnd | Op::BOr | Op::BXor if !dtype.is_integral() => "integer and bool tensors only",
        Op::Avg if dtype.is_integral() => "floating-point tensors only",
        _ => return Ok(()),
    };
    Err(TypedError::Unsupported { op, dtype, why })
}

/// Combines `parts` (each `out.len()` bytes of `dtype` values) in order
/// into `out`. AVG divides by the number of parts.
pub fn reduce(dtype: Dtype, op: Op, parts: &[&[u8]], out: &mut [u8]) -> Result<(), TypedError> {
    check(dtype, op)?;
    let want = out.len();
    if want % dtype.size() != 0 {
        return Err(TypedError::Length {
            len: want,
            want: want - want % dtype.size(),
            dtype,
        });
    }
    if let Some(p) = parts.iter().find(|p| p.len() != want) {
        return Err(TypedError::Length {
            len: p.len(),
            want,
            dtype,
        });
    }
    if parts.is_empty() {
        return Ok(());
    }
    match dtype {
        Dtype::F32 => floats::<f32>(op, parts, out),
        Dtype::Bf16 => floats::<bf16>(op, parts, out),
        Dtype::F16 => floats::<f16>(op, parts, out),
        Dtype::F64 => exact::<f64>(op, parts, out),
        Dtype::I8 => exact::<i8>(op, parts, out),
        Dtype::I16 => exact::<i16>(op, parts, out),
        Dtype::I32 => exact::<i32>(op, parts, out),
        Dtype::I64 => exact::<i64>(op, parts, out),
        Dtype::U8 => exact::<u8>(op, parts, out),
        Dtype::Bool => {
            fold(op, parts, out, bool_op, |v, _| v);
            // A lone part's bytes are not combined: made 0 or 1 here.
            out.iter_mut().for_each(|b| *b = u8::from(*b != 0));
        }
    }
    Ok(())
}

/// A part's values (copied: a message's bytes need not be aligned).
fn values<T: Pod>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
    v
}

/// The float path: widened to `f32`, combined, rounded once.
fn floats<T: Element>(op: Op, parts: &[&[u8]], out: &mut [u8]) {
    let first: Vec<T> = values(parts[0]);
    let mut acc = vec![0f32; first.len()];
    format::widen(&first, &mut acc);
    for part in &parts[1..] {
        let v: Vec<T> = values(part);
        for (a, v) in acc.iter_mut().zip(v) {
            *a = float_op(op, *a, v.to_f32());
        }
    }
    if op == Op::Avg {
        let n = parts.len() as f32;
        acc.iter_mut().for_each(|v| *v /= n);
    }
    let mut narrowed = vec![T::zeroed(); acc.len()];
    format::narrow(&acc, &mut narrowed);
    out.copy_from_slice(bytemuck::cast_slice(&narrowed));
}

/// `a op v` for a float type: a NaN `v` wins max and min, as torch's does.
fn float_op<T>(op: Op, a: T, v: T) -> T
where
    T: Copy + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
{
    // Only NaN is unordered against itself.
    let nan = v.partial_cmp(&v).is_none();
    match op {
        Op::Sum | Op::Avg => a + v,
        Op::Product => a * v,
        Op::Max if nan || v > a => v,
        Op::Min if nan || v < a => v,
        // Bitwise ops were refused by `check`.
        _ => a,
    }
}

/// The types combined in their own type.
trait Exact: Pod {
    /// `a op v`; `op` passed [`check`] for this type.
    fn combine(op: Op, a: Self, v: Self) -> Self;
    /// The sum divided by `n` (floats; integers never get here).
    fn divide(v: Self, _n: usize) -> Self {
        v
    }
}

macro_rules! integer {
    ($($t:ty),*) => {$(
        impl Exact for $t {
            fn combine(op: Op, a: Self, v: Self) -> Self {
                match op {
                    Op::Sum | Op::Avg => a.wrapping_add(v),
                    Op::Product => a.wrapping_mul(v),
                    Op::Min => a.min(v),
                    Op::Max => a.max(v),
                    Op::BAnd => a & v,
                    Op::BOr => a | v,
                    Op::BXor => a ^ v,
                }
            }
        }
    )*};
}
integer!(i8, i16, i32, i64, u8);

impl Exact for f64 {
    fn combine(op: Op, a: Self, v: Self) -> Self {
        float_op(op, a, v)
    }

    fn divide(v: Self, n: usize) -> Self {
        v / n as f64
    }
}

/// A `bool` byte: any nonzero byte is true; results are 0 or 1 (torch's
/// sum of bools is their or, as C++'s `bool` arithmetic makes it).
fn bool_op(op: Op, a: u8, v: u8) -> u8 {
    let (a, v) = (a != 0, v != 0);
    u8::from(match op {
        Op::Sum | Op::Avg | Op::Max | Op::BOr => a | v,
        Op::Product | Op::Min | Op::BAnd => a & v,
        Op::BXor => a ^ v,
    })
}

fn exact<T: Exact>(op: Op, parts: &[&[u8]], out: &mut [u8]) {
    fold(op, parts, out, T::combine, T::divide);
}

/// Combines the parts in order with `combine`; AVG then divides.
fn fold<T: Pod>(
    op: Op,
    parts: &[&[u8]],
    out: &mut [u8],
    combine: fn(Op, T, T) -> T,
    divide: fn(T, usize) -> T,
) {
    let mut acc: Vec<T> = values(parts[0]);
    for part in &parts[1..] {
        let v: Vec<T> = values(part);
        for (a, v) in acc.iter_mut().zip(v) {
            *a = combine(op, *a, v);
        }
    }
    if op == Op::Avg {
        acc.iter_mut().for_each(|v| *v = divide(*v, parts.len()));
    }
    out.copy_from_slice(bytemuck::cast_slice(&acc));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Pod>(dtype: Dtype, op: Op, parts: &[Vec<T>]) -> Vec<T> {
        let bytes: Vec<&[u8]> = parts.iter().map(|p| bytemuck::cast_slice(p)).collect();
        let mut out = vec![0u8; bytes[0].len()];
        reduce(dtype, op, &bytes, &mut out).unwrap();
        values(&out)
    }

    #[test]
    fn integers_wrap_in_their_own_type() {
        let parts = vec![vec![i64::MAX, 3, -7], vec![1, 1 << 40, 5]];
        assert_eq!(
            run(Dtype::I64, Op::Sum, &parts),
            vec![i64::MIN, 3 + (1 << 40), -2]
        );
        assert_eq!(run(Dtype::I64, Op::Product, &parts)[2], -35);
        let bytes = vec![vec![200u8, 0b1100], vec![100, 0b1010]];
        assert_eq!(run(Dtype::U8, Op::Sum, &bytes), vec![44, 22]);
        assert_eq!(run(Dtype::U8, Op::BXor, &bytes)[1], 0b0110);
        assert_eq!(run(Dtype::U8, Op::Min, &bytes), vec![100, 0b1010]);
        let small = vec![vec![-128i8], vec![-1]];
        assert_eq!(run(Dtype::I8, Op::Sum, &small), vec![127]);
    }

    #[test]
    fn f64_adds_exactly_in_order() {
        // In f32 the small terms would vanish.
        let parts = vec![vec![1e16f64], vec![1.0], vec![1.0]];
        assert_eq!(run(Dtype::F64, Op::Sum, &parts), vec![(1e16 + 1.0) + 1.0]);
        let nan = vec![vec![1.0f64], vec![f64::NAN]];
        assert!(run(Dtype::F64, Op::Max, &nan)[0].is_nan());
        assert_eq!(run(Dtype::F64, Op::Avg, &[vec![1.0], vec![2.0]]), vec![1.5]);
    }

    #[test]
    fn bools_are_logical() {
        let parts = vec![vec![0u8, 1, 1, 0], vec![0, 1, 0, 7]];
        assert_eq!(run(Dtype::Bool, Op::Sum, &parts), vec![0, 1, 1, 1]);
        assert_eq!(run(Dtype::Bool, Op::Product, &parts), vec![0, 1, 0, 0]);
        assert_eq!(run(Dtype::Bool, Op::BXor, &parts), vec![0, 0, 1, 1]);
    }

    #[test]
    fn floats_match_the_f32_path() {
        let parts = vec![vec![bf16::from_f32(1.5)], vec![bf16::from_f32(2.0)]];
        assert_eq!(run(Dtype::Bf16, Op::Product, &parts)[0].to_f32(), 3.0);
        let parts = vec![vec![0.1f32, 3.0], vec![0.2, 4.0]];
        assert_eq!(run(Dtype::F32, Op::Sum, &parts), vec![0.1f32 + 0.2, 7.0]);
    }

    #[test]
    fn bitwise_on_floats_and_integer_means_are_refused() {
        let mut out = [0u8; 4];
        let err = reduce(Dtype::F32, Op::BAnd, &[&[0; 4]], &mut out).unwrap_err();
        assert!(err.to_string().contains("BAND"), "{err}");
        assert!(check(Dtype::I32, Op::Avg).is_err());
        assert!(check(Dtype::Bool, Op::BOr).is_ok());
        assert!(matches!(
            reduce(Dtype::I32, Op::Sum, &[&[0; 3]], &mut [0; 4]),
            Err(TypedError::Length { .. })
        ));
    }
}
