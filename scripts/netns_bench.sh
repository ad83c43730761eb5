#!/usr/bin/env bash
# gradlane across a real bottleneck: two network namespaces joined by a veth
# pair, an HTB class of RATE on each side's egress (a queue with tail drop),
# delay and seeded loss injected by each end's socket wrapper (this host has
# no netem). Runs the receiver and sender examples for each configuration
# and prints one summary line per configuration: per-round total time of
# the sender, first round (connection start-up) left out.
#
#   sudo bash scripts/netns_bench.sh                 # defaults below
#   RATE=1gbit DELAY_MS=10 ROUNDS=6 sudo bash scripts/netns_bench.sh
#
# Needs root, iproute2 and tc. Tears the namespaces down on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=${RATE:-1gbit}
DELAY_MS=${DELAY_MS:-10}
ROUNDS=${ROUNDS:-6}
MODEL=${MODEL:-resnet50}
# The queue in front of each link, in bytes: without a byte limit the class
# queues 1000 of quinn's GSO batches, about 64 MB.
QUEUE_BYTES=${QUEUE_BYTES:-1000000}
A=gl-bench-a
B=gl-bench-b

if ! command -v tc >/dev/null || ! command -v ip >/dev/null; then
    echo "== installing iproute2" >&2
    apt-get install -y iproute2 >/dev/null
fi

cargo build --release --bin certs --bin receiver --bin sender
BIN=$PWD/target/release
CERTS=$(mktemp -d)
"$BIN/certs" --out-dir "$CERTS" --san localhost >/dev/null

remove_namespaces() {
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
}
trap 'remove_namespaces; rm -rf "$CERTS"' EXIT
remove_namespaces
ip netns add "$A"
ip netns add "$B"
ip link add gl-va type veth peer name gl-vb
ip link set gl-va netns "$A"
ip link set gl-vb netns "$B"
ip -n "$A" addr add 10.77.0.1/24 dev gl-va
ip -n "$B" addr add 10.77.0.2/24 dev gl-vb
for ns in "$A" "$B"; do
    dev=$([[ $ns == "$A" ]] && echo gl-va || echo gl-vb)
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$dev" up
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: htb default 10 r2q 1000
    ip netns exec "$ns" tc class add dev "$dev" parent 1: classid 1:10 htb rate "$RATE" ceil "$RATE"
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:10 handle 10: bfifo limit "$QUEUE_BYTES"
done

# One sender/receiver pair: prints "median / max ms per round" of the
# sender's total column, rounds after the first.
pair() {
    local loss=$1
    shift
    ip netns exec "$B" "$BIN/receiver" --listen 10.77.0.2:4433 \
        --cert "$CERTS/server.pem" --key "$CERTS/server.key" \
        --rounds "$ROUNDS" --loss "$loss" --delay-ms "$DELAY_MS" >/dev/null 2>&1 &
    local rx=$!
    sleep 0.5
    local out
    out=$(ip netns exec "$A" "$BIN/sender" --connect 10.77.0.2:4433 --ca "$CERTS/ca.pem" \
        --model "$MODEL" --rounds "$ROUNDS" --loss "$loss" --delay-ms "$DELAY_MS" "$@" 2>&1) || {
        echo "$out" >&2
        kill "$rx" 2>/dev/null || true
        return 1
    }
    wait "$rx" || true
    # Rows "| round | encode | important | total | ...": total of rounds >= 1.
    echo "$out" | awk -F'|' '/^\| [0-9]+ \|/ && $2 + 0 >= 1 { print $5 + 0 }' | sort -n |
        awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
               printf "median %.0f ms, max %.0f ms over %d rounds\n", m, v[NR], NR }'
}

echo "$MODEL over a $RATE HTB bottleneck, ${DELAY_MS} ms delay each way (injected), $ROUNDS rounds"
for loss in 0 0.05; do
    for lanes in 1 4; do
        printf '%-34s %s\n' "loss $loss, gradlane, $lanes lane(s):" "$(pair "$loss" --lanes "$lanes")"
    done
    printf '%-34s %s\n' "loss $loss, all reliable, 4 lanes:" "$(pair "$loss" --lanes 4 --loss-tolerance 0)"
    # quinn's own BBR (the default caps its window): the sender's controller
    # is the one that moves the round.
    printf '%-34s %s\n' "loss $loss, gradlane, 4 lanes, BBR:" "$(pair "$loss" --lanes 4 --congestion bbr)"
    printf '%-34s %s\n' "loss $loss, 4 lanes, after confirm:" "$(pair "$loss" --lanes 4 --lossy-release confirmed)"
done
