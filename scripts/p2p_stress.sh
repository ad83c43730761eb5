#!/usr/bin/env bash
# Point-to-point under stress (scripts/p2p_stress.py: many jobs of torch
# send/recv, any source, tags, batch_isend_irecv, waits in every order,
# ranks that end right after their last send; every rank's exit code
# checked). Needs the venv scripts/test.sh makes (GRADLANE_TEST_VENV,
# default .venv-test), with the package installed.
#
#   bash scripts/p2p_stress.sh --jobs 30 --ranks 2 3 --scale 5 --out /tmp/p2p.json
#   bash scripts/p2p_stress.sh --jobs 5 --backend gloo    # the program itself, over gloo
#   bash scripts/p2p_stress.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/test_venv.sh
exec "$VENV/bin/python" scripts/p2p_stress.py "$@"
