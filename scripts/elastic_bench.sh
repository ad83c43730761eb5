#!/usr/bin/env bash
# A rank dies mid-training: time to accuracy with gradlane's elastic
# membership against gloo's checkpoint-restart (issue 46). RANKS ranks in
# the namespaces of scripts/testbed.sh (each rank's egress an HTB class of
# RATE, kernel random loss LOSS on each rank's input) train
# examples/torch/train_tta.py (a ResNet-18 of WIDTH channels on the
# digits), one run per variant, then a table and a plot of accuracy
# against time.
#
#   sudo -E bash scripts/elastic_bench.sh                 # the figure: A, B, C at 1% loss
#   WIDTH=8 STEPS=30 KILL_STEP=8 REJOIN_STEP=14 CKPT_EVERY=5 OUT=/tmp/eb \
#       sudo -E bash scripts/elastic_bench.sh             # a small smoke run
#   sudo -E bash scripts/elastic_bench.sh --report        # the table and plot again, from OUT
#
# Variants (VARIANTS, default "gradlane gradlane-elastic gloo-bbr-restart"):
#   gradlane           A: the gradlane backend, nobody dies (the baseline;
#                      the backend's defaults, as tta_bench's gradlane)
#   gradlane-elastic   B: GRADLANE_ON_RANK_FAILURE=continue,
#                      GRADLANE_IDLE_TIMEOUT=IDLE_TIMEOUT and train_tta.py
#                      --elastic (gradlane.torch.elastic.admit after every
#                      step). Rank KILL_RANK SIGKILLs itself at the start of
#                      step KILL_STEP; the survivors find it dead after the
#                      idle timeout and train on. Once rank 0's CSV shows
#                      step REJOIN_STEP a replacement starts in the dead
#                      rank's namespace (same environment, GRADLANE_REJOIN=1):
#                      it is admitted at the members' next step, catches up
#                      (elastic.catch_up) and trains with them to the end
#   gloo-bbr-restart   C: torch's gloo over TCP bbr (tta_bench's gloo-bbr)
#                      with checkpoint-restart: rank 0 saves model,
#                      optimizer, schedule and step every CKPT_EVERY steps;
#                      rank KILL_RANK SIGKILLs itself at the start of step
#                      KILL_STEP; gloo fails the survivors, and, as torchrun
#                      does, every rank is stopped and started again (up to
#                      MAX_RESTARTS times) with --resume from the last
#                      checkpoint, MASTER_PORT one higher each time
# and, for reference: gradlane-continue (B's settings, nobody dies: what
# GRADLANE_ON_RANK_FAILURE=continue and admit cost alone), gloo-bbr and
# gloo-cubic (gloo, nobody dies), gloo-cubic-restart (C over cubic).
# HOOK (none, fp16 or bf16; default none) puts that torch DDP hook on
# every run (the variant's name gets +HOOK). PowerSGD is left out: the
# restart variants' checkpoint does not carry its state.
#
# The clock: rank 0's train_s (train_tta.py --clock) is the wall time since
# the first step of the run began, evaluations excluded (as tta_bench's
# training time), across restarts: the failure, its detection, the
# restart (new processes, rendezvous, checkpoint load) and the steps done
# again all count. Every run evaluates every EVAL_EVERY steps (default 1);
# its time to target is the clock at the first evaluation reaching
# TARGET. In the plot a dotted line marks the kill (the end of step
# KILL_STEP-1 on rank 0's clock: the victim dies at the start of the
# next), a dash-dotted one where rank 0 found out (gradlane's new view, or
# gloo's error) and a dashed one where the run got back to full strength
# (the replacement admitted, or the restarted ranks' first step).
#
# Settings (environment, defaults in brackets): RANKS [4], RATE [100mbit],
# QUEUE_BYTES [1000000], LOSS [0.01], WIDTH [32], STEPS [50], EVAL_EVERY
# [1], TARGET [0.95], SEED [0], TIME_LIMIT [300] (seconds of training on
# the clock), KILL_RANK [2], KILL_STEP [15], REJOIN_STEP [25], CKPT_EVERY
# [10], IDLE_TIMEOUT [5] (GRADLANE_IDLE_TIMEOUT of B: its failure
# detection bound), MAX_RESTARTS [3], DEVICE [cpu], OUT [docs/tta-elastic],
# VENV [.venv-test] or PY.
#
# Output in OUT: runs.csv (one line a run: time to target, steps, training
# time, step time p50/p99 of rank 0's last life, final accuracy, whether
# the final ranks' parameters are equal, the kill, detection and recovery
# times, lives, steps done again, the loss measured), runs/<variant>.csv
# (rank 0's evaluations; after a restart the steps go back to the
# checkpoint's), runs/<variant>/ (every rank's log across its lives, the
# testbed's counters), table.md and accuracy.png. A variant already in
# runs.csv with the same settings is skipped (delete its line to run it
# again).
#
# Needs root (the testbed) and the venv of README's test command, or an
# interpreter with torch, scikit-learn and the gradlane wheel (PY);
# matplotlib for the plot. target/release/certs is built if missing.
#
# Internally the testbed starts `elastic_bench.sh --rank ARGS...` as each
# rank: a wrapper that runs train_tta.py ARGS and restarts it as the
# variant says (EB_MODE none, rejoin or restart).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/certs.sh
source scripts/lib/certs.sh

