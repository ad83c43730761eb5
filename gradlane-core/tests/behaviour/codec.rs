//! Behavioural tests of the codec: exact keys and signs, the stated value
//! bound, edge cases, hostile frames, and aggregation.

use gradlane_core::codec::{
    self, aggregate, decode, decode_add_into, decode_into_dense, encode, encode_dense, threshold,
    top_k, AggregateError, DecodeError, EncodeError, Selection, SparseGradient, DEFAULT_BASE,
};
use proptest::prelude::*;

/// The documented bound, plus f32 output rounding: `|v|/sqrt(b) < |d| <=
/// sqrt(b)|v|`, relaxed by half an f32 ulp and, for subnormal results, 2^-150.
fn assert_within_bound(orig: f32, dec: f32, base: f64) {
    assert_eq!(
        orig.is_sign_negative(),
        dec.is_sign_negative(),
        "{orig} -> {dec}"
    );
    let (a, d) = (f64::from(orig.abs()), f64::from(dec.abs()));
    let s = base.sqrt();
    let rel = 1.0 + 2f64.powi(-23);
    let abs = 2f64.powi(-150);
    assert!(
        d <= a * s * rel + abs,
        "too big: {orig} -> {dec} (base {base})"
    );
    assert!(
        d >= a / s / rel - abs,
        "too small: {orig} -> {dec} (base {base})"
    );
}

fn round_trip(grad: &SparseGradient, base: f64) -> SparseGradient {
    let frame = encode(grad, base).expect("encode");
    let back = decode(&frame).expect("decode");
    assert_eq!(back.dim(), grad.dim());
    assert_eq!(back.keys(), grad.keys(), "keys must round-trip exactly");
    for (&o, &d) in grad.values().iter().zip(back.values()) {
        assert_within_bound(o, d, base);
    }
    back
}

fn any_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        prop::num::f32::NORMAL,
        prop::num::f32::SUBNORMAL,
        (-1e3f32..1e3),
        Just(f32::MAX),
        Just(-f32::MAX),
        Just(f32::from_bits(1)),
    ]
    .prop_filter("non-zero", |v| *v != 0.0)
}

fn any_grad() -> impl Strategy<Value = SparseGradient> {
    (1u64..=(1 << 32)).prop_flat_map(|dim| {
        let max_key = (dim - 1) as u32;
        prop::collection::vec((0..=max_key, any_value()), 0..300).prop_map(move |pairs| {
            // Summing duplicates may overflow f32: keep the first instead.
            let mut seen = std::collections::BTreeMap::new();
            for (k, v) in pairs {
                seen.entry(k).or_insert(v);
            }
            SparseGradient::from_pairs(dim, seen).expect("valid pairs")
        })
    })
}

