#!/usr/bin/env bash
# Self-check of scripts/testbed.sh with 2 ranks: the HTB rate holds and the
# testbed really drops. Six runs, each prints a PASS or FAIL line:
#   1. lossless bulk TCP, rank 1 -> rank 0 for SECONDS_TCP: goodput 0.9-1.0 of RATE;
#   2. the same at LOSS: iptables' drop fraction on rank 0's input ~ LOSS;
#   3. DATAGRAMS UDP datagrams at LOSS, paced below RATE: rank 0 receives
#      1 - LOSS of them (+-TOL), and iptables agrees;
#   4. DSCP_PRIORITY=1 at 50mbit: a flow marked EF keeps its 40 Mbit/s
#      against an unmarked one of 40;
#   5. a failing rank: testbed exits with its status after GRACE, naming it;
#   6. SIGINT (Ctrl-C): testbed stops, no process or namespace is left.
# After each run no gl-tb-* namespace may remain.
#
# With DELAY_MS > 0 (and JITTER_MS) every run goes through the testbed's
# delay stage, so the checks above hold behind that delay too (the lossless
# rate then within 5% on the wire: 0.95-1.0 of RATE from 1 s after the
# first byte, and the delay stage may drop nothing; SECONDS_TCP defaults
# to 15 instead of 5, and the TCP loss run uses LOSS_CC, default bbr), and
# one more comes first:
#   0. the RTT between the two ranks, by ping and by the time a TCP connect
#      takes (one RTT: SYN, SYN-ACK), medians, each within 10% of 2 x DELAY_MS.
#
#   sudo bash scripts/testbed_check.sh                     # 200mbit, 5% loss
#   RATE=100mbit LOSS=0.01 SECONDS_TCP=10 sudo bash scripts/testbed_check.sh
#   DELAY_MS=20 sudo -E bash scripts/testbed_check.sh      # the same, RTT 40 ms
#
# Needs root and python3 (the probes are python3 sockets), and ping with a
# delay (installed if missing). Exits nonzero if any check fails. About a
# minute.
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=${RATE:-200mbit}
export LOSS=${LOSS:-0.05}
SECONDS_TCP=${SECONDS_TCP:-}
DATAGRAMS=${DATAGRAMS:-20000}
TOL=${TOL:-0.015}
TCP_CC=${TCP_CC:-cubic}
# Seen by every testbed.sh run below.
export DELAY_MS=${DELAY_MS:-0}
export JITTER_MS=${JITTER_MS:-0}
RTT_SAMPLES=${RTT_SAMPLES:-20}
TB=scripts/testbed.sh
DELAY_ON=$(awk -v v="$DELAY_MS" 'BEGIN { print (v > 0) ? 1 : 0 }')
# Behind a delay TCP runs longer (slow start over a long RTT), and the
# TCP-at-LOSS run uses bbr (LOSS_CC): cubic at 5% loss over a 40 ms RTT
# moves about 1 Mbit/s, some 1500 packets in 15 s, too few to count a loss
# rate on (the check wants 2000).
if [[ -z $SECONDS_TCP ]]; then
    SECONDS_TCP=5
    ((DELAY_ON)) && SECONDS_TCP=15
fi
LOSS_CC=${LOSS_CC:-}
if [[ -z $LOSS_CC ]]; then
    LOSS_CC=$TCP_CC
    ((DELAY_ON)) && LOSS_CC=bbr
fi
if ((DELAY_ON)) && ! command -v ping >/dev/null; then
    echo "== installing iputils-ping" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q iputils-ping >/dev/null
fi

PY=$(python3 -c 'import sys; print(sys.executable)')
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PROBE=$WORK/probe.py

cat >"$PROBE" <<'EOF'
# Probes run by testbed_check.sh in every rank: rank 1 sends to rank 0.
import os, socket, sys, time

rank = int(os.environ["RANK"])
addr = os.environ["MASTER_ADDR"]
port = int(os.environ["MASTER_PORT"])
mode = sys.argv[1]


def connect():
    deadline = time.time() + 30
    while True:
        try:
            return socket.create_connection((addr, port), timeout=30)
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def big_rcvbuf(u):
    # Room for the whole run (root may pass rmem_max), so a receiver that
    # falls behind on a busy host loses nothing in its socket.
    try:
        u.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUFFORCE, 64 << 20)
    except (OSError, AttributeError):
        u.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)


def udp_rcvbuf_errors():
    rows = [l.split() for l in open("/proc/net/snmp") if l.startswith("Udp:")]
    return int(rows[1][rows[0].index("RcvbufErrors")])


def listen():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(1)
    return s


