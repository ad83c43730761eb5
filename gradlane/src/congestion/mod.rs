//! gradlane's congestion controllers: quinn's own, each with one decision
//! changed by a gate of ours ([`gate`]).
//!
//! - [`capped_bbr`]: BBR with the bound on bytes in flight that quinn's
//!   version lacks (the default).
//! - [`queue_gated_cubic`]: Cubic that reacts to loss only with a queue in
//!   sight, for paths with random loss.

pub(crate) mod capped_bbr;
pub(crate) mod gate;
pub(crate) mod queue_gated_cubic;

use capped_bbr::{CappedBbr, CappedBbrConfig};
use queue_gated_cubic::QueueGatedCubicConfig;
use quinn::congestion::{Bbr, BbrConfig, ControllerFactory, CubicConfig, NewRenoConfig};
use std::sync::Arc;
use std::time::Duration;

/// The congestion controller of a connection. The important stream and
/// the lossy datagrams share it, so under random loss the controller, not
/// retransmission, decides how long a round takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Congestion {
    /// quinn's BBR with its window capped at a gain times the measured
    /// bandwidth-delay product: BBR's rate under random loss, without
    /// filling every queue on the way (quinn 0.11's BBR never bounds its
    /// window). The default; change it only to compare.
    #[default]
    CappedBbr,
    /// quinn's BBR as it is: holds its rate under random loss, but its
    /// window grows without bound and overflows the queues it crosses.
    Bbr,
    /// quinn's CUBIC (quinn's own default): loss-based, so random loss
    /// collapses its rate.
    Cubic,
    /// NewReno: the conservative reference.
    NewReno,
    /// CUBIC told of a loss only when the RTT shows a standing queue or the
    /// loss rate is high: keeps its rate under random loss like BBR and
    /// backs off when a queue fills. On a CPU-bound host the host's own
    /// delay reads as a queue, and it falls behind BBR.
    QueueGatedCubic,
}

impl Congestion {
    /// The quinn factory of this controller.
    pub(crate) fn factory(self) -> Arc<dyn ControllerFactory + Send + Sync> {
        match self {
            Congestion::CappedBbr => Arc::new(CappedBbrConfig::default()),
            Congestion::Bbr => Arc::new(BbrConfig::default()),
            Congestion::Cubic => Arc::new(CubicConfig::default()),
            Congestion::NewReno => Arc::new(NewRenoConfig::default()),
            Congestion::QueueGatedCubic => Arc::new(QueueGatedCubicConfig::default()),
        }
    }
}

/// A snapshot of a connection's congestion controller, for diagnostics
/// (`allreduce_bench --path-stats`): what the window is and why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControllerState {
    /// The window quinn sends under, bytes (after gradlane's gate).
    pub window: u64,
    /// The window of quinn's own controller inside the gate, bytes.
    pub inner_window: u64,
    /// The capped BBR's measured delivery rate, bytes per second.
    pub gate_bandwidth: Option<f64>,
    /// The capped BBR's smallest RTT (its own filter, not quinn's).
    pub gate_min_rtt: Option<Duration>,
    /// The capped BBR's upper bound on the window, bytes.
    pub cap: Option<u64>,
    /// quinn's BBR's state, as `field=value` pairs taken from its `Debug`
    /// output (quinn keeps the fields private): its mode, the smallest RTT
    /// and bandwidth it sizes its window from, its own window and its
    /// loss recovery. Empty for other controllers.
    pub bbr: String,
}

impl std::fmt::Display for ControllerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "window {} B (quinn's {} B",
            self.window, self.inner_window
        )?;
        if !self.bbr.is_empty() {
            write!(f, ": {}", self.bbr)?;
        }
        write!(f, ")")?;
        if let Some(cap) = self.cap {
            write!(f, ", cap {cap} B")?;
        }
        if let (Some(bw), Some(rtt)) = (self.gate_bandwidth, self.gate_min_rtt) {
            write!(f, ", gate {:.1} MB/s min RTT {rtt:?}", bw / 1e6)?;
        }
        Ok(())
    }
}

/// What `connection`'s congestion controller holds now (a copy: quinn
/// hands out a clone of its controller).
pub fn controller_state(connection: &quinn::Connection) -> ControllerState {
    let controller = connection.congestion_state();
    let window = controller.window();
    let any = controller.into_any();
    let (inner, gate) = match any.downcast::<CappedBbr>() {
        Ok(capped) => {
            let gate = capped.gate().clone();
            (capped.into_inner(), Some(gate))
        }
        Err(any) => match any.downcast::<Bbr>() {
            Ok(bbr) => (bbr as Box<dyn quinn::congestion::Controller>, None),
            Err(_) => {
                return ControllerState {
                    window,
                    inner_window: window,
                    ..ControllerState::default()
                }
            }
        },
    };
    let inner_window = inner.window();
    let bbr = match inner.into_any().downcast::<Bbr>() {
        Ok(bbr) => bbr_fields(&format!("{bbr:?}")),
        Err(_) => String::new(),
    };
    ControllerState {
        window,
        inner_window,
        gate_bandwidth: gate.as_ref().and_then(|g| g.bandwidth()),
        gate_min_rtt: gate.as_ref().and_then(|g| g.min_rtt()),
        cap: gate.as_ref().and_then(|g| g.cap()),
        bbr,
    }
}

/// The fields of quinn's BBR that decide its window, from its `Debug`
/// output: `mode`, `min_rtt`, the bandwidth estimate (the first sample of
/// its max filter), `cwnd`, `min_cwnd`, `recovery_state` and
/// `recovery_window`, `is_at_full_bandwidth`.
fn bbr_fields(debug: &str) -> String {
    let field = |name: &str| -> Option<&str> {
        let start = debug.find(&format!(" {name}: "))? + name.len() + 3;
        let rest = &debug[start..];
        let end = rest.find([',', ' ', '}']).unwrap_or(rest.len());
        Some(&rest[..end])
    };
    let bandwidth = debug
        .find("max_filter")
        .and_then(|i| debug[i..].find("value: ").map(|j| i + j + 7))
        .map(|i| {
            let rest = &debug[i..];
            &rest[..rest.find([',', ' ', '}']).unwrap_or(rest.len())]
        });
    let mut out = Vec::new();
    for name in [
        "mode",
        "min_rtt",
        "cwnd",
        "min_cwnd",
        "recovery_state",
        "recovery_window",
        "is_at_full_bandwidth",
    ] {
        if let Some(v) = field(name) {
            out.push(format!("{name}={v}"));
        }
    }
    if let Some(bw) = bandwidth {
        out.push(format!("bw={bw}B/s"));
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn bbr_fields_reads_the_window_and_its_inputs_from_quinns_bbr() {
        let bbr = Arc::new(BbrConfig::default()).build(Instant::now(), 1200);
        let window = bbr.window();
        let bbr = bbr.into_any().downcast::<Bbr>().expect("quinn's BBR");
        let fields = bbr_fields(&format!("{bbr:?}"));
        assert_eq!(
            fields,
            format!(
                "mode=Startup min_rtt=0ns cwnd={window} min_cwnd=4800 \
                 recovery_state=NotInRecovery recovery_window=0 \
                 is_at_full_bandwidth=false bw=0B/s"
            )
        );
    }

    #[test]
    fn bbr_fields_of_something_else_is_empty() {
        assert_eq!(bbr_fields("Cubic { window: 3 }"), "");
    }
}
