"""The gradlane backend and hook on CUDA tensors: staged through pinned
host buffers (gradlane.torch._staging). Collected everywhere, run where
``torch.cuda.is_available()``, skipped elsewhere (this project's CI has
no GPU; docs/RESULTS.md says where these ran).

Two ranks share the machine's GPUs (rank r on cuda:r mod the count).
Each checks what staging must get right: the side stream waits for the
values the caller's stream computes; the caller's stream waits for the
copies back; CUDA gives the bits the CPU path gives; DDP (with and
without the hook, with overlap), PowerSGD after the hook's warm-up and
FSDP2 train as on CPU, every rank ending with the same bits."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

from test_torch import (  # noqa: E402 - the rank machinery of the CPU tests
    LR,
    STEPS,
    WORLD,
    batch,
    bits,
    fsdp_reference,
    reference_run,
    run_ranks,
    scenario_powersgd_warmup,
    small_cnn,
    wide_cnn,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device (these run on a GPU machine)"
)

#: Cycles of torch.cuda._sleep: long enough (tens of ms) that a copy not
#: ordered after it would read the values before they are written.
SLEEP_CYCLES = 100_000_000


def register_backend():
    """Registers "gradlane" by importing gradlane.torch, as a script must
    on torch releases that do not load the ``torch.distributed.backends``
    entry points (2.11 does not)."""
    import gradlane.torch  # noqa: F401


def cuda_device(rank):
    return torch.device("cuda", rank % torch.cuda.device_count())


def cpu(t):
    return t.detach().float().cpu().numpy().copy()


# ------------------------------------------------------------------ ranks


def scenario_collectives(rank):
    """Each collective on CUDA tensors and on the same CPU tensors: both
    results; the stream order around a staged collective; the Work."""
    import torch.distributed as dist

    dev = cuda_device(rank)
    torch.cuda.set_device(dev)
    register_backend()
    dist.init_process_group("gradlane")
    out = {}

    # The values are written by a kernel queued behind a long sleep: the
    # staging copy must wait for it. The doubling right after the call,
    # on the caller's stream, must wait for the copy back.
    t = torch.zeros(1 << 20, device=dev)
    torch.cuda._sleep(SLEEP_CYCLES)
    t.fill_(rank + 1)
    dist.all_reduce(t)
    t.mul_(2)
    out["ordered"] = cpu(t)[[0, -1]]

    # async_op: the Work's wait() and its future.
    t = torch.full((1000,), float(rank + 1), device=dev)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    out["async"] = cpu(t)[[0, -1]]
    (value,) = work.get_future().wait()
    out["future_is_the_tensor"] = value.data_ptr() == t.data_ptr()
    torch.cuda.synchronize()
    out["completed"] = work.is_completed()

    def both(name, make, run):
        """run(tensors) on CUDA copies and on CPU copies of make()."""
        for where in ("cuda", "cpu"):
            tensors = [x.to(dev) if where == "cuda" else x for x in make()]
            run(*tensors)
            out[f"{name}/{where}"] = [cpu(x) for x in tensors]

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        base = torch.arange(1, 1001, dtype=torch.float32) * 0.37 * (rank + 1)
        both(f"all_reduce/{dtype}", lambda b=base, d=dtype: [b.to(d)], dist.all_reduce)
        both(
            f"all_reduce_avg/{dtype}",
            lambda b=base, d=dtype: [b.to(d)],
            lambda x: dist.all_reduce(x, op=dist.ReduceOp.AVG),
        )
        both(
            f"reduce_scatter/{dtype}",
            lambda b=base, d=dtype: [torch.empty(500, dtype=d), b.to(d)],
            lambda o, i: dist.reduce_scatter_tensor(o, i),
        )
    both("max", lambda: [torch.tensor([1.0, -2.0, rank])], lambda x: dist.all_reduce(x, op=dist.ReduceOp.MAX))
    both(
        "broadcast_int64",
        lambda: [torch.arange(5) * (rank + 1)],
        lambda x: dist.broadcast(x, src=1),
    )
    both(
        "all_gather_into_tensor",
        lambda: [torch.empty(6), torch.full((3,), rank + 0.5)],
        dist.all_gather_into_tensor,
    )
    both(
        "all_gather",
        lambda: [torch.empty(3), torch.empty(3), torch.full((3,), float(rank))],
        lambda a, b, x: dist.all_gather([a, b], x),
    )
    pool = dist.distributed_c10d._get_default_group()._stager.buffers(pinned=True)
    out["pinned"] = (pool.allocated, pool.reused)
    dist.barrier()
    dist.destroy_process_group()
    return out


def scenario_ddp(rank, hook, overlap, model_name):
    """DDP on CUDA over the gradlane backend: with ``hook``, a model with
    gradlane's hook next to one with the backend's allreduce, on the same
    batches; every step's parameters (on the host)."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradlane.torch as gl

    dev = cuda_device(rank)
    torch.cuda.set_device(dev)
    register_backend()
    dist.init_process_group("gradlane")
    make = small_cnn if model_name == "small" else wide_cnn
    # Different weights per rank: DDP's broadcast must make them rank 0's.
    plain = make(seed=100 + rank).to(dev)
    models = {"plain": (plain, DDP(plain, device_ids=[dev.index]))}
    state = None
    if hook:
        hooked = make(seed=100 + rank).to(dev)
        ddp = DDP(hooked, device_ids=[dev.index])
        state = gl.HookState(overlap=overlap)
        ddp.register_comm_hook(state, gl.ddp_hook)
        models["hooked"] = (hooked, ddp)
    opts = {k: torch.optim.SGD(d.parameters(), lr=LR) for k, (_, d) in models.items()}
    out = {k: [] for k in models}
    for step in range(STEPS):
        x, y = batch(step, rank)
        for k, (model, ddp) in models.items():
            opts[k].zero_grad()
            F.cross_entropy(ddp(x.to(dev)), y.to(dev)).backward()
            opts[k].step()
            out[k].append([cpu(p) for p in model.parameters()])
    if state is not None:
        out["steps"] = state.steps
        out["pinned"] = state._stager.buffers(pinned=True).allocated
        state.close()
    dist.destroy_process_group()
    return out