# ---------------------------------------------------------------- the rank

# One line on the rank's log.
say() { echo "elastic_bench [rank ${RANK:-?} $(date +%T.%3N)]: $*"; }

# True while process $1 runs (not gone, not a zombie).
running() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $st && ${st:0:1} != Z ]]
}

# The step of the last row of rank 0's CSV (0 while there is none).
last_step() {
    local s
    s=$(tail -n 1 "$1" 2>/dev/null | cut -d, -f2)
    [[ $s =~ ^[0-9]+$ ]] && echo "$s" || echo 0
}

# One rank of a run, inside its namespace with torchrun's environment.
rank_main() {
    local train=(examples/torch/train_tta.py) st life=0 port0 child i deadline
    local -a more=()
    case ${EB_MODE:-none} in
        none) exec "$PY" "${train[@]}" "$@" ;;
        rejoin)
            # B: the victim's first life dies; its replacement starts once
            # the survivors are at REJOIN_STEP.
            set +e
            "$PY" "${train[@]}" "$@"
            st=$?
            set -e
            # Only the victim's SIGKILL (128 + 9) is replaced.
            [[ $st != 137 || $RANK != "$EB_VICTIM" ]] && exit "$st"
            say "train_tta.py ended with status $st; a replacement starts once rank 0's CSV shows step $EB_REJOIN_STEP"
            deadline=$((SECONDS + EB_WAIT))
            while (($(last_step "$EB_CSV") < EB_REJOIN_STEP)); do
                if ((SECONDS > deadline)); then
                    say "rank 0 did not reach step $EB_REJOIN_STEP within ${EB_WAIT}s"
                    exit "$st"
                fi
                sleep 0.1
            done
            say "rank 0 is at step $(last_step "$EB_CSV"): starting the replacement (GRADLANE_REJOIN=1)"
            GRADLANE_REJOIN=1 "$PY" "${train[@]}" "$@" &
            child=$!
            # The members admit it at a step's end: once they are through
            # their last step it would wait for an admission that never
            # comes. Given up 30 s after rank 0's last step, unless admitted.
            deadline=
            while running "$child"; do
                if [[ -z $deadline ]] && (($(last_step "$EB_CSV") >= EB_STEPS)); then
                    deadline=$((SECONDS + 30))
                fi
                if [[ -n $deadline ]] && ((SECONDS > deadline)) && ! grep -q "^elastic: rank $RANK rejoined" "$EB_LOG"; then
                    say "the members finished without admitting the replacement: REJOIN_STEP is too close to STEPS for this run"
                    kill -KILL "$child" 2>/dev/null || true
                fi
                sleep 0.2
            done
            set +e
            wait "$child"
            st=$?
            set -e
            exit "$st"
            ;;
        restart)
            # C, torchrun's way: when any rank fails, every rank is stopped,
            # and all start again from the checkpoint.
            port0=$MASTER_PORT
            while :; do
                MASTER_PORT=$((port0 + life)) "$PY" "${train[@]}" "$@" "${more[@]}" &
                child=$!
                while running "$child"; do
                    if [[ -e $EB_SYNC/fail.$life ]]; then
                        say "another rank failed: stopping this one"
                        kill -TERM "$child" 2>/dev/null || true
                        for ((i = 0; i < 50; i++)); do
                            running "$child" || break
                            sleep 0.1
                        done
                        kill -KILL "$child" 2>/dev/null || true
                        break
                    fi
                    sleep 0.1
                done
                set +e
                wait "$child"
                st=$?
                set -e
                ((st == 0)) && exit 0
                touch "$EB_SYNC/fail.$life" "$EB_SYNC/down.$life.$RANK"
                say "life $life ended with status $st; waiting for every rank to be down"
                deadline=$((SECONDS + 120))
                while (($(compgen -G "$EB_SYNC/down.$life.*" | wc -l) < WORLD_SIZE)); do
                    if ((SECONDS > deadline)); then
                        say "not every rank went down within 120s"
                        exit "$st"
                    fi
                    sleep 0.1
                done
                life=$((life + 1))
                if ((life > EB_MAX_RESTARTS)); then
                    say "no restarts left ($EB_MAX_RESTARTS)"
                    exit "$st"
                fi
                more=(--resume)
                say "restart $life: train_tta.py --resume, MASTER_PORT $((port0 + life))"
            done
            ;;
        *)
            say "EB_MODE is none, rejoin or restart, not '$EB_MODE'"
            exit 2
            ;;
    esac
}

