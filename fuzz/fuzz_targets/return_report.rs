//! Any bytes into a peer's return report, for a group and shards the
//! input's first bytes pick: a typed error, or a report whose every id is
//! inside its shard and ascending, never a panic. What a rank encodes
//! reads back as it was.
#![no_main]

use gradlane_core::group::{encode_return_report, ReturnReport};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&[ranks, shape], message)) = data.split_first_chunk::<2>() else {
        return;
    };
    let world = (ranks % 4 + 1) as usize;
    let (me, from) = ((ranks >> 2) as usize % world, (ranks >> 4) as usize % world);
    let chunks: Vec<usize> = (0..world).map(|r| (shape as usize >> r) % 9).collect();
    if let Ok(report) = ReturnReport::parse((me, from, world), message, &chunks) {
        assert!(report.lost.iter().all(|&id| (id as usize) < chunks[from]));
        assert_eq!(report.missed.len(), world);
        for (owner, ids) in report.missed.iter().enumerate() {
            assert!(ids.windows(2).all(|w| w[0] < w[1]));
            assert!(ids.iter().all(|&id| (id as usize) < chunks[owner]));
        }
    }
    // The message's bytes as lists: what a rank encodes parses.
    let pick = |of: usize, salt: usize| -> Vec<u32> {
        (0..chunks[of] as u32)
            .filter(|&c| message.get((c as usize + salt) % message.len().max(1)).is_some_and(|b| b % 2 == 1))
            .collect()
    };
    let lost: Vec<Vec<u32>> = (0..world).map(|q| pick(from, q)).collect();
    let missed: Vec<Vec<u32>> = (0..world).map(|o| pick(o, o + 7)).collect();
    let encoded = encode_return_report(&lost, &missed);
    let report = ReturnReport::parse((me, from, world), &encoded, &chunks).expect("own bytes");
    assert_eq!(report.lost, lost[me]);
    assert_eq!(report.missed, missed);
});
