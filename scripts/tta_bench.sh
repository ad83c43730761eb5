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
#              each optionally with one of torch's DDP hooks: +fp16
#              (fp16_compress_hook), +bf16 (bf16_compress_hook), +powersgd
#              (powerSGD_hook, rank 4 from step 10, one DDP bucket: see
#              docs/RESULTS.md on why more buckets wedge gloo),
#              +powersgd-fp16 (the same inside torch's fp16_compress_wrapper),
#              either with -rR for PowerSGD of rank R (+powersgd-r8) and
#              -sS for its compression from step S (+powersgd-r8-s3);
#              hook-zero_fill, hook-rescale, hook-error_feedback (the gradlane
#              backend with gradlane's DDP hook and that recovery),
#              hook-datagrams (zero fill, the lossy part always datagrams),
#              hook-bf16log8-tT (the hook with bf16 important chunks, log8
#              lossy ones with compression feedback, the owners' lossy
#              return, loss tolerance T); hook-f16-tT (the same in f16);
#              hook-...-tT+powersgd is gradlane's powersgd_hook: PowerSGD
#              as +powersgd, every step through that hook (the warm-up's
#              full gradients, then the factors); hook-...-tT-dl[F] adds
#              the adaptive deadline (factor F, default 1.25, both halves
#              of every allreduce) with error feedback; -rot the Hadamard
#              rotation; +sparse[-dD] is gradlane's sparse_hook keeping a
#              share D (default 0.01), exact over gloo or the backend,
#              through the differentiated allgather after a hook base;
#              +localsgd[-pP] is torch's local SGD
#              (post_localSGD_hook, averaging every P steps, default 4,
#              from step 10; its ranks' parameters differ between
#              averages, so params_equal says no where a run ends between)
#   loss       the testbed's LOSS, a drop probability
#   seed       train_tta.py's --seed (model, split and batches)
#   condition  plain; delayD (D ms of one-way delay on every rank's input,
#              scripts/testbed.sh --delay-ms D, so a 2D ms RTT); compete (a
#              bulk TCP flow from every rank to the next through the same
#              bottleneck); compete-dscp (the same, with the testbed's
#              priority queues for DSCP 56 and the hook's --dscp marks);
#              tail1.5 and tail3 (a shared cloud: other tenants' bulk
#              collectives between the same ranks, on and off at random,
#              as TAIL1_5 and TAIL3 say, "K ON_MS OFF_MS FLOWS": K tenants
#              a rank, each FLOWS connections at once for ON_MS on
#              average, then silent OFF_MS; calibrated so that a plain
#              gloo allreduce of the gradient has that p99/p50,
#              scripts/tail_probe.py)
#
# PLAN=full runs in stages, each resumable, each choosing from the runs
# before it (scripts/tta_report.py --pick):
#   1. prune: every variant of VARIANTS, lossless and at 5% loss, seed 0
#      (by default gloo cubic and bbr alone, with +fp16 and with
#      +powersgd; gradlane alone, +fp16 and +powersgd; the hook with
#      bf16 + log8 at loss tolerance 0.4 and 0.7. The hook in f32 and
#      torch's bf16 hook are left out: f32 lost to the exact backend in
#      every cell before, and bf16 sends the bytes fp16 does);
#   2. finalists: the two best gloo and the two best gradlane variants of
#      stage 1 (by the geometric mean of their time to target over its two
#      cells) at 1% loss, plain and delay20, seed 0;
#   3. key cells: per condition (0, 1%, 5% plain; 1% delay20) the best gloo
#      and the best gradlane variant with seeds 1 and 2 as well;
#   4. compete: the best gloo and gradlane variant of the lossless cell
#      under a competing flow, and the best hook variant under compete-dscp.
# PLAN=prune stops after stage 1. CELLS (one cell a line, or cells
# separated by ";") replaces the plan.
#
# Each run trains for STEPS steps (the learning rate's cosine reaches 0
# there) or until TIME_LIMIT seconds of training, whichever comes first,
# and evaluates every EVAL_EVERY steps (default 1: the time to target is
# the training time, evaluations excluded, of the first step whose
# evaluation reaches TARGET). Results go to OUT (default docs/tta):
# runs/<cell>.csv per run (rank 0's evaluations), runs.csv (one line a
# run), and the report. A cell whose line is in runs.csv already is
# skipped, so an interrupted bench resumes.
#
# DEVICE (cpu or cuda, default cpu) is where each rank trains; on a GPU
# host all ranks share its GPUs (train_tta.py --device). RACE_TAG names
# the hardware in runs.csv (default: the CPU model, and the GPU's name
# with DEVICE=cuda).
#
# Needs root (the testbed) and the venv of README's test command (VENV,
# default .venv-test, made by `bash scripts/test.sh`), or an interpreter
# with torch, scikit-learn and the gradlane wheel (PY); installs
# matplotlib for the plots where missing. cargo builds the certs and
# delay_stage binaries where it is installed; without it (a GPU host with
# the tree carried, docs/GPU.md) they must be in target/release already.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/certs.sh
source scripts/lib/certs.sh