if [[ ${1:-} == --rank ]]; then
    shift
    rank_main "$@"
    exit $?
fi

# ------------------------------------------------------------------ the bench

RANKS=${RANKS:-4}
RATE=${RATE:-100mbit}
QUEUE_BYTES=${QUEUE_BYTES:-1000000}
LOSS=${LOSS:-0.01}
WIDTH=${WIDTH:-32}
STEPS=${STEPS:-50}
EVAL_EVERY=${EVAL_EVERY:-1}
TARGET=${TARGET:-0.95}
SEED=${SEED:-0}
TIME_LIMIT=${TIME_LIMIT:-300}
KILL_RANK=${KILL_RANK:-2}
KILL_STEP=${KILL_STEP:-15}
REJOIN_STEP=${REJOIN_STEP:-25}
CKPT_EVERY=${CKPT_EVERY:-10}
IDLE_TIMEOUT=${IDLE_TIMEOUT:-5}
MAX_RESTARTS=${MAX_RESTARTS:-3}
HOOK=${HOOK:-none}
DEVICE=${DEVICE:-cpu}
VARIANTS=${VARIANTS:-gradlane gradlane-elastic gloo-bbr-restart}
OUT=${OUT:-docs/tta-elastic}
VENV=${VENV:-.venv-test}
PY=${PY:-$(realpath -ms "$VENV/bin/python")}
OUT=$(realpath -m "$OUT")

die() { echo "elastic_bench: $*" >&2; exit 2; }
int() { [[ $1 =~ ^[0-9]+$ ]]; }

report_only=0
case ${1:-} in
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    --report) report_only=1 ;;
    "") ;;
    *) die "unknown argument '$1' (--help, --report)" ;;
esac

for v in RANKS WIDTH STEPS EVAL_EVERY SEED TIME_LIMIT KILL_RANK KILL_STEP REJOIN_STEP CKPT_EVERY MAX_RESTARTS; do
    int "${!v}" || die "$v must be a whole number, not '${!v}'"
done
((KILL_RANK > 0 && KILL_RANK < RANKS)) || die "KILL_RANK must be 1..RANKS-1 (rank 0 holds the store), not $KILL_RANK"
((KILL_STEP >= 2 && KILL_STEP < REJOIN_STEP && REJOIN_STEP < STEPS)) ||
    die "need 2 <= KILL_STEP < REJOIN_STEP < STEPS (the replacement must be admitted before the end)"
((CKPT_EVERY >= 1 && CKPT_EVERY < KILL_STEP)) || die "CKPT_EVERY must be 1..KILL_STEP-1 (a checkpoint before the kill)"
case $HOOK in none | fp16 | bf16) ;; *) die "HOOK is none, fp16 or bf16, not $HOOK" ;; esac
case $DEVICE in cpu | cuda) ;; *) die "DEVICE is cpu or cuda, not $DEVICE" ;; esac