fn any_base() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(DEFAULT_BASE),
        Just(2.0),
        1.001f64..10.0,
        Just(codec::MIN_BASE)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn keys_signs_exact_values_bounded(grad in any_grad(), base in any_base()) {
        round_trip(&grad, base);
    }

    #[test]
    fn dense_paths_agree(values in prop::collection::vec(prop_oneof![Just(0.0f32), -100f32..100.0], 0..2000),
                         k in 0usize..300, t in 0f32..100.0) {
        let by_k = top_k(&values, k).unwrap();
        let nonzero = values.iter().filter(|v| **v != 0.0).count();
        prop_assert_eq!(by_k.len(), k.min(nonzero));
        if let Some(min_kept) = by_k.values().iter().map(|v| v.abs()).reduce(f32::min) {
            // Nothing dropped is larger than anything kept.
            for (i, v) in values.iter().enumerate() {
                if by_k.keys().binary_search(&(i as u32)).is_err() {
                    prop_assert!(v.abs() <= min_kept);
                }
            }
        }
        let by_t = threshold(&values, t).unwrap();
        let want: Vec<u32> = (0..values.len() as u32).filter(|&i| values[i as usize].abs() > t).collect();
        prop_assert_eq!(by_t.keys(), &want[..]);
        let frame = encode_dense(&values, Selection::Threshold(t), DEFAULT_BASE).unwrap();
        let mut dense = vec![1.0f32; values.len()];
        decode_into_dense(&frame, &mut dense).unwrap();
        for (i, (&o, &d)) in values.iter().zip(&dense).enumerate() {
            if o.abs() > t {
                assert_within_bound(o, d, DEFAULT_BASE);
            } else {
                prop_assert_eq!(d, 0.0, "index {}", i);
            }
        }
    }

    #[test]
    fn aggregation_equals_sum_of_decoded(grads in prop::collection::vec(
        prop::collection::vec((0u32..500, -10f32..10.0), 0..100), 0..6)) {
        let dim = 500u64;
        let frames: Vec<Vec<u8>> = grads.iter().map(|pairs| {
            let g = SparseGradient::from_pairs(dim, pairs.iter().copied()).unwrap();
            encode(&g, DEFAULT_BASE).unwrap()
        }).collect();
        let mut want = vec![0.5f32; dim as usize];
        for f in &frames {
            let d = decode(f).unwrap();
            for (&k, &v) in d.keys().iter().zip(d.values()) {
                want[k as usize] += v;
            }
        }
        let mut acc = vec![0.5f32; dim as usize];
        aggregate(&frames, &mut acc).unwrap();
        prop_assert_eq!(acc, want);
    }

    #[test]
    fn mutated_frames_never_panic(grad in any_grad(), base in any_base(),
                                  flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                                  cut in any::<prop::sample::Index>()) {
        let frame = encode(&grad, base).unwrap();
        let mut bad = frame.clone();
        for (i, x) in &flips {
            let i = i.index(bad.len());
            bad[i] ^= x | 1;
        }
        // Whatever happens, no panic; a frame that still decodes keeps the
        // codec's invariants.
        if let Ok(g) = decode(&bad) {
            prop_assert!(g.keys().windows(2).all(|p| p[0] < p[1]));
            prop_assert!(g.keys().iter().all(|&k| u64::from(k) < g.dim()));
            prop_assert!(g.values().iter().all(|v| v.is_finite()));
        }
        let short = &frame[..cut.index(frame.len())];
        prop_assert!(decode(short).is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200),
                                   with_magic in any::<bool>()) {
        let mut bytes = bytes;
        if with_magic {
            // Get past the magic/version checks so deeper paths are reached.
            let mut head = b"GLSQ\x01".to_vec();
            head.extend(bytes.iter().skip(5));
            bytes = head;
        }
        let r = decode(&bytes);
        let mut acc = vec![0f32; 64];
        let before = acc.clone();
        if decode_add_into(&bytes, &mut acc).is_err() {
            prop_assert_eq!(acc, before);
        }
        if let Ok(g) = r {
            prop_assert!(g.keys().windows(2).all(|p| p[0] < p[1]));
        }
    }
}

#[test]
fn empty_input() {
    let g = threshold(&[], 0.0).unwrap();
    assert!(g.is_empty());
    let back = round_trip(&g, DEFAULT_BASE);
    assert!(back.is_empty());
    let g = top_k(&[0.0; 10], 3).unwrap();
    assert!(g.is_empty());
    let frame = encode(&g, DEFAULT_BASE).unwrap();
    let mut out = vec![7.0f32; 10];
    decode_into_dense(&frame, &mut out).unwrap();
    assert_eq!(out, vec![0.0; 10]);
}

#[test]
fn single_element_is_exact() {
    for v in [1.0f32, -3.25e-20, f32::MAX, -f32::from_bits(1)] {
        let g = SparseGradient::new(1, vec![0], vec![v]).unwrap();
        let back = round_trip(&g, 2.0);
        assert_eq!(back.values(), &[v], "q = 0 decodes to S exactly");
    }
}

