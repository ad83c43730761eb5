use super::log8::{log8_level, GUESS_OCTAVES, LOG8};
use super::*;
use proptest::prelude::*;

/// `b^-q`, the smallest `|v|/S` of level `q`.
fn lower(q: usize) -> f32 {
    LOG8.above[q + 1]
}

/// Finite f32s of every magnitude, and some exact zeros.
fn finite() -> impl Strategy<Value = f32> {
    prop_oneof![
        9 => (any::<bool>(), -40i32..10, 0f32..1.0).prop_map(|(neg, e, m)| {
            let v = (1.0 + m) * 2f32.powi(e);
            if neg { -v } else { v }
        }),
        1 => Just(0.0f32),
    ]
}

#[test]
fn codes_and_names_round_trip() {
    for f in ValueFormat::ALL {
        assert_eq!(ValueFormat::from_code(f.code()), Some(f));
        assert_eq!(f.name().parse::<ValueFormat>(), Ok(f));
    }
    assert_eq!(ValueFormat::from_code(4), None);
    assert!(matches!(
        "fp8".parse::<ValueFormat>(),
        Err(FormatError::Name(_))
    ));
    assert_eq!(
        ClassFormats {
            important: ValueFormat::Log8,
            lossy: ValueFormat::Log8
        }
        .validate(),
        Err(FormatError::LossyOnly)
    );
}

#[test]
fn bf16_matches_the_reference_rounding() {
    // Every bf16 value survives the trip; ties round to even.
    for bits in 0..=u16::MAX {
        let v = f32_from_bf16(bits);
        let back = bf16_from_f32(v);
        if v.is_nan() {
            assert!(f32_from_bf16(back).is_nan());
        } else {
            assert_eq!(back, bits, "{v}");
        }
    }
    assert_eq!(bf16_from_f32(f32::from_bits(0x3F80_8000)), 0x3F80); // tie, even below
    assert_eq!(bf16_from_f32(f32::from_bits(0x3F81_8000)), 0x3F82); // tie, even above
    assert_eq!(bf16_from_f32(f32::MAX), 0x7F80); // overflows to inf
}

#[test]
fn f16_is_exact_for_halves_and_overflows_to_inf() {
    for bits in 0..=u16::MAX {
        let v = f32_from_f16(bits);
        if !v.is_nan() {
            assert_eq!(f16_from_f32(v), bits);
        }
    }
    assert_eq!(f32_from_f16(f16_from_f32(70000.0)), f32::INFINITY);
}

#[test]
fn log8_tables_are_the_same_bits_as_computed_exactly() {
    // The table is b^-q; check a few against f64 powers (which agree
    // to well within an f32 ulp) and that it falls strictly.
    for q in [0usize, 1, 10, 63, 126] {
        let want = LOG8_BASE.powi(-(q as i32));
        assert!(((lower(q) as f64) - want).abs() <= want * 1e-7, "{q}");
    }
    assert!((1..LOG8_LEVELS).all(|q| lower(q) < lower(q - 1)));
    // The zero row starts below the last level.
    assert!((lower(LOG8_LEVELS - 1) as f64) > 2f64.powi(-(GUESS_OCTAVES as i32)));
}

/// The level by its definition, for the table search to match.
fn level_by_search(x: f32) -> usize {
    (0..LOG8_LEVELS)
        .find(|&q| x >= lower(q))
        .unwrap_or(LOG8_LEVELS)
}

#[test]
fn the_table_search_finds_the_exact_level() {
    let t = &*LOG8;
    for q in 0..LOG8_LEVELS {
        // At each boundary and just below it.
        let at = lower(q);
        assert_eq!(log8_level(at, t), q);
        let below = f32::from_bits(at.to_bits() - 1);
        assert_eq!(log8_level(below, t), q + 1);
    }
    assert_eq!(log8_level(0.0, t), LOG8_LEVELS);
    assert_eq!(log8_level(f32::MIN_POSITIVE / 4.0, t), LOG8_LEVELS);
    assert_eq!(log8_level(1.0, t), 0);
    // Every 97th f32 in (2^-20, 1].
    let (lo, hi) = (2f32.powi(-20).to_bits(), 1f32.to_bits());
    for bits in (lo..=hi).step_by(97) {
        let x = f32::from_bits(bits);
        assert_eq!(log8_level(x, t), level_by_search(x), "x = {x:e}");
    }
}

