//! Several layouts on one link: the handshake's (id 0) and any a sender
//! registers later, one per gradient bucket, say. Every segment carries its
//! layout's id (`gradlane_core::wire::layout_of`), so one connection, one
//! congestion controller and one set of streams serve them all; each layout
//! has its own encoder (its own contribution history) at the sender and
//! its own reassembler (its own late merges) at the receiver. Round
//! indexes stay one sequence per link.
//!
//! Registering is a control message carrying the layout and its chunking,
//! answered once the peer has made its reassembler, so no segment of a
//! layout ever reaches a peer that does not know it.

use super::*;
use gradlane_core::control::{Hello, MAX_LAYOUT_BYTES};
use gradlane_core::format::ClassFormats;
use gradlane_core::layout::ChunkOptions;
use gradlane_core::reassembly::{ReassemblyConfig, ReceiverCounters};

/// Which of a link's layouts: 0 is the handshake's.
pub type LayoutId = u16;

/// The reassembler of each of the peer's layouts, by id.
pub(super) struct Receivers {
    by_id: Vec<Reassembler>,
    /// The link's receiver limits, for the layouts registered later.
    template: ReassemblyConfig,
}

impl Receivers {
    pub(super) fn new(first: Reassembler, template: ReassemblyConfig) -> Self {
        Self {
            by_id: vec![first],
            template,
        }
    }

    /// The reassembler of layout `id`; a segment of an unknown layout goes
    /// to layout 0's, which refuses and counts it.
    pub(super) fn route(&mut self, id: LayoutId) -> &mut Reassembler {
        let i = match (id as usize) < self.by_id.len() {
            true => id as usize,
            false => 0,
        };
        &mut self.by_id[i]
    }

    /// The reassembler of layout `id`, if registered.
    pub(super) fn get(&mut self, id: LayoutId) -> Option<&mut Reassembler> {
        self.by_id.get_mut(id as usize)
    }

    /// Registers the peer's next layout; ids come in order.
    pub(super) fn add(
        &mut self,
        id: LayoutId,
        hello: Hello,
        merge_late: bool,
    ) -> Result<(), String> {
        if id as usize != self.by_id.len() {
            return Err(format!(
                "layout {id} registered where {} was next",
                self.by_id.len()
            ));
        }
        // Each layout is bounded by the hello's decoder; their sum is
        // bounded here, so a peer cannot size many receivers' buffers.
        let held: u64 = self.by_id.iter().map(|r| r.layout().total_bytes()).sum();
        let bytes = held.saturating_add(hello.layout.total_bytes());
        if bytes > MAX_LAYOUT_BYTES {
            return Err(format!(
                "layout {id} would make the peer's layouts {bytes} bytes in all \
                 (at most {MAX_LAYOUT_BYTES})"
            ));
        }
        let config = ReassemblyConfig {
            chunking: hello.chunking,
            layout_id: id,
            late_window: match merge_late {
                true => self.template.late_window,
                false => 0,
            },
            ..self.template
        };
        let r = Reassembler::new(hello.layout, config).map_err(|e| e.to_string())?;
        self.by_id.push(r);
        Ok(())
    }

    /// Hands a delivered round's tensors back to the reassembler whose
    /// layout has their shapes.
    pub(super) fn recycle(&mut self, mut tensors: Vec<Vec<f32>>) {
        for r in &mut self.by_id {
            match r.recycle(tensors) {
                Ok(()) => return,
                Err(back) => tensors = back,
            }
        }
    }

    /// Every reassembler's counters, summed.
    pub(super) fn counters(&self) -> ReceiverCounters {
        let mut sum = ReceiverCounters::default();
        for c in self.by_id.iter().map(|r| r.counters()) {
            sum.malformed += c.malformed;
            sum.duplicates += c.duplicates;
            sum.late_buffered += c.late_buffered;
            sum.late_dropped_full += c.late_dropped_full;
            sum.late_dropped_bytes += c.late_dropped_bytes;
            sum.too_old += c.too_old;
            sum.too_many_open += c.too_many_open;
            sum.abandoned_rounds += c.abandoned_rounds;
            sum.abandoned_bytes += c.abandoned_bytes;
            sum.stale_ends += c.stale_ends;
        }
        sum
    }

