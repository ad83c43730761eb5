"""DDP over the backend with GRADLANE_ON_RANK_FAILURE=continue: a rank
killed with SIGKILL mid-training, and the others train on to the target
with the same parameters; a replacement for it rejoins and ends with the
same parameters too.

Ranks run as in test_torch (processes, torchrun's environment). The task
is a small one that a step of three ranks learns in a few dozen steps:
Gaussian blobs in 16 dimensions, four classes, an MLP.
"""

import os
import signal
import time

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

from rank_processes import rank_context, reports, stop  # noqa: E402
from test_torch import bits, params_of, rank_env, rank_main, run_ranks  # noqa: E402

RANKS = 3
STEPS = 40
KILL_STEP = 8
TARGET = 0.9
#: A silent link is a dead rank after this long: short, yet long enough
#: for a rank starved of CPU by a parallel build to keep its links.
IDLE = "10"


def blobs(seed, n):
    """n points of four Gaussian blobs in 16 dimensions, with labels."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(7)) * 2.0
    y = torch.randint(0, 4, (n,), generator=g)
    x = centers[y] + torch.randn(n, 16, generator=g)
    return x, y


def mlp():
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def scenario_killed_mid_training(rank, kill_rank, kill_step, steps):
    """DDP over gradlane, every rank from rank 0's weights; rank
    `kill_rank` kills itself with SIGKILL at the start of step
    `kill_step`. The others train on: their parameters, accuracy, step
    times and the group's members at the end."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradlane.torch._backend import gradlane_group_of

    dist.init_process_group("gradlane")
    model = mlp()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    times = []
    for step in range(steps):
        if rank == kill_rank and step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        started = time.perf_counter()
        x, y = blobs(1000 * step + rank, 32)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - started)
    x, y = blobs(99, 2000)
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    group = gradlane_group_of(None)
    out = {
        "params": params_of(model),
        "accuracy": accuracy,
        "times": times,
        "members": list(group.members),
        "epoch": group.epoch,
    }
    dist.destroy_process_group()
    return out


def test_ddp_trains_on_after_a_rank_is_killed(cert_dir):
    got = run_ranks(
        scenario_killed_mid_training,
        cert_dir,
        RANKS - 1,
        KILL_STEP,
        STEPS,
        world=RANKS,
        expect=RANKS - 1,
        extra_env={"GRADLANE_ON_RANK_FAILURE": "continue", "GRADLANE_IDLE_TIMEOUT": IDLE},
    )
    survivors = list(range(RANKS - 1))
    assert sorted(got) == survivors
    for r in survivors:
        out = got[r]
        assert out["members"] == survivors, out["members"]
        assert out["epoch"] == 1
        assert out["accuracy"] >= TARGET, out["accuracy"]
        assert len(out["times"]) == STEPS
        for a, b in zip(out["params"], got[0]["params"], strict=True):
            assert np.array_equal(bits(a), bits(b)), f"rank {r} vs rank 0"
    # The step that met the death took about the idle timeout; the ones
    # after it are ordinary again (a report, not a bound: the machine is
    # shared).
    times = got[0]["times"]
    normal = float(np.median(times[1:KILL_STEP]))
    print(
        f"\nnormal step {normal * 1000:.1f} ms; the step of the kill "
        f"{times[KILL_STEP]:.2f} s (idle timeout {IDLE} s); the next "
        f"{times[KILL_STEP + 1] * 1000:.1f} ms"
    )


#: Steps every rank trains after the replacement is admitted.
AFTER = 10


def train_step(ddp, opt, step, rank):
    import torch.nn.functional as F

    x, y = blobs(1000 * step + rank, 32)
    opt.zero_grad()
    F.cross_entropy(ddp(x), y).backward()
    opt.step()


def finish(model, out):
    import torch.distributed as dist

    from gradlane.torch._backend import gradlane_group_of

    x, y = blobs(99, 2000)
    with torch.no_grad():
        out["accuracy"] = (model(x).argmax(1) == y).float().mean().item()
    out["params"] = params_of(model)
    group = gradlane_group_of(None)
    out["members"] = list(group.members)
    out["epoch"] = group.epoch
    dist.destroy_process_group()
    return out