# ------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def collectives(cert_dir):
    return run_ranks(scenario_collectives, cert_dir)


def test_staging_keeps_the_callers_stream_order(collectives):
    for r in range(WORLD):
        # (1 + 2) doubled: read after the fill, written back before the mul.
        np.testing.assert_array_equal(collectives[r]["ordered"], [6.0, 6.0])
        np.testing.assert_array_equal(collectives[r]["async"], [3.0, 3.0])
        assert collectives[r]["future_is_the_tensor"]
        assert collectives[r]["completed"]


def test_cuda_collectives_give_the_cpu_paths_bits(collectives):
    for r in range(WORLD):
        o = collectives[r]
        names = {k.rsplit("/", 1)[0] for k in o if k.endswith("/cuda")}
        assert len(names) == 13, names
        for name in names:
            for got, want in zip(o[f"{name}/cuda"], o[f"{name}/cpu"], strict=True):
                assert np.array_equal(bits(got), bits(want)), f"rank {r}: {name}"
        # Pinned buffers were taken once and reused by later collectives.
        allocated, reused = o["pinned"]
        assert allocated > 0 and reused > 0, o["pinned"]


def test_ddp_on_cuda_trains_like_the_reference(cert_dir):
    got = run_ranks(scenario_ddp, cert_dir, False, False, "small")
    _, _, params = reference_run()
    for r in range(WORLD):
        for step in range(STEPS):
            for a, want in zip(got[r]["plain"][step], params[step], strict=True):
                np.testing.assert_allclose(a, want, rtol=0, atol=1e-5, err_msg=f"rank {r}")
            for a, b in zip(got[r]["plain"][step], got[0]["plain"][step], strict=True):
                assert np.array_equal(bits(a), bits(b)), f"step {step}: rank {r} vs 0"


@pytest.mark.parametrize("overlap", [False, True])
def test_hook_on_cuda_equals_the_exact_allreduce(cert_dir, overlap):
    got = run_ranks(scenario_ddp, cert_dir, True, overlap, "wide")
    for r in range(WORLD):
        assert got[r]["steps"] == STEPS and got[r]["pinned"] > 0
        for step in range(STEPS):
            for a, b in zip(got[r]["hooked"][step], got[r]["plain"][step], strict=True):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=f"rank {r}")
            for a, b in zip(got[r]["hooked"][step], got[0]["hooked"][step], strict=True):
                assert np.array_equal(bits(a), bits(b)), f"step {step}: rank {r} vs 0"


def test_fsdp2_on_cuda_trains_like_the_reference(cert_dir):
    # bfloat16 compute and reduction, as large models train.
    got = run_ranks("fsdp", cert_dir, True, "cuda")
    want = fsdp_reference()
    for r in range(WORLD):
        for a, w in zip(got[r]["params"], want, strict=True):
            np.testing.assert_allclose(a, w, rtol=0, atol=1e-2, err_msg=f"rank {r}")
        for a, b in zip(got[r]["params"], got[0]["params"], strict=True):
            assert np.array_equal(bits(a), bits(b)), f"rank {r} vs 0"


def test_powersgd_through_the_hook_on_cuda_trains_as_torchs(cert_dir):
    steps, start = 5, 3
    got = run_ranks(scenario_powersgd_warmup, cert_dir, "gradlane", steps, start, "cuda")
    for r in range(WORLD):
        o = got[r]
        assert o["warmup_steps"][-1] == start and o["iter"] == o["reference_iter"]
        assert o["compressed_steps"][-1] == steps - start
        for step in range(steps):
            for a, b in zip(o["ours"][step], o["theirs"][step], strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"rank {r} step {step}")
        for a, b in zip(o["ours"][-1], got[0]["ours"][-1], strict=True):
            assert np.array_equal(bits(a), bits(b)), f"rank {r} vs 0"
