#!/usr/bin/env bash
# README's test command: every Rust test, then the Python package built
# and tested in a venv of its own.
#
# 1. `cargo test --workspace --no-fail-fast` (every test binary runs even
#    if one fails). The venv and its packages are installed meanwhile.
# 2. A venv (default .venv-test in the repository; GRADLANE_TEST_VENV
#    moves it; an existing one is reused), with maturin 1.x, pytest,
#    pytest-xdist, numpy, torch, scikit-learn and matplotlib; the package
#    (python/) built as a release wheel and installed into it; pytest on
#    python/tests, two files at a time (GRADLANE_TEST_WORKERS changes it).
#
# Each half also runs README's commands as a user types them
# (tools/tests/readme_commands.rs; python/tests/test_readme.py for the
# Python ones). Both halves always run; the exit status is nonzero if
# either failed.
# Needs Python 3.11 or newer (PYTHON names the interpreter; default
# python3) with its venv module.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${GRADLANE_TEST_VENV:-.venv-test}
rust_status=0
python_status=0
started=$(date +%s)
# Each step's start, in seconds since the command began: where time goes.
step() { echo "== [$(($(date +%s) - started)) s] $*"; }

# The venv and its packages, mostly a download, are made while the Rust
# half compiles; their output is shown once they are needed.
python_setup() {
    set -e
    if [ ! -x "$VENV/bin/python" ]; then
        echo "== making the venv $VENV"
        "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "gradlane needs Python 3.11 or newer, this is " + sys.version'
        "$PYTHON" -m venv "$VENV"
    fi
    echo "== pip install maturin pytest pytest-xdist numpy (into $VENV)"
    "$VENV/bin/python" -m pip install --quiet "maturin>=1.9,<2" pytest pytest-xdist numpy

    # torch (and scikit-learn, whose wheel ships the digits the examples
    # train on; matplotlib, which draws the time-to-accuracy plots), for
    # gradlane.torch and its tests: PyPI serves a CUDA build of torch
    # (about 2.5 GB, a minute to download) whose import works on CPU.
    # expecttest: torch's own test harness imports it, and the subset of
    # torch's distributed suite in the tests runs on that harness.
    echo "== pip install torch scikit-learn matplotlib expecttest (into $VENV)"
    "$VENV/bin/python" -m pip install --quiet torch scikit-learn matplotlib expecttest
}
setup_log=$(mktemp)
( python_setup ) > "$setup_log" 2>&1 &
setup_pid=$!

step "cargo test --workspace --no-fail-fast"
# The control plane's simulation (gradlane-sim), in its two modes (the
# view agreement alone, the whole group), writes its summaries (how many
# schedules it checked, how fast, their outcomes) here, shown after the run.
agreement_summary=$(mktemp)
group_summary=$(mktemp)
GRADLANE_SIM_SUMMARY_AGREEMENT="$agreement_summary" GRADLANE_SIM_SUMMARY_GROUP="$group_summary" \
    cargo test --workspace --no-fail-fast
rust_status=$?
echo "== the simulation, agreement mode: $(cat "$agreement_summary")"
echo "== the simulation, group mode: $(cat "$group_summary")"
rm -f "$agreement_summary" "$group_summary"

step "waiting for the venv"
wait "$setup_pid"
setup_status=$?
cat "$setup_log"
rm -f "$setup_log"

python_tests() {
    set -e
    step "building the package (maturin build --release)"
    local wheels="$VENV/wheels"
    rm -rf "$wheels"
    # The venv's bin first, so that maturin builds for its interpreter.
    PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$PWD/$VENV" \
        "$VENV/bin/maturin" build --release -m python/Cargo.toml -o "$wheels"
    "$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheels"/gradlane-*.whl

    step "pytest python/tests"
    # The pytest script, not `python -m pytest`, which would put the
    # working directory on sys.path: the tests import the installed wheel.
    # Whole files to each worker, so that a file's module fixtures run once.
    # The slowest tests listed at the end: where the budget goes.
    "$VENV/bin/pytest" -n "${GRADLANE_TEST_WORKERS:-2}" --dist loadfile --durations=25 python/tests
}
# A subshell not tested by || or &&: inside a tested one bash ignores
# set -e, and a failed step would not stop the half.
if [ "$setup_status" = 0 ]; then
    ( python_tests )
    python_status=$?
else
    echo "== the venv could not be made (exit $setup_status)"
    python_status=$setup_status
fi
step "done"

echo "== rust tests: $([ $rust_status = 0 ] && echo ok || echo "FAILED ($rust_status)");" \
    "python tests: $([ $python_status = 0 ] && echo ok || echo "FAILED ($python_status)")"
[ $rust_status = 0 ] && [ $python_status = 0 ]
