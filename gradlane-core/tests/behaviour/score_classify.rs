//! Contribution scores and classification follow docs/DESIGN.md §2.3 and
//! §2.4 exactly.

use gradlane_core::classify::{AdaptiveRatio, Class, Classifier, ClassifyConfig, Ranking};
use gradlane_core::encode::{EncodeError, Encoder, EncoderConfig};
use gradlane_core::layout::{ChunkOptions, Layout, LayoutError, TensorSpec};
use gradlane_core::presets;
use gradlane_core::score::{ContributionTracker, GradientError};
use proptest::prelude::*;

#[test]
fn contribution_follows_the_formula_over_rounds() {
    let layout = presets::tiny();
    let plan = layout.plan(ChunkOptions::default()).unwrap();
    let alpha = 0.3f64;
    let mut tracker = ContributionTracker::new(plan.len(), alpha as f32);
    let mut expected: Vec<f64> = Vec::new();
    for round in 0..6u64 {
        // Different magnitudes every round so smoothing is visible.
        let grads: Vec<Vec<f32>> = gradlane_core::presets::gradients(&layout, round)
            .into_iter()
            .map(|t| {
                t.into_iter()
                    .map(|v| v * (1 + round * round) as f32)
                    .collect()
            })
            .collect();
        let got = tracker.update(&plan, &grads).unwrap().to_vec();
        // Independent reference in f64: mean |g| per chunk, then smoothing.
        let means: Vec<f64> = plan
            .chunks()
            .iter()
            .map(|c| {
                let v = &grads[c.tensor as usize][c.start as usize..(c.start + c.len) as usize];
                v.iter().map(|x| x.abs() as f64).sum::<f64>() / v.len() as f64
            })
            .collect();
        expected = if round == 0 {
            means
        } else {
            expected
                .iter()
                .zip(&means)
                .map(|(c, m)| alpha * c + (1.0 - alpha) * m)
                .collect()
        };
        for (j, (g, e)) in got.iter().zip(&expected).enumerate() {
            let rel = (*g as f64 - e).abs() / e.abs().max(1e-30);
            assert!(rel < 1e-5, "round {round} chunk {j}: {g} vs {e}");
        }
    }
}

