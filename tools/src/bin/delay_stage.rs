//! A user-space one-way delay stage on an NFQUEUE, for kernels without
//! netem (scripts/testbed.sh runs one per rank namespace).
//!
//! ```text
//! iptables -t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num 0
//! delay_stage --queue-num 0 --delay-ms 20 --jitter-ms 1 --ready-file /tmp/ready
//! ```
//!
//! Every packet the kernel queues is held and then accepted `--delay-ms`
//! (plus a seeded uniform jitter) after it arrived, in arrival order. The
//! stage speaks the nfnetlink_queue protocol itself over a netlink socket
//! (the workspace forbids `unsafe`, and the `nfq` crate gives no file
//! descriptor to poll or to size): copy mode "metadata only", so no payload
//! crosses into user space, and one batch verdict per wake-up accepts every
//! packet that is due.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use nix::errno::Errno;
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{
    bind, recv, send, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag,
    SockProtocol, SockType,
};
use nix::sys::time::TimeSpec;

/// Delay every packet of an NFQUEUE by --delay-ms (+- --jitter-ms), then
/// accept it.
///
/// Packets leave in the order they came: a packet's release time is
/// max(previous release, arrival + delay + jitter), so jitter never
/// reorders packets (unlike netem's), it only spreads their delays; a
/// packet whose jittered delay would overtake the one before it waits for
/// it. The jitter is uniform in [-J, J] from a generator seeded by --seed,
/// and a delay never goes below 0. So at packet rates well above 1/J the
/// delays bunch towards D + J: each packet waits for the slowest one ahead.
///
/// Needs root (CAP_NET_ADMIN) and an iptables rule that sends packets to
/// the queue, e.g. `iptables -t mangle -A PREROUTING -i eth0 -j NFQUEUE
/// --queue-num 0`. On SIGTERM or SIGINT it accepts what it holds and
/// prints its counters on stderr: packets delayed, the most held at once,
/// and the kernel's drops on this queue (queue full, or the socket's
/// buffer full). On a busy host run it SCHED_FIFO (`chrt -f 10
/// delay_stage ...`): a normal task's wake-ups can come a scheduler tick
/// or more late there.
#[derive(Debug, Parser)]
#[command(name = "delay_stage")]
struct Args {
    /// One-way delay in milliseconds (fractions allowed), 0..=60000.
    #[arg(long, value_parser = parse_ms)]
    delay_ms: f64,
    /// Jitter in milliseconds: each delay is uniform in [D - J, D + J],
    /// clamped at 0.
    #[arg(long, default_value = "0", value_parser = parse_ms)]
    jitter_ms: f64,
    /// Seed of the jitter's generator: the same seed and arrivals give the
    /// same schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// NFQUEUE number to bind (the iptables rule's --queue-num).
    #[arg(long, default_value_t = 0)]
    queue_num: u16,
    /// Packets the kernel queues for this stage before it drops new ones.
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..))]
    queue_max_len: u32,
    /// Receive buffer of the netlink socket in bytes (SO_RCVBUFFORCE), so
    /// a burst is not dropped while the stage is busy.
    #[arg(long, default_value_t = 64 << 20, value_parser = clap::value_parser!(u32).range(65536..))]
    rcvbuf: u32,
    /// File written (with the pid) once the queue is bound, so a script
    /// can wait for it before it adds the iptables rule.
    #[arg(long)]
    ready_file: Option<PathBuf>,
}

fn parse_ms(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of milliseconds"))?;
    if !(0.0..=60_000.0).contains(&v) {
        return Err(format!("'{s}' must be within 0..=60000 ms"));
    }
    Ok(v)
}

/// The release times of a FIFO delay line, from arrival times: pure, so it
/// is tested without a queue.
mod schedule {
    /// SplitMix64: small, seeded, the same sequence on every platform.
    #[derive(Debug, Clone)]
    pub struct SplitMix64(u64);

    impl SplitMix64 {
        pub fn new(seed: u64) -> Self {
            Self(seed)
        }

        pub fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    /// Release times (nanoseconds on the caller's clock) for packets given
    /// in arrival order.
    #[derive(Debug, Clone)]
    pub struct Schedule {
        delay_ns: u64,
        jitter_ns: u64,
        rng: SplitMix64,
        last_release: u64,
    }

