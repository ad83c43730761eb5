//! Exact messages beside the rounds: whole, exact, in order, flushed by an
//! orderly close, at any loss.

use crate::common;

use bytes::Bytes;
use common::{pair, quick};
use gradlane::{presets, Faults, LinkError};

fn body(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_arrive_whole_exact_and_in_order_under_loss() {
    let layout = presets::tiny();
    let faults = Faults::symmetric_loss(0.05, 7);
    let (_se, mut server, _ce, mut client) = pair("messages", &layout, Some(faults), quick()).await;
    // Empty, small, and larger than any window; both directions at once.
    let sizes = [0usize, 1, 1000, 9 << 20, 17];
    let send = async {
        for (i, &n) in sizes.iter().enumerate() {
            client
                .sender()
                .send_message(i as u64, body(n, i as u8))
                .await
                .unwrap();
        }
        let (tag, reply) = client.receiver().recv_message().await.unwrap();
        (tag, reply)
    };
    let recv = async {
        let mut got = Vec::new();
        for _ in &sizes {
            got.push(server.receiver().recv_message().await.unwrap());
        }
        server
            .sender()
            .send_message(99, body(3 << 20, 5))
            .await
            .unwrap();
        got
    };
    let ((tag, reply), got) = tokio::join!(send, recv);
    for (i, (t, b)) in got.iter().enumerate() {
        assert_eq!(*t, i as u64);
        assert_eq!(*b, body(sizes[i], i as u8), "message {i}");
    }
    assert_eq!(tag, 99);
    assert_eq!(reply, body(3 << 20, 5));
}

/// A message sent right before an orderly close still arrives: the close
/// waits until the peer has acknowledged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orderly_close_flushes_the_messages() {
    let layout = presets::tiny();
    let faults = Faults::symmetric_loss(0.1, 9);
    let (_se, mut server, _ce, mut client) =
        pair("msg-close", &layout, Some(faults), quick()).await;
    let last = body(5 << 20, 1);
    client.sender().send_message(1, last.clone()).await.unwrap();
    let closing = async { client.close().await };
    let (closed, got) = tokio::join!(closing, server.receiver().recv_message());
    closed.unwrap();
    assert_eq!(got.unwrap(), (1, last));
    // Then the peer learns of the close.
    assert!(matches!(
        server.receiver().recv_message().await,
        Err(LinkError::PeerClosed { round: None })
    ));
}
