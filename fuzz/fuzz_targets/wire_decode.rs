//! Any bytes into the segment decoders, and segments of every value format
//! into the payload decoders: errors, never a panic.
//!
//! The input is read twice. As it is, it goes through every decoder of
//! `wire` (a random header rarely fits a plan, so this mostly exercises the
//! structural checks). Then its first bytes pick a chunk plan, a format
//! code (byte 5 of the header: mostly one of the four, sometimes an
//! unknown one), a class, a tensor and a position, and a header is written
//! that fits the plan there, the rest of the input its payload: so the
//! plan checks of `DataHeader::validate` and the payload decoders
//! (`payload::value_count`, `check`, `read`) see every format with
//! payloads of any length and content, `Log8` sections with any scale
//! and section boundaries included.
//!
//! What a payload that passes the checks must satisfy, beyond not
//! panicking: its wire length is what `payload::wire_len` says for the
//! values it carries, a budget of that length fits them all, `Log8`
//! decodes to finite values, and an element format reads and writes back
//! the same bytes (NaN payloads aside, which conversion may quiet).
#![no_main]

mod shared;

use gradlane_core::format::ValueFormat;
use gradlane_core::layout::{ChunkOptions, ChunkPlan, ConvChunking};
use gradlane_core::payload;
use gradlane_core::wire::{self, DataHeader, Segment, DATA_HEADER_LEN, MAX_SEGMENT_PAYLOAD};
use libfuzzer_sys::fuzz_target;
use shared::layout;
use std::sync::LazyLock;

/// Plans with chunks of 1 value (every value its own `Log8` section) up to
/// larger than any tensor, both convolution cuts. Planned once: the
/// fuzzer's time goes to the decoders.
static PLANS: LazyLock<Vec<ChunkPlan>> = LazyLock::new(|| {
    let layout = layout();
    let mut plans = Vec::new();
    for block_values in [1, 3, 16, 64, 1024] {
        for conv in [ConvChunking::PerKernel, ConvChunking::PerSlice] {
            plans.push(
                layout
                    .plan(ChunkOptions { block_values, conv })
                    .expect("a valid plan"),
            );
        }
    }
    plans
});

fuzz_target!(|data: &[u8]| {
    raw(data);
    fitted(data);
});

/// The bytes as a peer's packet or stream.
fn raw(data: &[u8]) {
    for segment in wire::decode_all(data) {
        match segment {
            Ok(Segment::Data(h, payload)) => {
                for plan in PLANS.iter() {
                    check_payload(plan, h, payload);
                }
            }
            Ok(Segment::RoundEnd(_)) => {}
            Err(_) => break,
        }
    }
    let _ = wire::decode_head(data);
    let _ = wire::segment_len(data);
    let _ = wire::head_len(data);
    let _ = wire::layout_of(data);
}

/// A header written to fit a plan, with the input's tail as its payload.
fn fitted(data: &[u8]) {
    let [plan_pick, code, class, tensor, at_lo, at_hi, payload @ ..] = data else {
        return;
    };
    let plan = &PLANS[*plan_pick as usize % PLANS.len()];
    let tensor = *tensor as usize % plan.tensor_count();
    let values = plan.tensor_bytes(tensor) / 4;
    let first = u32::from(u16::from_le_bytes([*at_lo, *at_hi])) % values;
    let Some(chunk) = plan.chunk_at(tensor, first * 4) else {
        return;
    };
    let span = plan.tensor_chunks(tensor);
    let len = payload.len().min(MAX_SEGMENT_PAYLOAD as usize);
    let header = DataHeader {
        layout: 0,
        // Mostly classes that exist (0 important, 1..=7 lossy), 8 refused.
        class: class % 9,
        format: ValueFormat::F32,
        round: 0,
        tensor: tensor as u32,
        chunk: chunk as u32,
        first_chunk: span.start as u32,
        last_chunk: span.end as u32 - 1,
        tensor_bytes: values * 4,
        byte_offset: first * 4,
        payload_len: len as u32,
    };
    let mut segment = vec![0u8; DATA_HEADER_LEN + len];
    header.write(&mut segment);
    // Byte 5, the format: the four codes mostly, any byte sometimes, so
    // that an unknown code is refused rather than read as some format.
    segment[5] = if *code < 240 { code % 4 } else { *code };
    segment[DATA_HEADER_LEN..].copy_from_slice(&payload[..len]);
    let decoded = wire::decode(&segment);
    if ValueFormat::from_code(segment[5]).is_none() {
        assert!(decoded.is_err(), "an unknown format code was decoded");
    }
    if let Ok((Segment::Data(h, payload), used)) = decoded {
        assert_eq!(used, segment.len());
        check_payload(plan, h, payload);
    }
    // The same segment cut short, as a stream reader meets it.
    let _ = wire::decode(&segment[..segment.len() / 2]);
}

/// A decoded data segment through the plan checks and, if it passes them,
/// the payload decoders.
fn check_payload(plan: &ChunkPlan, h: DataHeader, bytes: &[u8]) {
    let Ok(n) = h.validate(plan) else {
        return;
    };
    let t = h.tensor as usize;
    let first = h.first_value();
    assert_eq!(
        payload::value_count(h.format, plan, t, first, bytes.len() as u32),
        Ok(n)
    );
    if payload::check(h.format, plan, t, first, bytes).is_err() {
        return;
    }
    let mut values = vec![0f32; n as usize];
    payload::read(h.format, plan, t, first, bytes, &mut values);
    assert_eq!(
        payload::wire_len(h.format, plan, t, first, n),
        bytes.len(),
        "{:?}: {n} values from {first} read from a payload of another length",
        h.format
    );
    assert_eq!(
        payload::values_within(h.format, plan, t, first, n, bytes.len()),
        n,
        "{:?}: a budget of the payload's own length does not fit its values",
        h.format
    );
    match h.format.element_bytes() {
        None => assert!(
            values.iter().all(|v| v.is_finite()),
            "log8 decoded a value that is not finite: {values:?}"
        ),
        Some(width) => {
            let mut again = vec![0u8; bytes.len()];
            let mut scales = payload::Log8Scales::default();
            payload::write(
                h.format,
                plan,
                t,
                (first, &values),
                (first, n),
                &mut again,
                &mut scales,
            );
            for (i, (a, b)) in again
                .chunks_exact(width)
                .zip(bytes.chunks_exact(width))
                .enumerate()
            {
                assert!(
                    a == b || values[i].is_nan(),
                    "{:?}: value {i} ({}) wrote back as {a:?}, read from {b:?}",
                    h.format,
                    values[i]
                );
            }
        }
    }
}
