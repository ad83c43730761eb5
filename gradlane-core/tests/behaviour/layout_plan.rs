//! Chunk plans and framing cover every byte exactly once.

use gradlane_core::classify::{Class, ClassifyConfig};
use gradlane_core::encode::{frame_with_classes, Encoder, EncoderConfig};
use gradlane_core::layout::{ChunkOptions, ConvChunking, Layout, TensorKind, TensorSpec};
use gradlane_core::presets;
use gradlane_core::wire::{self, Segment};
use proptest::prelude::*;

/// Every value of every tensor lies in exactly one chunk of the plan.
fn assert_chunks_cover(layout: &Layout, options: ChunkOptions) {
    let plan = layout.plan(options).unwrap();
    for t in 0..layout.len() {
        let mut next = 0u32;
        for id in plan.tensor_chunks(t) {
            let c = plan.chunks()[id];
            assert_eq!(c.tensor as usize, t);
            assert_eq!(
                c.start, next,
                "chunk {id} of tensor {t} leaves a gap or overlaps"
            );
            assert!(c.len > 0);
            next += c.len;
        }
        assert_eq!(
            next as usize,
            layout.tensor_len(t),
            "tensor {t} not fully covered"
        );
    }
}

/// Every byte of every tensor is carried by exactly one segment payload, the
/// payload holds the right values, and every header validates.
fn assert_packets_cover(layout: &Layout, classes: &[Class], levels: u8, max_datagram: usize) {
    let plan = layout.plan(ChunkOptions::default()).unwrap();
    let grads = gradlane_core::presets::gradients(layout, 7);
    let enc = frame_with_classes(&plan, 3, &grads, classes, levels, max_datagram).unwrap();
    let mut count: Vec<Vec<u8>> = (0..layout.len())
        .map(|t| vec![0; layout.tensor_len(t)])
        .collect();
    let mut check = |buf: &[u8], lossy: bool| {
        for seg in wire::decode_all(buf) {
            match seg.unwrap() {
                Segment::Data(h, payload) => {
                    h.validate(&plan).unwrap();
                    assert_eq!(lossy, h.class != 0);
                    assert_eq!(h.round, 3);
                    let t = h.tensor as usize;
                    let off = h.byte_offset as usize / 4;
                    for (i, v) in payload.chunks_exact(4).enumerate() {
                        count[t][off + i] += 1;
                        let v = f32::from_le_bytes(v.try_into().unwrap());
                        assert_eq!(v.to_bits(), grads[t][off + i].to_bits());
                        // The class in the header is the chunk's class.
                        let id = plan.chunk_at(t, (4 * (off + i)) as u32).unwrap();
                        assert_eq!(classes[id], h.class);
                    }
                }
                Segment::RoundEnd(end) => {
                    assert!(!lossy);
                    assert_eq!(end, enc.end);
                }
            }
        }
    };
    check(&enc.reliable, false);
    for (l, datagrams) in enc.lossy.iter().enumerate() {
        assert_eq!(datagrams.len() as u32, enc.end.packets[l + 1]);
        for d in datagrams {
            assert!(
                d.len() <= max_datagram,
                "datagram of {} > {max_datagram}",
                d.len()
            );
            check(d, true);
        }
    }
    for (t, c) in count.iter().enumerate() {
        if let Some(i) = c.iter().position(|&n| n != 1) {
            panic!("tensor {t} value {i} carried {} times", c[i]);
        }
    }
}

fn mixed_classes(n: usize, levels: u8, seed: u64) -> Vec<Class> {
    let mut rng = gradlane_core::rng::SplitMix64::new(seed);
    (0..n)
        .map(|_| {
            let s = rng.next_u64();
            (s % (levels as u64 + 1)) as Class
        })
        .collect()
}

#[test]
fn presets_have_their_published_sizes() {
    assert_eq!(presets::resnet18().total_values(), 11_689_512);
    assert_eq!(presets::resnet50().total_values(), 25_557_032);
    assert_eq!(presets::vgg11().total_values(), 132_863_336);
    assert_eq!(presets::resnet50().len(), 161);
}

#[test]
fn presets_chunks_cover_every_value_once() {
    for name in presets::NAMES {
        let layout = presets::by_name(name).unwrap();
        assert_chunks_cover(&layout, ChunkOptions::default());
        assert_chunks_cover(
            &layout,
            ChunkOptions {
                conv: ConvChunking::PerSlice,
                block_values: 100,
            },
        );
    }
}

#[test]
fn presets_packets_cover_every_byte_once() {
    for (name, datagram) in [("resnet18", 1162), ("resnet50", 1414), ("vgg11", 1200)] {
        let layout = presets::by_name(name).unwrap();
        let n = layout.plan(ChunkOptions::default()).unwrap().len();
        assert_packets_cover(&layout, &mixed_classes(n, 3, 11), 3, datagram);
    }
}

#[test]
fn encoder_output_covers_every_byte_once() {
    // Through the real scorer and classifier, not hand-picked classes.
    let layout = presets::resnet18();
    let grads = gradlane_core::presets::gradients(&layout, 1);
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let out = enc.encode(0, &grads, 1162).unwrap();
    assert_packets_cover(&layout, &out.classes, 3, 1162);
    // And the stream carries ceil(0.8 * n) of each tensor's chunks.
    let plan = enc.plan();
    let expected: u32 = (0..plan.tensor_count())
        .map(|t| (plan.tensor_chunks(t).len() as f64 * 0.8).ceil() as u32)
        .sum();
    assert_eq!(out.end.chunks[0], expected);
}

