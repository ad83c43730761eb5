//! The wire format: each bad field its own error, and no input can panic.

use gradlane_core::format::ValueFormat;
use gradlane_core::layout::{ChunkOptions, Layout, TensorSpec};
use gradlane_core::payload;
use gradlane_core::presets;
use gradlane_core::wire::{self, DataHeader, RoundEnd, Segment, WireError, DATA_HEADER_LEN};
use proptest::prelude::*;

fn layout() -> Layout {
    Layout::new(vec![
        TensorSpec::dense("a", [1000]),
        TensorSpec::conv2d("b", [4, 3, 3, 3]),
    ])
    .unwrap()
}

fn header() -> DataHeader {
    // Tensor 0 (1000 values, block 256): chunks 0..=3; bytes 1024..2048 are chunk 1.
    DataHeader {
        layout: 3,
        class: 2,
        format: ValueFormat::F32,
        round: 9,
        tensor: 0,
        chunk: 1,
        first_chunk: 0,
        last_chunk: 3,
        tensor_bytes: 4000,
        byte_offset: 1024,
        payload_len: 8,
    }
}

fn encode(h: &DataHeader) -> Vec<u8> {
    let mut b = vec![0u8; DATA_HEADER_LEN + h.payload_len as usize];
    h.write(&mut b);
    b
}

