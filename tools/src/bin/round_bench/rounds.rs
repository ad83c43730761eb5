//! One round of each kind of variant, timed from the start of sending to
//! the receiver holding it (with `--per-round`, where gradlane's datagrams
//! went), and closing a variant's connection: the part on the clock, apart
//! from the setup in `connect.rs`.

use std::time::{Duration, Instant};

use common::BoxError;
use gradlane_tools::cli as common;
use tokio::io::AsyncWriteExt;

use crate::connect::{GradlaneRun, Runner};
use crate::Bench;

/// One timed round of a variant.
#[derive(Default)]
pub(crate) struct Sample {
    pub(crate) time: f64,
    /// gradlane: when every important chunk was held.
    pub(crate) important: Option<f64>,
    /// gradlane: scoring and classing before the first byte.
    pub(crate) plan: Option<f64>,
    pub(crate) important_bytes: u64,
    pub(crate) zero_filled: u64,
}

impl Runner {
    /// One round, `r` (0 is the warm-up), bounded by `--round-timeout-s`.
    pub(crate) async fn round(&mut self, bench: &Bench, r: usize) -> Result<Sample, BoxError> {
        let limit = Duration::from_secs(bench.args.round_timeout_s);
        tokio::time::timeout(limit, self.round_inner(bench, r))
            .await
            .map_err(|_| format!("round {r} timed out"))?
    }

    pub(crate) async fn round_inner(
        &mut self,
        bench: &Bench,
        r: usize,
    ) -> Result<Sample, BoxError> {
        match self {
            Runner::Gradlane(g) => g.round(bench, r).await,
            Runner::Quinn(q) => {
                let start = Instant::now();
                let mut send = q.conn.open_uni().await?;
                let want = if q.f32s {
                    // What an application holding f32 tensors writes: each
                    // tensor's bytes, which quinn copies into its buffer.
                    let mut n = 0;
                    for t in &bench.grads[r % 2] {
                        let bytes: &[u8] = bytemuck::cast_slice(t.as_slice());
                        send.write_all(bytes).await?;
                        n += bytes.len();
                    }
                    n
                } else {
                    send.write_chunk(q.payload.clone()).await?;
                    q.payload.len()
                };
                send.finish()?;
                let (got, end) = q.done_rx.recv().await.ok_or("receiver gone")?;
                if got != want {
                    return Err(format!("round {r}: received {got} of {want} bytes").into());
                }
                Ok(Sample {
                    time: end.duration_since(start).as_secs_f64(),
                    ..Sample::default()
                })
            }
            Runner::Tcp(t) => {
                let start = Instant::now();
                t.sock.write_all(&t.payload).await?;
                let end = t.done_rx.recv().await.ok_or("tcp receiver gone")?;
                Ok(Sample {
                    time: end.duration_since(start).as_secs_f64(),
                    ..Sample::default()
                })
            }
        }
    }

    pub(crate) async fn stop(self) {
        match self {
            Runner::Gradlane(g) => {
                let _ = g.tx.close().await;
                g.client.wait_idle().await;
            }
            Runner::Quinn(q) => {
                q.conn.close(0u32.into(), b"done");
                q.reader.abort();
                q.client.wait_idle().await;
            }
            Runner::Tcp(t) => {
                drop(t.sock);
                t.reader.abort();
            }
        }
    }
}

impl GradlaneRun {
    pub(crate) async fn round(&mut self, bench: &Bench, r: usize) -> Result<Sample, BoxError> {
        let g = &bench.grads[r % 2];
        let window_before = self.tx.connection().stats().path.cwnd;
        let start = Instant::now();
        let send = async {
            if self.shared {
                self.tx.sender().send_round_shared(r as u32, g).await
            } else {
                let slices: Vec<&[f32]> = g.iter().map(|t| t.as_slice()).collect();
                self.tx.sender().send_round(r as u32, &slices).await
            }
        };
        let (report, received) = tokio::join!(send, async {
            let round = self.rx.receiver().recv_round_timed().await;
            (round, Instant::now())
        });
        let (round, delivered) = received;
        let report = report?;
        let (round, arrival) = round?;
        if round.index != r as u32 {
            return Err(format!("round {r}: received round {}", round.index).into());
        }
        if bench.args.per_round {
            let f = self.client.fault_stats().unwrap_or_default();
            let before = &self.faults_before;
            let lossy = round.stats.lossy();
            eprintln!(
                "  round {r}: lossy on {}, lossy packets sent {} ({:.2} MB), injector dropped {} out / {} in \
                 of {} / {} packets, refused by the system {}, lossy received {:.2} MB, zero-filled {:.2} MB, \
                 late merged into this round {:.2} MB, quinn discarded from its send queue {}, quinn dropped received {} (total), \
                 path MTU {}, black holes detected {} (total), datagram frames sent {} / \
                 received {} (total), packets declared lost {} (total), congestion window {} KB \
                 ({} KB before the round), smoothed RTT {:?}; timeline ms: planned {:.1}, framed {:.1}, lossy released {:.1}, \
                 important held {:.1}, lossy all sent {:.1}, delivered {:.1}",
                if report.lossy_on_stream {
                    "streams"
                } else {
                    "datagrams"
                },
                report.lossy_packets.iter().sum::<u64>(),
                report.lossy_bytes.iter().sum::<u64>() as f64 / 1e6,
                f.segments_dropped_out - before.segments_dropped_out,
                f.datagrams_dropped_in - before.datagrams_dropped_in,
                f.segments_sent - before.segments_sent,
                f.datagrams_received - before.datagrams_received,
                f.segments_send_failed - before.segments_send_failed,
                lossy.received_bytes as f64 / 1e6,
                lossy.zero_filled_bytes as f64 / 1e6,
                lossy.late_merged_bytes as f64 / 1e6,
                report.lossy_dropped_by_quinn,
                self.rx.receiver().datagrams_dropped_by_quinn(),
                self.tx.connection().stats().path.current_mtu,
                self.tx.connection().stats().path.black_holes_detected,
                self.tx.connection().stats().frame_tx.datagram,
                self.rx.connection().stats().frame_rx.datagram,
                self.tx.connection().stats().path.lost_packets,
                self.tx.connection().stats().path.cwnd / 1000,
                window_before / 1000,
                self.tx.connection().stats().path.rtt,
                report.plan.as_secs_f64() * 1e3,
                report.encode.as_secs_f64() * 1e3,
                report.lossy_start.as_secs_f64() * 1e3,
                arrival.important.duration_since(start).as_secs_f64() * 1e3,
                report.total.as_secs_f64() * 1e3,
                delivered.duration_since(start).as_secs_f64() * 1e3,
            );
            self.faults_before = f;
        }
        let sample = Sample {
            time: delivered.duration_since(start).as_secs_f64(),
            important: Some(arrival.important.duration_since(start).as_secs_f64()),
            plan: Some(report.plan.as_secs_f64()),
            important_bytes: report.important_bytes,
            zero_filled: round.stats.lossy().zero_filled_bytes,
        };
        self.rx.receiver().recycle(round.tensors);
        Ok(sample)
    }
}
