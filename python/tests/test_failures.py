"""Failures through the paths users take: a rank killed in the middle of
DDP's backward, a rank frozen past the failure timeout and resumed, and a
rank that never comes to a collective on a group with a timeout.

Each must reach the survivors as a typed Python exception (or, with
GRADLANE_ON_RANK_FAILURE=continue, a smaller group), never as a crash:
every rank process's exit code is checked, and one killed by a signal
other than the test's own SIGKILL fails the test.

Ranks run as in test_torch (processes forked from the preloaded server,
torchrun's environment); each returns what it saw through a queue.
"""

import datetime
import os
import queue
import re
import signal
import subprocess
import time

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

from rank_processes import rank_context, stop  # noqa: E402
from test_elastic import blobs, mlp  # noqa: E402
from test_torch import bits, params_of, rank_env  # noqa: E402

RANKS = 3
#: A silent link is a dead rank after this long (GRADLANE_IDLE_TIMEOUT).
IDLE = 5.0
#: What a failure may take beyond its bound to reach Python: the rest of
#: the step, and a CPU shared with the other test files' ranks.
MARGIN = 3.0
#: The step in whose backward the victim dies or freezes.
FAIL_STEP = 5
STEPS = 12
#: What torch's own distributed tests look for in a timeout's message
#: (distributed_test.py, _test_barrier_timeout).
TORCH_SUITE_TIMEOUT = " (Timed out|closed|timeout) "
#: How long the test waits for every rank's word.
RESULT_TIMEOUT = 180.0


def run_world(scenario, cert_dir, *args, world=RANKS, extra_env=None):
    """Runs `scenario(rank, *args)` on `world` rank processes: what each
    rank returned (or the traceback it raised) and each process's exit
    code, once every process has ended."""
    ctx = rank_context()
    results = ctx.Queue()
    env = rank_env(cert_dir, world, extra_env)
    procs = [
        ctx.Process(target=_rank_main, args=(scenario, r, env, args, results)) for r in range(world)
    ]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + RESULT_TIMEOUT
    try:
        while any(p.is_alive() for p in procs) or not results.empty():
            try:
                rank, out = results.get(timeout=0.5)
            except queue.Empty:
                assert time.monotonic() < deadline, f"ranks hung; results so far {got}"
                continue
            got[rank] = out
    finally:
        stop(procs, timeout=5)
    return got, {r: p.exitcode for r, p in enumerate(procs)}


def _rank_main(scenario, rank, env, args, results):
    import traceback

    os.environ.update(env)
    os.environ["RANK"] = str(rank)
    try:
        out = scenario(rank, *args)
    except BaseException:  # noqa: BLE001 - reported to the test
        out = {"raised": traceback.format_exc()}
    results.put((rank, out))


def assert_no_crash(exit_codes, killed=()):
    """Every rank ended by returning, but those the test killed."""
    for rank, code in exit_codes.items():
        if rank in killed:
            assert code == -signal.SIGKILL, f"rank {rank} exit code {code}"
        else:
            assert code == 0, f"rank {rank} ended with exit code {code} (a signal if negative)"


