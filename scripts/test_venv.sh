# Sourced (from the repository root) by the scripts that run in the venv
# README's test command makes: sets VENV (GRADLANE_TEST_VENV, default
# .venv-test), or ends the script with a clear message where it is missing.
VENV=${GRADLANE_TEST_VENV:-.venv-test}
if [ ! -x "$VENV/bin/python" ]; then
    echo "$(basename "$0"): no venv at $VENV: run bash scripts/test.sh once first" \
        "(it makes the venv and installs gradlane)" >&2
    exit 2
fi
