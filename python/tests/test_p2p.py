"""Point-to-point over the gradlane backend: send, recv (from a rank and
from any), isend, irecv, batch_isend_irecv, with tags and any dtype,
beside collectives; and torch.distributed.pipelining's GPipe schedule
over gradlane against the same schedule over gloo.

Each test runs one set of rank processes (forked from the preloaded
server, torchrun's environment) that checks many things and returns what
it saw; the test compares.
"""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

from test_torch import bits, run_ranks  # noqa: E402

DTYPES = ["float32", "float64", "bfloat16", "int64", "int8", "uint8", "bool", "complex64"]


def sample(dtype, rank, n=37):
    """Values particular to `rank`, of `dtype`."""
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(n, 2, generator=g) * 100
    dt = getattr(torch, dtype)
    if dt == torch.bool:
        return x > 0
    if dt.is_complex:
        return torch.complex(x[:, 0], x[:, 1])
    return x.to(dt)


def as_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().copy()


def scenario_p2p(rank):
    """Three ranks: a ring of sends in every dtype, tags out of order, a
    receive from any rank, an irecv posted across an allreduce, a
    non-contiguous tensor, and batch_isend_irecv both ways."""
    import torch.distributed as dist

    dist.init_process_group("gradlane")
    world = dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    out = {"ring": {}, "tags": None, "any": None, "across": None, "strided": None, "batch": None}
    # A ring, one dtype after another: send right, receive from the left.
    for dtype in DTYPES:
        got = torch.empty_like(sample(dtype, left))
        if rank % 2 == 0:
            dist.send(sample(dtype, rank), right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(sample(dtype, rank), right)
        out["ring"][dtype] = as_bytes(got)
    # Blocking sends and receives ran on this thread: no lane's was needed.
    import threading
    out["lanes"] = sorted(t.name for t in threading.enumerate() if t.name.startswith("gradlane-pg"))
    # An isend (on its lane) then a blocking send to the same peer and tag:
    # they arrive in that order.
    if rank == 0:
        pending = dist.isend(torch.full((50_000,), 7.0), 1, tag=9)
        dist.send(torch.full((2,), 8.0), 1, tag=9)
        pending.wait()
    elif rank == 1:
        first, second = torch.empty(50_000), torch.empty(2)
        dist.recv(first, 0, tag=9)
        dist.recv(second, 0, tag=9)
        out["in_order"] = (first[0].item(), second.tolist())
    # Tags: rank 0 sends tag 1 then tag 2 to rank 1, which receives 2 first.
    if rank == 0:
        dist.send(torch.full((3,), 1.0), 1, tag=1)
        dist.send(torch.full((3,), 2.0), 1, tag=2)
    elif rank == 1:
        a, b = torch.empty(3), torch.empty(3)
        dist.recv(b, 0, tag=2)
        dist.recv(a, 0, tag=1)
        out["tags"] = (a.tolist(), b.tolist())
    # From any rank: rank 2 receives from 0 and 1 in whatever order.
    if rank == 2:
        sources = []
        for _ in range(2):
            t = torch.empty(4)
            src = dist.recv(t)
            sources.append((src, t.tolist()))
        out["any"] = sorted(sources)
    else:
        dist.send(torch.full((4,), float(rank)), 2)
    # An irecv posted before a collective, the message sent after it.
    t = torch.empty(5)
    work = dist.irecv(t, left)
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    dist.isend(torch.arange(5.0) + rank, right).wait()
    work.wait()
    out["across"] = (total.item(), t.tolist())
    # A non-contiguous tensor each way.
    base = torch.arange(24.0).reshape(4, 6) + 100 * rank
    recv_into = torch.zeros(4, 6).t()
    if rank % 2 == 0:
        dist.send(base.t(), right)
        dist.recv(recv_into, left)
    else:
        dist.recv(recv_into, left)
        dist.send(base.t(), right)
    out["strided"] = recv_into.tolist()
    # batch_isend_irecv: to both neighbours and from both at once.
    from_left, from_right = torch.empty(1000), torch.empty(1000)
    ops = [
        dist.P2POp(dist.irecv, from_left, left),
        dist.P2POp(dist.irecv, from_right, right),
        dist.P2POp(dist.isend, torch.full((1000,), 10.0 * rank), right),
        dist.P2POp(dist.isend, torch.full((1000,), 10.0 * rank + 1), left),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch"] = (from_left[0].item(), from_right[0].item())
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def p2p(cert_dir):
    return run_ranks(scenario_p2p, cert_dir, world=3)


@pytest.fixture(scope="module")
def p2p_staged(cert_dir):
    # The CUDA code path (staging through host buffers), on CPU tensors.
    return run_ranks(
        scenario_p2p, cert_dir, world=3, extra_env={"GRADLANE_STAGE_CPU_TENSORS": "1"}
    )


@pytest.mark.parametrize("which", ["p2p", "p2p_staged"])
def test_point_to_point(which, request):
    got = request.getfixturevalue(which)
    world = 3
    for r in range(world):
        left = (r - 1) % world
        for dtype in DTYPES:
            want = as_bytes(sample(dtype, left))
            assert np.array_equal(got[r]["ring"][dtype], want), f"rank {r} {dtype}"
        total, across = got[r]["across"]
        assert total == 0.0 + 1.0 + 2.0
        assert across == (torch.arange(5.0) + left).tolist()
        want = (torch.arange(24.0).reshape(4, 6) + 100 * left).t().tolist()
        assert got[r]["strided"] == want, f"rank {r}"
        assert got[r]["batch"] == (10.0 * left, 10.0 * ((r + 1) % world) + 1)
    assert got[1]["tags"] == ([1.0] * 3, [2.0] * 3)
    assert got[1]["in_order"] == (7.0, [8.0, 8.0])
    if which == "p2p":
        # Unstaged, dist.send and dist.recv run on the caller's thread.
        assert all(got[r]["lanes"] == [] for r in range(world)), [g["lanes"] for g in got]
    assert got[2]["any"] == [(0, [0.0] * 4), (1, [1.0] * 4)]


def scenario_errors(rank):
    import torch.distributed as dist

    import gradlane

    dist.init_process_group("gradlane")
    errors = {}
    for name, call in {
        "to_self": lambda: dist.send(torch.zeros(2), rank),
        "too_small": None,
    }.items():
        if call is None:
            continue
        try:
            call()
            errors[name] = None
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors[name] = type(e).__name__
    # A message larger than the receiving tensor: a ValueError, both ranks
    # still in step.
    if rank == 0:
        dist.send(torch.zeros(8), 1)
    else:
        try:
            dist.recv(torch.zeros(4), 0)
            errors["size"] = None
        except ValueError as e:
            errors["size"] = str(e)
    dist.barrier()
    errors["group_error_base"] = issubclass(gradlane.GroupError, Exception)
    dist.destroy_process_group()
    return errors


def test_bad_point_to_point_calls_raise_clear_errors(cert_dir):
    got = run_ranks(scenario_errors, cert_dir, world=2)
    for r in range(2):
        assert got[r]["to_self"] in ("ValueError", "RuntimeError"), got[r]
    assert "sent 32 bytes" in got[1]["size"] and "holds 16" in got[1]["size"], got[1]


def gpipe_grads(group, rank):
    """Two stages of a small MLP, one per rank, four micro-batches of
    GPipe over `group`; this rank's stage's gradients after one step."""
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(0)
    full = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    stage_mod = full[:2] if rank == 0 else full[2:]
    stage = PipelineStage(stage_mod, rank, 2, torch.device("cpu"), group=group)
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    if rank == 0:
        schedule.step(x)
    else:
        losses = []
        schedule.step(target=y, losses=losses)
    return [p.grad.detach().numpy().copy() for p in stage_mod.parameters()]


def scenario_gpipe(rank):
    import torch.distributed as dist

    import gradlane.torch  # noqa: F401 - registers it where torch lacks the entry points

    dist.init_process_group("gloo")
    over_gloo = gpipe_grads(None, rank)
    gradlane_group = dist.new_group([0, 1], backend="gradlane")
    over_gradlane = gpipe_grads(gradlane_group, rank)
    dist.destroy_process_group()
    return {"gloo": over_gloo, "gradlane": over_gradlane}


def test_gpipe_over_gradlane_equals_gpipe_over_gloo(cert_dir):
    got = run_ranks(scenario_gpipe, cert_dir, world=2)
    for r in range(2):
        # Rank 0's stage holds one linear layer, rank 1's two.
        assert len(got[r]["gradlane"]) == 2 * (r + 1)
        for a, b in zip(got[r]["gradlane"], got[r]["gloo"], strict=True):
            assert np.array_equal(bits(a), bits(b)), f"rank {r}"
