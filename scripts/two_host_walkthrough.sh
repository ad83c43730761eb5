#!/usr/bin/env bash
# README's two-host torchrun walkthrough ("Across two hosts"), run as
# written, with two namespaces of scripts/testbed.sh as the hosts and two
# processes in each:
#
#   sudo bash scripts/two_host_walkthrough.sh
#   LOSS=0.01 DELAY_MS=5 sudo -E bash scripts/two_host_walkthrough.sh
#   bash scripts/two_host_walkthrough.sh --dry-run     # the commands only; no root
#
# 1. The commands are read from README (scripts/two_host_commands.py): its
#    certs command and each host's torchrun line, the testbed's host 0
#    address (10.77.0.1) in place of README's --master-addr.
# 2. Each host gets a directory of its own under a temporary one, with a
#    copy of examples/ (its checkout, as far as the lines use it).
# 3. README's certs command runs in host 0's directory (the certs program
#    that `cargo run --release --bin certs --` runs, built first), and the
#    files README says to copy go to host 1's certs/ (not ca.key).
# 4. scripts/testbed.sh --ranks 2 runs this script's --host mode in each
#    namespace: host N's line, by bash in host N's directory, with the
#    venv's bin first on PATH and no other variable of the testbed's
#    (RANK, MASTER_ADDR, GRADLANE_RANK_ADDR, ...): only what the line sets.
# 5. Each host's output is printed, prefixed "[host N]", and checked: rank
#    0's test accuracy must reach 0.95 (TARGET) and the 4 ranks must print
#    the same parameters' checksum. The exit status is nonzero otherwise.
#
# Settings: VENV (default .venv-test, made by `bash scripts/test.sh`),
# TARGET, and the testbed's own variables (RATE, LOSS, DELAY_MS, ...; see
# scripts/testbed.sh --help), which pass through. If another testbed run
# holds the testbed, this waits for it (testbed.sh --wait-lock). KEEP=DIR
# keeps the hosts' directories and logs in DIR (which must not exist).
# Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SELF=$ROOT/scripts/two_host_walkthrough.sh
# The testbed's address of its first namespace (host 0).
HOST0=10.77.0.1

die() {
    echo "two_host_walkthrough: $*" >&2
    exit 2
}

# --host WORK: inside namespace N (the testbed's RANK), run host N's line.
if [[ ${1:-} == --host ]]; then
    work=${2:?--host needs the work directory}
    node=${RANK:?the testbed sets RANK}
    line=$(sed -n "s/^host $node //p" "$work/commands")
    [[ -n $line ]] || die "no command for host $node in $work/commands"
    cd "$work/host$node"
    echo "host $node: $line"
    # A clean environment: the line's own assignments, and where torchrun
    # is, as a user's shell on the host would have.
    exec env -i HOME="${HOME:-/root}" PATH="$VENV_BIN:/usr/local/bin:/usr/bin:/bin" \
        PYTHONUNBUFFERED=1 LANG=C.UTF-8 bash -c "$line"
fi

DRY_RUN=0
(($# <= 1)) || die "takes one option at most, not '$*' (its settings come from the environment; see --help)"
case ${1:-} in
    --dry-run) DRY_RUN=1 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    "") ;;
    *) die "unknown option '$1' (--dry-run, --help)" ;;
esac

VENV=${VENV:-.venv-test}
TARGET=${TARGET:-0.95}
PY=$VENV/bin/python
# The commands need only the standard library: any python3 reads them.
[[ -x $PY ]] || ((!DRY_RUN)) || PY=python3
commands=$("$PY" scripts/two_host_commands.py commands --master-addr "$HOST0") ||
    die "cannot read the walkthrough from README.md (above)"
hosts=$(grep -c '^host ' <<<"$commands")
if ((DRY_RUN)); then
    echo "two_host_walkthrough: would run, on $hosts namespaces of scripts/testbed.sh:"
    echo "$commands"
    bash scripts/testbed.sh --dry-run --ranks "$hosts" -- bash "$SELF" --host WORK
    exit 0
fi
[[ $(id -u) == 0 ]] || die "needs root (the testbed's namespaces); run it with sudo -E"
"$PY" -c 'import gradlane.torch, sklearn' 2>/dev/null ||
    die "$VENV has no torch, scikit-learn or gradlane: run 'bash scripts/test.sh' first, or set VENV"
[[ -x $VENV/bin/torchrun ]] || die "$VENV has no torchrun"
export VENV_BIN
VENV_BIN=$(realpath "$VENV/bin")

if [[ -n ${KEEP:-} ]]; then
    [[ ! -e $KEEP ]] || die "KEEP=$KEEP exists already"
    mkdir -p "$KEEP"
    WORK=$(realpath "$KEEP")
else
    WORK=$(mktemp -d /tmp/gl-two-host.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
fi
echo "$commands" >"$WORK/commands"
for ((h = 0; h < hosts; h++)); do
    mkdir "$WORK/host$h"
    cp -r examples "$WORK/host$h/"
done

# The certs program README's `cargo run` line runs, run with its arguments
# in host 0's checkout.
cargo build --quiet --release --bin certs
certs_bin=${CARGO_TARGET_DIR:-$ROOT/target}/release/certs
read -r -a certs_args <<<"$(sed -n 's/^certs //p' "$WORK/commands")"
echo "== host 0: certs ${certs_args[*]}"
(cd "$WORK/host0" && "$certs_bin" "${certs_args[@]}")
read -r -a copy <<<"$(sed -n 's/^copy //p' "$WORK/commands")"
dir=${copy[0]}
for ((h = 1; h < hosts; h++)); do
    echo "== copying ${copy[*]:1} from host 0's $dir/ to host $h's"
    mkdir -p "$WORK/host$h/$dir"
    for f in "${copy[@]:1}"; do cp "$WORK/host0/$dir/$f" "$WORK/host$h/$dir/$f"; done
done

build=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- README.md examples python gradlane scripts || echo +changes)
echo "== $(date -u +%Y-%m-%dT%H:%MZ), build $build: the hosts' lines on the testbed (RATE=${RATE:-1gbit} LOSS=${LOSS:-0} DELAY_MS=${DELAY_MS:-0})"
set +e
bash scripts/testbed.sh --wait-lock --ranks "$hosts" --log-dir "$WORK/logs" -- bash "$SELF" --host "$WORK"
status=$?
set -e
logs=()
for ((h = 0; h < hosts; h++)); do
    log=$WORK/logs/rank$h.log
    logs+=("$log")
    [[ -f $log ]] && sed "s/^/[host $h] /" "$log"
done
((status == 0)) || die "the testbed run failed (status $status)"
echo "== check"
"$PY" scripts/two_host_commands.py check --target "$TARGET" "${logs[@]}" ||
    die "the job did not show success (above)"
echo "two_host_walkthrough: PASS"