RANKS=${RANKS:-4}
RATE=${RATE:-100mbit}
QUEUE_BYTES=${QUEUE_BYTES:-1000000}
WIDTH=${WIDTH:-32}
STEPS=${STEPS:-50}
EVAL_EVERY=${EVAL_EVERY:-1}
TARGET=${TARGET:-0.95}
TIME_LIMIT=${TIME_LIMIT:-120}
OUT=${OUT:-docs/tta}
# The tail conditions' tenants, "K ON_MS OFF_MS FLOWS", as calibrated
# (docs/RESULTS.md, "The tail conditions").
case $RATE in
    100mbit) tail_defaults=("1 1000 12000 1" "1 3000 15000 16") ;;
    *) tail_defaults=("1 300 3000 1" "1 300 3000 4") ;;
esac
TAIL1_5=${TAIL1_5:-${tail_defaults[0]}}
TAIL3=${TAIL3:-${tail_defaults[1]}}
VENV=${VENV:-.venv-test}
PLAN=${PLAN:-full}
VARIANTS=${VARIANTS:-gloo-cubic gloo-bbr gloo-cubic+fp16 gloo-bbr+fp16 gloo-cubic+powersgd gloo-bbr+powersgd gradlane gradlane+fp16 gradlane+powersgd hook-bf16log8-t0.4 hook-bf16log8-t0.7}
DEVICE=${DEVICE:-cpu}
PY=${PY:-$(realpath -ms "$VENV/bin/python")}
OUT=$(realpath -m "$OUT")

die() { echo "tta_bench: $*" >&2; exit 2; }
[[ $(id -u) = 0 ]] || die "needs root (network namespaces); run it with sudo -E"
"$PY" -c 'import gradlane.torch, sklearn' 2>/dev/null ||
    die "$PY has no torch, scikit-learn or gradlane; run 'bash scripts/test.sh' first or set VENV or PY"
"$PY" -c 'import matplotlib' 2>/dev/null || "$PY" -m pip install --quiet matplotlib ||
    echo "tta_bench: no matplotlib and none to install: the report comes without plots" >&2
case $DEVICE in
    cpu) tag="cpu: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)" ;;
    cuda) tag="cuda: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')" ;;
    *) die "DEVICE is cpu or cuda, not $DEVICE" ;;
esac
RACE_TAG=${RACE_TAG:-$tag}
case $PLAN in
    full | prune) ;;
    *) die "PLAN is full or prune, not $PLAN" ;;
esac

if command -v cargo >/dev/null; then
    cargo build --quiet --release --bin certs
fi
[[ -x target/release/certs ]] || die "no target/release/certs (cargo build --release --bin certs, or carry it)"
CERTS=$(mktemp -d)
WORK=$(mktemp -d)
trap 'rm -rf "$CERTS" "$WORK"' EXIT
testbed_certs "$CERTS" "$RANKS"

mkdir -p "$OUT/runs"
RUNS=$OUT/runs.csv
[[ -f $RUNS ]] || echo "variant,loss,seed,condition,rate,ranks,width,steps_run,train_s,time_to_target_s,final_acc,step_p50_s,step_p99_s,sent_bytes_per_step,measured_loss,params_equal,build,date,hardware" >"$RUNS"
if git rev-parse --short HEAD >/dev/null 2>&1; then
    build=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- examples python gradlane scripts || echo +changes)