# The table and the plot from OUT's runs.
report() {
    "$PY" - "$OUT" <<'EOF'
import csv, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {}
for r in csv.DictReader(open(out / "runs.csv")):
    runs[r["variant"]] = r  # a later line of a variant replaces an earlier one
if not runs:
    sys.exit("elastic_bench: no runs in " + str(out / "runs.csv"))
# A, B, C first, then the references: the same colors in every figure.
ORDER = ["gradlane", "gradlane-elastic", "gloo-bbr-restart", "gloo-cubic-restart",
         "gradlane-continue", "gloo-bbr", "gloo-cubic"]
runs = dict(sorted(runs.items(), key=lambda kv: (
    ORDER.index(kv[0].split("+")[0]) if kv[0].split("+")[0] in ORDER else len(ORDER), kv[0])))
target = float(next(iter(runs.values()))["target"])

def what(r):
    v = r["variant"]
    k = f"rank {r['kill_rank']} SIGKILLed at step {r['kill_step']}"
    if "-elastic" in v:
        return (f"{k}; the rest train on (continue, idle timeout {r['idle_timeout_s']} s); "
                f"a replacement started at step {r['rejoin_step']} rejoins")
    if "-restart" in v:
        return (f"{k}; every rank restarted from the last checkpoint "
                f"(every {r['checkpoint_every']} steps)")
    if "-continue" in v:
        return f"nobody dies (continue, idle timeout {r['idle_timeout_s']} s, admit every step)"
    return "nobody dies"

def num(x):
    return float(x) if x not in ("", None) else None

base = next((r for v, r in runs.items() if v.split("+")[0] == "gradlane"), None)
b_ttt = num(base["time_to_target_s"]) if base else None
lines = [
    f"Time to {target} test accuracy, {next(iter(runs.values()))['ranks']} ranks at "
    f"{next(iter(runs.values()))['rate']} per rank, {float(next(iter(runs.values()))['loss']):.0%} loss, "
    f"ResNet-18 width {next(iter(runs.values()))['width']}, {next(iter(runs.values()))['steps']} steps. "
    "Times are rank 0's clock: wall time since the first step, evaluations excluded, "
    "restarts included.",
    "",
    "| run | what happens | time to target (s) | vs gradlane | training (s) | steps | step p50 / p99 (s) "
    "| final acc | params equal | kill / detected / back (s) | lives | steps redone | loss measured |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]
for v, r in runs.items():
    ttt = num(r["time_to_target_s"])
    ratio = f"{ttt / b_ttt:.2f}x" if ttt and b_ttt else "-"
    marks = " / ".join(f"{float(r[k]):.1f}" if r[k] else "-" for k in ("kill_s", "detected_s", "back_s"))
    lines.append(
        f"| {v} | {what(r)} | {f'{ttt:.1f}' if ttt else 'not reached'} | {ratio} | {float(r['train_s']):.1f} "
        f"| {r['steps_run']} | {r['step_p50_s']} / {r['step_p99_s']} | {r['final_acc']} | {r['params_equal']} "
        f"| {marks if r['kill_s'] else '-'} | {r['lives']} | {r['steps_redone']} | {r['measured_loss']} |"
    )
(out / "table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("elastic_bench: no matplotlib, no plot", file=sys.stderr)
    sys.exit(0)
fig, ax = plt.subplots(figsize=(9, 6.4))
colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
for (v, r), c in zip(runs.items(), colors):
    rows = list(csv.DictReader(open(out / "runs" / f"{v}.csv")))
    xs = [float(x["train_s"]) for x in rows]
    ys = [float(x["test_acc"]) for x in rows]
    ttt = num(r["time_to_target_s"])
    label = f"{v}: {what(r)}; target at " + (f"{ttt:.1f} s" if ttt else "-")
    ax.plot(xs, ys, color=c, lw=1.6, label=label)
    if ttt:
        ax.plot([ttt], [next(y for x, y in zip(xs, ys) if x == ttt)], "o", color=c)
    for k, style in (("kill_s", ":"), ("detected_s", "-."), ("back_s", "--")):
        if r[k]:
            ax.axvline(float(r[k]), color=c, ls=style, lw=1.2, alpha=0.8)
ax.axhline(target, color="grey", lw=0.8)
for style, name in ((":", "kill"), ("-.", "failure found"), ("--", "rejoined / restarted")):
    ax.plot([], [], color="black", ls=style, lw=1.2, label=name)
first = next(iter(runs.values()))
ax.set_title(
    f"A rank dies: {first['ranks']} ranks, {first['rate']}, {float(first['loss']):.0%} loss, "
    f"ResNet-18 width {first['width']}",
    fontsize=10,
)
ax.set_xlabel("training time on rank 0's clock (s): wall time since the first step, evaluations excluded")
ax.set_ylabel("test accuracy")
ax.set_ylim(0, 1.02)
ax.grid(alpha=0.3)
ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1, frameon=False)
fig.tight_layout()
fig.savefig(out / "accuracy.png", dpi=130)
print(f"elastic_bench: wrote {out / 'table.md'} and {out / 'accuracy.png'}")
EOF
}

if ((report_only)); then
    [[ -f $OUT/runs.csv ]] || die "no $OUT/runs.csv to report on"
    report
    exit 0
fi

[[ $(id -u) = 0 ]] || die "needs root (network namespaces); run it with sudo -E"
"$PY" -c 'import gradlane.torch.elastic, sklearn' 2>/dev/null ||
    die "$PY has no torch, scikit-learn or gradlane (with gradlane.torch.elastic); set VENV or PY"
"$PY" -c 'import matplotlib' 2>/dev/null || echo "elastic_bench: no matplotlib: the report comes without the plot" >&2
if [[ ! -x target/release/certs ]]; then
    command -v cargo >/dev/null || die "no target/release/certs and no cargo to build it"
    cargo build --quiet --release --bin certs
fi
CERTS=$(mktemp -d)
WORK=$(mktemp -d)
trap 'rm -rf "$CERTS" "$WORK"' EXIT
testbed_certs "$CERTS" "$RANKS"

mkdir -p "$OUT/runs"
RUNS=$OUT/runs.csv
FIELDS="variant,loss,seed,rate,ranks,width,steps,target,kill_rank,kill_step,rejoin_step,checkpoint_every,idle_timeout_s,steps_run,train_s,time_to_target_s,final_acc,step_p50_s,step_p99_s,lives,steps_redone,kill_s,detected_s,back_s,params_equal,measured_loss,build,date"
[[ -f $RUNS ]] || echo "$FIELDS" >"$RUNS"
[[ $(head -1 "$RUNS") == "$FIELDS" ]] || die "$RUNS has other columns: move it away"
if git rev-parse --short HEAD >/dev/null 2>&1; then
    build=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- examples python gradlane scripts || echo +changes)
