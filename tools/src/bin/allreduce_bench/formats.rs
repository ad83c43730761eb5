//! Value formats on the command line and in buffers: `--format` specs and
//! `--loss-tolerance` values parsed, a spec named as the user writes it,
//! and an exact variant's f32 buffers rounded to its 16-bit type and back.
//! The rounds take a spec as given; what a spec means is decided here.

use gradlane::{bf16, f16, ClassFormats, Element, ValueFormat};
use gradlane_core::format::{narrow, widen};

/// A `--loss-tolerance` value: a share in `[0, 1]`.
pub(crate) fn tolerance(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if (0.0..=1.0).contains(&t) => Ok(t),
        _ => Err(format!("{s:?} is not a loss tolerance in [0, 1]")),
    }
}

/// A `--format` spec, `IMPORTANT` or `IMPORTANT+LOSSY`.
pub(crate) fn format_spec(spec: &str) -> Result<ClassFormats, String> {
    let (important, lossy) = spec.split_once('+').unwrap_or((spec, spec));
    let important: ValueFormat = important.trim().parse().map_err(|e| format!("{e}"))?;
    let lossy: ValueFormat = lossy.trim().parse().map_err(|e| format!("{e}"))?;
    if important == ValueFormat::Log8 {
        // log8 has no per-value round trip: it quantizes against a chunk's
        // scale, so it can neither be a buffer's type nor carry the part
        // that must arrive as sent.
        return Err(format!(
            "{spec:?}: log8 cannot be the important format (the important part travels \
             exact or rounded once: f32, bf16 or f16); log8 is for the lossy part, as in bf16+log8"
        ));
    }
    Ok(ClassFormats { important, lossy })
}

/// A spec as the user writes it: `bf16` when both parts agree, else
/// `bf16+log8`.
pub(crate) fn spec_name(formats: ClassFormats) -> String {
    match formats.important == formats.lossy {
        true => formats.important.to_string(),
        false => format!("{}+{}", formats.important, formats.lossy),
    }
}

/// One round's buffers of a 16-bit exact variant, one per local rank
/// (`No`: the variant reduces the f32 buffers themselves).
pub(crate) enum Narrowed {
    No,
    Bf16(Vec<Vec<bf16>>),
    F16(Vec<Vec<f16>>),
}

impl Narrowed {
    /// `grads` rounded once to `buffer_type`.
    pub(crate) fn of(buffer_type: ValueFormat, grads: &[Vec<f32>]) -> Self {
        fn to<T: Element>(grads: &[Vec<f32>]) -> Vec<Vec<T>> {
            grads
                .iter()
                .map(|g| {
                    let mut out = vec![T::from_f32(0.0); g.len()];
                    narrow(g, &mut out);
                    out
                })
                .collect()
        }
        match buffer_type {
            ValueFormat::Bf16 => Narrowed::Bf16(to(grads)),
            ValueFormat::F16 => Narrowed::F16(to(grads)),
            // f32; log8 is refused as a buffer type by `format_spec`.
            _ => Narrowed::No,
        }
    }

    /// The reduced values back into `bufs`, exactly.
    pub(crate) fn widen_into(&self, bufs: &mut [Vec<f32>]) {
        fn back<T: Element>(narrowed: &[Vec<T>], bufs: &mut [Vec<f32>]) {
            for (n, b) in narrowed.iter().zip(bufs.iter_mut()) {
                widen(n, b);
            }
        }
        match self {
            Narrowed::No => {}
            Narrowed::Bf16(n) => back(n, bufs),
            Narrowed::F16(n) => back(n, bufs),
        }
    }
}
