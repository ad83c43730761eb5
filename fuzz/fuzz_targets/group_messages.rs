//! Any bytes into the group's text messages (the rendezvous hello and
//! address table, the path offer and path hello, the view messages of
//! elastic membership) and the sparse shape: typed errors, never a panic;
//! what decodes encodes back to itself, and stays inside the bounds the
//! decoders promise.
#![no_main]

use gradlane_core::group::{
    AddressTable, JoinRequest, Joiners, MeshHello, PathHello, PathOffer, SparseShape,
    ViewDecision, ViewOutcome, ViewProposal, MAX_SOCKETS, MAX_WORLD,
};
use libfuzzer_sys::fuzz_target;

/// Strictly increasing, each below `world`.
fn in_order(ranks: impl IntoIterator<Item = usize>, world: usize) -> bool {
    let mut last = None;
    ranks.into_iter().all(|r| {
        let ok = r < world && last.is_none_or(|l| r > l);
        last = Some(r);
        ok
    })
}

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
    // The view messages, for the group size the first byte picks.
    if let Some((&world, rest)) = data.split_first() {
        let world = world as usize;
        if let Ok(p) = ViewProposal::decode(rest, world) {
            assert!(p.suspects.len() < world && in_order(p.suspects.iter().copied(), world));
            assert_eq!(ViewProposal::decode(&p.encode(), world), Ok(p));
        }
        if let Ok(d) = ViewDecision::decode(rest, world) {
            assert!(in_order(d.members.iter().copied(), world));
            assert!(d.outcome == ViewOutcome::NoQuorum || !d.members.is_empty());
            assert_eq!(ViewDecision::decode(&d.encode(), world), Ok(d));
        }
        match Joiners::decode(rest, world) {
            Ok(j) => {
                assert!(in_order(j.0.iter().map(|&(r, _)| r), world));
                assert_eq!(j.0.is_empty(), rest.is_empty());
                assert_eq!(Joiners::decode(&j.encode(), world), Ok(j));
            }
            Err(_) => assert!(world == 0 || !rest.is_empty()),
        }
    }
    if let Ok(join) = JoinRequest::decode(data) {
        assert!(join.rank < join.world && join.world <= MAX_WORLD);
        assert_eq!(JoinRequest::decode(&join.encode()), Ok(join));
    }
});