    impl Schedule {
        pub fn new(delay_ns: u64, jitter_ns: u64, seed: u64) -> Self {
            Self {
                delay_ns,
                jitter_ns,
                rng: SplitMix64::new(seed),
                last_release: 0,
            }
        }

        /// The release time of a packet that arrived at `arrival_ns` (not
        /// before the previous packet's arrival): arrival + delay + a
        /// uniform jitter in [-J, J], the delay clamped at 0, and never
        /// before the previous release (FIFO: no reordering).
        pub fn release(&mut self, arrival_ns: u64) -> u64 {
            let delay = if self.jitter_ns == 0 {
                self.delay_ns
            } else {
                let span = 2 * self.jitter_ns + 1;
                let offset = (self.rng.next_u64() % span) as i128 - self.jitter_ns as i128;
                (self.delay_ns as i128 + offset).max(0) as u64
            };
            let release = arrival_ns.saturating_add(delay).max(self.last_release);
            self.last_release = release;
            release
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const MS: u64 = 1_000_000;

        #[test]
        fn no_jitter_is_exactly_the_delay() {
            let mut s = Schedule::new(20 * MS, 0, 7);
            for a in [0, 5, 5, 1_000, 30 * MS] {
                assert_eq!(s.release(a), a + 20 * MS);
            }
        }

        #[test]
        fn fifo_is_kept_under_jitter() {
            // Arrivals 10 us apart, jitter +-5 ms: delays would reorder.
            let mut s = Schedule::new(20 * MS, 5 * MS, 3);
            let mut last = 0;
            for i in 0..100_000u64 {
                let a = i * 10_000;
                let r = s.release(a);
                assert!(r >= last, "packet {i} released before the one ahead");
                // Waiting for the packet ahead never pushes past arrival + D + J.
                assert!(r >= a + 15 * MS && r <= a + 25 * MS);
                last = r;
            }
        }

        #[test]
        fn jitter_bounds_and_mean() {
            // Arrivals 20 ms apart: FIFO never binds, each delay is its own.
            let (d, j) = (20 * MS, 4 * MS);
            let mut s = Schedule::new(d, j, 11);
            let n = 200_000u64;
            let mut sum = 0u128;
            let (mut lo, mut hi) = (u64::MAX, 0);
            for i in 0..n {
                let a = i * 20 * MS;
                let delay = s.release(a) - a;
                assert!(delay >= d - j && delay <= d + j, "delay {delay}");
                lo = lo.min(delay);
                hi = hi.max(delay);
                sum += delay as u128;
            }
            let mean = (sum / n as u128) as f64;
            assert!((mean - d as f64).abs() < 0.01 * d as f64, "mean {mean}");
            // The whole range is used.
            assert!(lo < d - j + j / 100 && hi > d + j - j / 100);
        }

        #[test]
        fn delay_is_clamped_at_zero() {
            let mut s = Schedule::new(MS, 5 * MS, 5);
            let mut zero = 0;
            for i in 0..10_000u64 {
                let a = i * 20 * MS;
                let r = s.release(a);
                assert!(r >= a && r <= a + 6 * MS);
                zero += usize::from(r == a);
            }
            // P(delay clamped to 0) is about 4/10.
            assert!((3_000..5_000).contains(&zero), "{zero}");
        }

        #[test]
        fn same_seed_same_schedule() {
            let arrivals: Vec<u64> = (0..1000).map(|i| i * 37_000).collect();
            let run = |seed| {
                let mut s = Schedule::new(10 * MS, 3 * MS, seed);
                arrivals.iter().map(|&a| s.release(a)).collect::<Vec<_>>()
            };
            assert_eq!(run(42), run(42));
            assert_ne!(run(42), run(43));
        }
    }
}

/// The nfnetlink_queue protocol (linux/netfilter/nfnetlink_queue.h), the
/// few messages the stage needs.
mod nfqueue {
    use super::*;

    const NFNL_SUBSYS_QUEUE: u16 = 3;
    const NFQNL_MSG_PACKET: u16 = 0;
    const NFQNL_MSG_CONFIG: u16 = 2;
    const NFQNL_MSG_VERDICT_BATCH: u16 = 3;
    const NLM_F_REQUEST: u16 = 1;
    const NLM_F_ACK: u16 = 4;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_HDRLEN: usize = 16;
    const NFGEN_HDRLEN: usize = 4;

