#!/usr/bin/env bash
# Time to accuracy behind a lossy bottleneck: examples/torch/train_tta.py
# (a ResNet-18 of WIDTH channels on the digits) on RANKS ranks in the
# namespaces of scripts/testbed.sh (each rank's egress an HTB class of
# RATE with a QUEUE_BYTES tail-drop queue, kernel random loss on each
# rank's input), once per cell of the plan, then a table and plots
# (scripts/tta_report.py).
#
#   sudo bash scripts/tta_bench.sh                     # PLAN=full, as in docs/RESULTS.md
#   PLAN=key sudo -E bash scripts/tta_bench.sh         # the 5% loss cells only, 3 seeds
#   CELLS="gloo-bbr 0.05 0 plain" sudo -E bash scripts/tta_bench.sh
#
# A cell is "variant loss seed condition":
#   variant    gloo-cubic, gloo-bbr (torch's gloo over TCP with that
#              congestion control), gradlane (the gradlane backend, exact),
#              hook-zero_fill, hook-rescale, hook-error_feedback (the
#              gradlane backend with gradlane's DDP hook and that recovery),
#              hook-datagrams (zero fill, the lossy part always datagrams)
#   loss       the testbed's LOSS, a drop probability
#   seed       train_tta.py's --seed (model, split and batches)
#   condition  plain; compete (a bulk TCP flow from every rank to the next
#              through the same bottleneck); compete-dscp (the same, with
#              the testbed's priority queues for DSCP 56 and the hook's
#              --dscp marks)
# PLAN=full runs every variant at 0, 1% and 5% loss with seed 0, the key
# cells (gloo-cubic, gloo-bbr and hook-zero_fill at 5%) with seeds 1 and 2
# as well, hook-datagrams at 0, 1% and 5% with seed 0, and gloo-cubic,
# gloo-bbr, hook-zero_fill under compete and hook-zero_fill under
# compete-dscp, lossless; key cells first. CELLS
# (one cell a line, or cells separated by ";") replaces the plan.
#
# Each run trains for STEPS steps (the learning rate's cosine reaches 0
# there) or until TIME_LIMIT seconds of training, whichever comes first.
# Results go to OUT (default docs/tta): runs/<cell>.csv per run (rank 0's
# evaluations), runs.csv (one line a run), and the report. A cell whose
# line is in runs.csv already is skipped, so an interrupted bench resumes.
#
# Needs root (the testbed) and the venv of README's test command (VENV,
# default .venv-test, made by `bash scripts/test.sh`); installs matplotlib
# into it for the plots.
set -euo pipefail
cd "$(dirname "$0")/.."

RANKS=${RANKS:-4}
RATE=${RATE:-100mbit}
QUEUE_BYTES=${QUEUE_BYTES:-1000000}
WIDTH=${WIDTH:-32}
STEPS=${STEPS:-50}
EVAL_EVERY=${EVAL_EVERY:-5}
TARGET=${TARGET:-0.95}
TIME_LIMIT=${TIME_LIMIT:-240}
OUT=${OUT:-docs/tta}
VENV=${VENV:-.venv-test}
PLAN=${PLAN:-full}
PY=$(realpath -ms "$VENV/bin/python")
OUT=$(realpath -m "$OUT")

die() { echo "tta_bench: $*" >&2; exit 2; }
[[ $(id -u) = 0 ]] || die "needs root (network namespaces); run it with sudo -E"
"$PY" -c 'import gradlane.torch, sklearn' 2>/dev/null ||
    die "$VENV has no torch, scikit-learn or gradlane; run 'bash scripts/test.sh' first or set VENV"
"$PY" -c 'import matplotlib' 2>/dev/null || "$PY" -m pip install --quiet matplotlib

plan() {
    local v l s
    # Key cells first, so that a bench cut short has them.
    for s in 0 1 2; do
        for v in gloo-cubic gloo-bbr hook-zero_fill; do echo "$v 0.05 $s plain"; done
    done
    for l in 0 0.01; do
        for v in gloo-cubic gloo-bbr gradlane hook-zero_fill; do echo "$v $l 0 plain"; done
    done
    for l in 0.05 0.01 0; do
        for v in gradlane hook-rescale hook-error_feedback; do
            [[ $v = gradlane && $l != 0.05 ]] || echo "$v $l 0 plain"
        done
    done
    for l in 0 0.01 0.05; do echo "hook-datagrams $l 0 plain"; done
    for v in gloo-cubic gloo-bbr hook-zero_fill; do echo "$v 0 0 compete"; done
    echo "hook-zero_fill 0 0 compete-dscp"
}
case $PLAN in
    full) cells=$(plan) ;;
    key) cells=$(plan | awk '$2 == 0.05 && $4 == "plain" && $1 ~ /gloo|zero_fill/') ;;
    *) die "PLAN is full or key, not $PLAN" ;;
esac
[[ -n ${CELLS:-} ]] && cells=$(echo "$CELLS" | tr ';' '\n' | sed '/^ *$/d')

cargo build --quiet --release --bin certs
CERTS=$(mktemp -d)
WORK=$(mktemp -d)
trap 'rm -rf "$CERTS" "$WORK"' EXIT
sans=()
for r in $(seq 1 "$RANKS"); do sans+=(--san "10.77.0.$r"); done
./target/release/certs --out-dir "$CERTS" "${sans[@]}" >/dev/null

