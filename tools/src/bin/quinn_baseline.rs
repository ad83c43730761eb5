//! Loopback throughput baseline: tokio TCP vs quinn (default, tuned with
//! Cubic/BBR, and tuned behind seeded loss + delay), side by side in one run.
//!
//! ```text
//! cargo run --release --bin quinn_baseline -- --size-mb 100 --reps 5
//! ```
//!
//! Each rep moves `--size-mb` MB over one stream on a fresh connection (the
//! handshake is not timed) and times from the first write to the receiver
//! having read the last byte. Prints a markdown table of Gbit/s.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use gradlane::Faults;
use gradlane::{quic, CertFiles};
use gradlane::{Config, Congestion};
use gradlane_tools::local_certs::localhost_certs;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Loopback throughput of TCP and quinn configurations.
#[derive(Debug, Parser)]
struct Args {
    /// Megabytes (10^6) per transfer.
    #[arg(long, default_value_t = 100)]
    size_mb: usize,
    /// Repetitions per configuration.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Loss probability each way for the lossy rows.
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// One-way delay in milliseconds added by each side for the lossy rows.
    #[arg(long, default_value_t = 1)]
    delay_ms: u64,
    /// Give up on a transfer after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    /// Only run rows whose name contains this text.
    #[arg(long)]
    only: Option<String>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CHUNK: usize = 1 << 20;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let size = args.size_mb * 1_000_000;
    let (dir, files) = localhost_certs("baseline")?;
    let data = Arc::new(vec![0xa5u8; CHUNK]);
    let limit = Duration::from_secs(args.timeout_s);

    let lossy = Faults {
        loss_out: args.loss,
        loss_in: args.loss,
        delay: Duration::from_millis(args.delay_ms),
        ..Faults::default()
    };
    let lossy_name = format!(
        "{}% loss each way, {} ms delay each way",
        args.loss * 100.0,
        args.delay_ms
    );
    let tuned = |congestion| Config {
        congestion,
        ..Config::default()
    };
    let rows: Vec<(String, Kind)> = vec![
        ("tokio TCP".into(), Kind::Tcp),
        ("quinn default config".into(), Kind::QuinnDefault),
        (
            "quinn tuned, Cubic".into(),
            Kind::Tuned(Box::new(tuned(Congestion::Cubic)), None),
        ),
        (
            "quinn tuned, BBR".into(),
            Kind::Tuned(Box::new(tuned(Congestion::Bbr)), None),
        ),
        (
            format!("quinn tuned, Cubic, {lossy_name}"),
            Kind::Tuned(Box::new(tuned(Congestion::Cubic)), Some(lossy)),
        ),
        (
            format!("quinn tuned, BBR, {lossy_name}"),
            Kind::Tuned(Box::new(tuned(Congestion::Bbr)), Some(lossy)),
        ),
    ];

    let mut table = Vec::new();
    for (name, kind) in rows {
        if args
            .only
            .as_ref()
            .is_some_and(|o| !name.contains(o.as_str()))
        {
            continue;
        }
        let mut rates = Vec::new();
        let mut note = String::new();
        let setup = Setup::new(&kind, &files)?;
        for rep in 0..args.reps {
            let lossy = match &kind {
                Kind::Tuned(_, Some(f)) => Some(Faults {
                    seed: rep as u64,
                    ..*f
                }),
                _ => None,
            };
            match tokio::time::timeout(limit, setup.run(size, &data, lossy)).await {
                Ok(Ok(secs)) => {
                    let gbps = size as f64 * 8.0 / secs / 1e9;
                    eprintln!("{name}: rep {rep}: {gbps:.2} Gbit/s");
                    rates.push(gbps);
                }
                Ok(Err(e)) => {
                    eprintln!("{name}: rep {rep}: error {e}");
                    note = format!("error: {e}");
                }
                Err(_) => {
                    eprintln!("{name}: rep {rep}: timed out");
                    note = format!("timed out after {}s", args.timeout_s);
                }
            }
        }
        rates.sort_by(f64::total_cmp);
        table.push((name, rates, note));
    }
    let _ = std::fs::remove_dir_all(&dir);

    println!();
    println!(
        "{} MB per transfer, {} reps, loopback, one stream",
        args.size_mb, args.reps
    );
    println!();
    println!("| configuration | median Gbit/s | min | max | note |");
    println!("|---|---:|---:|---:|---|");
    for (name, rates, note) in table {
        let cell = |x: Option<&f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
        println!(
            "| {name} | {} | {} | {} | {note} |",
            cell(rates.get(rates.len() / 2)),
            cell(rates.first()),
            cell(rates.last())
        );
    }
    Ok(())
}

