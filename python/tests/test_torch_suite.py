"""A part of torch's own distributed test suite over gradlane, one test of
each op gloo runs on CPU: the conformance check inside the test command.

The whole comparison, every test gloo passes at 2 and 3 ranks, over gloo
and over gradlane, is scripts/torch_suite.sh (minutes); its figures are in
docs/RESULTS.md. This runs its driver (scripts/torch_suite_driver.py:
torch's spawn driver rebuilt for the installed torch) at 2 ranks on the
tests below and expects every one to pass.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/test.sh installs it into the venv)")

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import torch_suite  # noqa: E402

#: One of the suite's tests for each op and feature gloo has on CPU (isend
#: and irecv run inside the batch and tag tests; the product and complex
#: sums cover the plain one).
TESTS = [
    "test_all_reduce_product",
    "test_all_reduce_sum_complex",
    "test_all_reduce_coalesced_max",
    "test_reduce_sum",
    "test_broadcast",
    "test_all_gather",
    "test_all_gather_coalesced_simple",
    "test_all_gather_object_subgroup",
    "test_gather",
    "test_scatter",
    "test_scatter_object_list",
    "test_send_recv_with_tag",
    "test_send_recv_any_source",
    "test_batch_isend_irecv_gloo_tags",
    "test_barrier_timeout_full_group",
    "test_monitored_barrier_gloo",
    "test_get_future",
    "test_DistributedDataParallelCPU",
    "test_sparse_all_reduce_sum",
]


def test_torch_suite_subset_passes_over_gradlane(cert_dir, tmp_path):
    junit = tmp_path / "suite.xml"
    driver = SCRIPTS / "torch_suite_driver.py"
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
        f"--junitxml={junit}", "-o", "junit_family=xunit1",
        *[f"{driver}::TestDistBackendWithSpawn::{t}" for t in TESTS],
    ]
    env = dict(
        os.environ,
        GRADLANE_SUITE_BACKEND="gradlane",
        GRADLANE_CERT_DIR=cert_dir,
        WORLD_SIZE="2",
        TEMP_DIR=str(tmp_path),
    )
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert junit.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    got = torch_suite.outcomes(junit)
    assert sorted(got) == sorted(TESTS), run.stdout[-3000:]
    bad = {t: v for t, v in got.items() if v[0] != "passed"}
    assert not bad, "\n".join(f"{t}: {s}: {why}" for t, (s, why) in sorted(bad.items()))
