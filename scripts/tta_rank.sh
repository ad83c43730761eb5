#!/usr/bin/env bash
# One rank of scripts/tta_bench.sh, run by scripts/testbed.sh inside the
# rank's namespace: examples/torch/train_tta.py (or RANK_SCRIPT) with the
# arguments given, under the interpreter PY. With COMPETE=1 a bulk TCP
# flow runs from this rank to the next one (rank + 1 mod WORLD_SIZE, at
# the testbed's address 10.77.0.(rank + 1)) for as long as training does,
# so every rank's egress bottleneck carries competing traffic. With
# TENANTS=K, K other tenants' bulk collectives run from this rank to the
# next as bursts, on and off at random (scripts/bulk_tcp.py tenant: mean
# TENANT_ON_MS on, TENANT_OFF_MS off, TENANT_FLOWS connections at once,
# seeded by the rank and the tenant), so that every collective meets a
# tail.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:?PY must name the Python interpreter}
next=10.77.0.$(((RANK + 1) % WORLD_SIZE + 1))
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
if [[ ${COMPETE:-0} == 1 ]]; then
    port=${COMPETE_PORT:-5201}
    "$PY" scripts/bulk_tcp.py sink --port "$port" &
    pids+=($!)
    "$PY" scripts/bulk_tcp.py send --to "$next:$port" &
    pids+=($!)
fi
if [[ ${TENANTS:-0} -gt 0 ]]; then
    port=${TENANT_PORT:-5202}
    "$PY" scripts/bulk_tcp.py sink --port "$port" &
    pids+=($!)
    for k in $(seq 1 "$TENANTS"); do
        "$PY" scripts/bulk_tcp.py tenant --to "$next:$port" --on-ms "${TENANT_ON_MS:?}" \
            --off-ms "${TENANT_OFF_MS:?}" --flows "${TENANT_FLOWS:-1}" --seed $((1000 * RANK + k)) &
        pids+=($!)
    done
fi
"$PY" "${RANK_SCRIPT:-examples/torch/train_tta.py}" "$@"