enum Kind {
    Tcp,
    QuinnDefault,
    Tuned(Box<Config>, Option<Faults>),
}

/// Long-lived pieces of one configuration (certs, tuned configs). Endpoints
/// are made per rep so each lossy rep gets its own seeded sockets.
struct Setup<'a> {
    kind: &'a Kind,
    files: &'a CertFiles,
}

impl<'a> Setup<'a> {
    fn new(kind: &'a Kind, files: &'a CertFiles) -> Result<Self, BoxError> {
        Ok(Self { kind, files })
    }

    /// One timed transfer; returns seconds.
    async fn run(
        &self,
        size: usize,
        data: &Arc<Vec<u8>>,
        faults: Option<Faults>,
    ) -> Result<f64, BoxError> {
        let local: SocketAddr = "127.0.0.1:0".parse()?;
        match self.kind {
            Kind::Tcp => tcp(size, data).await,
            Kind::QuinnDefault => {
                let server = quinn::Endpoint::server(
                    quic::server_config(&self.files.server_cert, &self.files.server_key)?,
                    local,
                )?;
                let mut client = quinn::Endpoint::client(local)?;
                client.set_default_client_config(quic::client_config(&self.files.ca_cert)?);
                quic(&server, &client, size, data).await
            }
            Kind::Tuned(config, _) => {
                // Only the client drops (each outgoing and each incoming
                // packet with probability `loss`), so each direction loses
                // `loss`, as in round_bench; dropping on both ends would lose
                // about twice that per direction. Both ends add the delay.
                let server_faults = faults.map(|f| Faults {
                    loss_out: 0.0,
                    loss_in: 0.0,
                    seed: f.seed ^ 0x5eed,
                    ..f
                });
                let files = &self.files;
                let server_config = Config {
                    faults: server_faults,
                    ..(**config).clone()
                };
                let client_config = Config {
                    faults,
                    ..(**config).clone()
                };
                let server =
                    quic::server(local, &files.server_cert, &files.server_key, &server_config)?;
                let client = quic::client(local, &files.ca_cert, &client_config)?;
                quic(&server, &client, size, data).await
            }
        }
    }
}

async fn tcp(size: usize, data: &Arc<Vec<u8>>) -> Result<f64, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await?;
        let mut buf = vec![0u8; CHUNK];
        let mut got = 0;
        loop {
            let n = sock.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok::<_, std::io::Error>((got, Instant::now()))
    });
    let mut sock = tokio::net::TcpStream::connect(addr).await?;
    let start = Instant::now();
    let mut left = size;
    while left > 0 {
        let n = left.min(data.len());
        sock.write_all(&data[..n]).await?;
        left -= n;
    }
    sock.shutdown().await?;
    let (got, end) = reader.await??;
    if got != size {
        return Err(format!("tcp: received {got} of {size} bytes").into());
    }
    Ok(end.duration_since(start).as_secs_f64())
}

async fn quic(
    server: &quinn::Endpoint,
    client: &quinn::Endpoint,
    size: usize,
    data: &Arc<Vec<u8>>,
) -> Result<f64, BoxError> {
    let server_addr = server.local_addr()?;
    let accept = {
        let server = server.clone();
        tokio::spawn(async move {
            let incoming = server.accept().await.ok_or("server endpoint closed")?;
            let conn = incoming.await?;
            Ok::<_, BoxError>(conn)
        })
    };
    let conn = client.connect(server_addr, "localhost")?.await?;
    let server_conn = accept.await??;
    let reader = tokio::spawn(async move {
        let mut recv = server_conn.accept_uni().await?;
        let mut got = 0;
        while let Some(chunk) = recv.read_chunk(usize::MAX, true).await? {
            got += chunk.bytes.len();
        }
        let end = Instant::now();
        Ok::<_, BoxError>((got, end, server_conn))
    });
    let start = Instant::now();
    let mut send = conn.open_uni().await?;
    let mut left = size;
    while left > 0 {
        let n = left.min(data.len());
        send.write_all(&data[..n]).await?;
        left -= n;
    }
    send.finish()?;
    let (got, end, server_conn) = reader.await??;
    if got != size {
        return Err(format!("quic: received {got} of {size} bytes").into());
    }
    conn.close(0u32.into(), b"done");
    server_conn.close(0u32.into(), b"done");
    client.wait_idle().await;
    Ok(end.duration_since(start).as_secs_f64())
}
