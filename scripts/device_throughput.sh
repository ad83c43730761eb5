#!/usr/bin/env bash
# The fast-path figures of a many-core GPU host, in one run that fits a
# 15-minute lease of the `device` machine (no cargo there): the transport's
# CPU seconds per GB on a loopback round, the 4-rank exact allreduce at 1,
# 2 and 4 sockets beside the TCP ring, and the 4-rank DDP step over gloo,
# torch's hooks over gloo, the gradlane backend and gradlane's hook.
#
# Here (a machine with cargo and the venv of scripts/test.sh):
#     bash scripts/device_throughput.sh pack
# puts stripped release binaries and the wheel in target/device/. There,
# from the repository root, with target/device carried:
#     bash scripts/device_throughput.sh run OUTDIR
# Each figure goes to OUTDIR (default $OUT, else /tmp/gradlane-device) as
# its own file; summary.txt collects the lines that matter.
set -uo pipefail
cd "$(dirname "$0")/.."
pack=target/device

case "${1:-}" in
pack)
    set -e
    cargo build --release --bin round_bench --bin allreduce_bench
    mkdir -p "$pack"
    rm -f "$pack"/*
    for b in round_bench allreduce_bench; do
        strip -o "$pack/$b" "target/release/$b"
    done
    venv=${GRADLANE_TEST_VENV:-.venv-test}
    PATH="$venv/bin:$PATH" VIRTUAL_ENV="$PWD/$venv" \
        "$venv/bin/maturin" build --release -m python/Cargo.toml -o "$pack"
    du -sh "$pack"
    exit 0
    ;;
run) ;;
*)
    echo "usage: $0 pack | run [OUTDIR]" >&2
    exit 2
    ;;
esac

out=${2:-${OUT:-/tmp/gradlane-device}}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

py=$(mktemp -d)
python3 -m pip install --quiet --no-index --no-deps --target "$py" "$pack"/gradlane-*.whl
export PYTHONPATH="$py${PYTHONPATH:+:$PYTHONPATH}"
certs=$(mktemp -d)
python3 -c "import gradlane, sys; gradlane.generate_certs(sys.argv[1], ['127.0.0.1', 'localhost'])" "$certs"
note "host: $(nproc) cores, $(nvidia-smi -L 2>/dev/null | head -1), $(python3 -c 'import torch; print("torch", torch.__version__)')"
note "build: $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u '+%Y-%m-%d %H:%M UTC')"

note "== round_bench: lossless loopback round, CPU s/GB"
"$pack/round_bench" --rounds 10 --losses 0 --delay-ms 0 --controllers capped-bbr --quick \
    --only "gradlane BBR" --only "raw quinn BBR" --only "TCP" \
    >"$out/round_bench.txt" 2>"$out/round_bench.err"
grep -E '^\| (gradlane|raw quinn|tokio TCP) \|' "$out/round_bench.txt" | tee -a "$summary"

for k in 1 2 4; do
    note "== allreduce_bench: 4 ranks, resnet50, exact and TCP ring, $k sockets"
    "$pack/allreduce_bench" --ranks 4 --model resnet50 --rounds 3 --losses 0 \
        --only exact --only "TCP ring" --sockets "$k" \
        >"$out/allreduce_s$k.txt" 2>"$out/allreduce_s$k.err"
    grep -E '^\| (exact|TCP ring) \|' "$out/allreduce_s$k.txt" | tee -a "$summary"
done

# The DDP step of the issue's table: ResNet-18 width 64 (45 MB of
# gradient a step), 4 ranks on the one GPU, 30 steps.
# ddp NAME ENV ARGS...: ENV is VAR=VALUE or "-".
ddp() {
    local name=$1 envs=$2
    shift 2
    local -a with=()
    [ "$envs" != - ] && with=("$envs")
    local port=$((29500 + RANDOM % 1000 * 4))
    timeout 120 env "${with[@]}" python3 -m torch.distributed.run --nproc-per-node 4 \
        --master-port "$port" examples/torch/train_tta.py --device cuda --width 64 \
        --steps 30 --eval-every 30 --threads 4 "$@" >"$out/ddp_$name.txt" 2>&1
    note "$name: $(grep -h 'summary:' "$out/ddp_$name.txt" | head -1)"
}
note "== DDP step, 4 ranks"
# Only now: allreduce_bench reads it as its --cert-dir, which needs --rank.
export GRADLANE_CERT_DIR="$certs"
ddp gloo - --transport gloo
ddp gloo_fp16 - --transport gloo --comm-hook fp16
ddp gloo_powersgd - --transport gloo --comm-hook powersgd
ddp gradlane_backend - --transport gradlane
ddp gradlane_backend_sockets4 GRADLANE_SOCKETS=4 --transport gradlane
ddp gradlane_hook - --transport hook --important-format bf16 --lossy-format log8 --lossy-return