    const NFQA_PACKET_HDR: u16 = 1;
    const NFQA_VERDICT_HDR: u16 = 2;
    const NFQA_CFG_CMD: u16 = 1;
    const NFQA_CFG_PARAMS: u16 = 2;
    const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
    const NFQA_CFG_MASK: u16 = 4;
    const NFQA_CFG_FLAGS: u16 = 5;
    const NFQNL_CFG_CMD_BIND: u8 = 1;
    const NFQNL_COPY_META: u8 = 1;
    /// GSO packets whole rather than segmented by the kernel first: the
    /// stage never reads a payload, so their checksums do not matter.
    const NFQA_CFG_F_GSO: u32 = 4;
    const NF_ACCEPT: u32 = 1;

    fn align4(n: usize) -> usize {
        (n + 3) & !3
    }

    /// One nfnetlink message: header, nfgenmsg, attributes.
    struct Msg(Vec<u8>);

    impl Msg {
        fn new(kind: u16, flags: u16, queue: u16) -> Self {
            let mut b = Vec::with_capacity(64);
            b.extend_from_slice(&0u32.to_ne_bytes()); // length, set in finish
            b.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | kind).to_ne_bytes());
            b.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
            b.extend_from_slice(&0u32.to_ne_bytes()); // seq
            b.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
            b.push(0); // AF_UNSPEC
            b.push(0); // NFNETLINK_V0
            b.extend_from_slice(&queue.to_be_bytes());
            Self(b)
        }

        fn attr(mut self, kind: u16, payload: &[u8]) -> Self {
            let len = 4 + payload.len();
            self.0.extend_from_slice(&(len as u16).to_ne_bytes());
            self.0.extend_from_slice(&kind.to_ne_bytes());
            self.0.extend_from_slice(payload);
            self.0.resize(align4(self.0.len()), 0);
            self
        }

        fn finish(mut self) -> Vec<u8> {
            let len = self.0.len() as u32;
            self.0[..4].copy_from_slice(&len.to_ne_bytes());
            self.0
        }
    }

    /// A bound queue on its netlink socket.
    pub struct Queue {
        fd: OwnedFd,
        pub num: u16,
        buf: Vec<u8>,
    }

    impl Queue {
        /// Opens the socket and binds queue `num` in metadata-only mode.
        pub fn bind(num: u16, max_len: u32, rcvbuf: u32) -> io::Result<Self> {
            let fd = socket(
                AddressFamily::Netlink,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::NetlinkNetFilter,
            )?;
            bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
            // Root may exceed rmem_max; without it the plain option.
            if setsockopt(&fd, sockopt::RcvBufForce, &(rcvbuf as usize)).is_err() {
                setsockopt(&fd, sockopt::RcvBuf, &(rcvbuf as usize))?;
            }
            let mut q = Self {
                fd,
                num,
                buf: vec![0; 1 << 16],
            };
            let cmd = [NFQNL_CFG_CMD_BIND, 0, 0, 0];
            q.request(Msg::new(NFQNL_MSG_CONFIG, NLM_F_ACK, num).attr(NFQA_CFG_CMD, &cmd))?;
            let mut params = [0u8; 5];
            params[4] = NFQNL_COPY_META;
            q.request(Msg::new(NFQNL_MSG_CONFIG, NLM_F_ACK, num).attr(NFQA_CFG_PARAMS, &params))?;
            q.request(
                Msg::new(NFQNL_MSG_CONFIG, NLM_F_ACK, num)
                    .attr(NFQA_CFG_QUEUE_MAXLEN, &max_len.to_be_bytes()),
            )?;
            q.request(
                Msg::new(NFQNL_MSG_CONFIG, NLM_F_ACK, num)
                    .attr(NFQA_CFG_FLAGS, &NFQA_CFG_F_GSO.to_be_bytes())
                    .attr(NFQA_CFG_MASK, &NFQA_CFG_F_GSO.to_be_bytes()),
            )?;
            Ok(q)
        }

        pub fn fd(&self) -> &OwnedFd {
            &self.fd
        }