else
    # A tree carried without .git: scripts/gpu_pack.sh wrote its build.
    build=$(cat target/gpu/BUILD 2>/dev/null || echo unknown)
fi
# Runs the cells given (one "variant loss seed condition" a line) under
# the stage name $1.
run_cells() {
    local stage=$1 cells=$2 n i=0 variant loss seed condition name args cc base torch_hook
    local compete dscp delay tenants tenant_count tenant_on tenant_off tenant_flows logs t0 status took summary sums equal measured row async hardware
    cells=$(echo "$cells" | sed '/^ *$/d')
    [[ -n $cells ]] || return 0
    n=$(echo "$cells" | wc -l)
    echo "tta_bench: stage $stage, $n runs"
    while read -r variant loss seed condition; do
        i=$((i + 1))
        name="${condition}_${variant}_loss${loss}_seed${seed}"
        if grep -q "^$variant,$loss,$seed,$condition,$RATE,$RANKS,$WIDTH," "$RUNS"; then
            echo "[$stage $i/$n] $name: in $RUNS already, skipped"
            continue
        fi
        args=(--width "$WIDTH" --steps "$STEPS" --eval-every "$EVAL_EVERY" --target-acc "$TARGET"
            --time-limit "$TIME_LIMIT" --seed "$seed" --csv "$OUT/runs/$name.csv")
        args+=(--device "$DEVICE")
        cc=cubic async=1
        base=${variant%%+*} torch_hook=none
        [[ $variant == *+* ]] && torch_hook=${variant#*+}
        # +powersgd-rR, +powersgd-fp16-rR: PowerSGD of rank R (default 4);
        # -sS after either: its compression from step S (default 10).
        if [[ $torch_hook =~ ^(powersgd(-fp16)?)(-r([0-9]+))?(-s([0-9]+))?$ ]]; then
            torch_hook=${BASH_REMATCH[1]}
            [[ -n ${BASH_REMATCH[4]} ]] && args+=(--powersgd-rank "${BASH_REMATCH[4]}")
            [[ -n ${BASH_REMATCH[6]} ]] && args+=(--powersgd-start "${BASH_REMATCH[6]}")
        fi
        # +localsgd-pP: local SGD averaging every P steps (default 4).
        if [[ $torch_hook =~ ^localsgd-p([0-9]+)$ ]]; then
            torch_hook=localsgd
            args+=(--localsgd-period "${BASH_REMATCH[1]}")
        fi
        # +sparse-dD: gradlane's sparse hook keeping a share D (default
        # 0.01): exact over gloo or the backend, the differentiated
        # allgather after a hook base.
        if [[ $torch_hook =~ ^sparse(-d([0-9.]+))?$ ]]; then
            torch_hook=sparse
            args+=(--sparse-density "${BASH_REMATCH[2]:-0.01}")
        fi
        case $torch_hook in
            none) ;;
            sparse) args+=(--comm-hook sparse) ;;
            localsgd) args+=(--comm-hook localsgd) ;;
            fp16 | bf16) args+=(--comm-hook "$torch_hook") ;;
            # One bucket: see docs/RESULTS.md on PowerSGD over gloo.
            powersgd | powersgd-fp16) args+=(--comm-hook "$torch_hook" --bucket-cap-mb 64) ;;
            *) die "unknown torch hook '+$torch_hook' in $variant" ;;
        esac
        case $base in
            gloo-cubic) args+=(--transport gloo) ;;
            gloo-bbr) args+=(--transport gloo); cc=bbr ;;
            gradlane) args+=(--transport gradlane) ;;
            # The backend with each collective done inside the call (no
            # overlap with backward): what overlapping gains.
            gradlane-sync) args+=(--transport gradlane); async=0 ;;
            hook-zero_fill | hook-rescale | hook-error_feedback) args+=(--transport hook --recovery "${base#hook-}") ;;
            hook-datagrams) args+=(--transport hook --lossy-carrier datagrams) ;;
            hook-bf16log8-t* | hook-f16-t*)
                # The hook in bf16 + log8 (the owners' lossy return) or in
                # f16 (torch's fp16 hook's bytes, through the hook), at
                # loss tolerance T; -dl[F]: the adaptive deadline, factor F
                # over the median step (default 1.25), with error feedback
                # (both halves bounded); -rot: the Hadamard rotation.
                local spec=${base#hook-*-t} factor
                case $base in
                    hook-f16-t*) args+=(--transport hook --important-format f16 --lossy-format f16) ;;
                    *) args+=(--transport hook --important-format bf16 --lossy-format log8 --lossy-return) ;;
                esac
                if [[ $spec == *-rot* ]]; then
                    args+=(--rotation hadamard)
                    spec=${spec/-rot/}
                fi
                if [[ $spec == *-dl* ]]; then
                    factor=${spec#*-dl}
                    args+=(--deadline adaptive --recovery error_feedback --deadline-factor "${factor:-1.25}")
                fi
                args+=(--loss-tolerance "${spec%%-dl*}") ;;
            *) die "unknown variant $variant" ;;
        esac
        [[ $torch_hook == none || $base == gloo-* || $base == gradlane* || $torch_hook == powersgd ||
            $torch_hook == sparse ]] ||
            die "$variant: torch's hooks go over a backend (gloo-*, gradlane); gradlane's hook takes +powersgd or +sparse"
        compete=0 dscp=0 delay=0 tenants="0 1 1 1"
        case $condition in
            plain) ;;
            tail1.5) tenants=$TAIL1_5 ;;
            tail3) tenants=$TAIL3 ;;
            delay[0-9]*) delay=${condition#delay} ;;
            compete) compete=1 ;;
            compete-dscp) compete=1 dscp=1; args+=(--dscp) ;;
            *) die "unknown condition $condition" ;;
        esac
        logs=$WORK/$name
        mkdir -p "$logs"
        t0=$(date +%s)
        printf '[%s %d/%d] %s ... ' "$stage" "$i" "$n" "$name"
        status=0
        # A hard bound far above any healthy run, so that a wedged one cannot
        # eat the bench; the testbed tears down on TERM.
        read -r tenant_count tenant_on tenant_off tenant_flows <<<"$tenants"
        TENANTS=$tenant_count TENANT_ON_MS=$tenant_on TENANT_OFF_MS=$tenant_off TENANT_FLOWS=$tenant_flows \
        GRADLANE_ASYNC=$async GRADLANE_CERT_DIR=$CERTS PY=$PY COMPETE=$compete RANKS=$RANKS RATE=$RATE \
            QUEUE_BYTES=$QUEUE_BYTES LOSS=$loss DELAY_MS=$delay TCP_CC=$cc DSCP_PRIORITY=$dscp PRIORITY_DSCP=56 \
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
        hardware=""
        # runs.csv files begun before the hardware column keep their columns.
        [[ $(head -1 "$RUNS") == *,hardware ]] && hardware=",\"${RACE_TAG//\"/}\""
        echo "$variant,$loss,$seed,$condition,$RATE,$RANKS,$WIDTH,$row,$measured,$equal,$build,$(date -u +%FT%H:%MZ)$hardware" >>"$RUNS"
        echo "${took}s: $summary; loss measured $measured; parameters equal: $equal"
        cp "$logs/rank0.log" "$OUT/runs/$name.log"
    done <<<"$cells"
}

# The cells a stage of PLAN=full adds, chosen from the runs so far.
pick() { "$PY" scripts/tta_report.py --out "$OUT" --target "$TARGET" --pick "$1"; }

echo "tta_bench: $RANKS ranks, $RATE per rank, queue $QUEUE_BYTES B, width $WIDTH, $STEPS steps, evaluated every $EVAL_EVERY, target $TARGET, limit ${TIME_LIMIT}s; build $build"
started=$(date +%s)
if [[ -n ${CELLS:-} ]]; then
    run_cells cells "$(echo "$CELLS" | tr ';' '\n')"
else
    prune=""
    for l in 0 0.05; do
        for v in $VARIANTS; do prune+="$v $l 0 plain"$'\n'; done
    done
    run_cells prune "$prune"
    if [[ $PLAN == full ]]; then
        run_cells finalists "$(pick finalists)"
        run_cells key "$(pick key)"
        run_cells compete "$(pick compete)"
    fi
fi

echo "tta_bench: done in $((($(date +%s) - started) / 60)) min"
"$PY" scripts/tta_report.py --out "$OUT" --target "$TARGET"
