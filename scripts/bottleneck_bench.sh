#!/usr/bin/env bash
# round_bench behind a bottleneck: the whole benchmark (gradlane, raw quinn,
# all-reliable, TCP; one process) runs in a fresh network namespace whose
# loopback device has an HTB class of RATE on egress, in front of it a
# tail-drop queue of QUEUE_BYTES. Loopback alone is bound by the CPU on small machines; here the
# link binds, as it does between hosts. Delay and loss are injected by the
# QUIC sockets as in the plain run (this host has no netem).
#
#   sudo bash scripts/bottleneck_bench.sh                        # 1 Gbit/s
#   RATE=2gbit QUEUE_BYTES=2000000 sudo bash scripts/bottleneck_bench.sh --rounds 10 --quick
#   MTU=9000 sudo bash scripts/bottleneck_bench.sh              # a jumbo link
#
# Arguments go to round_bench. Needs root, iproute2 and tc.
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=${RATE:-1gbit}
# The queue in front of the link, in bytes (a switch port's buffer). Without
# a byte limit the class gets a queue of 1000 packets, and quinn's GSO
# batches (up to 64 KB each) make that a 64 MB queue: 60-90 ms of delay.
QUEUE_BYTES=${QUEUE_BYTES:-1000000}
# The link's MTU: an Ethernet link between hosts by default (loopback's
# 65,536 would let MTU discovery send 64 KB packets no such link carries).
MTU=${MTU:-1500}
NS=gl-bottleneck

if ! command -v tc >/dev/null || ! command -v ip >/dev/null; then
    echo "== installing iproute2" >&2
    apt-get install -y iproute2 >/dev/null
fi

cargo build --release --bin round_bench
trap 'ip netns del "$NS" 2>/dev/null || true' EXIT
ip netns del "$NS" 2>/dev/null || true
ip netns add "$NS"
ip -n "$NS" link set lo up mtu "$MTU"
# Packets of both directions leave through lo's one egress: the rate is
# shared by data and acknowledgements, as on a half-duplex link.
ip netns exec "$NS" tc qdisc add dev lo root handle 1: htb default 10 r2q 1000
ip netns exec "$NS" tc class add dev lo parent 1: classid 1:10 htb rate "$RATE" ceil "$RATE"
ip netns exec "$NS" tc qdisc add dev lo parent 1:10 handle 10: bfifo limit "$QUEUE_BYTES"
echo "round_bench in namespace $NS, loopback shaped to $RATE (HTB), queue $QUEUE_BYTES bytes, MTU $MTU" >&2
ip netns exec "$NS" ./target/release/round_bench "$@"
ip netns exec "$NS" tc -s qdisc show dev lo | grep -m1 -o "dropped [0-9]*" | sed "s/^/bottleneck queue: /" >&2
ip netns exec "$NS" awk '/^Udp:/ { if (!h) { split($0, k); h = 1 } else { for (i = 2; i <= NF; i++) if (k[i] ~ /Errors/) printf "udp %s %s\n", k[i], $i } }' /proc/net/snmp >&2
