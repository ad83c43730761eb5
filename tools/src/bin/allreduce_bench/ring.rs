//! The reference: a ring allreduce over kernel TCP, its ranks joined on
//! loopback or across processes. It shares no code with the QUIC variants.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::BoxError;
use futures_util::future::join_all;
use gradlane::Group;
use gradlane_tools::cli as common;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::placement::Placement;

/// One rank of a ring over kernel TCP.
pub(crate) struct Ring {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) next: TcpStream,
    pub(crate) prev: TcpStream,
    pub(crate) sent: u64,
}

/// This process's ranks joined in a ring of TCP connections: all of them
/// on loopback, or this process's one rank listening at its address,
/// port `master_port + 100 + rank`, having learnt the others' addresses
/// through `control`.
pub(crate) async fn ring(
    place: &Placement,
    control: Option<&mut Group>,
) -> Result<Vec<Ring>, BoxError> {
    let world = place.world;
    let (listeners, addrs) = match (&place.across, control) {
        (Some(a), Some(control)) => {
            let std::net::IpAddr::V4(ip) = a.listen else {
                return Err("the TCP ring across processes takes IPv4 addresses".into());
            };
            let port = a.port + 100;
            let listener = TcpListener::bind((ip, port + place.first as u16)).await?;
            // Each rank's IPv4 address in two 16-bit halves, exact in f32s.
            let o = ip.octets();
            let mine = [
                f32::from(u16::from_be_bytes([o[0], o[1]])),
                f32::from(u16::from_be_bytes([o[2], o[3]])),
            ];
            let mut all = vec![0f32; 2 * world];
            control.allgather(&mine, &mut all).await?;
            let addrs = all
                .chunks(2)
                .enumerate()
                .map(|(r, h)| {
                    let [a, b] = (h[0] as u16).to_be_bytes();
                    let [c, d] = (h[1] as u16).to_be_bytes();
                    SocketAddr::from(([a, b, c, d], port + r as u16))
                })
                .collect();
            (vec![listener], addrs)
        }
        _ => {
            let mut listeners = Vec::new();
            for _ in 0..world {
                listeners.push(TcpListener::bind("127.0.0.1:0").await?);
            }
            let addrs: Vec<SocketAddr> = listeners
                .iter()
                .map(|l| l.local_addr())
                .collect::<Result<_, _>>()?;
            (listeners, addrs)
        }
    };
    let connects = place
        .ranks()
        .map(|r| connect_retrying(addrs[(r + 1) % world]));
    let accepts = listeners.iter().map(|l| l.accept());
    let (nexts, prevs) = tokio::join!(join_all(connects), join_all(accepts));
    let mut ring = Vec::new();
    for (r, (next, prev)) in place.ranks().zip(nexts.into_iter().zip(prevs)) {
        let (next, (prev, _)) = (next?, prev?);
        next.set_nodelay(true)?;
        ring.push(Ring {
            rank: r,
            world,
            next,
            prev,
            sent: 0,
        });
    }
    Ok(ring)
}

/// Connects to `addr`, trying again for up to 30 s while nothing listens
/// there yet (the next rank may not have bound its port).
pub(crate) async fn connect_retrying(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect(addr).await {
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => return other,
        }
    }
}

impl Ring {
    /// The ring allreduce (mean): N-1 steps of reduce-scatter, N-1 of
    /// allgather, each sending one segment to the next rank while taking
    /// one from the previous.
    pub(crate) async fn allreduce(&mut self, buf: &mut [f32]) -> Result<(), BoxError> {
        let (n, w) = (buf.len(), self.world);
        let seg = |i: usize| (i % w) * n / w..((i % w) + 1) * n / w;
        let mut incoming = vec![0f32; n / w + 1];
        for phase in 0..2 {
            for step in 0..w - 1 {
                let send = seg(self.rank + w - step + if phase == 0 { 0 } else { 1 });
                let recv = seg(self.rank + w - step - 1 + if phase == 0 { 0 } else { 1 });
                let out: Vec<u8> = bytemuck::cast_slice(&buf[send.clone()]).to_vec();
                let into = &mut incoming[..recv.len()];
                let (w_res, r_res) = tokio::join!(
                    self.next.write_all(&out),
                    self.prev.read_exact(bytemuck::cast_slice_mut(into))
                );
                w_res?;
                r_res?;
                self.sent += out.len() as u64;
                match phase {
                    0 => buf[recv.clone()]
                        .iter_mut()
                        .zip(into.iter())
                        .for_each(|(a, b)| *a += b),
                    _ => buf[recv.clone()].copy_from_slice(into),
                }
            }
        }
        let scale = 1.0 / w as f32;
        buf.iter_mut().for_each(|v| *v *= scale);
        Ok(())
    }
}
