//! How values travel: the value format of each class of a round
//! (docs/DESIGN.md §2.2, "Value formats").
//!
//! Every tensor is `f32` in memory on both ends; a [`ValueFormat`] says
//! what its values become on the wire:
//!
//! | format | bytes per value | what a value becomes |
//! |---|---|---|
//! | [`F32`](ValueFormat::F32) | 4 | itself |
//! | [`Bf16`](ValueFormat::Bf16) | 2 | the nearest bfloat16 (ties to even) |
//! | [`F16`](ValueFormat::F16) | 2 | the nearest IEEE half (ties to even; overflow to ±inf) |
//! | [`Log8`](ValueFormat::Log8) | 1, plus 4 per chunk | a sign and a level of the reciprocal log quantization (CN113487036A) against the chunk's scale |
//!
//! `Bf16` and `F16` are exact for values already of that type, and carry
//! infinities and NaN as they are (NaN stays NaN). `Log8` is for the lossy
//! levels only: each chunk carries one `f32` scale `S`, the largest
//! magnitude in the chunk, and one byte per value (bit 7 the sign, bits
//! 0-6 the level `q`, 127 for zero). A value `v` gets the smallest `q` with
//! `|v|/S ≥ b^-q` (`b` = [`LOG8_BASE`]); that is the codec's
//! `q = ⌈log_b(S/|v|)⌉` with the chunk's largest magnitude as its scale
//! instead of the sum of magnitudes, so no level is spent above the largest
//! value. It decodes to the geometric middle of its bucket,
//! `S·b^-(q-1/2)`, and to `S` itself for `q = 0`.
//!
//! **Error bound of `Log8`** (property-tested in this module): a value with
//! `|v| ≥ S·b^-126` decodes to `d` of its sign with
//! `b^-1/2 ≤ d/v ≤ b^1/2` (within 1e-6 relative for the `f32` arithmetic):
//! at most +4.88% / -4.65% at `b = 1.1`; the chunk's largest value is
//! exact; smaller values (below `S·6.05e-6`) become 0. A chunk holding a
//! value that is not finite has no such scale: the encoder sends it in the
//! important part's format instead (see [`log8_encode`]).
//!
//! Every table is computed with `f64` operations that IEEE 754 rounds
//! exactly, so every machine decodes a code to the same bits: replicas of
//! a model stay bit-identical across hosts.

use thiserror::Error;

mod log8;

pub use log8::{
    log8_decode, log8_encode, log8_round_trip, log8_scale, log8_scale_ok, log8_value, NonFinite,
};

pub use half::{bf16, f16};

/// The base `b` of `Log8`'s levels: 127 levels span `b^126 ≈ 1.6·10^5`
/// below each chunk's largest value, within ±4.9% of each value.
pub const LOG8_BASE: f64 = 1.1;

/// The `Log8` code of zero (and of values below the smallest level).
pub const LOG8_ZERO: u8 = 0x7F;

/// Levels of `Log8`, `q` in `0..LOG8_LEVELS`.
pub const LOG8_LEVELS: usize = 127;

/// Bytes of a `Log8` chunk section before its codes: the scale.
pub const LOG8_SCALE_BYTES: usize = 4;

/// What the values of one class look like on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ValueFormat {
    /// Four bytes per value, exactly as in memory (the default).
    #[default]
    F32,
    /// bfloat16: the top half of an `f32`, rounded to nearest even. The
    /// range of `f32` with 8 bits of precision.
    Bf16,
    /// IEEE 754 binary16, rounded to nearest even: 11 bits of precision,
    /// but values above 65504 become infinite.
    F16,
    /// One byte per value and one `f32` scale per chunk (see the module
    /// docs); lossy levels only.
    Log8,
}

/// A format name or code that is not one of [`ValueFormat`]'s, or a format
/// where it cannot go.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    /// An unknown name.
    #[error("unknown value format {0:?}: one of \"f32\", \"bf16\", \"f16\", \"log8\"")]
    Name(String),
    /// `Log8` asked for the important part, which travels exactly.
    #[error("the important part cannot be log8 (it travels exact or rounded once): one of f32, bf16, f16")]
    LossyOnly,
}

impl ValueFormat {
    /// Every format, by code.
    pub const ALL: [ValueFormat; 4] = [
        ValueFormat::F32,
        ValueFormat::Bf16,
        ValueFormat::F16,
        ValueFormat::Log8,
    ];

    /// The code a segment header carries.
    pub const fn code(self) -> u8 {
        match self {
            ValueFormat::F32 => 0,
            ValueFormat::Bf16 => 1,
            ValueFormat::F16 => 2,
            ValueFormat::Log8 => 3,
        }
    }

