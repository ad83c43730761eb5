#!/usr/bin/env bash
# Stall soak: run the loopback benchmarks several times while a parallel
# `cargo build` keeps the cores busy, and print, per variant, the median,
# p99 and largest round time over all runs and the largest over the median.
# A stall (rounds several times slower than the rest, and staying so)
# shows as max/median far above 1.
#
#   scripts/stall_soak.sh                 # build, soak, summarize
#   scripts/stall_soak.sh summarize DIR   # summarize an earlier soak's logs
#
# Environment (defaults in brackets):
#   RUNS [5]            runs of each benchmark
#   ROUNDS [20]         timed rounds per variant and run
#   LOSSES [0,0.01,0.05] injected loss rates
#   BENCHES ["allreduce round ps"] which benchmarks to run
#   PS_SECONDS [10]     ps_bench's seconds per variant
#   OUT [target/stall-soak/<date>]  where the logs go
#   BIN [target/release] the benchmarks' binaries (another build's, to
#                       soak an old commit); unset, they are built here
#   LOAD [1]            1: a loop of `cargo build --release` in a scratch
#                       copy of this tree (its own target dir under OUT,
#                       a source file touched before each build) runs
#                       for the whole soak; 0: none
#   EXTRA [""]          more flags for allreduce_bench (e.g. --path-stats)
#
# allreduce_bench's rounds come from its per-round lines on stderr,
# round_bench's from its per-variant summary (p99 of 20 rounds is the
# largest), ps_bench's from its push latencies.
set -euo pipefail
# A relative log directory is the caller's, not the tree's.
if [[ "${1:-}" == "summarize" && -n "${2:-}" ]]; then
    set -- summarize "$(realpath -m "$2")"
fi
cd "$(dirname "$0")/.."

