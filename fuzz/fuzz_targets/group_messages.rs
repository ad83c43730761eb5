//! Any bytes into the group's text messages (the rendezvous hello and
//! address table, the path offer and path hello) and the sparse shape:
//! typed errors, never a panic; what decodes encodes back to itself, and
//! stays inside the bounds the decoders promise.
#![no_main]

use gradlane_core::group::{
    AddressTable, MeshHello, PathHello, PathOffer, SparseShape, MAX_SOCKETS, MAX_WORLD,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = MeshHello::decode(data) {
        assert!(hello.rank < hello.world && hello.world <= MAX_WORLD);
        assert_eq!(MeshHello::decode(&hello.encode()), Ok(hello));
    }
    // The table for the group size the first byte picks.
    if let Some((&world, rest)) = data.split_first() {
        if let Ok(table) = AddressTable::decode(rest, world as usize) {
            assert_eq!(table.0.len(), world as usize);
            assert_eq!(AddressTable::decode(&table.encode(), world as usize), Ok(table));
        }
    }
    if let Ok(offer) = PathOffer::decode(data) {
        assert!((1..=MAX_SOCKETS).contains(&offer.paths) && offer.ports.len() < MAX_SOCKETS);
        assert_eq!(PathOffer::decode(&offer.encode()), Ok(offer));
    }
    if let Ok(hello) = PathHello::decode(data) {
        assert_eq!(PathHello::decode(&hello.encode()), Ok(hello));
    }
    if let Ok(shape) = SparseShape::decode(data) {
        assert!(shape.count.saturating_mul(8) <= u32::MAX as u64);
        assert_eq!(SparseShape::decode(&shape.encode()), Ok(shape));
    }
});
