"""examples/torch/train_tta.py and scripts/tta_report.py, the two halves of
scripts/tta_bench.sh that run without root: a short training run under
torchrun on two CPU ranks, and the report made from a bench's files."""

import csv
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

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch" / "train_tta.py"
REPORT = ROOT / "scripts" / "tta_report.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(tmp_path, *args):
    gradlane.generate_certs(str(tmp_path), ["127.0.0.1"])
    env = dict(os.environ, GRADLANE_CERT_DIR=str(tmp_path), GLOO_SOCKET_IFNAME="lo")
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    return subprocess.run(
        [str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(EXAMPLE), "--width", "4", "--eval-every", "5", *args],
        env=env, capture_output=True, text=True, timeout=600,
    )


def rows_of(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("transport", ["hook", "gloo"])
def test_a_run_writes_one_row_per_evaluation_and_ranks_agree(tmp_path, transport):
    out = tmp_path / "run.csv"
    run = train(tmp_path, "--transport", transport, "--steps", "10", "--csv", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = rows_of(out)
    assert [int(r["step"]) for r in rows] == [5, 10]
    assert list(rows[0]) == ["train_s", "step", "sent_bytes", "train_loss", "test_acc"]
    times = [float(r["train_s"]) for r in rows]
    assert 0 < times[0] < times[1]
    # The interface's counter: the ranks' traffic went out on loopback.
    assert int(rows[-1]["sent_bytes"]) > 0, rows
    assert all(0.0 <= float(r["test_acc"]) <= 1.0 for r in rows)
    sums = re.findall(r"rank \d of 2: parameters ([0-9a-f]{16})", run.stdout)
    assert len(sums) == 2 and sums[0] == sums[1], run.stdout
    if transport == "hook":
        assert re.search(r"hook: [0-9.]+ s in the hook, [0-9.]+ s in the Rust allreduce", run.stdout)


def test_the_time_limit_stops_every_rank_at_the_same_step(tmp_path):
    out = tmp_path / "run.csv"
    run = train(tmp_path, "--transport", "gloo", "--steps", "50", "--time-limit", "1e-6",
                "--csv", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert [int(r["step"]) for r in rows_of(out)] == [5]
    assert "summary: 5 steps in" in run.stdout
    sums = re.findall(r"rank \d of 2: parameters ([0-9a-f]{16})", run.stdout)
    assert len(sums) == 2 and sums[0] == sums[1], run.stdout


def test_bad_arguments_are_refused_before_anything_starts():
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "0"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "must be positive" in run.stderr, run.stderr
    for flags in (["--dscp"], ["--overlap"], ["--lossy-carrier", "datagrams"]):
        run = subprocess.run(
            [sys.executable, str(EXAMPLE), "--transport", "gloo", *flags],
            capture_output=True, text=True, timeout=60,
        )
        assert run.returncode == 2 and "needs --transport hook" in run.stderr, run.stderr


RUN_FIELDS = (
    "variant,loss,seed,condition,rate,ranks,width,steps_run,train_s,time_to_target_s,final_acc,"
    "step_p50_s,step_p99_s,sent_bytes_per_step,measured_loss,params_equal,build,date"
).split(",")


def fake_bench(out, runs):
    """A bench's files: runs.csv and each run's evaluations, accuracy
    rising linearly to `final` over `train_s` seconds."""
    (out / "runs").mkdir(parents=True)
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, RUN_FIELDS)
        w.writeheader()
        for variant, loss, seed, ttt, train_s, final in runs:
            w.writerow(dict(
                variant=variant, loss=loss, seed=seed, condition="plain", rate="100mbit",
                ranks=4, width=32, steps_run=50, train_s=train_s, time_to_target_s=ttt,
                final_acc=final, step_p50_s=1.5, step_p99_s=2.0, sent_bytes_per_step=17_000_000,
                measured_loss=loss, params_equal="yes", build="test", date="now",
            ))
            with open(out / "runs" / f"plain_{variant}_loss{loss}_seed{seed}.csv", "w") as g:
                g.write("train_s,step,sent_bytes,train_loss,test_acc\n")
                for step in range(5, 55, 5):
                    g.write(f"{train_s * step / 50},{step},0,0.1,{final * step / 50}\n")


def test_the_report_compares_with_gloos_better_and_says_what_was_not_reached(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    fake_bench(tmp_path, [
        ("gloo-cubic", 0.05, 0, "", 240, 0.6),  # never reached the target
        ("gloo-bbr", 0.05, 0, 100, 120, 0.97),
        ("gloo-bbr", 0.05, 1, 110, 130, 0.97),
        ("gloo-bbr", 0.05, 2, 90, 110, 0.97),
        ("hook-zero_fill", 0.05, 0, 60, 80, 0.97),
    ])
    run = subprocess.run(
        [sys.executable, str(REPORT), "--out", str(tmp_path), "--target", "0.95"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    table = (tmp_path / "table.md").read_text()
    rows = {line.split("|")[3].strip(): line for line in table.splitlines()[2:]}
    assert "not reached in 240" in rows["gloo-cubic"]
    assert "| 100 (90-110) |" in rows["gloo-bbr"]
    # 60 s against gloo-bbr's median of 100 s.
    assert "| 0.60x |" in rows["hook-zero_fill"]
    for png in ("accuracy.png", "time_to_target.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_against_a_gloo_that_never_reached_the_target_the_ratio_is_a_bound(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    fake_bench(tmp_path, [
        ("gloo-cubic", 0.05, 0, "", 200, 0.6),
        ("hook-zero_fill", 0.05, 0, 50, 80, 0.97),
    ])
    run = subprocess.run(
        [sys.executable, str(REPORT), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    hook = next(l for l in (tmp_path / "table.md").read_text().splitlines() if "hook-zero_fill" in l)
    assert "| < 0.25x |" in hook, hook
