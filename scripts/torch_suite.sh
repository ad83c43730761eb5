#!/usr/bin/env bash
# torch's own distributed test suite over gloo and over gradlane, on the
# same tests, at 2 and 3 ranks, with the comparison printed
# (scripts/torch_suite.py; its --help lists the options, passed through).
#
#   bash scripts/torch_suite.sh                      # the whole comparison
#   bash scripts/torch_suite.sh --ranks 2 -k reduce  # a part
#
# Uses the test venv (GRADLANE_TEST_VENV, default .venv-test; README's test
# command makes it) and installs the package built from this checkout into
# it first, unless GRADLANE_SUITE_NO_BUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/test_venv.sh
if [ "${GRADLANE_SUITE_NO_BUILD:-0}" != 1 ]; then
    wheels=$(mktemp -d)
    PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$PWD/$VENV" \
        "$VENV/bin/maturin" build --release -m python/Cargo.toml -o "$wheels"
    "$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheels"/gradlane-*.whl
    rm -rf "$wheels"
fi
exec "$VENV/bin/python" scripts/torch_suite.py "$@"
