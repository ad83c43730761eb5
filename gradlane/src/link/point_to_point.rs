//! Point-to-point messages beside the collectives' (torch's send and
//! recv): framed as [`messages`](super::messages) are, on a unidirectional
//! stream of their own that opens with [`POINT_TO_POINT_MAGIC`].
//!
//! The collectives' messages keep one order that every rank follows;
//! point-to-point ones come whenever two ranks choose, so they cannot
//! share that stream without putting a message where a collective expects
//! its own. On their own stream they are whole, exact and in order per
//! link, and a receiver that has not asked for them yet holds back only
//! the sender of more of them (QUIC's flow control on that stream), never
//! the collectives.

use super::messages::{write_message, Message, MessageBody};
use super::*;

/// The first bytes of a point-to-point stream.
pub(super) const POINT_TO_POINT_MAGIC: [u8; 4] = *b"GLp1";

/// Sends point-to-point messages to the link's peer; cloneable, usable
/// from any task beside the link's halves (messages from several tasks
/// each arrive whole, in the order their writes took the stream).
#[derive(Clone)]
pub struct PointToPointSender {
    conn: Connection,
    control: SharedControl,
}

impl PointToPointSender {
    /// Sends one message: it arrives whole, exact and in order with this
    /// end's other point-to-point messages, with `tag`. Returns once quinn
    /// holds all of it.
    pub async fn send(&self, tag: u64, body: Bytes) -> Result<(), LinkError> {
        write_message(
            &self.control.point_to_point,
            &self.conn,
            POINT_TO_POINT_MAGIC,
            tag,
            vec![body],
        )
        .await
    }
}

/// The peer's point-to-point messages, read ahead a few at a time.
pub struct PointToPointReceiver {
    conn: Connection,
    messages: mpsc::Receiver<Message>,
}

impl PointToPointReceiver {
    /// The peer's next point-to-point message: its tag and body; an error
    /// once the link is gone.
    pub async fn recv(&mut self) -> Result<(u64, MessageBody), LinkError> {
        match self.messages.recv().await {
            Some(m) => m,
            None => Err(LinkError::from_conn(self.conn.closed().await)),
        }
    }
}

impl LinkSender {
    /// A sender of point-to-point messages on this link.
    pub fn point_to_point(&self) -> PointToPointSender {
        PointToPointSender {
            conn: self.conn.clone(),
            control: self.control.clone(),
        }
    }
}

impl LinkReceiver {
    /// The receiver of the peer's point-to-point messages: the first call
    /// takes it, later ones get `None`.
    pub fn take_point_to_point(&mut self) -> Option<PointToPointReceiver> {
        Some(PointToPointReceiver {
            conn: self.conn.clone(),
            messages: self.point_to_point.take()?,
        })
    }
}