    /// The format of a header's code, if it is one.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(ValueFormat::F32),
            1 => Some(ValueFormat::Bf16),
            2 => Some(ValueFormat::F16),
            3 => Some(ValueFormat::Log8),
            _ => None,
        }
    }

    /// The name users write: "f32", "bf16", "f16", "log8".
    pub const fn name(self) -> &'static str {
        match self {
            ValueFormat::F32 => "f32",
            ValueFormat::Bf16 => "bf16",
            ValueFormat::F16 => "f16",
            ValueFormat::Log8 => "log8",
        }
    }

    /// Bytes per value of an element format; `None` for `Log8`, whose
    /// length depends on the chunks a payload crosses.
    pub const fn element_bytes(self) -> Option<usize> {
        match self {
            ValueFormat::F32 => Some(4),
            ValueFormat::Bf16 | ValueFormat::F16 => Some(2),
            ValueFormat::Log8 => None,
        }
    }

    /// Whether a value may come out of a round trip other than it went in
    /// (for `f32` data): every format but `F32`.
    pub const fn rounds(self) -> bool {
        !matches!(self, ValueFormat::F32)
    }

    /// `v` after a round trip through an element format (`Log8` has no
    /// per-value round trip: see [`log8_encode`]; `v` is returned).
    pub fn round(self, v: f32) -> f32 {
        match self {
            ValueFormat::F32 | ValueFormat::Log8 => v,
            ValueFormat::Bf16 => f32_from_bf16(bf16_from_f32(v)),
            ValueFormat::F16 => f32_from_f16(f16_from_f32(v)),
        }
    }
}

impl std::fmt::Display for ValueFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ValueFormat {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self, FormatError> {
        Self::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| FormatError::Name(s.to_owned()))
    }
}

/// The formats of a round's classes: one for the important part, one for
/// every lossy level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClassFormats {
    /// The important chunks' format: `F32` (default), `Bf16` or `F16`.
    pub important: ValueFormat,
    /// The lossy levels' format: any (default `F32`).
    pub lossy: ValueFormat,
}

impl ClassFormats {
    /// Everything `f32`: today's bytes, bit for bit.
    pub const F32: ClassFormats = ClassFormats {
        important: ValueFormat::F32,
        lossy: ValueFormat::F32,
    };

    /// Both classes in `format` (an element format).
    pub const fn all(format: ValueFormat) -> Self {
        ClassFormats {
            important: format,
            lossy: format,
        }
    }

    /// The format of class `class` (0 important, else lossy).
    pub const fn of(&self, class: u8) -> ValueFormat {
        match class {
            0 => self.important,
            _ => self.lossy,
        }
    }

    /// Refuses `Log8` for the important part.
    pub fn validate(&self) -> Result<(), FormatError> {
        match self.important {
            ValueFormat::Log8 => Err(FormatError::LossyOnly),
            _ => Ok(()),
        }
    }
}

/// A type of value a collective reduces in place: `f32`, [`bf16`] or
/// [`struct@f16`]. Sums are taken in `f32` and rounded once to the type.
pub trait Element: bytemuck::Pod + Send + Sync + std::fmt::Debug + sealed::Sealed {
    /// The format the type travels in.
    const FORMAT: ValueFormat;
    /// The value as an `f32` (exact).
    fn to_f32(self) -> f32;
    /// The value of the type nearest `v` (ties to even).
    fn from_f32(v: f32) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::bf16 {}
    impl Sealed for super::f16 {}
}

