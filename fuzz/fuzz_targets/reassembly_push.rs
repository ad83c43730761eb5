//! A peer's packets into the receiver state machine: the first byte picks
//! the channel of each packet, the next two its length. Whatever arrives,
//! the reassembler counts or refuses it and never panics or writes out of
//! bounds; delivering afterwards must not panic either.
#![no_main]

use gradlane_core::reassembly::{Channel, Reassembler, ReassemblyConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut r) = Reassembler::new(gradlane_core::presets::tiny(), ReassemblyConfig::default())
    else {
        return;
    };
    let mut rest = data;
    while rest.len() >= 3 {
        let channel = if rest[0] & 1 == 0 {
            Channel::Reliable
        } else {
            Channel::Lossy
        };
        let len = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
        let packet = &rest[3..3 + len];
        let _ = r.push(packet, channel);
        rest = &rest[3 + len..];
    }
    for round in 0..4 {
        let _ = r.deliver(round);
    }
});
