#!/usr/bin/env bash
# The time-to-accuracy race on a GPU host, one stage per lease (docs/GPU.md):
# scripts/tta_bench.sh with DEVICE=cuda over the testbed, 4 ranks on the
# host's GPU, ResNet-18 width 32, each stage's cells chosen to fit one
# 15-minute lease with its start (at most 10 minutes of runs).
#
#   bash scripts/gpu_race.sh STAGE          # on the GPU host, as root
#
# Stages (RATE per rank; a cell is "variant loss seed condition"):
#   1g      1 Gbit/s, lossless and 1% loss: gloo bbr with fp16 and with
#           PowerSGD-fp16, the gradlane backend, gradlane's powersgd_hook
#   100m    100 Mbit/s, 1% loss, plain and 40 ms RTT: the same four
#   1g-rtt  1 Gbit/s, 1% loss, 40 ms RTT: the same four
#   seeds   seed 1 of the key cells (the best of each side at 1% loss)
#   prune   gloo's other candidates at 1 Gbit/s and 1% loss (cubic; no
#           hook; plain PowerSGD), to check the pruning the CPU race did
#
# Results go to OUT (default $OUT/tta-gpu when the device tool's $OUT is
# set, else docs/tta-gpu): runs.csv, per-run CSVs and logs, table.md.
# A stage skips the cells runs.csv has already, so carrying docs/tta-gpu
# back and forth makes the stages add up. LIMIT=N runs only a stage's
# first N cells (a dry run of the script, say on CPU with DEVICE=cpu).
set -euo pipefail
cd "$(dirname "$0")/.."

STAGE=${1:?"usage: gpu_race.sh STAGE (1g, 100m, 1g-rtt, seeds, prune)"}
if [[ -n ${OUT:-} && -d $OUT && -z ${RACE_OUT:-} ]]; then
    RACE_OUT=$OUT/tta-gpu
    # The runs of earlier stages, carried in the tree.
    [[ -d docs/tta-gpu ]] && { mkdir -p "$RACE_OUT"; cp -r docs/tta-gpu/. "$RACE_OUT/"; }
fi
RACE_OUT=${RACE_OUT:-docs/tta-gpu}

GLOO="gloo-bbr+fp16 gloo-bbr+powersgd-fp16"
OURS="gradlane hook-bf16log8-t0.7+powersgd-r8"
cells() { # loss seed condition, for every variant of GLOO and OURS
    local v
    for v in $GLOO $OURS; do echo "$v $1 $2 $3"; done
}
case $STAGE in
    1g) RATE=1gbit; CELLS=$(cells 0 0 plain; cells 0.01 0 plain) ;;
    100m) RATE=100mbit; CELLS=$(cells 0.01 0 plain; cells 0.01 0 delay20) ;;
    1g-rtt) RATE=1gbit; CELLS=$(cells 0.01 0 delay20) ;;
    seeds)
        RATE=${RATE:-100mbit}
        CELLS=$(for v in $GLOO $OURS; do echo "$v 0.01 1 plain"; done) ;;
    prune)
        RATE=1gbit
        CELLS=$(for v in gloo-cubic+fp16 gloo-bbr gloo-bbr+powersgd gloo-cubic+powersgd-fp16; do
            echo "$v 0.01 0 plain"; done) ;;
    *) echo "gpu_race: unknown stage $STAGE (1g, 100m, 1g-rtt, seeds, prune)" >&2; exit 2 ;;
esac

if [[ -n ${LIMIT:-} ]]; then
    CELLS=$(echo "$CELLS" | head -n "$LIMIT")
fi
if ! command -v tc >/dev/null; then
    # shellcheck source=scripts/gpu_env.sh
    source scripts/gpu_env.sh
fi
echo "gpu_race: stage $STAGE, $RATE, into $RACE_OUT" >&2
DEVICE=${DEVICE:-cuda} RATE=$RATE WIDTH=${WIDTH:-32} RANKS=${RANKS:-4} OUT=$RACE_OUT \
    CELLS="$CELLS" TIME_LIMIT=${TIME_LIMIT:-90} bash scripts/tta_bench.sh
# The device tool brings back no file whose name has a "+" (most cells'
# per-run files): pack them into one that has none.
if [[ -d $RACE_OUT/runs ]]; then
    tar -czf "$RACE_OUT/runs.tgz" -C "$RACE_OUT" runs
fi