else
    build=unknown
fi

# One run of variant $1.
run_one() {
    local variant=$1 name base mode=none cc=cubic key work logs status t0 took row equal measured
    local -a args envs
    base=$variant
    name=$variant
    [[ $HOOK != none ]] && name+="+$HOOK"
    key="$name,$LOSS,$SEED,$RATE,$RANKS,$WIDTH,$STEPS,$TARGET,$KILL_RANK,$KILL_STEP,$REJOIN_STEP,$CKPT_EVERY,$IDLE_TIMEOUT,"
    if awk -v k="$key" 'index($0, k) == 1 { f = 1 } END { exit !f }' "$RUNS"; then
        echo "elastic_bench: $name: in $RUNS already, skipped"
        return 0
    fi
    work=$WORK/$name
    logs=$OUT/runs/$name
    rm -rf "$logs" "$OUT/runs/$name.csv" "$OUT/runs/$name.failed"
    mkdir -p "$work/sync" "$logs"
    args=(--width "$WIDTH" --steps "$STEPS" --eval-every "$EVAL_EVERY" --target-acc "$TARGET"
        --time-limit "$TIME_LIMIT" --seed "$SEED" --device "$DEVICE"
        --csv "$OUT/runs/$name.csv" --clock "$work/clock.json")
    [[ $HOOK != none ]] && args+=(--comm-hook "$HOOK")
    local kill=(--kill-rank "$KILL_RANK" --kill-step "$KILL_STEP")
    # The backend's own defaults unless the variant sets them.
    envs=(-u GRADLANE_ON_RANK_FAILURE -u GRADLANE_IDLE_TIMEOUT -u GRADLANE_REJOIN GRADLANE_ASYNC=1)
    local elastic=(GRADLANE_ON_RANK_FAILURE=continue "GRADLANE_IDLE_TIMEOUT=$IDLE_TIMEOUT")
    case $base in
        gradlane) args+=(--transport gradlane) ;;
        gradlane-continue) args+=(--transport gradlane --elastic); envs+=("${elastic[@]}") ;;
        gradlane-elastic)
            args+=(--transport gradlane --elastic "${kill[@]}")
            envs+=("${elastic[@]}")
            mode=rejoin
            ;;
        gloo-cubic | gloo-bbr) args+=(--transport gloo); cc=${base#gloo-} ;;
        gloo-cubic-restart | gloo-bbr-restart)
            args+=(--transport gloo --checkpoint-every "$CKPT_EVERY" --checkpoint-dir "$work/checkpoint" "${kill[@]}")
            cc=${base#gloo-}
            cc=${cc%-restart}
            mode=restart
            ;;
        *) die "unknown variant $variant (see --help)" ;;
    esac
    t0=$(date +%s)
    printf 'elastic_bench: %s ... ' "$name"
    status=0
    env "${envs[@]}" GRADLANE_CERT_DIR="$CERTS" PY="$PY" RANKS="$RANKS" RATE="$RATE" QUEUE_BYTES="$QUEUE_BYTES" \
        LOSS="$LOSS" TCP_CC="$cc" LOG_DIR="$logs" GRACE=60 \
        EB_MODE=$mode EB_SYNC="$work/sync" EB_CSV="$OUT/runs/$name.csv" EB_VICTIM="$KILL_RANK" \
        EB_REJOIN_STEP="$REJOIN_STEP" EB_STEPS="$STEPS" EB_LOG="$logs/rank$KILL_RANK.log" EB_WAIT=$((TIME_LIMIT + 300)) EB_MAX_RESTARTS="$MAX_RESTARTS" \
        timeout $((TIME_LIMIT * 3 + 600)) \
        bash scripts/testbed.sh -- bash scripts/elastic_bench.sh --rank "${args[@]}" 2>"$logs/testbed.err" || status=$?
    took=$(($(date +%s) - t0))
    if [[ $status != 0 ]]; then
        echo "FAILED (status $status, ${took}s); logs in $logs.failed:"
        tail -n 5 "$logs"/rank*.log "$logs/testbed.err" | sed 's/^/    /' || true
        mv "$logs" "$logs.failed"
        return 0
    fi
    # Each rank's last checksum: the final lives'.
    equal=no
    local sums
    sums=$(for f in "$logs"/rank*.log; do grep -o "rank [0-9]* of $RANKS: parameters [0-9a-f]\{16\}" "$f" | tail -1; done | awk '{print $NF}')
    [[ $(echo "$sums" | grep -c .) = "$RANKS" && $(echo "$sums" | sort -u | wc -l) = 1 ]] && equal=yes
    measured=$(sed -n 's/.*(loss \([0-9.]*\)).*/\1/p' "$logs/testbed.err" | awk '{s += $1; n++} END { if (n) printf "%.4f", s / n }')
    row=$("$PY" - "$OUT/runs/$name.csv" "$logs/rank0.log" "$TARGET" "$KILL_STEP" "$mode" <<'EOF'
import csv, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))
log = open(sys.argv[2], errors="replace").read().splitlines()
target, kill_step, mode = float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
hit = next((r["train_s"] for r in rows if float(r["test_acc"]) >= target), "")
last = rows[-1]
summary = [l for l in log if l.startswith("summary:")][-1]
p50, p99 = re.search(r"step p50 ([\d.]+) s p99 ([\d.]+) s", summary).groups()
def at(prefix):
    for l in log:
        m = re.match(prefix + r".*\(([\d.]+) s\)$", l)
        if m:
            return m.groups()[-1]
    return ""
