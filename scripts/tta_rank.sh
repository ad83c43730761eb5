#!/usr/bin/env bash
# One rank of scripts/tta_bench.sh, run by scripts/testbed.sh inside the
# rank's namespace: examples/torch/train_tta.py with the arguments given,
# under the interpreter PY. With COMPETE=1 a bulk TCP flow runs from this
# rank to the next one (rank + 1 mod WORLD_SIZE, at the testbed's address
# 10.77.0.(rank + 1)) for as long as training does, so every rank's
# egress bottleneck carries competing traffic.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:?PY must name the Python interpreter}
if [[ ${COMPETE:-0} == 1 ]]; then
    port=${COMPETE_PORT:-5201}
    next=10.77.0.$(((RANK + 1) % WORLD_SIZE + 1))
    "$PY" scripts/bulk_tcp.py sink --port "$port" &
    sink=$!
    "$PY" scripts/bulk_tcp.py send --to "$next:$port" &
    source=$!
    trap 'kill "$sink" "$source" 2>/dev/null || true' EXIT
fi
"$PY" examples/torch/train_tta.py "$@"
