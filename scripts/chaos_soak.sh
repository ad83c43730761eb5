#!/usr/bin/env bash
# The chaos soak of the torch backend (scripts/chaos_soak.py: DDP over
# gradlane while ranks are killed, frozen and cut off, under both failure
# policies; counts crashes, hangs and mismatched results). Runs in a
# network namespace of its own, whose loopback the partitions' iptables
# rules touch, never the host's. Root (unshare, iptables); installs
# iptables where it is missing. Needs the venv scripts/test.sh makes
# (GRADLANE_TEST_VENV, default .venv-test), with the package installed.
#
#   sudo bash scripts/chaos_soak.sh --schedules 500 --seed 1 --json /tmp/chaos.json
#   sudo bash scripts/chaos_soak.sh --seed 17 --schedules 1 --policy continue   # replay one
#   sudo CHAOS_LOG=info bash scripts/chaos_soak.sh --seed 17 --schedules 1 --policy continue   # with the ranks' logs
#   bash scripts/chaos_soak.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/test_venv.sh
for a in "$@"; do
    if [ "$a" = "--help" ] || [ "$a" = "-h" ]; then exec "$VENV/bin/python" scripts/chaos_soak.py --help; fi
done
if ! command -v iptables >/dev/null; then
    echo "== installing iptables"
    apt-get update -qq && apt-get install -y -qq iptables >/dev/null
fi
exec unshare --net bash -c 'ip link set lo up && exec "$0" scripts/chaos_soak.py "$@"' "$VENV/bin/python" "$@"
