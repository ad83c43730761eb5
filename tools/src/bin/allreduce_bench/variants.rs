//! The variants of the table: what each runs ([`Kind`]), its name and the
//! seed of its fault injectors, per format spec and loss tolerance.

use gradlane::{ClassFormats, SparseAllgather, ValueFormat};

use crate::formats::spec_name;

/// What a variant of the table runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// The differentiated allreduce of the f32 gradient at this loss
    /// tolerance, its buckets' rounds in these formats.
    Differentiated {
        tolerance: f64,
        formats: ClassFormats,
    },
    /// The exact allreduce of a buffer of this type.
    Exact(ValueFormat),
    /// The sparse allgather; how unequal counts are gathered, if unequal.
    Sparse(Option<SparseAllgather>),
    /// The ring over kernel TCP.
    Tcp,
}

/// One row of the table per loss rate.
#[derive(Debug, Clone)]
pub(crate) struct Variant {
    pub(crate) name: String,
    pub(crate) kind: Kind,
    /// Seeds the QUIC ranks' fault injectors: the same for every format of
    /// a variant, so that formats meet the same draws.
    pub(crate) seed: u64,
}

/// The variants of a run: the differentiated, all-reliable and exact ones
/// once per format spec (the exact one once per important type), then the
/// sparse allgathers and the TCP ring. With the default `f32` alone the
/// names are the plain ones ("exact"), as before formats existed, so that
/// tables stay comparable; otherwise each says its format ("exact bf16",
/// "differentiated bf16+log8").
pub(crate) fn variants(
    formats: &[ClassFormats],
    lossy_return: bool,
    tolerances: &[f64],
) -> Vec<Variant> {
    let plain = formats == [ClassFormats::F32] && !lossy_return;
    let named = |base: &str, spec: String| match plain {
        true => base.to_string(),
        false => format!("{base} {spec}"),
    };
    let default_tolerance = tolerances == [0.2];
    let mut out = Vec::new();
    let mut kinds: Vec<(&str, f64, u64)> = tolerances
        .iter()
        .map(|&t| ("differentiated", t, 100))
        .collect();
    kinds.push(("differentiated, all reliable", 0.0, 101));
    for (base, tolerance, seed) in kinds {
        for &f in formats {
            let mut name = named(base, spec_name(f));
            if lossy_return {
                name.push_str(", lossy return");
            }
            if !default_tolerance && tolerance > 0.0 {
                name.push_str(&format!(", tolerance {tolerance}"));
            }
            out.push(Variant {
                name,
                kind: Kind::Differentiated {
                    tolerance,
                    formats: f,
                },
                seed,
            });
        }
    }
    let mut types: Vec<ValueFormat> = Vec::new();
    for f in formats {
        if !types.contains(&f.important) {
            types.push(f.important);
        }
    }
    for t in types {
        out.push(Variant {
            name: named("exact", t.to_string()),
            kind: Kind::Exact(t),
            seed: 102,
        });
    }
    for (name, unequal, seed) in [
        ("sparse allgather, equal counts", None, 106),
        (
            "sparse allgather, unequal counts, allgatherv",
            Some(SparseAllgather::Allgatherv),
            107,
        ),
        (
            "sparse allgather, unequal counts, broadcast in order",
            Some(SparseAllgather::BroadcastInOrder),
            108,
        ),
    ] {
        out.push(Variant {
            name: name.to_string(),
            kind: Kind::Sparse(unequal),
            seed,
        });
    }
    out.push(Variant {
        name: "TCP ring".to_string(),
        kind: Kind::Tcp,
        seed: 0,
    });
    out
}
