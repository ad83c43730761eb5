#!/usr/bin/env bash
# gradlane demo: one receiver and one sender over loopback, with seeded
# injected loss (5% each way on the sender's socket) and 1 ms delay.
#
#   bash scripts/demo.sh                    # ResNet-50, 5 rounds
#   bash scripts/demo.sh --model tiny --rounds 3 --congestion cubic
#   BIN_DIR=target/debug bash scripts/demo.sh   # programs built already
#
# Extra arguments go to the sender. BIN_DIR names a directory holding
# certs, receiver and sender built already (no release build then).
# The run's certificates are made in a temporary directory, removed on
# exit with everything else the demo made: certs/ stays yours (a `certs`
# command after the demo does not find it taken, and the demo does not
# depend on what it holds). The receiver listens on a free loopback port.
# Both tables are printed; the receiver is stopped on exit.
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ -n ${BIN_DIR:-} ]]; then
    BIN=$BIN_DIR
else
    echo "== building certs, receiver and sender (release; the first build takes a few minutes)" >&2
    cargo build --release --bin certs --bin receiver --bin sender
    BIN=target/release
fi

# Rounds for the receiver: the sender's --rounds if given, else the default.
ROUNDS=5
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --rounds) ROUNDS="${args[$((i + 1))]:-$ROUNDS}" ;;
        --rounds=*) ROUNDS="${args[$i]#--rounds=}" ;;
    esac
done

WORK=$(mktemp -d -t gradlane-demo.XXXXXX)
CERTS=$WORK/certs
RECV_OUT=$WORK/receiver.out
RECV_PID=
cleanup() {
    if [[ -n "$RECV_PID" ]] && kill -0 "$RECV_PID" 2>/dev/null; then
        kill "$RECV_PID" 2>/dev/null || true
        wait "$RECV_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/certs" --out-dir "$CERTS" --san localhost --san 127.0.0.1 >/dev/null

echo "== receiver on 127.0.0.1, a free port" >&2
"$BIN/receiver" --listen 127.0.0.1:0 --cert "$CERTS/server.pem" --key "$CERTS/server.key" \
    --rounds "$ROUNDS" --seed 2 >"$RECV_OUT" 2>&1 &
RECV_PID=$!

# Wait until the receiver listens (it says where on its output), at most 10 s.
ADDR=
for _ in $(seq 100); do
    ADDR=$(sed -n 's/^receiver: listening on //p' "$RECV_OUT")
    [[ -n $ADDR ]] && break
    if ! kill -0 "$RECV_PID" 2>/dev/null; then
        echo "receiver exited early:" >&2
        cat "$RECV_OUT" >&2
        exit 1
    fi
    sleep 0.1
done
if [[ -z $ADDR ]]; then
    echo "receiver did not say where it listens within 10 s:" >&2
    cat "$RECV_OUT" >&2
    exit 1
fi

echo "== sender to $ADDR: --loss 0.05 --delay-ms 1 $*" >&2
echo
echo "### sender"
echo
status=0
"$BIN/sender" --connect "$ADDR" --server-name localhost --ca "$CERTS/ca.pem" --seed 1 \
    --loss 0.05 --delay-ms 1 "$@" || status=$?
if [[ $status -ne 0 ]]; then
    # Let the receiver notice the closed link and say why it stopped.
    sleep 1
    kill "$RECV_PID" 2>/dev/null || true
fi
wait "$RECV_PID" || { [[ $status -ne 0 ]] || status=$?; }
RECV_PID=
echo
echo "### receiver"
echo
cat "$RECV_OUT"
exit "$status"
