"""examples/torch/train_digits.py as a user runs it: torchrun, two CPU
ranks, gradlane's hook over a path that loses 5% of each rank's packets.
Training must still reach the accuracy target and every rank must end
with the same parameters."""

import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/test.sh installs it)")
pytest.importorskip("sklearn", reason="scikit-learn is not installed (scripts/test.sh installs it)")

import gradlane  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "torch" / "train_digits.py"
TARGET_ACCURACY = 0.95


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("transport", ["hook", "gradlane"])
def test_digits_reach_the_target_and_ranks_agree(tmp_path, transport):
    gradlane.generate_certs(str(tmp_path), ["127.0.0.1"])
    env = dict(os.environ, GRADLANE_CERT_DIR=str(tmp_path))
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    run = subprocess.run(
        [str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(EXAMPLE), "--transport", transport, "--injected-loss",
         "0.05" if transport == "hook" else "0", "--steps", "200", "--eval-every", "100"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    accuracies = [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", run.stdout)]
    assert accuracies and accuracies[-1] >= TARGET_ACCURACY, run.stdout
    sums = re.findall(r"rank \d of 2: parameters ([0-9a-f]+)", run.stdout)
    assert len(sums) == 2 and sums[0] == sums[1], run.stdout