proptest! {
    /// bf16 and f16: a value of the type goes through unchanged, and
    /// any other is its nearest neighbour of the type.
    #[test]
    fn sixteen_bit_formats_round_to_nearest(v in finite()) {
        let b = ValueFormat::Bf16.round(v);
        prop_assert_eq!(ValueFormat::Bf16.round(b), b);
        prop_assert!((b - v).abs() <= v.abs() * 2f32.powi(-8));
        let h = ValueFormat::F16.round(v);
        prop_assert_eq!(ValueFormat::F16.round(h).to_bits(), h.to_bits());
        if v.abs() < 65504.0 && v.abs() > 6.2e-5 {
            prop_assert!((h - v).abs() <= v.abs() * 2f32.powi(-11));
        }
    }

    /// Log8 within its stated bound: the sign kept, the ratio within
    /// b^±1/2, the largest value exact, small values zero, zeros zero.
    #[test]
    fn log8_is_within_its_bound(values in prop::collection::vec(finite(), 1..300)) {
        let scale = log8_scale(&values).unwrap();
        let mut codes = vec![0u8; values.len()];
        log8_encode(&values, scale, &mut codes);
        let mut out = vec![1f32; values.len()];
        log8_decode(&codes, scale, &mut out);
        let (lo, hi) = (LOG8_BASE.sqrt().recip() as f32, LOG8_BASE.sqrt() as f32);
        let smallest = scale * lower(LOG8_LEVELS - 1);
        for (&v, &d) in values.iter().zip(&out) {
            if v == 0.0 || v.abs() < smallest {
                prop_assert_eq!(d, 0.0);
                continue;
            }
            if v.abs() == scale {
                prop_assert_eq!(d, v);
            }
            prop_assert_eq!(d.is_sign_negative(), v.is_sign_negative());
            let ratio = d / v;
            prop_assert!(ratio >= lo * (1.0 - 1e-6) && ratio <= hi * (1.0 + 1e-6),
                "v {} decoded {} (scale {})", v, d, scale);
        }
    }

    /// Any code and any acceptable scale decode to a finite value, and
    /// never panic.
    #[test]
    fn any_code_decodes_finite(codes in prop::collection::vec(any::<u8>(), 0..64), scale in 0f32..f32::MAX) {
        let mut out = vec![0f32; codes.len()];
        log8_decode(&codes, scale, &mut out);
        prop_assert!(out.iter().all(|v| v.is_finite()));
    }
}

proptest! {
    /// The fused round trip is encoding then decoding, bit for bit.
    #[test]
    fn the_round_trip_is_encode_then_decode(values in prop::collection::vec(finite(), 1..300)) {
        let scale = log8_scale(&values).unwrap();
        let mut codes = vec![0u8; values.len()];
        log8_encode(&values, scale, &mut codes);
        let mut want = vec![0f32; values.len()];
        log8_decode(&codes, scale, &mut want);
        let mut got = vec![1f32; values.len()];
        log8_round_trip(&values, &mut got).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&got), bits(&want));
    }
}

#[test]
fn a_chunk_with_a_value_not_finite_has_no_scale() {
    assert_eq!(
        log8_scale(&[1.0, f32::INFINITY]),
        Err(NonFinite { index: 1 })
    );
    assert_eq!(log8_scale(&[f32::NAN, 1.0]), Err(NonFinite { index: 0 }));
    assert_eq!(log8_scale(&[0.0; 9]), Ok(0.0));
    let mut out = [1f32; 3];
    log8_round_trip(&[0.0, 0.0, -0.0], &mut out).unwrap();
    assert_eq!(out, [0.0; 3]);
    assert!(!log8_scale_ok(f32::NAN) && !log8_scale_ok(-1.0) && log8_scale_ok(0.0));
}
