#!/usr/bin/env bash
# allreduce_bench behind a bottleneck: RANKS ranks, one process each, in
# the namespaces of scripts/testbed.sh (each rank's egress an HTB class of
# RATE, kernel random loss on each rank's input), once per loss rate in
# LOSSES. The TCP ring meets the same loss as the QUIC variants. Rank 0's
# table per loss rate goes to stdout.
#
#   sudo bash scripts/allreduce_bottleneck.sh                      # defaults below
#   RATE=500mbit LOSSES="0 0.05" ROUNDS=3 sudo -E bash scripts/allreduce_bottleneck.sh --model resnet18
#   sudo bash scripts/allreduce_bottleneck.sh --model resnet18 --format f32,bf16,bf16+log8
#
# Arguments after the options go to allreduce_bench (see its --help), after
# the script's own --losses, --delay-ms, --rounds and --only: e.g. --format
# to compare value formats (exact f32, exact bf16, differentiated
# bf16+log8, ...) or --lossy-return.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/certs.sh
source scripts/lib/certs.sh

RANKS=${RANKS:-4}
RATE=${RATE:-200mbit}
LOSSES=${LOSSES:-0 0.01 0.05}
ROUNDS=${ROUNDS:-4}
TCP_CC=${TCP_CC:-cubic}

cargo build --release --bin certs --bin allreduce_bench
CERTS=$(mktemp -d)
LOGS=$(mktemp -d)
trap 'rm -rf "$CERTS" "$LOGS"' EXIT
testbed_certs "$CERTS" "$RANKS"

for loss in $LOSSES; do
    echo "== $RANKS ranks, $RATE per rank, loss $loss (kernel, on input), TCP $TCP_CC"
    GRADLANE_CERT_DIR=$CERTS RANKS=$RANKS RATE=$RATE LOSS=$loss TCP_CC=$TCP_CC LOG_DIR=$LOGS \
        bash scripts/testbed.sh -- ./target/release/allreduce_bench \
        --losses 0 --delay-ms 0 --rounds "$ROUNDS" --only "differentiated,exact,TCP" "$@"
    grep -v "^loss" "$LOGS/rank0.log"
done
