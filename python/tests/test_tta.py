"""examples/torch/train_tta.py and scripts/tta_report.py, the two halves of
scripts/tta_bench.sh that run without root: a short training run on two
CPU ranks, and the report made from a bench's files.

A run is started by torchrun where torchrun itself is in question (the
first test), and otherwise as two ranks forked from rank_processes'
server with torchrun's environment: the same script and its main(), with
torch imported once rather than by torchrun and by each rank again."""

import csv
import importlib.util
import os
import pathlib
import re
import socket
import subprocess
import sys
import traceback

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/test.sh installs it)")
pytest.importorskip("sklearn", reason="scikit-learn is not installed (scripts/test.sh installs it)")

import gradlane  # noqa: E402
from rank_processes import rank_context  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch" / "train_tta.py"
REPORT = ROOT / "scripts" / "tta_report.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RANKS = 2
RESULT_TIMEOUT = 600.0


def example_module():
    """examples/torch/train_tta.py as a module (it is a script, not in a
    package)."""
    spec = importlib.util.spec_from_file_location("train_tta", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def example_rank(rank, env, argv, out_path, results):
    """One rank of the example as torchrun starts it: torchrun's
    environment, stdout and stderr in one file, main's exit status."""
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(out, 2)
    status = 1
    try:
        os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
        status = example_module().main(argv)
    except SystemExit as e:
        # As the interpreter would: a message is printed, and is status 1.
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - in the rank's output, as a script's
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        results.put((rank, status))


def train(tmp_path, *args, torchrun=False):
    """The example on two CPU ranks with a short run's flags:
    (returncode, stdout, stderr) as subprocess.run gives them, the ranks'
    output in stdout."""
    gradlane.generate_certs(str(tmp_path), ["127.0.0.1"])
    argv = ["--width", "4", "--eval-every", "5", *args]
    env = {"GRADLANE_CERT_DIR": str(tmp_path), "GLOO_SOCKET_IFNAME": "lo"}
    if torchrun:
        exe = pathlib.Path(sys.executable).with_name("torchrun")
        return subprocess.run(
            [str(exe), "--nproc-per-node", str(RANKS), "--master-port", str(free_port()),
             str(EXAMPLE), *argv],
            env=dict(os.environ, **env), capture_output=True, text=True, timeout=600,
        )
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(RANKS),
               LOCAL_WORLD_SIZE=str(RANKS))
    ctx = rank_context()
    results = ctx.Queue()
    outs = [tmp_path / f"rank{r}.out" for r in range(RANKS)]
    procs = [
        ctx.Process(target=example_rank, args=(r, env, argv, str(outs[r]), results), daemon=True)
        for r in range(RANKS)
    ]
    for p in procs:
        p.start()
    try:
        statuses = dict(results.get(timeout=RESULT_TIMEOUT) for _ in range(RANKS))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    returncode = next((s for s in statuses.values() if s != 0), 0)
    stdout = "".join(out.read_text() for out in outs)
    return subprocess.CompletedProcess(argv, returncode, stdout, "")