def scenario_killed_and_replaced(rank, kill_rank, kill_step, powersgd=False, store_file=None):
    """Members: train, calling elastic.admit at every step's end; rank
    `kill_rank` SIGKILLs itself at step `kill_step`. Once a replacement is
    admitted, every rank trains AFTER more steps. A replacement
    (GRADLANE_REJOIN=1): catches up from the members' state, then trains
    the same steps. With `powersgd`, every DDP runs torch's PowerSGD hook
    (compressing from step 2 on): the replacement must take the members'
    step count and bases, or it would run the full allreduce beside their
    compressed ones. With `store_file`, the ranks meet through a file
    store (which outlives rank 0) instead of rank 0's TCP store."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradlane.torch import elastic

    replacement = os.environ.get("GRADLANE_REJOIN") == "1"
    if store_file is None:
        dist.init_process_group("gradlane")
    else:
        dist.init_process_group(
            "gradlane", init_method=f"file://{store_file}", rank=rank, world_size=RANKS
        )
    model = mlp()
    if replacement:
        # Other weights than the members', to show they are replaced.
        torch.nn.init.normal_(model[0].weight)
    ddp = DDP(model, init_sync=not replacement)
    if powersgd:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        ps = psgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2
        )
        ddp.register_comm_hook(ps, psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    out = {"replacement": replacement}
    if replacement:
        extra = elastic.catch_up(ddp, opt)
        step, end = extra["step"] + 1, extra["step"] + 1 + AFTER
        out["caught_up_at"] = extra["step"]
        out["params_at_admission"] = params_of(model)
        out["momentum_at_admission"] = [
            opt.state[p]["momentum_buffer"].numpy().copy() for p in model.parameters()
        ]
    else:
        step, end = 0, None
    while end is None or step < end:
        if rank == kill_rank and step == kill_step and not replacement:
            os.kill(os.getpid(), signal.SIGKILL)
        train_step(ddp, opt, step, rank)
        joined = elastic.admit(ddp, opt, extra={"step": step})
        if joined:
            out["admitted"] = joined
            out["admitted_at"] = step
            out["params_at_admission"] = params_of(model)
            out["momentum_at_admission"] = [
                opt.state[p]["momentum_buffer"].numpy().copy() for p in model.parameters()
            ]
            end = step + 1 + AFTER
        if end is None and step > 5000:
            raise RuntimeError("no replacement was admitted")
        step += 1
    if powersgd:
        out["powersgd_iter"] = ps.iter
        out["q"] = {k: v.numpy().copy() for k, v in ps.q_memory_dict.items()}
    return finish(model, out)


def test_a_killed_rank_is_replaced_and_ends_with_the_same_parameters(cert_dir):
    replace_a_killed_rank(cert_dir, powersgd=False)


def test_rank_0_killed_is_replaced_through_another_member(cert_dir, tmp_path):
    replace_a_killed_rank(cert_dir, powersgd=False, victim=0, store_file=str(tmp_path / "store"))


def test_a_replacement_takes_the_members_powersgd_state(cert_dir):
    got = replace_a_killed_rank(cert_dir, powersgd=True)
    victim = RANKS - 1
    assert got[victim]["powersgd_iter"] == got[0]["powersgd_iter"]
    assert got[0]["powersgd_iter"] > 2, "PowerSGD compressed"
    for r in range(RANKS):
        assert sorted(got[r]["q"]) == sorted(got[0]["q"])
        for k, q in got[r]["q"].items():
            assert np.array_equal(bits(q), bits(got[0]["q"][k])), f"rank {r} bucket {k}"


def replace_a_killed_rank(cert_dir, powersgd, victim=RANKS - 1, store_file=None):
    ctx = rank_context()
    results = ctx.Queue()
    env = rank_env(
        cert_dir,
        RANKS,
        {"GRADLANE_ON_RANK_FAILURE": "continue", "GRADLANE_IDLE_TIMEOUT": IDLE},
    )
    args = (scenario_killed_and_replaced, victim, KILL_STEP, powersgd, store_file)

    def start(rank, extra):
        p = ctx.Process(
            target=rank_main,
            args=(args[0], rank, {**env, **extra}, args[1:], results),
            daemon=True,
        )
        p.start()
        return p

    procs = [start(r, {}) for r in range(RANKS)]
    try:
        procs[victim].join(timeout=300)
        assert procs[victim].exitcode == -signal.SIGKILL
        # The command a user runs to start one replacement rank: the same
        # environment, RANK of the dead one, GRADLANE_REJOIN=1.
        procs.append(start(victim, {"GRADLANE_REJOIN": "1"}))
        got = reports(results, RANKS, 300)
    finally:
        stop(procs)
    assert sorted(got) == list(range(RANKS))
    assert got[victim]["replacement"]
    # A member that was never replaced, to compare the others with.
    ref = 1 if victim == 0 else 0
    admitted_at = got[ref]["admitted_at"]
    assert got[victim]["caught_up_at"] == admitted_at
    for r in range(RANKS):
        out = got[r]
        assert out["members"] == list(range(RANKS)), out["members"]
        assert out["epoch"] == 2
        assert out["accuracy"] >= TARGET, (r, out["accuracy"])
        if r != victim:
            assert out["admitted"] == [victim] and out["admitted_at"] == admitted_at
        # The state it took, and where training left it: the members'.
        for what in ("params_at_admission", "momentum_at_admission", "params"):
            for a, b in zip(out[what], got[ref][what], strict=True):
                assert np.array_equal(bits(a), bits(b)), f"{what}: rank {r} vs rank {ref}"
    return got


def test_a_bad_on_rank_failure_is_a_clear_error(monkeypatch):
    from gradlane.torch._environment import on_rank_failure_from_env

    monkeypatch.setenv("GRADLANE_ON_RANK_FAILURE", "retry")
    with pytest.raises(ValueError, match="GRADLANE_ON_RANK_FAILURE 'retry'"):
        on_rank_failure_from_env()
    monkeypatch.setenv("GRADLANE_ON_RANK_FAILURE", "Continue")
    assert on_rank_failure_from_env() == "continue"
    monkeypatch.delenv("GRADLANE_ON_RANK_FAILURE")
    assert on_rank_failure_from_env() == "fail"


def test_rejoin_without_continue_is_a_clear_error(monkeypatch):
    from gradlane.torch._environment import rejoin_from_env

    monkeypatch.setenv("GRADLANE_REJOIN", "1")
    monkeypatch.delenv("GRADLANE_ON_RANK_FAILURE", raising=False)
    with pytest.raises(ValueError, match="needs GRADLANE_ON_RANK_FAILURE=continue"):
        rejoin_from_env()
    monkeypatch.setenv("GRADLANE_REJOIN", "yes")
    with pytest.raises(ValueError, match="GRADLANE_REJOIN 'yes'"):
        rejoin_from_env()
