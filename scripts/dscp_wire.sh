#!/usr/bin/env bash
# DSCP marks on the wire (DESIGN 2.5): a receiver and a sender with --dscp
# over loopback, captured with tshark; prints the bytes and frames seen per
# direction and DSCP, next to each end's own count.
#
#   bash scripts/dscp_wire.sh                          # ResNet-18, 3 rounds
#   bash scripts/dscp_wire.sh --model resnet50 --loss 0.01
#
# Extra arguments go to the sender. Capturing needs root (or the capture
# capability); tshark is installed if missing. Loopback hands the capture
# the sender's GSO batches before they are cut into packets, so a frame
# may hold up to 10 packets: compare bytes, not frames.
set -euo pipefail

cd "$(dirname "$0")/.."

PORT=4437
ADDR=127.0.0.1:$PORT

if ! command -v tshark >/dev/null; then
    echo "== installing tshark" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q tshark >&2
fi

echo "== building the examples (release)" >&2
cargo build --release --bin certs --bin receiver --bin sender
BIN=target/release
if [[ ! -f certs/ca.pem || ! -f certs/server.pem || ! -f certs/server.key ]]; then
    echo "== making certificates in certs/" >&2
    "$BIN/certs" --out-dir certs --san localhost --san 127.0.0.1 --force >&2
fi

ROUNDS=3
MODEL=resnet18
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --rounds) ROUNDS="${args[$((i + 1))]}" ;;
        --model) MODEL="${args[$((i + 1))]}" ;;
    esac
done

WORK=$(mktemp -d -t gradlane-dscp.XXXXXX)
CAPTURE=$WORK/wire.pcapng
RECV_PID=
SHARK_PID=
cleanup() {
    for pid in "$RECV_PID" "$SHARK_PID"; do
        if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

tshark -q -B 64 -i lo -f "udp port $PORT" -w "$CAPTURE" 2>"$WORK/tshark.err" &
SHARK_PID=$!
# tshark says so once it captures.
for _ in $(seq 100); do
    grep -q "Capturing on" "$WORK/tshark.err" 2>/dev/null && break
    sleep 0.1
done
grep -q "Capturing on" "$WORK/tshark.err" || {
    cat "$WORK/tshark.err" >&2
    echo "tshark did not start capturing" >&2
    exit 1
}

"$BIN/receiver" --listen "$ADDR" --cert certs/server.pem --key certs/server.key \
    --rounds "$ROUNDS" --dscp >"$WORK/receiver.out" &
RECV_PID=$!
sleep 0.5

"$BIN/sender" --connect "$ADDR" --server-name localhost --ca certs/ca.pem \
    --model "$MODEL" --rounds "$ROUNDS" --dscp "$@" | tee "$WORK/sender.out" >&2
wait "$RECV_PID"
RECV_PID=
kill -INT "$SHARK_PID"
wait "$SHARK_PID" 2>/dev/null || true
SHARK_PID=

echo
echo "On the wire (tshark, udp port $PORT):"
echo
echo "| direction | DSCP | TOS | frames | MB |"
echo "|---|---:|---:|---:|---:|"
tshark -r "$CAPTURE" -T fields -e udp.srcport -e ip.dsfield.dscp -e udp.length 2>/dev/null |
    awk -v port="$PORT" '
        { dir = ($1 == port) ? "receiver to sender" : "sender to receiver"
          k = dir SUBSEP $2; frames[k]++; bytes[k] += $3 - 8 }
        END { for (k in frames) { split(k, p, SUBSEP)
              printf "| %s | %d | %d | %d | %.2f |\n", p[1], p[2], p[2] * 4, frames[k], bytes[k] / 1e6 } }' |
    sort -t'|' -k2,2 -k3,3nr
echo
echo "tshark: $(grep -i "captured\|dropped" "$WORK/tshark.err" | tr '\n' ' ')"
echo
echo "Each end's own count:"
grep -h "^marked" "$WORK/sender.out" | sed 's/^/  sender: /'
grep -h "^marked" "$WORK/receiver.out" | sed 's/^/  receiver: /'