mkdir -p "$OUT/runs"
RUNS=$OUT/runs.csv
[[ -f $RUNS ]] || echo "variant,loss,seed,condition,rate,ranks,width,steps_run,train_s,time_to_target_s,final_acc,step_p50_s,step_p99_s,sent_bytes_per_step,measured_loss,params_equal,build,date" >"$RUNS"
build=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- examples python gradlane scripts || echo +changes)
n=$(echo "$cells" | wc -l)
i=0
echo "tta_bench: $n runs; $RANKS ranks, $RATE per rank, queue $QUEUE_BYTES B, width $WIDTH, $STEPS steps, target $TARGET, limit ${TIME_LIMIT}s; build $build"
started=$(date +%s)
while read -r variant loss seed condition; do
    i=$((i + 1))
    name="${condition}_${variant}_loss${loss}_seed${seed}"
    if grep -q "^$variant,$loss,$seed,$condition,$RATE,$RANKS,$WIDTH," "$RUNS"; then
        echo "[$i/$n] $name: in $RUNS already, skipped"
        continue
    fi
    args=(--width "$WIDTH" --steps "$STEPS" --eval-every "$EVAL_EVERY" --target-acc "$TARGET"
        --time-limit "$TIME_LIMIT" --seed "$seed" --csv "$OUT/runs/$name.csv")
    cc=cubic
    case $variant in
        gloo-cubic) args+=(--transport gloo) ;;
        gloo-bbr) args+=(--transport gloo); cc=bbr ;;
        gradlane) args+=(--transport gradlane) ;;
        hook-zero_fill | hook-rescale | hook-error_feedback) args+=(--transport hook --recovery "${variant#hook-}") ;;
        hook-datagrams) args+=(--transport hook --lossy-carrier datagrams) ;;
        *) die "unknown variant $variant" ;;
    esac
    compete=0 dscp=0
    case $condition in
        plain) ;;
        compete) compete=1 ;;
        compete-dscp) compete=1 dscp=1; args+=(--dscp) ;;
        *) die "unknown condition $condition" ;;
    esac
    logs=$WORK/$name
    mkdir -p "$logs"
    t0=$(date +%s)
    printf '[%d/%d] %s ... ' "$i" "$n" "$name"
    status=0
    # A hard bound far above any healthy run, so that a wedged one cannot
    # eat the bench; the testbed tears down on TERM.
    GRADLANE_CERT_DIR=$CERTS PY=$PY COMPETE=$compete RANKS=$RANKS RATE=$RATE \
        QUEUE_BYTES=$QUEUE_BYTES LOSS=$loss TCP_CC=$cc DSCP_PRIORITY=$dscp PRIORITY_DSCP=56 \
        LOG_DIR=$logs GRACE=60 timeout $((TIME_LIMIT * 3 + 600)) \
        bash scripts/testbed.sh -- bash scripts/tta_rank.sh "${args[@]}" 2>"$logs/testbed.err" || status=$?
    took=$(($(date +%s) - t0))
    if [[ $status != 0 ]]; then
        echo "FAILED (status $status, ${took}s); logs:"
        tail -n 5 "$logs"/rank*.log "$logs/testbed.err" | sed 's/^/    /' || true
        cp -r "$logs" "$OUT/runs/$name.failed" 2>/dev/null || true
        continue
    fi
    summary=$(grep -h '^summary:' "$logs/rank0.log" | tail -1)
    sums=$(cat "$logs"/rank*.log | grep -o "rank [0-9]* of $RANKS: parameters [0-9a-f]\{16\}" | awk '{print $NF}')
    equal=no
    [[ $(echo "$sums" | grep -c .) = "$RANKS" && $(echo "$sums" | sort -u | wc -l) = 1 ]] && equal=yes
    measured=$(sed -n 's/.*(loss \([0-9.]*\)).*/\1/p' "$logs/testbed.err" | awk '{s += $1; n++} END { if (n) printf "%.4f", s / n }')
    "$PY" - "$OUT/runs/$name.csv" "$summary" "$TARGET" >"$WORK/row" <<'EOF'
import csv, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))
m = re.search(r"(\d+) steps in ([\d.]+) s, step p50 ([\d.]+) s p99 ([\d.]+) s", sys.argv[2])
steps, train_s, p50, p99 = m.groups()
target = float(sys.argv[3])
hit = next((r["train_s"] for r in rows if float(r["test_acc"]) >= target), "")
last = rows[-1]
per_step = round(int(last["sent_bytes"]) / int(last["step"])) if last["sent_bytes"] else ""
print(f"{steps},{train_s},{hit},{last['test_acc']},{p50},{p99},{per_step}")
EOF
    row=$(cat "$WORK/row")
    echo "$variant,$loss,$seed,$condition,$RATE,$RANKS,$WIDTH,$row,$measured,$equal,$build,$(date -u +%FT%H:%MZ)" >>"$RUNS"
    echo "${took}s: $summary; loss measured $measured; parameters equal: $equal"
    cp "$logs/rank0.log" "$OUT/runs/$name.log"
done <<<"$cells"
echo "tta_bench: done in $((($(date +%s) - started) / 60)) min"
"$PY" scripts/tta_report.py --out "$OUT" --target "$TARGET"