def ddp_model(hook):
    """DDP over the default group on the MLP, with `hook`: None (DDP's own
    allreduce), "gradlane" (gradlane's ddp_hook), "gradlane-powersgd"
    (gradlane's powersgd_hook, compressing from step 2), "gradlane-sparse"
    (gradlane's sparse_hook through the differentiated allgather), "fp16"
    or "powersgd" (torch's hooks)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = mlp()
    ddp = DDP(model)
    if hook == "gradlane":
        import gradlane.torch as gl

        ddp.register_comm_hook(gl.HookState(), gl.ddp_hook)
    elif hook == "gradlane-powersgd":
        import gradlane.torch as gl
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        state = psgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2
        )
        ddp.register_comm_hook(gl.PowerSGDHookState(state, gl.HookState()), gl.powersgd_hook)
    elif hook == "gradlane-sparse":
        import gradlane.torch as gl

        sparse = gl.SparseHookState(0.1, transport="differentiated", hook=gl.HookState())
        ddp.register_comm_hook(sparse, gl.sparse_hook)
    elif hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        state = psgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2
        )
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    return model, ddp


def in_backward_at(model, step_of, action):
    """Calls `action()` inside backward, when the first layer's weight
    gradient is computed (the last one DDP's buckets wait for), at the
    step `step_of()` returns FAIL_STEP."""
    weight = next(model.parameters())

    def hook(grad):
        if step_of() == FAIL_STEP:
            action()
        return grad

    weight.register_hook(hook)


def error_of(e):
    return {"type": type(e).__name__, "rank": getattr(e, "rank", None), "message": str(e)}


def scenario_death_in_backward(rank, victim, hook):
    """DDP training; `victim` SIGKILLs itself inside backward at
    FAIL_STEP. A survivor returns the error its backward raised and how
    long after that backward began."""
    import torch.distributed as dist
    import torch.nn.functional as F

    dist.init_process_group("gradlane")
    model, ddp = ddp_model(hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    step = 0
    if rank == victim:
        in_backward_at(model, lambda: step, lambda: os.kill(os.getpid(), signal.SIGKILL))
    for step in range(STEPS):
        x, y = blobs(1000 * step + rank, 32)
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        started = time.monotonic()
        try:
            loss.backward()
        except Exception as e:  # noqa: BLE001 - what the test checks
            return {"step": step, "after": time.monotonic() - started, **error_of(e)}
        opt.step()
    return {"step": STEPS}


@pytest.mark.parametrize(
    ("hook", "staged"),
    [
        (None, False),
        ("gradlane", False),
        ("fp16", False),
        ("powersgd", False),
        # gradlane's own compressors, the failure at a compressed step.
        ("gradlane-powersgd", False),
        ("gradlane-sparse", False),
        # CPU tensors through the host buffers CUDA tensors take.
        (None, True),
        ("gradlane", True),
    ],
)
def test_a_death_in_backward_raises_rank_failed_on_every_survivor(cert_dir, hook, staged):
    victim = RANKS - 1
    env = {"GRADLANE_IDLE_TIMEOUT": str(IDLE)}
    if staged:
        env["GRADLANE_STAGE_CPU_TENSORS"] = "1"
    got, codes = run_world(scenario_death_in_backward, cert_dir, victim, hook, extra_env=env)
    assert_no_crash(codes, killed=[victim])
    for r in range(RANKS - 1):
        out = got[r]
        assert "raised" not in out, out
        # The step before where the victim's last bytes of it were still
        # in its send buffers when it died.
        assert out["step"] in (FAIL_STEP - 1, FAIL_STEP), out
        assert out["type"] == "RankFailedError", out
        assert out["rank"] == victim, out
        assert f"rank {victim}" in out["message"], out
        assert out["after"] <= IDLE + MARGIN, out
        print(f"\nrank {r} ({hook}): {out['type']} {out['after']:.2f} s into the backward")


def scenario_death_seen_through_futures(rank, victim):
    """`victim` dies at once; each survivor's asynchronous allreduce then
    fails, seen through wait(), the Work's future, and a callback chained
    on it (which sees the error where it reads the value)."""
    import torch.distributed as dist

    dist.init_process_group("gradlane")
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    if rank == victim:
        # Once every other rank has passed the barrier: the victim's last
        # packets of it could die with it.
        others = [f"passed/{r}" for r in range(RANKS) if r != victim]
        store.wait(others, datetime.timedelta(seconds=120))
        os.kill(os.getpid(), signal.SIGKILL)
    store.set(f"passed/{rank}", "1")
    work = dist.all_reduce(torch.ones(16), async_op=True)
    seen = {}

    def read(fut):
        try:
            fut.value()
        except Exception as e:  # noqa: BLE001 - what the test checks
            seen["callback"] = error_of(e)
        return None

    chained = work.get_future().then(read)
    for name, call in [("wait", work.wait), ("future", work.get_future().wait)]:
        try:
            call()
        except Exception as e:  # noqa: BLE001 - what the test checks
            seen[name] = error_of(e)
    chained.wait()
    seen["is_success"] = work.is_success()
    seen["exception"] = type(work.exception()).__name__
    return seen


def test_a_death_reaches_wait_the_future_and_its_callbacks_typed(cert_dir):
    victim = RANKS - 1
    got, codes = run_world(
        scenario_death_seen_through_futures,
        cert_dir,
        victim,
        extra_env={"GRADLANE_IDLE_TIMEOUT": str(IDLE)},
    )
    assert_no_crash(codes, killed=[victim])
    for r in range(RANKS - 1):
        seen = got[r]
        for name in ("wait", "future", "callback"):
            assert seen.get(name, {}).get("type") == "RankFailedError", (name, seen)
            assert seen[name]["rank"] == victim, (name, seen)
        assert seen["is_success"] is False
        assert seen["exception"] == "RankFailedError"


def scenario_frozen_and_resumed(rank, victim, frozen_for):
    """DDP training with GRADLANE_ON_RANK_FAILURE=continue; `victim` stops
    itself (SIGSTOP) inside backward at FAIL_STEP and a process of its own
    resumes it `frozen_for` seconds later. The survivors train on to the
    end; the victim returns the error of its first backward after."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from gradlane.torch._backend import gradlane_group_of

    dist.init_process_group("gradlane")
    model, ddp = ddp_model(None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    step = 0

    def freeze():
        subprocess.Popen(["sh", "-c", f"sleep {frozen_for}; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)

    if rank == victim:
        in_backward_at(model, lambda: step, freeze)
    for step in range(STEPS):
        x, y = blobs(1000 * step + rank, 32)
        opt.zero_grad()
        try:
            F.cross_entropy(ddp(x), y).backward()
        except Exception as e:  # noqa: BLE001 - what the test checks
            return {"step": step, **error_of(e)}
        opt.step()
    group = gradlane_group_of(None)
    return {"step": STEPS, "params": params_of(model), "members": list(group.members)}


def test_a_rank_resumed_after_removal_raises_removed_error(cert_dir):
    victim = RANKS - 1
    got, codes = run_world(
        scenario_frozen_and_resumed,
        cert_dir,
        victim,
        IDLE + 5,
        extra_env={
            "GRADLANE_ON_RANK_FAILURE": "continue",
            "GRADLANE_IDLE_TIMEOUT": str(IDLE),
        },
    )
    assert_no_crash(codes)
    survivors = list(range(RANKS - 1))
    for r in survivors:
        assert got[r].get("step") == STEPS, got[r]
        assert got[r]["members"] == survivors
        for a, b in zip(got[r]["params"], got[0]["params"], strict=True):
            assert np.array_equal(bits(a), bits(b)), f"rank {r} vs rank 0"
    out = got[victim]
    assert out.get("type") == "RemovedError", out
    assert out["step"] == FAIL_STEP, out


def scenario_never_comes(rank, timeout):
    """Rank 1 stays out of rank 0's collectives until rank 0 says so
    through the store: a barrier on the default group and an allreduce on
    a second group (each group of `timeout` seconds) must raise in rank
    0; then an allreduce on a third group (a long timeout) whose wait()
    is given `timeout`, and which completes once rank 1 comes."""
    import torch.distributed as dist

    limit = datetime.timedelta(seconds=timeout)
    dist.init_process_group("gradlane", timeout=limit)
    second = dist.new_group(backend="gradlane", timeout=limit)
    third = dist.new_group(backend="gradlane", timeout=datetime.timedelta(seconds=120))
    store = dist.distributed_c10d._get_default_store()
    out = {}
    if rank == 0:
        for name, call in [
            ("barrier", lambda: dist.barrier()),
            ("allreduce", lambda: dist.all_reduce(torch.ones(8), group=second)),
        ]:
            started = time.monotonic()
            try:
                call()
                out[name] = {"type": None}
            except Exception as e:  # noqa: BLE001 - what the test checks
                out[name] = {"after": time.monotonic() - started, **error_of(e)}
                out[name]["missing"] = getattr(e, "missing", None)
        t = torch.ones(8)
        work = dist.all_reduce(t, group=third, async_op=True)
        started = time.monotonic()
        try:
            work.wait(timeout=datetime.timedelta(seconds=timeout))
            out["wait"] = {"type": None}
        except Exception as e:  # noqa: BLE001 - what the test checks
            out["wait"] = {"after": time.monotonic() - started, **error_of(e)}
        store.set("rank 0 timed out", "1")
        work.wait()
        out["sum"] = t.tolist()
        # Rank 0 serves the store: it stays until rank 1 is through, so
        # that what this test checks is the timeouts, not the end.
        store.wait(["rank 1 done"], datetime.timedelta(seconds=120))
    else:
        store.wait(["rank 0 timed out"], datetime.timedelta(seconds=120))
        t = torch.ones(8)
        try:
            dist.all_reduce(t, group=third)
            out["sum"] = t.tolist()
        finally:
            store.set("rank 1 done", "1")
    return out


def test_a_collective_whose_peer_never_comes_raises_within_the_groups_timeout(cert_dir):
    timeout = 1.0
    got, codes = run_world(scenario_never_comes, cert_dir, timeout, world=2)
    assert_no_crash(codes)
    out = got[0]
    assert "raised" not in out, out
    for op in ("barrier", "allreduce"):
        e = out[op]
        assert e["type"] == "CollectiveTimeoutError", e
        assert e["missing"] == [1], e
        assert op in e["message"], e
        assert re.search(TORCH_SUITE_TIMEOUT, e["message"]), e
        assert timeout * 0.9 <= e["after"] <= timeout + MARGIN, e
        print(f"\n{op}: {e['type']} after {e['after']:.2f} s (timeout {timeout} s)")
    e = out["wait"]
    assert e["type"] == "CollectiveTimeoutError", e
    assert "allreduce" in e["message"], e
    assert re.search(TORCH_SUITE_TIMEOUT, e["message"]), e
    assert timeout * 0.9 <= e["after"] <= timeout + MARGIN, e
    # The collective went on past wait()'s timeout, and completed.
    assert out["sum"] == [2.0] * 8
    assert got[1].get("sum") == [2.0] * 8, got[1]


def scenario_silent_past_timeout(rank, victim, timeout, silent_for):
    """Allreduces with GRADLANE_ON_RANK_FAILURE=continue on a group of
    `timeout` seconds; `victim` stays away from the second for
    `silent_for` seconds (alive: its links answer). The others go on
    without it; it raises at its next collective."""
    import torch.distributed as dist

    from gradlane.torch._backend import gradlane_group_of

    dist.init_process_group("gradlane", timeout=datetime.timedelta(seconds=timeout))
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == victim:
        time.sleep(silent_for)
    try:
        for _ in range(3):
            t = torch.full((4,), float(rank + 1))
            dist.all_reduce(t)
            wide = torch.full((4,), float(rank + 1), dtype=torch.float64)
            dist.all_reduce(wide)
            count = torch.full((4,), rank + 1, dtype=torch.int64)
            dist.all_reduce(count)
    except Exception as e:  # noqa: BLE001 - what the test checks
        return error_of(e)
    return {
        "sum": t.tolist(),
        "float64": wide.tolist(),
        "int64": count.tolist(),
        "members": list(gradlane_group_of(None).members),
    }


def scenario_monitored_barrier_away(rank, victim, timeout, away_for):
    """torch's monitored_barrier with GRADLANE_ON_RANK_FAILURE=continue;
    `victim` stays away from it for `away_for` seconds (alive), then
    calls it too."""
    import torch.distributed as dist

    from gradlane.torch._backend import gradlane_group_of

    dist.init_process_group("gradlane")
    dist.barrier()
    if rank == victim:
        time.sleep(away_for)
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout))
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - what the test checks
        return error_of(e)
    return {"sum": t.tolist(), "members": list(gradlane_group_of(None).members)}


def removed_under_continue(scenario, cert_dir, timeout):
    """Runs `scenario(rank, victim, timeout, 6.0)` (the victim, the last
    rank, away for 6 s) under GRADLANE_ON_RANK_FAILURE=continue, and
    asserts that no rank crashed, that the victim was removed and that the
    others went on as ranks 0 and 1 whose float32 sum (1 + 2) is scaled to
    the world DDP divides by. What each rank returned."""
    victim = RANKS - 1
    got, codes = run_world(
        scenario,
        cert_dir,
        victim,
        timeout,
        6.0,
        extra_env={"GRADLANE_ON_RANK_FAILURE": "continue"},
    )
    assert_no_crash(codes)
    for r in range(RANKS - 1):
        assert got[r].get("members") == [0, 1], got[r]
        assert got[r]["sum"] == [3.0 * RANKS / 2] * 4, got[r]
    assert got[victim].get("type") == "RemovedError", got[victim]
    return got


def test_a_rank_away_from_a_monitored_barrier_is_removed_under_continue(cert_dir):
    removed_under_continue(scenario_monitored_barrier_away, cert_dir, 1.0)


def test_a_rank_silent_past_the_timeout_is_removed_under_continue(cert_dir):
    got = removed_under_continue(scenario_silent_past_timeout, cert_dir, 2.0)
    for r in range(RANKS - 1):
        # The survivors' sum scaled in float64 too; an integer sum is a
        # count, not scaled.
        assert got[r]["float64"] == [3.0 * RANKS / 2] * 4, got[r]
        assert got[r]["int64"] == [3] * 4, got[r]