#[test]
fn all_equal_values() {
    let values = vec![-0.125f32; 1000];
    let g = top_k(&values, 1000).unwrap();
    let back = round_trip(&g, DEFAULT_BASE);
    let first = back.values()[0];
    assert!(back.values().iter().all(|&v| v == first));
}

#[test]
fn keys_at_zero_and_near_u32_max() {
    let dim = 1u64 << 32;
    let keys = vec![0, 1, 2, u32::MAX - 2, u32::MAX - 1, u32::MAX];
    let values = vec![1.0, -2.0, 3.0, -4.0, 5.0, -6.0];
    let g = SparseGradient::new(dim, keys, values).unwrap();
    round_trip(&g, DEFAULT_BASE);
    let g = SparseGradient::new(dim, vec![u32::MAX], vec![1.0]).unwrap();
    round_trip(&g, DEFAULT_BASE);
}

#[test]
fn denormals_and_extremes() {
    let values = vec![
        f32::from_bits(1),
        -f32::from_bits(3),
        f32::MIN_POSITIVE / 3.0,
        f32::MIN_POSITIVE,
        1.0,
        -f32::MAX / 4.0,
    ];
    let g = threshold(&values, 0.0).unwrap();
    assert_eq!(g.len(), values.len());
    for base in [codec::MIN_BASE, 1.1, DEFAULT_BASE, 2.0, 16.0] {
        round_trip(&g, base);
    }
    // Decoded as 2^-150 in f64, which rounds to zero in f32: clamped to the
    // smallest subnormal so the entry survives and re-encodes.
    let g = SparseGradient::new(2, vec![0, 1], vec![f32::from_bits(1), 1.0]).unwrap();
    let back = round_trip(&g, 16.0);
    assert_eq!(back.values()[0], f32::from_bits(1));
    round_trip(&back, 16.0);
}

#[test]
fn non_finite_input_is_typed_error() {
    let mut v = vec![0.5f32; 1000];
    v[321] = f32::NAN;
    for sel in [
        Selection::Threshold(1.0),
        Selection::TopK(5),
        Selection::TopK(0),
    ] {
        assert_eq!(
            encode_dense(&v, sel, DEFAULT_BASE),
            Err(EncodeError::NonFinite { index: 321 })
        );
    }
    v[321] = f32::INFINITY;
    assert_eq!(
        encode_dense(&v, Selection::Threshold(0.0), DEFAULT_BASE),
        Err(EncodeError::NonFinite { index: 321 })
    );
    assert_eq!(
        SparseGradient::from_pairs(10, [(4, f32::NEG_INFINITY)]),
        Err(EncodeError::NonFinite { index: 4 })
    );
    assert!(matches!(
        encode_dense(&v, Selection::Threshold(f32::NAN), DEFAULT_BASE),
        Err(EncodeError::BadThreshold(_))
    ));
    assert_eq!(
        encode_dense(&[1.0], Selection::TopK(1), 1.0),
        Err(EncodeError::BadBase(1.0))
    );
}

