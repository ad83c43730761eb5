"""scripts/p2p_stress.py in small: the same jobs over gloo and over
gradlane, every rank a process that ends as torchrun's do. Over gradlane
every rank exits with 0 (no abort) and checked every message; both
backends count the same operations and bytes, as the program is drawn
from the seeds alone. RESULTS has the long runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/test.sh installs it)")

STRESS = Path(__file__).resolve().parents[2] / "scripts" / "p2p_stress.py"
JOBS = 3


def run_stress(backend, out, cert_dir):
    cmd = [sys.executable, str(STRESS), "--jobs", str(JOBS), "--ranks", "3", "2",
           "--seed", "40", "--backend", backend, "--out", str(out), "--timeout", "240"]
    if backend == "gradlane":
        cmd += ["--cert-dir", cert_dir]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.exists(), done.stdout + done.stderr
    return json.loads(out.read_text()), done.stdout


def test_stress_jobs_end_cleanly_and_count_as_over_gloo(tmp_path, cert_dir):
    ours, log = run_stress("gradlane", tmp_path / "gradlane.json", cert_dir)
    s = ours["summary"]
    assert (s["jobs"], s["jobs_failed"], s["aborts"], s["other_nonzero_exits"]) == (
        JOBS, 0, 0, 0), log
    for job in ours["jobs"]:
        for rank in job["ranks"]:
            assert rank["exit"] == 0 and not rank["terminate"], rank
    theirs, log = run_stress("gloo", tmp_path / "gloo.json", cert_dir)
    assert theirs["summary"]["jobs_failed"] == 0, log
    counts = {
        name: [(r["counts"]["ops"], r["counts"]["bytes_received"])
               for job in run["jobs"] for r in job["ranks"]]
        for name, run in (("gradlane", ours), ("gloo", theirs))
    }
    assert counts["gradlane"] == counts["gloo"]
    assert s["operations"] > 500