        /// Sends a configuration message and waits for its acknowledgement
        /// (blocking: only before the loop starts).
        fn request(&mut self, msg: Msg) -> io::Result<()> {
            send(self.fd.as_raw_fd(), &msg.finish(), MsgFlags::empty())?;
            loop {
                let n = recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty())?;
                let mut err = None;
                for (kind, body) in messages(&self.buf[..n]) {
                    if kind == NLMSG_ERROR && body.len() >= 4 {
                        let code = i32::from_ne_bytes(body[..4].try_into().unwrap());
                        err = Some(code);
                    }
                }
                match err {
                    Some(0) => return Ok(()),
                    Some(code) => return Err(io::Error::from_raw_os_error(-code)),
                    None => continue,
                }
            }
        }

        /// Receives what the socket holds without blocking: calls `packet`
        /// with each queued packet's id, returns the netlink errors seen
        /// (failed verdicts). WouldBlock when empty.
        pub fn recv_batch(&mut self, mut packet: impl FnMut(u32)) -> io::Result<u64> {
            let n = recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::MSG_DONTWAIT)?;
            let mut errors = 0;
            for (kind, body) in messages(&self.buf[..n]) {
                if kind == NLMSG_ERROR {
                    errors += u64::from(
                        body.len() >= 4 && i32::from_ne_bytes(body[..4].try_into().unwrap()) != 0,
                    );
                } else if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET {
                    if let Some(id) = packet_id(body) {
                        packet(id);
                    }
                }
            }
            Ok(errors)
        }

        /// Accepts every queued packet whose id is at most `id`.
        pub fn accept_up_to(&self, id: u32) -> io::Result<()> {
            let mut hdr = [0u8; 8];
            hdr[..4].copy_from_slice(&NF_ACCEPT.to_be_bytes());
            hdr[4..].copy_from_slice(&id.to_be_bytes());
            let msg = Msg::new(NFQNL_MSG_VERDICT_BATCH, 0, self.num)
                .attr(NFQA_VERDICT_HDR, &hdr)
                .finish();
            loop {
                match send(self.fd.as_raw_fd(), &msg, MsgFlags::empty()) {
                    Err(Errno::EINTR) => continue,
                    r => return r.map(drop).map_err(io::Error::from),
                }
            }
        }
    }

    /// (type, payload) of each netlink message in a datagram.
    fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
        std::iter::from_fn(move || {
            if buf.len() < NLMSG_HDRLEN {
                return None;
            }
            let len = u32::from_ne_bytes(buf[..4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes(buf[4..6].try_into().unwrap());
            if len < NLMSG_HDRLEN || len > buf.len() {
                return None;
            }
            let body = &buf[NLMSG_HDRLEN..len];
            buf = &buf[align4(len).min(buf.len())..];
            Some((kind, body))
        })
    }

    /// The packet id in a NFQNL_MSG_PACKET's NFQA_PACKET_HDR.
    fn packet_id(body: &[u8]) -> Option<u32> {
        let mut attrs = body.get(NFGEN_HDRLEN..)?;
        while attrs.len() >= 4 {
            let len = u16::from_ne_bytes(attrs[..2].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes(attrs[2..4].try_into().unwrap()) & 0x3fff;
            if len < 4 || len > attrs.len() {
                return None;
            }
            if kind == NFQA_PACKET_HDR && len >= 8 {
                return Some(u32::from_be_bytes(attrs[4..8].try_into().unwrap()));
            }
            attrs = &attrs[align4(len).min(attrs.len())..];
        }
        None
    }

    /// (queue full, socket full) drops of queue `num` in this namespace,
    /// from /proc/net/netfilter/nfnetlink_queue.
    pub fn kernel_drops(num: u16) -> Option<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/net/netfilter/nfnetlink_queue").ok()?;
        text.lines().find_map(|line| {
            let f: Vec<u64> = line
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            (f.len() >= 7 && f[0] == u64::from(num)).then(|| (f[5], f[6]))
        })
    }
}

/// What the stage reports on exit.
#[derive(Debug, Default)]
struct Counters {
    delayed: u64,
    max_held: usize,
    enobufs: u64,
    verdict_errors: u64,
    held_at_exit: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("delay_stage: {e}");
            ExitCode::FAILURE
        }
    }
}

