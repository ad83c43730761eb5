//! The connections of ranks asking to rejoin, taken as they come: each
//! one's handshake and `JoinRequest` complete on a task of its own, so
//! that a collective never waits for one; a member reads the list at the
//! end of its collectives (`rejoin.rs` says the rest).

use super::{tag, Kind};
use crate::endpoint::{Endpoint, Incoming};
use crate::link::Link;
use futures_util::FutureExt;
use gradlane_core::control::codes;
use gradlane_core::group::JoinRequest;
use quinn::VarInt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long a member waits for a connecting rank's request.
const REQUEST_WAIT: Duration = Duration::from_secs(10);

/// The ranks waiting at this member to rejoin: each one's link and
/// request, as the handshakes complete (on tasks of their own, so that a
/// collective never waits for one).
pub(super) type Waiting = Arc<Mutex<Vec<(Link, JoinRequest)>>>;

pub(super) fn lock(w: &Waiting) -> MutexGuard<'_, Vec<(Link, JoinRequest)>> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes the connections the endpoint holds now, without waiting, and
/// completes each on a task: a `JoinRequest` goes to `waiting`, anything
/// else is dropped.
pub(super) fn take_requests(endpoint: &Endpoint, waiting: &Waiting) {
    while let Some(Some(incoming)) = endpoint.incoming().now_or_never() {
        let waiting = waiting.clone();
        tokio::spawn(read_request(incoming, waiting));
    }
}

async fn read_request(incoming: Incoming, waiting: Waiting) {
    let remote = incoming.remote_address();
    let mut link = match incoming.finish().await {
        Ok(link) => link,
        Err(e) => {
            tracing::info!(%remote, %e, "a connection to the group failed its handshake");
            return;
        }
    };
    let got = tokio::time::timeout(REQUEST_WAIT, link.receiver().recv_message()).await;
    let request = match got {
        Ok(Ok((t, body))) if t == tag(0, Kind::Join) => JoinRequest::decode(&body),
        other => {
            tracing::info!(%remote, ?other, "a connection to the group asked nothing");
            return;
        }
    };
    match request {
        Ok(request) => {
            tracing::info!(rank = request.rank, %remote, "a rank asks to rejoin");
            lock(&waiting).push((link, request));
        }
        Err(e) => {
            tracing::info!(%remote, %e, "a malformed request to rejoin");
            refuse(&link, &format!("malformed request to rejoin: {e}"));
        }
    }
}

pub(super) fn refuse(link: &Link, why: &str) {
    link.connection()
        .close(VarInt::from_u32(codes::REMOVED), why.as_bytes());
}