if mode == "tcp":
    # Goodput from the first byte to the last, and (steady_mbit) from
    # WARMUP seconds after the first byte on, past TCP's slow start.
    seconds = float(sys.argv[2])
    warmup = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    if rank == 0:
        conn, _ = listen().accept()
        total, first, last, at_warm, t_warm = 0, None, None, None, None
        while True:
            b = conn.recv(1 << 20)
            if not b:
                break
            now = time.monotonic()
            if first is None:
                first = now
            if at_warm is None and now - first >= warmup:
                at_warm, t_warm = total, now
            total += len(b)
            last = now
        dt = last - first
        steady = (total - at_warm) * 8 / (last - t_warm) / 1e6 if at_warm is not None and last > t_warm else 0
        print(f"RESULT tcp bytes={total} seconds={dt:.3f} mbit={total * 8 / dt / 1e6:.2f} steady_mbit={steady:.2f}")
    elif rank == 1:
        c = connect()
        buf = b"\0" * (1 << 20)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            c.sendall(buf)
        c.close()

elif mode == "udp":
    count, size, mbit = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    if rank == 0:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        big_rcvbuf(u)
        u.bind((addr, port))
        u.settimeout(0.2)
        conn, _ = listen().accept()  # the sender starts once this is up
        conn.setblocking(False)
        received, sent, drain_until = 0, None, None
        ctl = b""
        while True:
            try:
                u.recv(65536)
                received += 1
            except socket.timeout:
                pass
            if sent is None:
                try:
                    ctl += conn.recv(100)
                except BlockingIOError:
                    pass
                if ctl.endswith(b"\n"):
                    sent = int(ctl)
                    drain_until = time.monotonic() + 1.0
            elif time.monotonic() > drain_until:
                break
        print(f"RESULT udp sent={sent} received={received} fraction={received / sent:.4f}"
              f" rcvbuf_errors={udp_rcvbuf_errors()}")
    elif rank == 1:
        c = connect()
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        payload = b"\0" * size
        burst = 50
        gap = burst * (size + 42) * 8 / (mbit * 1e6)
        t = time.monotonic()
        for i in range(0, count, burst):
            for _ in range(min(burst, count - i)):
                u.sendto(payload, (addr, port))
            t += gap
            time.sleep(max(0.0, t - time.monotonic()))
        c.sendall(f"{count}\n".encode())
        c.close()