def rows_of(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("transport", ["hook", "gloo"])
def test_a_run_writes_one_row_per_evaluation_and_ranks_agree(tmp_path, transport):
    out = tmp_path / "run.csv"
    run = train(tmp_path, "--transport", transport, "--steps", "10", "--csv", str(out),
                torchrun=True)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = rows_of(out)
    assert [int(r["step"]) for r in rows] == [5, 10]
    assert list(rows[0]) == [
        "train_s", "step", "sent_bytes", "train_loss", "test_acc", "lossy_bytes", "hook_bytes",
    ]
    times = [float(r["train_s"]) for r in rows]
    assert 0 < times[0] < times[1]
    # The interface's counter: the ranks' traffic went out on loopback.
    assert int(rows[-1]["sent_bytes"]) > 0, rows
    assert all(0.0 <= float(r["test_acc"]) <= 1.0 for r in rows)
    sums = re.findall(r"rank \d of 2: parameters ([0-9a-f]{16})", run.stdout)
    assert len(sums) == 2 and sums[0] == sums[1], run.stdout
    if transport == "hook":
        assert re.search(r"hook: [0-9.]+ s in the hook, [0-9.]+ s in the Rust allreduce", run.stdout)
        # A step's payload through the hook, its lossy part within it.
        assert all(0 <= int(r["lossy_bytes"]) <= int(r["hook_bytes"]) for r in rows), rows
        assert int(rows[-1]["hook_bytes"]) > 0, rows
    else:
        assert all(r["lossy_bytes"] == r["hook_bytes"] == "" for r in rows), rows


@pytest.mark.parametrize("flags", [
    ["--transport", "gloo", "--comm-hook", "fp16"],
    ["--transport", "gradlane", "--comm-hook", "bf16"],
    # Two DDP buckets at this size (a 1 MB first bucket is not reached by
    # width 4, so force several with a tiny cap): the gradlane backend
    # runs PowerSGD's chained collectives in the order every rank issues.
    ["--transport", "gradlane", "--comm-hook", "powersgd", "--powersgd-start", "3",
     "--bucket-cap-mb", "0.01"],
    ["--transport", "gloo", "--comm-hook", "powersgd", "--powersgd-start", "3",
     "--bucket-cap-mb", "64"],
    ["--transport", "hook", "--important-format", "bf16", "--lossy-format", "log8",
     "--lossy-return", "--loss-tolerance", "0.4"],
    # torch's docs' way to send PowerSGD's warm-up in fp16.
    ["--transport", "gloo", "--comm-hook", "powersgd-fp16", "--powersgd-start", "3",
     "--bucket-cap-mb", "64"],
    # gradlane's powersgd_hook: the warm-up through gradlane's hook.
    ["--transport", "hook", "--important-format", "bf16", "--lossy-format", "log8",
     "--lossy-return", "--loss-tolerance", "0.7", "--comm-hook", "powersgd",
     "--powersgd-start", "3", "--powersgd-rank", "8"],
])
def test_torchs_hooks_and_the_value_formats_train_and_ranks_agree(tmp_path, flags):
    out = tmp_path / "run.csv"
    run = train(tmp_path, *flags, "--steps", "10", "--csv", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = rows_of(out)
    assert [int(r["step"]) for r in rows] == [5, 10]
    # The loss went down: the hook's reduced gradients were applied.
    assert float(rows[-1]["train_loss"]) < 2.3, rows
    sums = re.findall(r"rank \d of 2: parameters ([0-9a-f]{16})", run.stdout)
    assert len(sums) == 2 and sums[0] == sums[1], run.stdout
    if "--comm-hook" in flags:
        assert f"(torch hook {flags[flags.index('--comm-hook') + 1]})" in run.stdout, run.stdout
    if flags[:2] == ["--transport", "hook"] and "--comm-hook" in flags:
        # Every step went through gradlane's differentiated allreduce: the
        # 3 warm-up steps whole, the 7 after them as PowerSGD's factors.
        assert re.search(r"buckets cut at their deadline over 10 steps", run.stdout), run.stdout
        assert "powersgd: 3 warm-up steps, 7 steps of factors" in run.stdout, run.stdout


def test_the_time_limit_stops_every_rank_at_the_same_step(tmp_path):
    out = tmp_path / "run.csv"
    run = train(tmp_path, "--transport", "gloo", "--steps", "50", "--time-limit", "1e-6",
                "--csv", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert [int(r["step"]) for r in rows_of(out)] == [5]
    assert "summary: 5 steps in" in run.stdout
    sums = re.findall(r"rank \d of 2: parameters ([0-9a-f]{16})", run.stdout)
    assert len(sums) == 2 and sums[0] == sums[1], run.stdout


def test_bad_arguments_are_refused_before_anything_starts(capsys):
    # The script as a user starts it: exit status 2 and the reason.
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "0"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "must be positive" in run.stderr, run.stderr
    # The other refusals come from the same parse_args, called here.
    example = example_module()

    def refused(*argv):
        with pytest.raises(SystemExit) as e:
            example.parse_args(list(argv))
        return e.value.code, capsys.readouterr().err

    for flags in (["--dscp"], ["--overlap"], ["--lossy-carrier", "datagrams"]):
        code, err = refused("--transport", "gloo", *flags)
        assert code == 2 and "needs --transport hook" in err, err
    for flags in (["--important-format", "bf16"], ["--lossy-format", "log8"], ["--lossy-return"]):
        code, err = refused("--transport", "gradlane", *flags)
        assert code == 2 and "needs --transport hook" in err, err
    code, err = refused("--transport", "hook", "--deadline", "soon")
    assert code == 2 and "--deadline" in err, err
    code, err = refused("--transport", "hook", "--loss-tolerance", "1.5")
    assert code == 2 and "loss_tolerance 1.5 is not in [0, 1]" in err, err
    code, err = refused("--transport", "hook", "--comm-hook", "fp16")
    assert code == 2 and "use --transport gloo or gradlane" in err, err


RUN_FIELDS = (
    "variant,loss,seed,condition,rate,ranks,width,steps_run,train_s,time_to_target_s,final_acc,"
    "step_p50_s,step_p99_s,sent_bytes_per_step,measured_loss,params_equal,build,date"
).split(",")


def fake_bench(out, runs):
    """A bench's files: runs.csv and each run's evaluations, accuracy
    rising linearly to `final` over `train_s` seconds. A run is (variant,
    loss, seed, time to target, training time, final accuracy), with an
    optional condition (plain unless given)."""
    (out / "runs").mkdir(parents=True)
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, RUN_FIELDS)
        w.writeheader()
        for variant, loss, seed, ttt, train_s, final, *cond in runs:
            condition = cond[0] if cond else "plain"
            w.writerow(dict(
                variant=variant, loss=loss, seed=seed, condition=condition, rate="100mbit",
                ranks=4, width=32, steps_run=50, train_s=train_s, time_to_target_s=ttt,
                final_acc=final, step_p50_s=1.5, step_p99_s=2.0, sent_bytes_per_step=17_000_000,
                measured_loss=loss, params_equal="yes", build="test", date="now",
            ))
            with open(out / "runs" / f"{condition}_{variant}_loss{loss}_seed{seed}.csv", "w") as g:
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
    table = (tmp_path / "table.md").read_text().split("Every variant:")[1]
    rows = {line.split("|")[3].strip(): line for line in table.strip().splitlines()[2:]}
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
    every = (tmp_path / "table.md").read_text().split("Every variant:")[1]
    hook = next(l for l in every.splitlines() if "hook-zero_fill" in l)
    assert "| < 0.25x |" in hook, hook


def report(out, *args):
    return subprocess.run(
        [sys.executable, str(REPORT), "--out", str(out), *args],
        capture_output=True, text=True, timeout=120,
    )


def test_best_against_best_takes_each_sides_fastest_variant_per_condition(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    fake_bench(tmp_path, [
        ("gloo-bbr", 0, 0, 60, 70, 0.978),
        ("gloo-bbr+fp16", 0, 0, 40, 50, 0.975),
        ("gradlane", 0, 0, 50, 60, 0.98),
        ("hook-bf16log8-t0.4", 0, 0, 36, 45, 0.98),
        ("gloo-bbr+fp16", 0.05, 0, 50, 60, 0.975),
        ("hook-bf16log8-t0.4", 0.05, 0, 30, 40, 0.97),  # 0.60x, but 0.8 points below
        ("gloo-bbr+fp16", 0.01, 0, 50, 60, 0.978, "delay20"),
        ("gradlane+fp16", 0.01, 0, 30, 40, 0.978, "delay20"),
    ])
    run = report(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    best = (tmp_path / "table.md").read_text().split("Every variant:")[0]
    rows = [line.split("|") for line in best.splitlines() if line.startswith("| plain") or
            line.startswith("| delay")]
    picked = {(r[1].strip(), r[2].strip(), r[3].strip()): r for r in rows}
    assert picked[("plain", "0", "gloo")][4].strip() == "gloo-bbr+fp16"
    lossless = picked[("plain", "0", "gradlane")]
    assert lossless[4].strip() == "hook-bf16log8-t0.4" and lossless[10].strip() == "0.900x"
    assert "met" in lossless[11] and "missed" not in lossless[11]
    # Fast enough, but below gloo's lossless accuracy by more than half a point.
    assert "missed" in picked[("plain", "0.05", "gradlane")][11]
    assert "met" in picked[("delay20", "0.01", "gradlane")][11]


def steady_csv(out, cell, seconds, lossy=None):
    """A run's per-step CSV: steps 2-11 slow (a warm-up the steady table
    must not count), then `seconds(step)` each; with `lossy`, the hook's
    bytes of each step (lossy, total)."""
    clock = 0.0
    lines = ["train_s,step,sent_bytes,train_loss,test_acc,lossy_bytes,hook_bytes"]
    for step in range(1, 51):
        clock += 2.0 if step < 12 else seconds(step)
        extra = ",".join(str(b) for b in lossy(step)) if lossy else ","
        lines.append(f"{clock},{step},0,0.1,0.5,{extra}")
    (out / "runs" / f"{cell}.csv").write_text("\n".join(lines) + "\n")


def test_the_steady_table_reads_the_steps_after_the_warm_up_and_the_lossy_share(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    fake_bench(tmp_path, [
        ("gloo-cubic", 0, 0, 4, 6, 0.978, "tail3"),
        ("hook-bf16log8-t0.4", 0, 0, 4, 6, 0.978, "tail3"),
    ])
    steady_csv(tmp_path, "tail3_gloo-cubic_loss0_seed0", lambda s: 0.3 if s == 30 else 0.1)
    # Warm-up steps all exact, then a quarter of each step's bytes lossy.
    steady_csv(tmp_path, "tail3_hook-bf16log8-t0.4_loss0_seed0",
               lambda s: 0.13 if s == 30 else 0.1,
               lambda s: (0, 1000) if s < 12 else (250, 1000))
    run = report(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    tail = (tmp_path / "table.md").read_text().split("The steady steps, 12 and after")[1]
    rows = {line.split("|")[3].strip(): line for line in tail.splitlines() if line.startswith("| tail3")}
    assert rows["gloo-cubic"].rstrip().endswith("| 0.100 | 0.300 | 3.00 | - |"), rows
    assert rows["hook-bf16log8-t0.4"].rstrip().endswith("| 0.100 | 0.130 | 1.30 | 0.25 |"), rows


def test_the_attribution_puts_each_compressors_three_paths_side_by_side(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    fake_bench(tmp_path, [
        ("gloo-cubic+powersgd-r8", 0.02, 0, 20, 30, 0.978),
        ("gradlane+powersgd-r8", 0.02, 0, 16, 30, 0.978),
        ("hook-bf16log8-t0.4+powersgd-r8", 0.02, 0, 12, 30, 0.978),
        ("gloo-cubic+fp16", 0.02, 0, 30, 40, 0.978),
        # PowerSGD in torch's fp16 wrapper: another compressor, not a row
        # of PowerSGD's three paths.
        ("gloo-cubic+powersgd-fp16-r8", 0.02, 0, 18, 30, 0.978),
    ])
    step = {"gloo-cubic+powersgd-r8": 0.3, "gradlane+powersgd-r8": 0.2,
            "hook-bf16log8-t0.4+powersgd-r8": 0.15, "gloo-cubic+fp16": 0.5,
            "gloo-cubic+powersgd-fp16-r8": 0.25}
    for v, s in step.items():
        steady_csv(tmp_path, f"plain_{v}_loss0.02_seed0", lambda _, s=s: s)
    run = report(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    part = (tmp_path / "table.md").read_text().split("What the mechanism adds")[1]
    rows = [line.split("|") for line in part.splitlines() if line.startswith("| PowerSGD")]
    paths = [(r[4].strip(), r[5].strip()) for r in rows]
    assert paths == [("gloo", "gloo-cubic+powersgd-r8"), ("gradlane exact", "gradlane+powersgd-r8"),
                     ("differentiated", "hook-bf16log8-t0.4+powersgd-r8")]
    assert rows[2][10].strip() == "0.75x"
    # fp16 ran over gloo alone there: nothing to compare, no row.
    assert not any(line.startswith("| fp16 |") for line in part.splitlines())


def test_pick_chooses_finalists_then_key_cells_with_three_seeds(tmp_path):
    fake_bench(tmp_path, [
        ("gloo-bbr", 0, 0, 60, 70, 0.978),
        ("gloo-cubic", 0, 0, 62, 70, 0.978),
        ("gloo-bbr+fp16", 0, 0, 40, 50, 0.975),
        ("gloo-bbr", 0.05, 0, 80, 90, 0.978),
        ("gloo-cubic", 0.05, 0, "", 120, 0.6),
        ("gloo-bbr+fp16", 0.05, 0, 50, 60, 0.975),
        ("gradlane", 0, 0, 50, 60, 0.98),
        ("gradlane", 0.05, 0, 55, 60, 0.98),
        ("hook-zero_fill", 0, 0, 58, 60, 0.98),
        ("hook-zero_fill", 0.05, 0, 70, 80, 0.98),
        ("hook-bf16log8-t0.4", 0, 0, 36, 45, 0.98),
        ("hook-bf16log8-t0.4", 0.05, 0, 30, 40, 0.98),
    ])
    run = report(tmp_path, "--pick", "finalists")
    assert run.returncode == 0, run.stderr
    cells = set(run.stdout.split("\n")) - {""}
    finalists = {"gloo-bbr+fp16", "gloo-bbr", "hook-bf16log8-t0.4", "gradlane"}
    assert cells == {f"{v} 0.01 0 {c}" for v in finalists for c in ("plain", "delay20")}
    run = report(tmp_path, "--pick", "key")
    key = set(run.stdout.split("\n")) - {""}
    assert "gloo-bbr+fp16 0.05 2 plain" in key and "hook-bf16log8-t0.4 0 1 plain" in key
    assert not any(c.startswith(("gloo-cubic", "hook-zero_fill")) for c in key), key
    run = report(tmp_path, "--pick", "compete")
    assert run.stdout.split() == [
        "gloo-bbr+fp16", "0", "0", "compete", "hook-bf16log8-t0.4", "0", "0", "compete",
        "hook-bf16log8-t0.4", "0", "0", "compete-dscp"]
    assert report(tmp_path, "--pick", "nonsense").returncode != 0
