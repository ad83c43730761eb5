#!/usr/bin/env bash
# The connect check: 1,000 fresh clients, each losing 30% of its packets
# each way (seeds 1001-2000), connect to one loopback server, 20 at a
# time; every connect must get its link. Prints how many failed and how
# long the run took; exits non-zero if any failed.
#
#   scripts/connect_check.sh           # the check
#   scripts/connect_check.sh times     # connect times at 0% and 5% loss,
#                                      # 50 connects each, one at a time
#
# Environment (for `times`): GRADLANE_CONNECT_LOSSES [0,0.05] and
# GRADLANE_CONNECTS [50].
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-check}" in
    check) test=connect::a_thousand_seeded_connects_at_30_percent_loss_all_succeed ;;
    times) test=connect::connect_times ;;
    *) echo "usage: $0 [check|times]" >&2; exit 2 ;;
esac
cargo test -p gradlane --test integration --no-run
exec cargo test -p gradlane --test integration "$test" -- --ignored --exact --nocapture
