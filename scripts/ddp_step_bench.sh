#!/usr/bin/env bash
# DDP step time on loopback, side by side: examples/torch/train_tta.py's
# ResNet-18 (WIDTH 64: 11.2M parameters, 45 MB of gradient a step) on
# RANKS torchrun ranks over gloo, over the gradlane backend (exact) and
# with gradlane's DDP hook, in alternation, REPS times each. Prints each
# run's step p50 and p99 and, for the hook, the time spent in the hook
# against the time spent in the Rust allreduce it calls (what the Python
# binding costs), then the medians over the runs.
#
#   bash scripts/ddp_step_bench.sh
#   RANKS=2 STEPS=40 REPS=5 bash scripts/ddp_step_bench.sh
#
# Uses the venv of README's test command (VENV, default .venv-test, made
# by `bash scripts/test.sh`) and certificates from GRADLANE_CERT_DIR (made
# here with the certs tool if unset).
set -euo pipefail
cd "$(dirname "$0")/.."

RANKS=${RANKS:-4}
STEPS=${STEPS:-30}
REPS=${REPS:-3}
WIDTH=${WIDTH:-64}
PORT=${PORT:-29620}
VENV=${VENV:-.venv-test}
TRANSPORTS=${TRANSPORTS:-gloo gradlane hook}

if [ ! -x "$VENV/bin/torchrun" ] || ! "$VENV/bin/python" -c 'import gradlane.torch, sklearn' 2>/dev/null; then
    echo "ddp_step_bench: $VENV has no torch, scikit-learn or gradlane; run 'bash scripts/test.sh' first or set VENV" >&2
    exit 2
fi
if [ -z "${GRADLANE_CERT_DIR:-}" ]; then
    GRADLANE_CERT_DIR=$(mktemp -d)
    trap 'rm -rf "$GRADLANE_CERT_DIR"' EXIT
    cargo run --quiet --release --bin certs -- --out-dir "$GRADLANE_CERT_DIR" --san 127.0.0.1 >/dev/null
fi
export GRADLANE_CERT_DIR

echo "build $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- python examples || echo '+changes'), $(date -u '+%F %H:%M') UTC; $RANKS ranks, width $WIDTH, $STEPS steps a run"
results=$(mktemp)
for rep in $(seq "$REPS"); do
    for t in $TRANSPORTS; do
        out=$("$VENV/bin/torchrun" --nproc-per-node "$RANKS" --master-port "$PORT" \
            examples/torch/train_tta.py --transport "$t" --width "$WIDTH" \
            --steps "$STEPS" --eval-every "$STEPS" 2>&1) || {
            echo "$out" | tail -30 >&2
            echo "ddp_step_bench: the $t run failed" >&2
            exit 1
        }
        p50=$(echo "$out" | sed -n 's/.*step p50 \([0-9.]*\) s p99 \([0-9.]*\) s.*/\1/p')
        p99=$(echo "$out" | sed -n 's/.*step p50 \([0-9.]*\) s p99 \([0-9.]*\) s.*/\2/p')
        hook=$(echo "$out" | sed -n 's/^hook: \([0-9.]*\) s in the hook, \([0-9.]*\) s in the Rust.*/\1 \2/p')
        # Ranks print at once, so their lines can run together.
        sums=$(echo "$out" | grep -o "rank [0-9]* of $RANKS: parameters [0-9a-f]\{16\}" || true)
        distinct=$(echo "$sums" | awk '{print $NF}' | sort -u | wc -l)
        sums=$(echo "$sums" | grep -c . || true)
        if [ "$sums" != "$RANKS" ] || [ "$distinct" != 1 ]; then
            echo "$out" | tail -20 >&2
            echo "ddp_step_bench: $t: the ranks' parameters differ or a rank did not report" >&2
            exit 1
        fi
        echo "$t $p50 $p99 ${hook:-- -}" | tee -a "$results"
    done
done
"$VENV/bin/python" - "$results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for t, p50, p99, hook, net in rows:
    by.setdefault(t, []).append((float(p50), float(p99), hook, net))
base = statistics.median(r[0] for r in by.get("gloo", [(float("nan"),)]))
print("| transport | runs | step p50 s (median) | step p99 s (median) | p50 vs gloo | in the hook / in Rust |")
print("|---|---:|---:|---:|---:|---:|")
for t, rs in by.items():
    p50 = statistics.median(r[0] for r in rs)
    p99 = statistics.median(r[1] for r in rs)
    ratios = [float(r[2]) / float(r[3]) for r in rs if r[2] != "-" and float(r[3]) > 0]
    ratio = f"{statistics.median(ratios):.3f}x" if ratios else "-"
    print(f"| {t} | {len(rs)} | {p50:.3f} | {p99:.3f} | {p50 / base:.2f}x | {ratio} |")
EOF
rm -f "$results"