/// Checks one ranked group: exactly ceil(ratio*n) important, they are the top
/// ones, and levels split the rest in rank order into equal bands.
fn check_group(contrib: &[f32], ids: &[usize], classes: &[Class], ratio: f64, levels: u8) {
    let n = ids.len();
    let k = (ratio * n as f64 - 1e-9).ceil().max(0.0) as usize;
    let mut ranked: Vec<usize> = ids.to_vec();
    ranked.sort_by(|&a, &b| contrib[b].total_cmp(&contrib[a]).then(a.cmp(&b)));
    let important = ranked.iter().filter(|&&id| classes[id] == 0).count();
    assert_eq!(important, k, "ceil({ratio} * {n})");
    for (pos, &id) in ranked.iter().enumerate() {
        if pos < k {
            assert_eq!(classes[id], 0, "rank {pos} should be important");
        } else {
            let m = n - k;
            let p = pos - k;
            // Band i holds positions [i*m/L, (i+1)*m/L).
            let l = levels as usize;
            let band = (0..l).rev().find(|&i| i * m / l <= p).unwrap();
            assert_eq!(classes[id] as usize, band + 1, "lossy rank {p} of {m}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn classes_are_top_k_then_equal_bands(
        sizes in prop::collection::vec(1usize..3000, 1..6),
        loss_tolerance in 0.0f64..=1.0,
        levels in 1u8..=7,
        global in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let layout = Layout::new(sizes.iter().enumerate()
            .map(|(i, &n)| TensorSpec::dense(format!("t{i}"), [n])).collect()).unwrap();
        let plan = layout.plan(ChunkOptions { block_values: 16, ..Default::default() }).unwrap();
        let mut rng = gradlane_core::rng::SplitMix64::new(seed);
        // Few distinct values, so ties are common and tie order is exercised.
        let contrib: Vec<f32> = (0..plan.len()).map(|_| {
            let s = rng.next_u64();
            (s % 50) as f32 * 0.25
        }).collect();
        let ranking = if global { Ranking::Global } else { Ranking::PerTensor };
        let mut c = Classifier::new(ClassifyConfig { loss_tolerance, levels, ranking, ..Default::default() }).unwrap();
        let ratio = 1.0 - loss_tolerance;
        let mut classes = Vec::new();
        c.classify(&plan, &contrib, &mut classes).unwrap();
        if global {
            let ids: Vec<usize> = (0..plan.len()).collect();
            check_group(&contrib, &ids, &classes, ratio, levels);
        } else {
            for t in 0..plan.tensor_count() {
                let ids: Vec<usize> = plan.tensor_chunks(t).collect();
                check_group(&contrib, &ids, &classes, ratio, levels);
            }
        }
    }
}

#[test]
fn first_round_all_important_then_ranked() {
    let layout = presets::tiny();
    let plan = layout.plan(ChunkOptions::default()).unwrap();
    let contrib: Vec<f32> = (0..plan.len()).map(|i| i as f32).collect();
    let mut c = Classifier::new(ClassifyConfig {
        first_round_all_important: true,
        ..Default::default()
    })
    .unwrap();
    let mut classes = Vec::new();
    c.classify(&plan, &contrib, &mut classes).unwrap();
    assert!(classes.iter().all(|&x| x == 0));
    c.classify(&plan, &contrib, &mut classes).unwrap();
    assert!(classes.iter().any(|&x| x != 0));
}

#[test]
fn random_ranking_keeps_counts_and_is_seeded() {
    let layout = presets::tiny();
    let plan = layout.plan(ChunkOptions::default()).unwrap();
    // Contributions rising with id: contribution ranking would make the last
    // chunks of each tensor important.
    let contrib: Vec<f32> = (0..plan.len()).map(|i| i as f32).collect();
    let run = |seed| {
        let mut c = Classifier::new(ClassifyConfig {
            random_ranking: Some(seed),
            ..Default::default()
        })
        .unwrap();
        let mut classes = Vec::new();
        c.classify(&plan, &contrib, &mut classes).unwrap();
        classes
    };
    let (a, b, other) = (run(5), run(5), run(6));
    assert_eq!(a, b);
    assert_ne!(a, other);
    let by_rank = {
        let mut c = Classifier::new(ClassifyConfig::default()).unwrap();
        let mut classes = Vec::new();
        c.classify(&plan, &contrib, &mut classes).unwrap();
        classes
    };
    assert_ne!(a, by_rank);
    let count = |v: &[Class]| v.iter().filter(|&&x| x == 0).count();
    assert_eq!(count(&a), count(&by_rank));
}

#[test]
fn adaptive_ratio_follows_the_loss() {
    let mut c = Classifier::new(ClassifyConfig {
        loss_tolerance: 0.2,
        adaptive: Some(AdaptiveRatio { ratio_min: 0.2 }),
        ..Default::default()
    })
    .unwrap();
    c.report_loss(2.0).unwrap();
    assert!((c.loss_tolerance() - 0.2).abs() < 1e-12);
    c.report_loss(1.0).unwrap();
    assert!((c.loss_tolerance() - 0.6).abs() < 1e-12);
    c.report_loss(0.1).unwrap();
    assert!(
        (c.loss_tolerance() - 0.8).abs() < 1e-12,
        "floored at ratio_min"
    );
    assert!(c.report_loss(f64::NAN).is_err());
    assert!(c.report_loss(-1.0).is_err());
    // Applied to the next classification.
    let layout = Layout::new(vec![TensorSpec::dense("a", [1000])]).unwrap();
    let plan = layout
        .plan(ChunkOptions {
            block_values: 10,
            ..Default::default()
        })
        .unwrap();
    let mut classes = Vec::new();
    c.classify(&plan, &vec![1.0; 100], &mut classes).unwrap();
    assert_eq!(classes.iter().filter(|&&x| x == 0).count(), 20);
}

#[test]
fn bad_caller_input_is_a_typed_error() {
    let layout = presets::tiny();
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let mut grads = gradlane_core::presets::gradients(&layout, 1);

    let short = &grads[..3];
    assert_eq!(
        enc.encode(0, short, 1200).unwrap_err(),
        EncodeError::Gradient(GradientError::TensorCount {
            expected: 6,
            got: 3
        })
    );

    grads[2].pop();
    let err = enc.encode(0, &grads, 1200).unwrap_err();
    assert_eq!(
        err,
        EncodeError::Gradient(GradientError::TensorLength {
            tensor: 2,
            expected: 4608,
            got: 4607
        })
    );
    assert_eq!(err.to_string(), "tensor 2 has 4607 values, expected 4608");
    grads[2].push(1.0);

    // A value that is not finite (an fp16 overflow) is no error: its chunk
    // travels in the important part, and its contribution is left as it
    // was (0 at a first round).
    grads[4][777] = f32::NAN;
    let round = enc.encode(0, &grads, 1200).unwrap();
    let chunk = enc.plan().chunk_at(4, 777 * 4).unwrap();
    assert_eq!(round.classes[chunk], 0);
    assert_eq!(enc.contributions()[chunk], 0.0);
    grads[4][777] = f32::NEG_INFINITY;
    let round = enc.encode(1, &grads, 1200).unwrap();
    assert_eq!(round.classes[chunk], 0);
    assert_eq!(enc.contributions()[chunk], 0.0);
    grads[4][777] = 1.0;
    enc.encode(2, &grads, 1200).unwrap();
    assert!(enc.contributions().iter().all(|&c| c > 0.0));

    assert_eq!(Layout::new(vec![]).unwrap_err(), LayoutError::Empty);
    assert_eq!(
        Layout::new(vec![]).unwrap_err().to_string(),
        "layout has no tensors"
    );
}

/// Rounds above 8 MB are scored in parts on several threads: the scores
/// equal a one-thread reference exactly, and chunks with values not
/// finite are found wherever the parts are cut.
#[test]
fn a_large_round_scores_the_same_in_parts() {
    let layout = Layout::new(vec![
        TensorSpec::dense("a", [1500, 1000]),
        TensorSpec::conv2d("b", [64, 64, 3, 3]),
        TensorSpec::dense("c", [1000, 1024]),
    ])
    .unwrap();
    let plan = layout.plan(ChunkOptions::default()).unwrap();
    let mut grads = gradlane_core::presets::gradients(&layout, 7);
    let mut tracker = ContributionTracker::new(plan.len(), 0.3);
    let got = tracker.update(&plan, &grads).unwrap().to_vec();
    for (j, c) in plan.chunks().iter().enumerate() {
        let v = &grads[c.tensor as usize][c.start as usize..(c.start + c.len) as usize];
        let want = gradlane_core::score::abs_sum(v) / c.len as f32;
        assert_eq!(got[j].to_bits(), want.to_bits(), "chunk {j}");
    }

    // Values not finite near the end of the last tensor and early in the
    // first, wherever the parts are cut: both chunks are listed, and keep
    // their contributions.
    grads[2][1_000_000] = f32::INFINITY;
    grads[0][12] = f32::NAN;
    let before = tracker.values().to_vec();
    let after = tracker.update(&plan, &grads).unwrap().to_vec();
    let bad = [
        plan.chunk_at(0, 12 * 4).unwrap() as u32,
        plan.chunk_at(2, 1_000_000 * 4).unwrap() as u32,
    ];
    assert_eq!(tracker.non_finite(), &bad[..]);
    for &id in &bad {
        assert_eq!(after[id as usize], before[id as usize]);
    }
    assert!(after.iter().all(|c| c.is_finite()));
    grads[0][12] = 0.5;
    grads[2][1_000_000] = 0.5;
    tracker.update(&plan, &grads).unwrap();
    assert!(tracker.non_finite().is_empty());
}