#[test]
fn typed_frame_errors() {
    let g = SparseGradient::new(100, vec![10, 20, 30], vec![1.0, -2.0, 3.0]).unwrap();
    let f = encode(&g, 2.0).unwrap();
    let mut bad = f.clone();
    bad[0] ^= 1;
    assert_eq!(decode(&bad), Err(DecodeError::BadMagic));
    let mut bad = f.clone();
    bad[4] = 2;
    assert_eq!(decode(&bad), Err(DecodeError::UnsupportedVersion(2)));
    assert_eq!(decode(&f[..20]), Err(DecodeError::Truncated));
    let mut bad = f.clone();
    bad[8..16].copy_from_slice(&2u64.to_le_bytes());
    assert_eq!(decode(&bad), Err(DecodeError::CountTooLarge(3)));
    let mut bad = f.clone();
    bad[8..16].copy_from_slice(&25u64.to_le_bytes());
    assert_eq!(decode(&bad), Err(DecodeError::KeyOutOfRange));
    let mut bad = f.clone();
    bad[8..16].copy_from_slice(&(u64::MAX).to_le_bytes());
    assert_eq!(decode(&bad), Err(DecodeError::DimensionTooLarge(u64::MAX)));
    let mut bad = f.clone();
    bad[28..36].copy_from_slice(&f64::NAN.to_le_bytes());
    assert_eq!(decode(&bad), Err(DecodeError::BadSum));
    let mut bad = f.clone();
    bad[5] = 7;
    assert_eq!(decode(&bad), Err(DecodeError::BadWidthScheme));
    let mut bad = f.clone();
    bad[6] = 40;
    assert_eq!(decode(&bad), Err(DecodeError::BadQWidth(40)));
    let mut bad = f.clone();
    bad.extend_from_slice(&[0, 0]);
    assert_eq!(decode(&bad), Err(DecodeError::TrailingBytes));

    // Two equal keys: hand-build a frame whose second delta is 0.
    let g = SparseGradient::new(100, vec![5, 6], vec![1.0, 1.0]).unwrap();
    let f = encode(&g, 2.0).unwrap();
    let (h, _) = codec::parse_header(&f).unwrap();
    let widths = h.scheme.widths().to_vec();
    assert_eq!(h.scheme.flag_bits(), 0, "{widths:?}");
    // flag bits 0, width 3: element = delta(3) sign(1) q(q_width).
    let per = 3 + 1 + h.q_width;
    let mut bits: u64 = 5 | (1 << per); // key 5, then delta 1
    bits &= !(0b111 << per); // make the second delta 0
    let mut bad = f.clone();
    let payload_start = bad.len() - (2 * per as usize).div_ceil(8);
    for (i, b) in bad[payload_start..].iter_mut().enumerate() {
        let orig = *b as u64;
        let keep_mask = !((0b111u64 << per) >> (8 * i)) & 0xff;
        *b = ((orig & keep_mask) | ((bits >> (8 * i)) & !keep_mask & 0xff)) as u8;
    }
    assert_eq!(decode(&bad), Err(DecodeError::NonIncreasingKeys));

    let mut acc = vec![0f32; 99];
    assert_eq!(
        decode_add_into(&f, &mut acc),
        Err(DecodeError::DimensionMismatch {
            frame: 100,
            output: 99
        })
    );
}

#[test]
fn aggregate_is_all_or_nothing() {
    let g = SparseGradient::new(10, vec![1, 2], vec![1.0, 2.0]).unwrap();
    let good = encode(&g, DEFAULT_BASE).unwrap();
    let bad = b"nope".to_vec();
    let mut acc = vec![1.0f32; 10];
    let err = aggregate(&[good.clone(), bad], &mut acc).unwrap_err();
    assert_eq!(
        err,
        AggregateError::Frame {
            index: 1,
            source: DecodeError::BadMagic
        }
    );
    assert_eq!(acc, vec![1.0; 10]);
    aggregate(&[good.clone(), good], &mut acc).unwrap();
    assert!(acc[1] > 2.5 && acc[2] > 4.0 && acc[0] == 1.0);
}

#[test]
fn compact_at_one_percent() {
    // A modest heavy-tailed check that the size goal is not silently lost:
    // 1% of 200k Laplace-ish values must cost under 2 bytes each.
    let mut x = 7u64;
    let values: Vec<f32> = (0..200_000)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64 - 0.5;
            (-u.signum() * (1.0 - 2.0 * u.abs()).ln() * 1e-3) as f32
        })
        .collect();
    let f = encode_dense(&values, Selection::TopK(2000), DEFAULT_BASE).unwrap();
    let per = f.len() as f64 / 2000.0;
    assert!(per <= 2.0, "{per} bytes per kept element");
}