elif mode == "dscp":
    # Two UDP flows of MBIT each for SECONDS, one marked EF (TOS 0xb8).
    import threading
    mbit, seconds = float(sys.argv[2]), float(sys.argv[3])
    if rank == 0:
        counts = {}

        def rx(p):
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            big_rcvbuf(u)
            u.bind((addr, p))
            u.settimeout(3)
            n = 0
            try:
                while True:
                    u.recv(65536)
                    n += 1
            except socket.timeout:
                pass
            counts[p] = n

        ts = [threading.Thread(target=rx, args=(p,)) for p in (port, port + 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        ef, other = (counts[p] * 1242 * 8 / seconds / 1e6 for p in (port, port + 1))
        print(f"RESULT dscp ef={ef:.1f} other={other:.1f} rcvbuf_errors={udp_rcvbuf_errors()}")
    elif rank == 1:
        time.sleep(1)

        def tx(p, tos):
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            payload = b"\0" * 1200
            gap = 10 * 1242 * 8 / (mbit * 1e6)
            t = time.monotonic()
            end = t + seconds
            while time.monotonic() < end:
                for _ in range(10):
                    try:
                        u.sendto(payload, (addr, p))
                    except OSError:
                        pass
                t += gap
                time.sleep(max(0.0, t - time.monotonic()))

        ts = [threading.Thread(target=tx, args=(port, 0xB8)), threading.Thread(target=tx, args=(port + 1, 0))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

elif mode == "rtt":
    # Medians of N TCP connects (one RTT each) and N pings, rank 1 -> 0.
    import statistics, subprocess
    n = int(sys.argv[2])
    if rank == 0:
        s = listen()
        s.listen(64)
        for _ in range(n + 1):
            s.accept()[0].close()
    elif rank == 1:
        connect().close()  # waits for the listener
        times = []
        for _ in range(n):
            t = time.monotonic()
            c = socket.create_connection((addr, port), timeout=30)
            times.append((time.monotonic() - t) * 1e3)
            c.close()
        # -U: user-to-user time. Without it ping takes the reply's kernel
        # receive timestamp, stamped on arrival before the delay stage
        # holds the packet, and shows only the far end's delay (D, not 2D).
        out = subprocess.run(["ping", "-U", "-n", "-c", str(n), "-i", "0.05", addr],
                             capture_output=True, text=True, check=True).stdout
        pings = [float(l.split("time=")[1].split()[0]) for l in out.splitlines() if "time=" in l]
        print(f"RESULT rtt tcp_ms={statistics.median(times):.2f} ping_ms={statistics.median(pings):.2f}"
              f" tcp_range={min(times):.2f}-{max(times):.2f} ping_range={min(pings):.2f}-{max(pings):.2f}"
              f" pings={len(pings)}")

elif mode == "fail":
    if rank == 1:
        sys.exit(3)
    time.sleep(120)

elif mode == "sleep":
    time.sleep(120)
EOF

fails=0
report() { # report PASS|FAIL text...
    echo "$*"
    [[ $1 == PASS ]] || fails=$((fails + 1))
}

leftovers() {
    local ns
    ns=$(ip netns list | awk '$1 ~ /^gl-tb-/ { printf "%s ", $1 }')
    if [[ -n $ns ]]; then report FAIL "namespaces left after the run: $ns"; fi
    if pgrep -f "$PROBE" >/dev/null; then report FAIL "probe processes left after the run"; fi
}

# run NAME PROBE-ARGS...: testbed.sh with 2 ranks and the probe, output to
# $WORK/NAME.log; LOSS, GRACE and the like come as assignments before it.
run() {
    local name=$1 status=0
    shift
    echo "== $name" >&2
    RANKS=2 RATE="$RATE" TCP_CC="$TCP_CC" bash "$TB" -- "$PY" "$PROBE" "$@" >"$WORK/$name.log" 2>&1 || status=$?
    sed 's/^/   /' "$WORK/$name.log" >&2
    leftovers
    return "$status"
}

# field VALUE of "key=VALUE" in the RESULT line of a log
result() { sed -n "s/.*RESULT.* $2=\([^ ]*\).*/\1/p" "$WORK/$1.log" | head -1; }
# "dropped accepted" of iptables on a rank's input, from the counters
counters() { sed -n "s/^testbed: rank $2: .*iptables dropped \([0-9]*\) accepted \([0-9]*\).*/\1 \2/p" "$WORK/$1.log"; }
# the delay stage's counters line of a rank
stage_line() { sed -n "s/^testbed: rank $2: \(delay_stage: .*\)/\1/p" "$WORK/$1.log"; }
# "queue-full socket-full" drops of a rank's delay stage
stage_drops() { stage_line "$1" "$2" | sed -n 's/.*kernel drops: \([0-9]*\) queue full, \([0-9]*\) socket full.*/\1 \2/p'; }
# queue drops of a rank's egress
queue_drops() { sed -n "s/^testbed: rank $2: .*queue dropped \([0-9]*\);.*/\1/p" "$WORK/$1.log"; }
calc() { awk "BEGIN { print $* }"; }

rate_mbit=$(awk -v r="$RATE" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
    m["kbit"] = 1e-3; m["mbit"] = 1; m["gbit"] = 1e3; print n * m[u] }')
[[ $rate_mbit != 0 ]] || { echo "RATE must be in kbit, mbit or gbit" >&2; exit 2; }

# 0. With a delay: the RTT is 2 x DELAY_MS, by ping and by TCP connect.
if ((DELAY_ON)); then
    rtt=$(calc "2 * $DELAY_MS")
    if LOSS=0 run rtt rtt "$RTT_SAMPLES"; then
        tcp_ms=$(result rtt tcp_ms)
        ping_ms=$(result rtt ping_ms)
        verdict=$(calc "($tcp_ms >= 0.9 * $rtt && $tcp_ms <= 1.1 * $rtt && $ping_ms >= 0.9 * $rtt && $ping_ms <= 1.1 * $rtt) ? \"PASS\" : \"FAIL\"")
        report "$verdict" "RTT at DELAY_MS $DELAY_MS (+-$JITTER_MS): TCP connect median $tcp_ms ms (range $(result rtt tcp_range)), ping median $ping_ms ms (range $(result rtt ping_range), $(result rtt pings) replies); want $rtt ms +-10%"
    else
        report FAIL "RTT at DELAY_MS $DELAY_MS: the testbed run failed"
    fi
fi

# 1. Rate holds, lossless. Behind a delay: within 5% on the wire, in the
#    steady state: from 1 s after the first byte (slow start over a long
#    RTT is TCP's own cost, not the testbed's), and goodput times
#    1514/1448, the bytes HTB counts per byte of payload (Ethernet, IP and
#    TCP with timestamps), so a full link is 1.0, not 0.956.
min_ratio=0.9
((DELAY_ON)) && min_ratio=0.95
if LOSS=0 run tcp0 tcp "$SECONDS_TCP"; then
    mbit=$(result tcp0 mbit)
    steady=
    ratio=$(calc "$mbit / $rate_mbit")
    if ((DELAY_ON)); then
        steady=" (steady $(result tcp0 steady_mbit), on the wire $(printf %.2f "$(calc "$(result tcp0 steady_mbit) * 1514 / 1448")"))"
        ratio=$(calc "$(result tcp0 steady_mbit) * 1514 / 1448 / $rate_mbit")
    fi
    verdict=$(calc "($ratio >= $min_ratio && $ratio <= 1.0) ? \"PASS\" : \"FAIL\"")
    stage=
    if ((DELAY_ON)); then
        read -r sq ss < <(stage_drops tcp0 0)
        [[ ${sq:-x} == 0 && ${ss:-x} == 0 ]] || verdict=FAIL
        stage="; rank 0's $(stage_line tcp0 0)"
    fi
    report "$verdict" "TCP lossless: $mbit Mbit/s goodput$steady over ${SECONDS_TCP}s = $(printf %.3f "$ratio") of RATE $RATE (want $min_ratio-1.0); queue drops at rank 1: $(queue_drops tcp0 1)$stage"
else
    report FAIL "TCP lossless: the testbed run failed"
fi

# 2. TCP meets LOSS.
if TCP_CC=$LOSS_CC run tcp_loss tcp "$SECONDS_TCP"; then
    read -r d a < <(counters tcp_loss 0)
    f=$(calc "$d / ($d + $a)")
    read -r d1 a1 < <(counters tcp_loss 1)
    f1=$(calc "($d1 + $a1) ? $d1 / ($d1 + $a1) : 0")
    verdict=$(calc "($d + $a >= 2000 && $f >= $LOSS - $TOL && $f <= $LOSS + $TOL) ? \"PASS\" : \"FAIL\"")
    report "$verdict" "TCP at LOSS $LOSS: rank 0 (data) dropped $d of $((d + a)) = $(printf %.4f "$f"), rank 1 (acks) $d1 of $((d1 + a1)) = $(printf %.4f "$f1"); goodput $(result tcp_loss mbit) Mbit/s ($LOSS_CC)"
else
    report FAIL "TCP at LOSS $LOSS: the testbed run failed"
fi

# 3. UDP meets LOSS; paced at half the rate so the queue does not drop.
if run udp_loss udp "$DATAGRAMS" 1200 "$(calc "$rate_mbit / 2")"; then
    sent=$(result udp_loss sent)
    got=$(result udp_loss received)
    frac=$(result udp_loss fraction)
    read -r d a < <(counters udp_loss 0)
    f=$(calc "$d / ($d + $a)")
    want=$(calc "1 - $LOSS")
    verdict=$(calc "($frac >= $want - $TOL && $frac <= $want + $TOL) ? \"PASS\" : \"FAIL\"")
    report "$verdict" "UDP at LOSS $LOSS: received $got of $sent datagrams = $frac (want $want +-$TOL); iptables at rank 0 dropped $d of $((d + a)) = $(printf %.4f "$f"); queue drops at rank 1: $(queue_drops udp_loss 1); socket overflows: $(result udp_loss rcvbuf_errors)"
else
    report FAIL "UDP at LOSS $LOSS: the testbed run failed"
fi

# 4. DSCP_PRIORITY=1 at 50mbit: two UDP flows of 40 Mbit/s, one marked EF;
#    EF keeps its 40, the other gets what is left (without priority: 25 each).
if LOSS=0 RATE=50mbit DSCP_PRIORITY=1 run dscp dscp 40 4; then
    ef=$(result dscp ef)
    other=$(result dscp other)
    verdict=$(calc "($ef >= 38 && $other <= 15) ? \"PASS\" : \"FAIL\"")
    report "$verdict" "DSCP priority at 50mbit, 2 x 40 Mbit/s offered: EF $ef Mbit/s (want >= 38), unmarked $other (want <= 15)"
else
    report FAIL "DSCP priority: the testbed run failed"
fi

# 5. A failing rank ends the run after the grace period, with its status.
start=$SECONDS
status=0
LOSS=0 GRACE=2 run fail fail || status=$?
took=$((SECONDS - start))
if ((status == 3 && took < 20)) && grep -q "rank 1 exited with status 3" "$WORK/fail.log"; then
    report PASS "failing rank: exit status $status, rank 1 named, rank 0 stopped after the grace (${took}s)"
else
    report FAIL "failing rank: exit status $status (want 3), ${took}s (want < 20)"
fi

# 6. Ctrl-C: SIGINT to the testbed while the ranks sleep.
start=$SECONDS
status=0
echo "== sigint" >&2
timeout --preserve-status -s INT 4 bash "$TB" --ranks 2 --loss 0 -- "$PY" "$PROBE" sleep >"$WORK/sigint.log" 2>&1 || status=$?
sed 's/^/   /' "$WORK/sigint.log" >&2
took=$((SECONDS - start))
before=$fails
leftovers
if ((fails == before && status == 130 && took < 15)); then
    report PASS "SIGINT: testbed exited with status $status after ${took}s, nothing left"
else
    report FAIL "SIGINT: status $status, ${took}s"
fi

if ((fails)); then
    echo "testbed check: $fails FAIL" >&2
    exit 1
fi
echo "testbed check: all PASS" >&2
