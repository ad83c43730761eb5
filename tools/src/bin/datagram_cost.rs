//! What quinn's datagrams cost against a stream of the same bytes, with no
//! gradlane code on either side: one tuned connection on loopback, the
//! same megabytes sent alternately as one stream and as datagrams of a
//! given size, timed, with the process's CPU time per transfer (in the
//! kernel's 10 ms ticks: use transfers of tens of megabytes). Medians over
//! `--reps` transfers of each, after one untimed pair.
//!
//! ```text
//! cargo run --release --bin datagram_cost -- --size-mb 20 --reps 10
//! ```
//!
//! This is why gradlane carries the lossy levels on streams while the path
//! loses nothing (`LossyCarrier::Adaptive`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use common::BoxError;
use gradlane::quic;
use gradlane::Config;
use tokio::sync::mpsc;

use gradlane_tools::cli as common;
use gradlane_tools::local_certs::localhost_certs;

/// Datagram vs stream cost of quinn on loopback.
#[derive(Debug, Parser)]
#[command(name = "datagram_cost")]
struct Args {
    /// Megabytes (10^6) per transfer.
    #[arg(long, default_value_t = 20)]
    size_mb: usize,
    /// Transfers per kind.
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// Datagram payload in bytes (0: the connection's limit once a first
    /// transfer let MTU discovery run; gradlane's default is the limit at
    /// QUIC's 1200-byte floor, 1162 bytes here).
    #[arg(long, default_value_t = 0)]
    datagram: usize,
}

/// This process's CPU time (user and system) in seconds; 0 where
/// /proc is missing.
fn cpu_seconds() -> f64 {
    // /proc/self/stat fields 14 and 15: utime and stime in clock ticks
    // (100 a second on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn main() -> ExitCode {
    common::main("datagram_cost", run)
}

async fn run(args: Args) -> Result<(), BoxError> {
    if args.size_mb == 0 || args.reps == 0 {
        return Err("--size-mb and --reps must be at least 1".into());
    }
    let size = args.size_mb * 1_000_000;
    let (dir, files) = localhost_certs("dgram")?;
    let config = Config::default();
    let local = "127.0.0.1:0".parse()?;
    let server = quic::server(local, &files.server_cert, &files.server_key, &config)?;
    let client = quic::client(local, &files.ca_cert, &config)?;
    let addr = server.local_addr()?;
    let accept = tokio::spawn(async move {
        let incoming = server.accept().await.ok_or("closed")?;
        Ok::<_, BoxError>((server, incoming.await?))
    });
    let conn = client.connect(addr, "localhost")?.await?;
    let (_server, peer) = accept.await??;
    // One untimed transfer first: MTU discovery raises the limit.
    let send = async {
        let mut s = conn.open_uni().await?;
        s.write_all(&vec![0u8; size]).await?;
        s.finish()?;
        Ok::<_, BoxError>(())
    };
    let receive = async {
        peer.accept_uni().await?.read_to_end(size).await?;
        Ok::<_, BoxError>(())
    };
    let (sent, received) = tokio::join!(send, receive);
    sent?;
    received?;
    let max = conn.max_datagram_size().ok_or("no datagrams")?;
    let dsize = if args.datagram == 0 {
        max
    } else {
        args.datagram.min(max)
    };

    // Receivers: stream bytes and datagram bytes, each reporting when a
    // transfer's worth has arrived.
    let (stream_done, mut stream_rx) = mpsc::unbounded_channel();
    let p = peer.clone();
    tokio::spawn(async move {
        while let Ok(mut recv) = p.accept_uni().await {
            let mut got = 0;
            while let Ok(Some(c)) = recv.read_chunk(usize::MAX, true).await {
                got += c.bytes.len();
            }
            let _ = stream_done.send(got);
        }
    });
    let (dgram_done, mut dgram_rx) = mpsc::unbounded_channel();
    let p = peer.clone();
    tokio::spawn(async move {
        let mut got = 0;
        while let Ok(d) = p.read_datagram().await {
            got += d.len();
            if got >= size {
                let _ = dgram_done.send(got);
                got = 0;
            }
        }
    });

    let payload = Bytes::from(vec![0xa5u8; size]);
    let datagrams: Vec<Bytes> = (0..size.div_ceil(dsize))
        .map(|i| payload.slice(i * dsize..((i + 1) * dsize).min(size)))
        .collect();
    let mut stream_t = Vec::new();
    let mut dgram_t = Vec::new();
    for rep in 0..=args.reps {
        let (c0, t0) = (cpu_seconds(), Instant::now());
        let mut s = conn.open_uni().await?;
        s.write_chunk(payload.clone()).await?;
        s.finish()?;
        let got = stream_rx.recv().await.ok_or("stream reader gone")?;
        if got != size {
            return Err(format!("stream: received {got} of {size} bytes").into());
        }
        let stream = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);

        let (c0, t0) = (cpu_seconds(), Instant::now());
        for d in &datagrams {
            conn.send_datagram_wait(d.clone()).await?;
        }
        tokio::time::timeout(Duration::from_secs(10), dgram_rx.recv())
            .await
            .map_err(|_| "datagrams lost (this measures a lossless path)")?
            .ok_or("datagram reader gone")?;
        let dgram = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
        if rep > 0 {
            stream_t.push(stream);
            dgram_t.push(dgram);
        }
    }
    let med = |v: &mut Vec<(f64, f64)>, f: fn(&(f64, f64)) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2] * 1e3
    };
    let (sw, sc) = (med(&mut stream_t, |x| x.0), med(&mut stream_t, |x| x.1));
    let (dw, dc) = (med(&mut dgram_t, |x| x.0), med(&mut dgram_t, |x| x.1));
    println!(
        "{size} bytes a transfer; datagrams of {dsize} bytes (the limit: {max}); \
         path MTU at the end {}",
        conn.stats().path.current_mtu
    );
    println!("| kind | wall ms | cpu ms |\n|---|---:|---:|");
    println!("| stream | {sw:.1} | {sc:.0} |");
    println!("| datagrams | {dw:.1} | {dc:.0} |");
    println!(
        "datagrams / stream: wall {:.2}x, cpu {:.2}x",
        dw / sw,
        dc / sc
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
