//! Real model shapes for tests, benchmarks and examples, and seeded
//! synthetic gradients to fill them with ([`gradients`]).
//!
//! The layouts follow torchvision's definitions parameter for parameter
//! (convolutions without bias followed by batch norm in the ResNets; VGG-11
//! without batch norm, with conv biases), so their sizes are the published
//! ones: ResNet-18 11,689,512, ResNet-50 25,557,032, VGG-11 132,863,336.

use crate::layout::{Layout, TensorSpec};
use crate::rng::SplitMix64;

/// A model preset by name, for command-line tools.
pub fn by_name(name: &str) -> Option<Layout> {
    match name {
        "resnet18" => Some(resnet18()),
        "resnet50" => Some(resnet50()),
        "vgg11" => Some(vgg11()),
        "tiny" => Some(tiny()),
        _ => None,
    }
}

/// Names accepted by [`by_name`].
pub const NAMES: &[&str] = &["resnet18", "resnet50", "vgg11", "tiny"];

fn bn(t: &mut Vec<TensorSpec>, name: &str, c: usize) {
    t.push(TensorSpec::dense(format!("{name}.weight"), [c]));
    t.push(TensorSpec::dense(format!("{name}.bias"), [c]));
}

fn stem(t: &mut Vec<TensorSpec>) {
    t.push(TensorSpec::conv2d("conv1.weight", [64, 3, 7, 7]));
    bn(t, "bn1", 64);
}

fn head(t: &mut Vec<TensorSpec>, features: usize) {
    t.push(TensorSpec::dense("fc.weight", [1000, features]));
    t.push(TensorSpec::dense("fc.bias", [1000]));
}

fn finish(t: Vec<TensorSpec>) -> Layout {
    // The presets are fixed, valid shapes; a failure here is a bug in this file.
    Layout::new(t).expect("preset layouts are valid")
}

/// ResNet-18 (11,689,512 parameters, 62 tensors).
pub fn resnet18() -> Layout {
    let mut t = Vec::new();
    stem(&mut t);
    let mut inp = 64;
    for (layer, &width) in [64usize, 128, 256, 512].iter().enumerate() {
        for block in 0..2 {
            let p = format!("layer{}.{block}", layer + 1);
            let cin = if block == 0 { inp } else { width };
            t.push(TensorSpec::conv2d(
                format!("{p}.conv1.weight"),
                [width, cin, 3, 3],
            ));
            bn(&mut t, &format!("{p}.bn1"), width);
            t.push(TensorSpec::conv2d(
                format!("{p}.conv2.weight"),
                [width, width, 3, 3],
            ));
            bn(&mut t, &format!("{p}.bn2"), width);
            if block == 0 && cin != width {
                t.push(TensorSpec::conv2d(
                    format!("{p}.downsample.0.weight"),
                    [width, cin, 1, 1],
                ));
                bn(&mut t, &format!("{p}.downsample.1"), width);
            }
        }
        inp = width;
    }
    head(&mut t, 512);
    finish(t)
}

/// ResNet-50 (25,557,032 parameters, 161 tensors).
pub fn resnet50() -> Layout {
    let mut t = Vec::new();
    stem(&mut t);
    let mut inp = 64;
    for (layer, (&width, &blocks)) in [64usize, 128, 256, 512]
        .iter()
        .zip(&[3, 4, 6, 3])
        .enumerate()
    {
        let out = width * 4;
        for block in 0..blocks {
            let p = format!("layer{}.{block}", layer + 1);
            let cin = if block == 0 { inp } else { out };
            t.push(TensorSpec::conv2d(
                format!("{p}.conv1.weight"),
                [width, cin, 1, 1],
            ));
            bn(&mut t, &format!("{p}.bn1"), width);
            t.push(TensorSpec::conv2d(
                format!("{p}.conv2.weight"),
                [width, width, 3, 3],
            ));
            bn(&mut t, &format!("{p}.bn2"), width);
            t.push(TensorSpec::conv2d(
                format!("{p}.conv3.weight"),
                [out, width, 1, 1],
            ));
            bn(&mut t, &format!("{p}.bn3"), out);
            if block == 0 {
                t.push(TensorSpec::conv2d(
                    format!("{p}.downsample.0.weight"),
                    [out, cin, 1, 1],
                ));
                bn(&mut t, &format!("{p}.downsample.1"), out);
            }
        }
        inp = out;
    }
    head(&mut t, 2048);
    finish(t)
}

/// VGG-11 without batch norm (132,863,336 parameters, 22 tensors).
pub fn vgg11() -> Layout {
    let mut t = Vec::new();
    let mut cin = 3;
    // torchvision's feature indices: convs at 0, 3, 6, 8, 11, 13, 16, 18.
    for (idx, cout) in [
        (0, 64),
        (3, 128),
        (6, 256),
        (8, 256),
        (11, 512),
        (13, 512),
        (16, 512),
        (18, 512),
    ] {
        t.push(TensorSpec::conv2d(
            format!("features.{idx}.weight"),
            [cout, cin, 3, 3],
        ));
        t.push(TensorSpec::dense(format!("features.{idx}.bias"), [cout]));
        cin = cout;
    }
    for (idx, (o, i)) in [
        (0, (4096, 512 * 7 * 7)),
        (3, (4096, 4096)),
        (6, (1000, 4096)),
    ] {
        t.push(TensorSpec::dense(
            format!("classifier.{idx}.weight"),
            [o, i],
        ));
        t.push(TensorSpec::dense(format!("classifier.{idx}.bias"), [o]));
    }
    finish(t)
}

/// A small CNN-shaped layout (about 60k parameters) for quick tests.
pub fn tiny() -> Layout {
    finish(vec![
        TensorSpec::conv2d("conv1.weight", [16, 3, 3, 3]),
        TensorSpec::dense("conv1.bias", [16]),
        TensorSpec::conv2d("conv2.weight", [32, 16, 3, 3]),
        TensorSpec::dense("conv2.bias", [32]),
        TensorSpec::dense("fc.weight", [10, 32 * 16 * 10]),
        TensorSpec::dense("fc.bias", [10]),
    ])
}

/// Seeded synthetic gradients in `layout`'s order, shaped like real ones:
/// per tensor a log-uniform scale in [1e-4, 1e-1], per block of 256
/// values a factor in [1, 8] (so chunks' contributions differ), per value a
/// heavy-tailed magnitude (`u^-1/2 - 1`, a Pareto-like tail) and a sign.
/// No value is zero, so a zero in a rebuilt tensor can only mean "not
/// received".
pub fn gradients(layout: &Layout, seed: u64) -> Vec<Vec<f32>> {
    (0..layout.len())
        .map(|t| {
            let mut rng = SplitMix64::new(seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let scale = 10f32.powf(-4.0 + 3.0 * rng.next_f64() as f32);
            let mut block = 1.0;
            (0..layout.tensor_len(t))
                .map(|i| {
                    if i % 256 == 0 {
                        block = 1.0 + 7.0 * rng.next_f64() as f32;
                    }
                    let bits = rng.next_u64();
                    let u = (crate::rng::unit(bits) as f32).max(1e-6);
                    let sign = if bits & 1 == 0 { 1.0 } else { -1.0 };
                    sign * scale * block * (u.sqrt().recip() - 1.0 + 1e-3)
                })
                .collect()
        })
        .collect()
}