fn bind_error(num: u16, e: io::Error) -> String {
    let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
    // The kernel answers EPERM too when another socket holds the queue.
    if errno == Errno::EPERM && nfqueue::kernel_drops(num).is_some() {
        return format!("binding NFQUEUE {num}: {e}: another process has bound it");
    }
    match errno {
        Errno::EPERM | Errno::EACCES => format!(
            "binding NFQUEUE {num}: {e}: needs root (CAP_NET_ADMIN in this network namespace)"
        ),
        Errno::EBUSY => format!("binding NFQUEUE {num}: {e}: another process has bound it"),
        _ => format!("binding NFQUEUE {num}: {e}"),
    }
}

fn run(args: &Args) -> Result<(), String> {
    let err = |what: &str| {
        let what = what.to_string();
        move |e: Errno| format!("{what}: {e}")
    };
    // SIGTERM and SIGINT are blocked and read from a signalfd, so the one
    // ppoll of the loop wakes for them too and the loop ends between
    // verdicts, never in the middle of one.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGINT);
    mask.thread_block()
        .map_err(err("blocking SIGTERM/SIGINT"))?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(err("signalfd"))?;

    let mut queue = nfqueue::Queue::bind(args.queue_num, args.queue_max_len, args.rcvbuf)
        .map_err(|e| bind_error(args.queue_num, e))?;
    if let Some(path) = &args.ready_file {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .map_err(|e| format!("writing the ready file {}: {e}", path.display()))?;
    }
    eprintln!(
        "delay_stage: queue {} bound: delay {} ms, jitter +-{} ms (seed {}), FIFO",
        args.queue_num, args.delay_ms, args.jitter_ms, args.seed
    );

    let ms_to_ns = |ms: f64| (ms * 1e6).round() as u64;
    let mut schedule =
        schedule::Schedule::new(ms_to_ns(args.delay_ms), ms_to_ns(args.jitter_ms), args.seed);
    let start = Instant::now();
    let now_ns = || start.elapsed().as_nanos() as u64;
    // (release time, packet id), in arrival order = release order.
    let mut held: VecDeque<(u64, u32)> = VecDeque::new();
    let mut c = Counters::default();
    loop {
        // Everything queued so far, stamped on arrival.
        loop {
            let arrival = now_ns();
            match queue.recv_batch(|id| {
                held.push_back((schedule.release(arrival), id));
                c.delayed += 1;
            }) {
                Ok(errors) => c.verdict_errors += errors,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The socket's buffer overflowed: the kernel dropped
                // packets (counted in its queue_user_dropped too).
                Err(e) if e.raw_os_error() == Some(Errno::ENOBUFS as i32) => c.enobufs += 1,
                Err(e) => return Err(format!("receiving from NFQUEUE {}: {e}", args.queue_num)),
            }
        }
        c.max_held = c.max_held.max(held.len());

        // One verdict accepts every packet that is due: ids rise in
        // arrival order, and so do release times.
        let now = now_ns();
        let mut due = None;
        while let Some(&(release, id)) = held.front() {
            if release > now {
                break;
            }
            due = Some(id);
            held.pop_front();
        }
        if let Some(id) = due {
            queue
                .accept_up_to(id)
                .map_err(|e| format!("verdict on NFQUEUE {}: {e}", args.queue_num))?;
        }

        // Sleep until the next release (ppoll's timespec: well under a
        // millisecond late), a packet, or a signal.
        let timeout = held
            .front()
            .map(|&(release, _)| TimeSpec::from(Duration::from_nanos(release.saturating_sub(now))));
        let mut fds = [
            PollFd::new(queue.fd().as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        match ppoll(&mut fds, timeout, None) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(format!("ppoll: {e}")),
        }
        if fds[1]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN))
        {
            break;
        }
    }

    // Let go of what is still held rather than have the kernel drop it.
    c.held_at_exit = held.len();
    if let Some(&(_, id)) = held.back() {
        let _ = queue.accept_up_to(id);
    }
    let drops = nfqueue::kernel_drops(queue.num)
        .map(|(full, sock)| format!("{full} queue full, {sock} socket full"))
        .unwrap_or_else(|| "not readable".into());
    eprintln!(
        "delay_stage: queue {}: delayed {} packets, held at most {}, released {} early at exit; \
         kernel drops: {drops}; ENOBUFS {}; verdict errors {}",
        queue.num, c.delayed, c.max_held, c.held_at_exit, c.enobufs, c.verdict_errors
    );
    Ok(())
}