impl Element for f32 {
    const FORMAT: ValueFormat = ValueFormat::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Element for bf16 {
    const FORMAT: ValueFormat = ValueFormat::Bf16;
    fn to_f32(self) -> f32 {
        f32_from_bf16(self.to_bits())
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_bits(bf16_from_f32(v))
    }
}

impl Element for f16 {
    const FORMAT: ValueFormat = ValueFormat::F16;
    fn to_f32(self) -> f32 {
        f32_from_f16(self.to_bits())
    }
    fn from_f32(v: f32) -> Self {
        f16::from_bits(f16_from_f32(v))
    }
}

/// Widens `values` into `out` (same length), exactly.
pub fn widen<T: Element>(values: &[T], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(values) {
        *o = v.to_f32();
    }
}

/// Rounds `values` into `out` (same length), each once to nearest.
pub fn narrow<T: Element>(values: &[f32], out: &mut [T]) {
    for (o, &v) in out.iter_mut().zip(values) {
        *o = T::from_f32(v);
    }
}

/// The bfloat16 nearest `v` (ties to even), as bits; NaN stays a (quiet)
/// NaN, infinities stay infinite, and values beyond bfloat16's largest
/// round to infinity.
#[inline]
pub fn bf16_from_f32(v: f32) -> u16 {
    let b = v.to_bits();
    // Written without branches so that loops over slices vectorize.
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    let nan = (b & 0x7FFF_FFFF) > 0x7F80_0000;
    if nan {
        ((b >> 16) | 0x40) as u16
    } else {
        rounded
    }
}

/// The `f32` of bfloat16 bits (exact).
#[inline]
pub fn f32_from_bf16(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// The IEEE half nearest `v` (ties to even), as bits.
#[inline]
pub fn f16_from_f32(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// The `f32` of IEEE half bits (exact).
#[inline]
pub fn f32_from_f16(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Writes `src` as little-endian f32 bytes into `dst` (`dst.len() == 4 * src.len()`).
pub fn put_f32s(dst: &mut [u8], src: &[f32]) {
    if cfg!(target_endian = "little") {
        // The in-memory form is the wire form: one memcpy.
        dst.copy_from_slice(bytemuck::cast_slice(src));
    } else {
        for (d, v) in dst.chunks_exact_mut(4).zip(src) {
            d.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Reads little-endian f32 bytes from `src` into `dst` (`src.len() == 4 * dst.len()`).
pub fn get_f32s(dst: &mut [f32], src: &[u8]) {
    if cfg!(target_endian = "little") {
        // `src` may sit at any address, so copy bytes into the aligned `dst`.
        bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(src);
    } else {
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
            *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        }
    }
}

/// Appends `values` in element format `format` (little-endian) to `out`.
/// `Log8` is not an element format: use [`log8_encode`].
pub fn put_elements(format: ValueFormat, values: &[f32], out: &mut Vec<u8>) {
    match format {
        ValueFormat::F32 => {
            if cfg!(target_endian = "little") {
                out.extend_from_slice(bytemuck::cast_slice(values));
            } else {
                values
                    .iter()
                    .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
            }
        }
        ValueFormat::Bf16 => put_u16s(values, out, bf16_from_f32),
        ValueFormat::F16 => put_u16s(values, out, f16_from_f32),
        ValueFormat::Log8 => {}
    }
}

// Generic over the conversion (not a `fn` pointer) so that it is inlined
// into the loop, which then vectorizes.
fn put_u16s(values: &[f32], out: &mut Vec<u8>, f: impl Fn(f32) -> u16) {
    let at = out.len();
    out.resize(at + values.len() * 2, 0);
    for (d, &v) in out[at..].chunks_exact_mut(2).zip(values) {
        d.copy_from_slice(&f(v).to_le_bytes());
    }
}

/// Writes `values` in element format `format` into `out`, which holds
/// exactly their bytes (`element_bytes * values.len()`).
pub fn write_elements(format: ValueFormat, values: &[f32], out: &mut [u8]) {
    match format {
        ValueFormat::F32 => put_f32s(out, values),
        ValueFormat::Bf16 => write_u16s(values, out, bf16_from_f32),
        ValueFormat::F16 => write_u16s(values, out, f16_from_f32),
        ValueFormat::Log8 => {}
    }
}

fn write_u16s(values: &[f32], out: &mut [u8], f: impl Fn(f32) -> u16) {
    for (d, &v) in out.chunks_exact_mut(2).zip(values) {
        d.copy_from_slice(&f(v).to_le_bytes());
    }
}

/// Reads element-format bytes into `out` (`bytes.len()` is exactly
/// `element_bytes * out.len()`). `Log8` is not an element format: use
/// [`log8_decode`].
pub fn read_elements(format: ValueFormat, bytes: &[u8], out: &mut [f32]) {
    match format {
        ValueFormat::F32 => get_f32s(out, bytes),
        ValueFormat::Bf16 => read_u16s(bytes, out, f32_from_bf16),
        ValueFormat::F16 => read_u16s(bytes, out, f32_from_f16),
        ValueFormat::Log8 => {}
    }
}

fn read_u16s(bytes: &[u8], out: &mut [f32], f: impl Fn(u16) -> f32) {
    for (d, s) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *d = f(u16::from_le_bytes([s[0], s[1]]));
    }
}

/// What a round trip through `format` takes from each of `values`:
/// `out[i] = values[i] - decode(encode(values[i]))`, the values taken as
/// one chunk for `Log8`. A value that is not finite, or a `Log8` chunk
/// holding one (it travels in another format, exactly), leaves 0.
pub fn rounding_error(format: ValueFormat, values: &[f32], out: &mut [f32]) {
    let error = |v: f32, d: f32| {
        let e = v - d;
        if e.is_finite() {
            e
        } else {
            0.0
        }
    };
    match format {
        ValueFormat::F32 => out.fill(0.0),
        ValueFormat::Bf16 => {
            for (o, &v) in out.iter_mut().zip(values) {
                *o = error(v, f32_from_bf16(bf16_from_f32(v)));
            }
        }
        ValueFormat::F16 => {
            for (o, &v) in out.iter_mut().zip(values) {
                *o = error(v, f32_from_f16(f16_from_f32(v)));
            }
        }
        ValueFormat::Log8 => {
            if log8_round_trip(values, out).is_err() {
                out.fill(0.0);
                return;
            }
            for (o, &v) in out.iter_mut().zip(values) {
                *o = error(v, *o);
            }
        }
    }
}

#[cfg(test)]
mod tests;
