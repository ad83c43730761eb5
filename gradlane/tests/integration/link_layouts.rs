//! Several layouts on one link: rounds of each arrive as that layout's,
//! with their own important part exact, at any loss, in one round
//! sequence.

use crate::common;

use common::{bit_equal, pair, quick};
use gradlane::{presets, Faults, Layout, LinkError, TensorSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_of_registered_layouts_arrive_as_theirs() {
    let handshake = presets::tiny();
    let a = Layout::new(vec![
        TensorSpec::conv2d("conv", [32, 16, 3, 3]),
        TensorSpec::dense("bias", [32]),
    ])
    .unwrap();
    let b = Layout::new(vec![TensorSpec::dense("fc", [3000])]).unwrap();
    let faults = Faults::symmetric_loss(0.05, 3);
    let (_se, mut server, _ce, mut client) =
        pair("layouts", &handshake, Some(faults), quick()).await;
    // Unknown before it is registered.
    let g = presets::gradients(&a, 1);
    assert!(matches!(
        client.sender().send_round_on(1, 0, &g).await,
        Err(LinkError::UnknownLayout(1))
    ));
    let ia = client.sender().register_layout(&a).await.unwrap();
    let ib = client.sender().register_layout(&b).await.unwrap();
    assert_eq!((ia, ib), (1, 2));
    let layouts = [(0u16, &handshake), (ia, &a), (ib, &b)];
    for round in 0..9u32 {
        let (id, layout) = layouts[round as usize % 3];
        let grads = presets::gradients(layout, 10 + round as u64);
        let (sent, got) = tokio::join!(
            client.sender().send_round_on(id, round, &grads),
            server.receiver().recv_round()
        );
        let (sent, got) = (sent.unwrap(), got.unwrap());
        assert_eq!((got.index, got.layout), (round, id));
        assert_eq!(got.tensors.len(), layout.len());
        assert_eq!(got.stats.classes[0].received_bytes, sent.important_bytes);
        // What was not zero-filled is exact (rounds of one layout are
        // three rounds apart: late data of the last one may be added in).
        if round < 3 {
            for (t, g) in got.tensors.iter().zip(&grads) {
                for (x, y) in t.iter().zip(g) {
                    assert!(*x == 0.0 || x.to_bits() == y.to_bits(), "round {round}");
                }
            }
        }
        let s = &got.stats;
        for c in 0..=s.levels as usize {
            let k = &s.classes[c];
            assert_eq!(
                k.sent_bytes,
                k.received_bytes + k.zero_filled_bytes,
                "round {round} class {c}"
            );
        }
        // The missing chunks are exactly the zero-filled ones.
        assert_eq!(
            got.missing_chunks.is_empty(),
            s.lossy().zero_filled_bytes == 0
        );
    }
    assert_eq!(server.receiver().counters().malformed, 0);
    // And the other way too: the server registers its own.
    let ic = server.sender().register_layout(&b).await.unwrap();
    assert_eq!(ic, 1);
    let grads = presets::gradients(&b, 99);
    let (sent, got) = tokio::join!(
        server.sender().send_round_on(ic, 0, &grads),
        client.receiver().recv_round()
    );
    let (sent, got) = (sent.unwrap(), got.unwrap());
    assert_eq!((got.layout, got.tensors.len()), (1, 1));
    assert_eq!(got.stats.classes[0].received_bytes, sent.important_bytes);
    assert!(bit_equal(&got.tensors[0], &grads[0]) || !got.missing_chunks.is_empty());
}
