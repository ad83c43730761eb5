#!/usr/bin/env bash
# The Python tests that need a GPU, on a GPU host with target/gpu carried
# (scripts/gpu_pack.sh; docs/GPU.md): python/tests/test_cuda.py (skipped
# where there is no GPU) and test_staging.py beside it.
#
#   run(command="bash scripts/gpu_tests.sh", carry=["target/gpu"])
#
# Installs the carried wheel, and pytest from the carried wheels where the
# host's Python has none (no network there). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
GPU_DIR=${GPU_DIR:-$PWD/target/gpu}
# Ubuntu's system Python refuses pip without --break-system-packages.
pip_install() {
    "$PY" -m pip install --quiet --no-index "$@" ||
        "$PY" -m pip install --quiet --no-index --break-system-packages "$@"
}
pip_install --no-deps --force-reinstall "$GPU_DIR"/wheels/*.whl
"$PY" -m pytest --version >/dev/null 2>&1 || pip_install --find-links "$GPU_DIR/pywheels" pytest
"$PY" -c 'import torch; print("gpu_tests: torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
"$PY" -m pytest -p no:cacheprovider -v python/tests/test_cuda.py python/tests/test_staging.py "$@"