#[test]
fn conv_chunks_are_the_output_channels_kernels() {
    let layout = presets::resnet50();
    let plan = layout.plan(ChunkOptions::default()).unwrap();
    let grads = gradlane_core::presets::gradients(&layout, 3);
    let mut convs = 0;
    for (t, spec) in layout.tensors().iter().enumerate() {
        if spec.kind != TensorKind::Conv2d {
            continue;
        }
        convs += 1;
        let [out, cin, kh, kw] = spec.shape[..] else {
            panic!()
        };
        let ids = plan.tensor_chunks(t);
        assert_eq!(
            ids.len(),
            out,
            "{} should have one chunk per output channel",
            spec.name
        );
        for (o, id) in ids.enumerate() {
            let c = plan.chunks()[id];
            let k = cin * kh * kw;
            assert_eq!((c.start as usize, c.len as usize), (o * k, k));
            // Row-major [out, in, kh, kw]: output channel o's kernel is
            // exactly these values.
            let kernel: Vec<f32> = (0..cin)
                .flat_map(|i| {
                    (0..kh).flat_map(move |y| (0..kw).map(move |x| ((i * kh) + y) * kw + x))
                })
                .map(|j| grads[t][o * k + j])
                .collect();
            assert_eq!(
                &grads[t][c.start as usize..(c.start + c.len) as usize],
                &kernel[..]
            );
        }
    }
    assert_eq!(convs, 53);
}

fn arb_layout() -> impl Strategy<Value = Layout> {
    let spec = prop_oneof![
        (1usize..9, 1usize..9, 1usize..4, 1usize..4)
            .prop_map(|(o, i, h, w)| (TensorKind::Conv2d, vec![o, i, h, w])),
        prop::collection::vec(1usize..40, 1..4).prop_map(|s| (TensorKind::Dense, s)),
        (1usize..3000).prop_map(|n| (TensorKind::Dense, vec![n])),
    ];
    prop::collection::vec(spec, 1..12).prop_map(|specs| {
        let tensors = specs
            .into_iter()
            .enumerate()
            .map(|(i, (kind, shape))| TensorSpec {
                name: format!("t{i}"),
                shape,
                kind,
            })
            .collect();
        Layout::new(tensors).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_layouts_are_covered_once(
        layout in arb_layout(),
        block in 1u32..600,
        per_slice in any::<bool>(),
        levels in 1u8..=7,
        datagram in 44usize..3000,
        seed in any::<u64>(),
    ) {
        let conv = if per_slice { ConvChunking::PerSlice } else { ConvChunking::PerKernel };
        assert_chunks_cover(&layout, ChunkOptions { block_values: block, conv });
        let n = layout.plan(ChunkOptions::default()).unwrap().len();
        assert_packets_cover(&layout, &mixed_classes(n, levels, seed), levels, datagram);
    }
}

#[test]
fn encoder_refuses_a_tiny_datagram_limit() {
    let layout = presets::tiny();
    let grads = gradlane_core::presets::gradients(&layout, 1);
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let err = enc.encode(0, &grads, 44).unwrap_err();
    assert_eq!(
        err.to_string(),
        "datagram limit 44 is below the minimum of 45 bytes"
    );
    let bad = EncoderConfig {
        classify: ClassifyConfig {
            levels: 8,
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(Encoder::new(&layout, bad).is_err());
}

#[test]
fn recycled_buffers_are_reused() {
    let layout = presets::tiny();
    let grads = gradlane_core::presets::gradients(&layout, 1);
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let first = enc.encode(0, &grads, 1200).unwrap();
    let ptr = first.reliable.as_ptr();
    // Still referenced elsewhere: not reused.
    let held = first.lossy[0][0].clone();
    enc.recycle(first);
    assert_ne!(enc.encode(1, &grads, 1200).unwrap().reliable.as_ptr(), ptr);
    drop(held);
    let second = enc.encode(2, &grads, 1200).unwrap();
    let ptr = second.reliable.as_ptr();
    enc.recycle(second);
    let third = enc.encode(3, &grads, 1200).unwrap();
    assert_eq!(third.reliable.as_ptr(), ptr);
    assert_packets_cover(&layout, &third.classes, 3, 1200);
}

#[test]
fn reframing_keeps_every_byte_under_a_smaller_limit() {
    let layout = presets::resnet18();
    let grads = gradlane_core::presets::gradients(&layout, 4);
    let mut enc = Encoder::new(&layout, EncoderConfig::default()).unwrap();
    let out = enc.encode(2, &grads, 1414).unwrap();
    let plan = enc.plan().clone();
    for d in out.lossy.iter().flatten().take(500) {
        let pieces = enc.reframe(d, 1200).unwrap();
        let mut before = Vec::new();
        for seg in wire::decode_all(d) {
            if let Segment::Data(h, p) = seg.unwrap() {
                before.push((h.tensor, h.byte_offset, p.to_vec(), h.class));
            }
        }
        // The pieces, in order, carry the same bytes at the same positions.
        let mut at = 0;
        for p in &pieces {
            assert!(p.len() <= 1200);
            for seg in wire::decode_all(p) {
                let Segment::Data(h, payload) = seg.unwrap() else {
                    panic!()
                };
                h.validate(&plan).unwrap();
                while before[at].2.is_empty() {
                    at += 1;
                }
                let (t, off, bytes, class) = &mut before[at];
                assert_eq!((h.tensor, h.byte_offset, h.class), (*t, *off, *class));
                assert_eq!(&bytes[..payload.len()], payload);
                bytes.drain(..payload.len());
                *off += payload.len() as u32;
            }
        }
        assert!(before.iter().all(|b| b.2.is_empty()), "every byte carried");
    }
    assert!(enc.reframe(&out.lossy[0][0], 43).is_err());
    assert!(enc.reframe(&[1, 2, 3], 1200).is_err());
}