    /// Late bytes waiting in every reassembler.
    pub(super) fn late_buffered_bytes(&self) -> usize {
        self.by_id.iter().map(|r| r.late_buffered_bytes()).sum()
    }
}

impl LinkSender {
    /// Registers another layout for this end's rounds and returns its id
    /// for [`send_round_on`](Self::send_round_on). Returns once the peer
    /// is ready for it (one round trip). Its chunks are cut with the
    /// link's chunking and scored with its own history.
    pub async fn register_layout(&mut self, layout: &Layout) -> Result<LayoutId, LinkError> {
        self.register_layout_with(layout, true, None).await
    }

    /// [`register_layout`](Self::register_layout), choosing whether the
    /// peer adds this layout's late lossy data into its next round
    /// (`merge_late`, the default) or drops it, counted: for a sender that
    /// makes up for lost data itself (error feedback), where merging would
    /// count it twice; and the value formats of its rounds (`None`: the
    /// link's [`Config::formats`](crate::Config::formats)).
    pub async fn register_layout_with(
        &mut self,
        layout: &Layout,
        merge_late: bool,
        formats: Option<ClassFormats>,
    ) -> Result<LayoutId, LinkError> {
        let id = LayoutId::try_from(self.encoders.len())
            .map_err(|_| LinkError::Protocol("more than 65,536 layouts on one link".into()))?;
        let config = EncoderConfig {
            layout_id: id,
            formats: formats.unwrap_or(self.encoder_template.formats),
            ..self.encoder_template
        };
        let encoder = Encoder::new(layout, config)?;
        let hello = Hello {
            layout: layout.clone(),
            chunking: self.encoder_template.chunking,
        };
        let acked = self.tx.acked_notify.notified();
        tokio::pin!(acked);
        acked.as_mut().enable();
        {
            let stream = &mut *self.control.stream.lock().await;
            let message = Control::Layout {
                id,
                merge_late,
                hello,
            };
            write_control(stream, message).await?;
        }
        loop {
            if lock(&self.tx.layouts).contains(&id) {
                break;
            }
            tokio::select! {
                _ = acked.as_mut() => acked.set(self.tx.acked_notify.notified()),
                e = self.conn.closed() => return Err(LinkError::from_conn(e)),
            }
            acked.as_mut().enable();
        }
        self.encoders.push(encoder);
        Ok(id)
    }

    /// The chunking of this end's layouts (the handshake's).
    pub fn chunking(&self) -> ChunkOptions {
        self.encoder_template.chunking
    }

    /// The value formats of this end's rounds, unless a layout was
    /// registered with its own ([`Config::formats`](crate::Config::formats)).
    pub fn formats(&self) -> ClassFormats {
        self.encoder_template.formats
    }

    /// The underlying QUIC connection (for statistics).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Closes the link in order. See [`Link::close`].
    pub async fn close(&self) -> Result<(), LinkError> {
        self.linger.close(CLOSE_WAIT).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradlane_core::layout::{Layout, TensorSpec};

    #[test]
    fn a_peers_layouts_past_the_bound_in_all_are_refused_before_a_receiver_is_made() {
        let tiny = Layout::new(vec![TensorSpec::dense("t", [4])]).unwrap();
        let first = Reassembler::new(tiny.clone(), ReassemblyConfig::default()).unwrap();
        let mut receivers = Receivers::new(first, ReassemblyConfig::default());
        let hello = |layout: Layout| Hello {
            layout,
            chunking: ChunkOptions::default(),
        };
        receivers.add(1, hello(tiny), true).unwrap();
        // 32 tensors of 2 GiB: 64 GiB, which with the two small layouts
        // is over the bound. Layout::new sizes nothing per value.
        let huge: Vec<TensorSpec> = (0..32)
            .map(|i| TensorSpec::dense(format!("w{i}"), [1usize << 29]))
            .collect();
        let err = receivers
            .add(2, hello(Layout::new(huge).unwrap()), true)
            .unwrap_err();
        assert!(err.contains("at most"), "{err}");
        assert!(receivers.get(2).is_none());
    }
}