kill = detected = back = ""
if mode != "none":
    kill = next((r["train_s"] for r in rows if int(r["step"]) == kill_step - 1), "")
    detected = at(r"(failure|elastic: view)")
    back = at(r"(resume|elastic: admitted)")
lives = 1 + sum(l.startswith("resume:") for l in log)
# Steps trained again: where the steps go back (a restart), from the
# highest step before to the one resumed from.
redone, prev = 0, 0
for r in rows:
    s = int(r["step"])
    if s <= prev:
        redone += prev - s + 1
    prev = s
print(f"{last['step']},{last['train_s']},{hit},{last['test_acc']},{p50},{p99},{lives},{redone},{kill},{detected},{back}")
EOF
    ) || { echo "FAILED: no result in $logs (see rank0.log)"; return 0; }
    echo "$name,$LOSS,$SEED,$RATE,$RANKS,$WIDTH,$STEPS,$TARGET,$KILL_RANK,$KILL_STEP,$REJOIN_STEP,$CKPT_EVERY,$IDLE_TIMEOUT,$row,$equal,$measured,$build,$(date -u +%FT%H:%MZ)" >>"$RUNS"
    echo "${took}s: $(grep -h '^summary:' "$logs/rank0.log" | tail -1); parameters equal: $equal"
}

echo "elastic_bench: $RANKS ranks, $RATE per rank, loss $LOSS, width $WIDTH, $STEPS steps, target $TARGET;" \
    "rank $KILL_RANK killed at step $KILL_STEP, replaced at step $REJOIN_STEP, checkpoints every $CKPT_EVERY," \
    "idle timeout ${IDLE_TIMEOUT}s; build $build"
started=$(date +%s)
for v in $VARIANTS; do run_one "$v"; done
echo "elastic_bench: done in $((($(date +%s) - started) / 60)) min"
report