summarize() {
    python3 - "$1" <<'EOF'
import re, sys, glob, os, statistics
out = sys.argv[1]

def pct(v, p):
    # nearest rank, as round_bench's p99: of 20 rounds, the largest
    v = sorted(v)
    k = max(1, -(-int(p * len(v) * 1000) // 1000))
    return v[min(len(v), k) - 1]

def allreduce_rounds(log):
    """Each timed round of an allreduce_bench log: (loss, [(variant, ms)])."""
    names = {}
    for line in open(log, errors="replace"):
        m = re.match(r"loss ([0-9.]+): setting up (.*)$", line.strip())
        if m:
            names.setdefault(m.group(1), []).append(m.group(2))
            continue
        m = re.match(r"loss ([0-9.]+): round (\d+) of \d+( \(warm-up\))?: (.*) ms$", line.strip())
        if m and not m.group(3):
            loss = m.group(1)
            times = [float(t) for t in m.group(4).split(" / ")]
            yield loss, list(zip(names.get(loss, []), times))

rows = {}
runs_seen = {}
rounds = []
by_run = {}
for log in sorted(glob.glob(os.path.join(out, "allreduce-*.log"))):
    for loss, timed in allreduce_rounds(log):
        rounds.append([(("allreduce_bench", name, loss), t) for name, t in timed])
        for name, t in timed:
            key = ("allreduce_bench", name, loss)
            rows.setdefault(key, []).append(t)
            runs_seen.setdefault(key, set()).add(log)
            by_run.setdefault(log, {}).setdefault((name, loss), []).append(t)

# The load on a shared host changes by more than 2x within a run, and it
# slows every variant of a round alike (they interleave, round by round);
# a stalled path slows its own variant. So each round also gets a load
# factor, the median over its variants of time / that variant's median,
# and each time over its round's factor is the load-adjusted time.
adjusted = {}
for r in rounds:
    med = {k: statistics.median(rows[k]) for k, _ in r}
    load = statistics.median(t / med[k] for k, t in r)
    for k, t in r:
        adjusted.setdefault(k, []).append(t / load)

# One line per run: each run's own worst variant (largest round over the
# variant's median over all runs), and the exact variant at 5%.
pooled = {k: statistics.median(v) for k, v in rows.items()}
if by_run:
    print("allreduce_bench, per run: the variant whose largest round is the most over its median (pooled over")
    print("all runs), the QUIC variants' worst, and the exact variant at 5% loss")
    print()
    print("| run | rounds | worst variant | its largest / pooled median | worst QUIC allreduce (exact, differentiated) | exact 5%: median ms, largest ms |")
    print("|---|---:|---|---:|---|---|")
    for log, vs in sorted(by_run.items()):
        run = re.search(r"allreduce-(\d+)\.log", log).group(1)
        ratio = {k: max(t) / pooled[("allreduce_bench",) + k] for k, t in vs.items()}
        worst = max(ratio, key=ratio.get)
        quic = {k: r for k, r in ratio.items() if k[0].startswith(("exact", "differentiated"))}
        wq = max(quic, key=quic.get) if quic else None
        ex = next((t for (n, l), t in vs.items() if n == "exact" and float(l) == 0.05), None)
        print(f"| {run} | {sum(len(t) for t in vs.values())} | {worst[0]} at {float(worst[1])*100:g}% | {ratio[worst]:.2f}x | "
              + (f"{wq[0]} at {float(wq[1])*100:g}%: {quic[wq]:.2f}x" if wq else "-") + " | "
              + (f"{statistics.median(ex):.0f}, {max(ex):.0f}" if ex else "-") + " |")
    print()

print("| benchmark | variant | loss | runs | rounds | median ms | p99 ms | max ms | max/median | p99/median | load-adjusted max/median |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (bench, name, loss), t in sorted(rows.items(), key=lambda kv: (float(kv[0][2]), kv[0][1])):
    med = statistics.median(t)
    p99 = pct(t, 0.99)
    mx = max(t)
    a = adjusted[(bench, name, loss)]
    print(f"| {bench} | {name} | {float(loss)*100:g}% | {len(runs_seen[(bench, name, loss)])} | {len(t)} | "
          f"{med:.0f} | {p99:.0f} | {mx:.0f} | {mx/med:.2f}x | {p99/med:.2f}x | {max(a)/statistics.median(a):.2f}x |")

# allreduce_bench --path-stats: rank 0's paths after every round, with
# quinn's BBR inside the gate (gradlane::controller_state)
def dur(v):
    for unit, f in (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if v.endswith(unit):
            return float(v[: -len(unit)]) * f
    return None

paths = {}
for log in sorted(glob.glob(os.path.join(out, "allreduce-*.log"))):
    loss = None
    for line in open(log, errors="replace"):
        m = re.match(r"loss ([0-9.]+):", line)
        if m:
            loss = m.group(1)
            continue
        m = re.match(r"  (.*?): (to \d+: .*)$", line.rstrip())
        if not m or "[window" not in line:
            continue
        for path in m.group(2).split("; to "):
            w = re.search(r"\[window (\d+) B \(quinn's (\d+) B", path)
            r = re.search(r"min_rtt=([0-9.]+[a-zµ]+)", path)
            if not w:
                continue
            p = paths.setdefault((m.group(1), loss), [0, 0, 0, 0, 0, 0])
            window, inner = int(w.group(1)), int(w.group(2))
            rtt = dur(r.group(1)) if r else None
            p[0] += 1
            p[1] += rtt is not None and 0 < rtt < 1e-3
            p[2] += inner < 64_000
            p[3] += window < 64_000
            p[4] += window > inner
            p[5] += "mode=ProbeRtt" in path
if paths:
    print()
    print("Paths after each round (allreduce_bench --path-stats: rank 0's, every variant): samples; quinn's BBR smallest RTT")
    print("above zero and under 1 ms (the paths have 2 ms of injected delay); quinn's window under 64 kB; the window used")
    print("under 64 kB; the window used above quinn's (the gate's floor lifting it); quinn's BBR in ProbeRTT")
    print()
    print("| variant | loss | samples | BBR min RTT in (0, 1 ms) | quinn's window < 64 kB | window < 64 kB | window > quinn's | in ProbeRTT |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (name, loss), p in sorted(paths.items(), key=lambda kv: (float(kv[0][1] or 0), kv[0][0])):
        print(f"| {name} | {float(loss or 0)*100:g}% | {p[0]} | {p[1]} | {p[2]} | {p[3]} | {p[4]} | {p[5]} |")

# round_bench: "NAME Some(Cc) loss L: N rounds, median X ms, p99 Y ms"
rb = {}
for log in sorted(glob.glob(os.path.join(out, "round-*.log"))):
    for line in open(log, errors="replace"):
        m = re.match(r"(.*) loss ([0-9.]+): (\d+) rounds, median ([0-9.]+) ms, p99 ([0-9.]+) ms(.*)$", line.strip())
        if m:
            rb.setdefault((m.group(1), m.group(2)), []).append(
                (int(m.group(3)), float(m.group(4)), float(m.group(5)), m.group(6).strip()))
if rb:
    print()
    print("round_bench, per run: median / largest round ms (largest/median)")
    print()
    print("| variant | loss | runs | rounds per run | per run | largest round / pooled median of the runs' medians |")
    print("|---|---:|---:|---|---|---:|")
    for (name, loss), rs in sorted(rb.items(), key=lambda kv: (float(kv[0][1]), kv[0][0])):
        meds = [r[1] for r in rs]
        mx = max(r[2] for r in rs)
        cells = ", ".join(f"{r[1]:.0f}/{r[2]:.0f} ({r[2]/r[1]:.2f}x)" + (f" [{r[3]}]" if r[3] else "") for r in rs)
        print(f"| {name} | {float(loss)*100:g}% | {len(rs)} | {','.join(str(r[0]) for r in rs)} | {cells} | "
              f"{mx/statistics.median(meds):.2f}x |")

# ps_bench: the table's rows, one per run
ps = {}
for log in sorted(glob.glob(os.path.join(out, "ps-*.log"))):
    loss = re.search(r"ps-([0-9.]+)-", os.path.basename(log))
    for line in open(log, errors="replace"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[1].replace(".", "").isdigit():
            ps.setdefault((cells[0], loss.group(1) if loss else "?"), []).append(
                (float(cells[1]), float(cells[3]), float(cells[4])))
if ps:
    print()
    print("| ps_bench variant | loss | runs | updates/s per run | push p50 ms per run | push p99 ms per run | largest p99/p50 |")
    print("|---|---:|---:|---|---|---|---:|")
    for (name, loss), rs in sorted(ps.items(), key=lambda kv: (float(kv[0][1]), kv[0][0])):
        print(f"| {name} | {float(loss)*100:g}% | {len(rs)} | {', '.join(f'{r[0]:.1f}' for r in rs)} | "
              f"{', '.join(f'{r[1]:.0f}' for r in rs)} | {', '.join(f'{r[2]:.0f}' for r in rs)} | "
              f"{max(r[2]/max(r[1],1e-9) for r in rs):.2f}x |")
EOF
}

if [[ "${1:-}" == "summarize" ]]; then
    [[ -d "${2:?summarize needs the log directory of a soak}" ]] ||
        { echo "stall_soak: no such directory: $2" >&2; exit 2; }
    summarize "$2"
    exit 0
fi

RUNS=${RUNS:-5}
ROUNDS=${ROUNDS:-20}
LOSSES=${LOSSES:-0,0.01,0.05}
BENCHES=${BENCHES:-allreduce round ps}
PS_SECONDS=${PS_SECONDS:-10}
OUT=${OUT:-target/stall-soak/$(date -u +%Y%m%dT%H%M%SZ)}
LOAD=${LOAD:-1}
EXTRA=${EXTRA:-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if [[ -z "${BIN:-}" ]]; then
    cargo build --release --bin allreduce_bench --bin round_bench --bin ps_bench
    BIN=${CARGO_TARGET_DIR:-target}/release
fi
BIN=$(cd "$BIN" && pwd)

# The build is the commit of the tree the binaries were built in (BIN may
# be another worktree's target dir), +dirty if that tree has changes.
build_of() {
    git -C "$1" rev-parse --short HEAD 2>/dev/null || echo unknown
    git -C "$1" diff --quiet HEAD -- 2>/dev/null || echo +dirty
}
{
    echo "soak $(date -u +%FT%TZ): build $(build_of "$BIN" | tr -d '\n'), binaries $BIN"
    echo "RUNS=$RUNS ROUNDS=$ROUNDS LOSSES=$LOSSES BENCHES=$BENCHES LOAD=$LOAD EXTRA=$EXTRA"
} | tee "$OUT/soak.txt"

load_pid=
stop_load() {
    if [[ -n "$load_pid" ]]; then
        # The loop runs in its own process group (setsid): end it and its
        # cargo and rustc children, and nothing else.
        kill -- "-$load_pid" 2>/dev/null || true
        wait "$load_pid" 2>/dev/null || true
        load_pid=
    fi
}
trap stop_load EXIT

if [[ "$LOAD" == 1 ]]; then
    src="$OUT/load-src"
    rm -rf "$src"
    mkdir -p "$src"
    git ls-files -z | xargs -0 tar cf - | tar xf - -C "$src"
    setsid bash -c '
        cd "$1"
        export CARGO_TARGET_DIR="$2"
        while true; do
            touch gradlane-core/src/lib.rs
            cargo build --release -p gradlane -q >/dev/null 2>&1 || sleep 1
            echo "$(date -u +%T) build done" >> "$3"
        done
    ' load "$src" "$OUT/load-target" "$OUT/load.log" &
    load_pid=$!
    echo "load: cargo build loop, pid $load_pid, log $OUT/load.log" | tee -a "$OUT/soak.txt"
fi

for run in $(seq 1 "$RUNS"); do
    for bench in $BENCHES; do
        case $bench in
        allreduce)
            log="$OUT/allreduce-$run.log"
            echo "$(date -u +%T) run $run: allreduce_bench --rounds $ROUNDS --losses $LOSSES $EXTRA" | tee -a "$OUT/soak.txt"
            # shellcheck disable=SC2086
            "$BIN/allreduce_bench" --rounds "$ROUNDS" --losses "$LOSSES" $EXTRA >"$log" 2>&1 ||
                echo "allreduce_bench run $run failed: see $log" | tee -a "$OUT/soak.txt"
            ;;
        round)
            log="$OUT/round-$run.log"
            echo "$(date -u +%T) run $run: round_bench --rounds $ROUNDS --losses $LOSSES --quick --budget-s 600" | tee -a "$OUT/soak.txt"
            "$BIN/round_bench" --rounds "$ROUNDS" --losses "$LOSSES" --quick --budget-s 600 >"$log" 2>&1 ||
                echo "round_bench run $run failed: see $log" | tee -a "$OUT/soak.txt"
            ;;
        ps)
            for loss in ${LOSSES//,/ }; do
                log="$OUT/ps-$loss-$run.log"
                echo "$(date -u +%T) run $run: ps_bench --loss $loss --seconds $PS_SECONDS" | tee -a "$OUT/soak.txt"
                "$BIN/ps_bench" --loss "$loss" --seconds "$PS_SECONDS" >"$log" 2>&1 ||
                    echo "ps_bench run $run at $loss failed: see $log" | tee -a "$OUT/soak.txt"
            done
            ;;
        *)
            echo "unknown benchmark $bench (allreduce, round or ps)" >&2
            exit 2
            ;;
        esac
    done
done
stop_load
echo "$(date -u +%T) done" | tee -a "$OUT/soak.txt"
summarize "$OUT" | tee "$OUT/summary.md"