#[test]
fn a_valid_segment_round_trips() {
    let h = header();
    let mut b = encode(&h);
    b[DATA_HEADER_LEN..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let (seg, used) = wire::decode(&b).unwrap();
    assert_eq!(used, b.len());
    assert_eq!(seg, Segment::Data(h, &[1, 2, 3, 4, 5, 6, 7, 8][..]));
    let plan = layout().plan(ChunkOptions::default()).unwrap();
    assert_eq!(h.validate(&plan), Ok(2));
    assert_eq!(wire::segment_len(&b[..DATA_HEADER_LEN]), Ok(Some(b.len())));
    assert_eq!(wire::segment_len(&b[..7]), Ok(None));

    let end = RoundEnd {
        layout: 65535,
        round: 4,
        levels: 3,
        important_digest: 77,
        chunks: [3, 1, 1, 0, 0, 0, 0, 0],
        bytes: [12, 4, 400, 0, 0, 0, 0, 0],
        packets: [1, 1, 2, 0, 0, 0, 0, 0],
    };
    let b = end.to_bytes();
    assert_eq!(wire::decode(&b).unwrap(), (Segment::RoundEnd(end), b.len()));
}

fn h_values(
    plan: &gradlane_core::layout::ChunkPlan,
    format: ValueFormat,
    len: u32,
) -> Result<u32, WireError> {
    DataHeader {
        format,
        payload_len: len,
        ..header()
    }
    .values(plan)
}

#[test]
fn every_bad_field_has_its_own_error() {
    let plan = layout().plan(ChunkOptions::default()).unwrap();
    let structural = |mutate: &dyn Fn(&mut Vec<u8>)| {
        let mut b = encode(&header());
        mutate(&mut b);
        wire::decode(&b).map(|_| ()).unwrap_err()
    };
    assert_eq!(structural(&|b| b[0] = 0), WireError::BadMagic(0x4C00));
    // Version 1 (every value f32, byte 5 reserved) is not misread.
    assert_eq!(structural(&|b| b[2] = 1), WireError::Version(1));
    assert_eq!(structural(&|b| b[3] = 9), WireError::Kind(9));
    assert_eq!(structural(&|b| b[4] = 8), WireError::Class(8));
    assert_eq!(structural(&|b| b[5] = 4), WireError::Format(4));
    assert_eq!(
        structural(&|b| {
            b[4] = 0;
            b[5] = ValueFormat::Log8.code();
        }),
        WireError::LossyOnlyFormat(ValueFormat::Log8)
    );
    // Bytes 6-7 are the layout: any value decodes, and a link routes by it.
    let mut b = encode(&header());
    b[7] = 1;
    assert_eq!(wire::layout_of(&b), Some(256 + 3));
    assert_eq!(wire::layout_of(&b[..7]), None);
    assert_eq!(
        structural(&|b| b.truncate(20)),
        WireError::Truncated { need: 40, have: 20 }
    );
    assert_eq!(
        structural(&|b| b.truncate(44)),
        WireError::Truncated { need: 48, have: 44 }
    );
    let with = |f: fn(&mut DataHeader)| {
        let mut h = header();
        f(&mut h);
        let b = encode(&h);
        match wire::decode(&b) {
            Err(e) => e,
            Ok(_) => h.validate(&plan).unwrap_err(),
        }
    };
    assert_eq!(with(|h| h.payload_len = 0), WireError::EmptyPayload);
    assert_eq!(h_values(&plan, ValueFormat::Bf16, 8), Ok(4));
    assert_eq!(
        with(|h| {
            h.format = ValueFormat::Bf16;
            h.payload_len = 5;
        }),
        WireError::Misaligned {
            offset: 1024,
            len: 5
        }
    );
    // Bf16 covers twice its bytes: 8 bytes from 3996 run past the end.
    assert_eq!(
        with(|h| {
            h.format = ValueFormat::Bf16;
            h.byte_offset = 3996;
            h.chunk = 3;
            h.payload_len = 4;
        }),
        WireError::OutOfRange {
            offset: 3996,
            len: 4,
            tensor_bytes: 4000
        }
    );
    assert_eq!(
        with(|h| {
            h.format = ValueFormat::Log8;
            h.payload_len = 4;
        }),
        WireError::Payload(payload::PayloadError::Log8Section { first: 256 })
    );
    assert_eq!(
        with(|h| h.payload_len = 6),
        WireError::Misaligned {
            offset: 1024,
            len: 6
        }
    );
    assert_eq!(
        with(|h| h.byte_offset = 1026),
        WireError::Misaligned {
            offset: 1026,
            len: 8
        }
    );
    assert_eq!(
        with(|h| h.payload_len = 2 << 20),
        WireError::PayloadTooLarge(2 << 20)
    );
    assert_eq!(
        with(|h| h.byte_offset = 3996),
        WireError::OutOfRange {
            offset: 3996,
            len: 8,
            tensor_bytes: 4000
        }
    );
    assert_eq!(
        with(|h| h.chunk = 5),
        WireError::ChunkOrder {
            chunk: 5,
            first: 0,
            last: 3
        }
    );
    assert_eq!(with(|h| h.tensor = 7), WireError::UnknownTensor(7));
    assert_eq!(
        with(|h| h.tensor_bytes = 8000),
        WireError::TensorSize {
            tensor: 0,
            expected: 4000,
            got: 8000
        }
    );
    assert_eq!(
        with(|h| h.last_chunk = 2),
        WireError::ChunkSpan {
            tensor: 0,
            first: 0,
            last: 2
        }
    );
    assert_eq!(
        with(|h| h.chunk = 2),
        WireError::ChunkMismatch {
            tensor: 0,
            chunk: 2,
            offset: 1024
        }
    );

    let mut end = RoundEnd {
        round: 1,
        levels: 3,
        ..Default::default()
    }
    .to_bytes();
    end[4] = 0;
    assert_eq!(wire::decode(&end).unwrap_err(), WireError::Class(0));
    let bad = RoundEnd {
        round: 1,
        levels: 2,
        chunks: [0, 0, 0, 5, 0, 0, 0, 0], // level 3 of a 2-level round
        bytes: [0, 0, 0, 20, 0, 0, 0, 0],
        packets: [0, 0, 0, 1, 0, 0, 0, 0],
        ..Default::default()
    };
    assert_eq!(
        wire::decode(&bad.to_bytes()).unwrap_err(),
        WireError::BadRoundEnd
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let plan = presets::tiny().plan(ChunkOptions::default()).unwrap();
        for seg in wire::decode_all(&bytes) {
            if let Ok(Segment::Data(h, payload)) = seg {
                prop_assert_eq!(payload.len(), h.payload_len as usize);
                let _ = h.validate(&plan);
            }
        }
        let _ = wire::segment_len(&bytes);
    }

    /// Payloads of every format, any bytes: a value count or an error,
    /// and what `check` passes reads without a panic.
    #[test]
    fn arbitrary_payloads_never_panic(
        format in 0u8..4,
        first in 0u32..1100,
        bytes in prop::collection::vec(any::<u8>(), 1..2000),
    ) {
        let plan = layout().plan(ChunkOptions::default()).unwrap();
        let format = ValueFormat::from_code(format).unwrap();
        let t = (first >= 1000) as usize;
        let first = first % 1000;
        if let Ok(n) = payload::value_count(format, &plan, t, first, bytes.len() as u32) {
            if payload::check(format, &plan, t, first, &bytes).is_ok() {
                let mut out = vec![0f32; n as usize];
                payload::read(format, &plan, t, first, &bytes, &mut out);
            }
        }
    }

    #[test]
    fn mutated_segments_never_panic(
        at in 0usize..48,
        value in any::<u8>(),
        cut in 0usize..60,
    ) {
        // Start from a valid segment so mutations reach the deeper checks.
        let plan = layout().plan(ChunkOptions::default()).unwrap();
        let mut b = encode(&header());
        let n = b.len();
        b[at % n] = value;
        b.truncate(cut.max(1));
        if let Ok((Segment::Data(h, _), used)) = wire::decode(&b) {
            prop_assert!(used <= b.len());
            let _ = h.validate(&plan);
        }
    }
}
