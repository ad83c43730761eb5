"""gradlane's powersgd_hook under loss: every compressed step's factors go
through the differentiated allreduce, their least important chunks lossy,
and the replicas stay bit-identical (every rank decompresses the same
factors) while PowerSGD's error feedback absorbs what was dropped.

The exact case (the hook against torch's powerSGD_hook, step by step) is
test_torch.py's."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

from test_torch import bits, run_ranks, train_steps, wide_cnn  # noqa: E402

LOSS = 0.3
STEPS = 50
START = 3
RANKS = 3


def scenario_lossy_powersgd(rank, steps, start, loss):
    """DDP with powersgd_hook at `loss` injected on every rank's packets:
    each step's parameters, and the hook's statistics."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradlane.torch as gl

    dist.init_process_group("gloo")
    model = wide_cnn(seed=7)
    ddp = DDP(model)
    hook = gl.HookState(
        loss_tolerance=0.4,
        injected_loss=loss,
        seed=100 + rank,
        lossy_carrier="datagrams",
        important_format="bf16",
        lossy_format="log8",
    )
    state = gl.PowerSGDHookState(
        psgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                           start_powerSGD_iter=start),
        hook,
    )
    ddp.register_comm_hook(state, gl.powersgd_hook)
    out = train_steps(ddp, model, steps, lambda: hook.last_stats, batches=5)
    out["compressed_steps"] = state.compressed_steps
    out["totals"] = dict(hook.totals)
    state.close()
    dist.destroy_process_group()
    return out


def test_lossy_powersgd_keeps_replicas_bit_identical(cert_dir):
    got = run_ranks(scenario_lossy_powersgd, cert_dir, STEPS, START, LOSS, world=RANKS)
    for r in range(RANKS):
        assert got[r]["compressed_steps"] == STEPS - START
        for step in range(STEPS):
            for a, b in zip(got[r]["params"][step], got[0]["params"][step], strict=True):
                assert np.array_equal(bits(a), bits(b)), f"step {step}: rank {r} vs 0"
        assert all(np.isfinite(p).all() for p in got[r]["params"][-1])
    # The factors' lossy chunks travelled as datagrams, and some were lost
    # and zero-filled, at every rank's shard or another's.
    compressed = [s for o in got.values() for s in o["stats"][START:]]
    assert sum(s["sent_lossy_bytes"] for s in compressed) > 0
    assert sum(s["zero_filled_lossy_bytes"] for s in compressed) > 0
    # It trains through the loss: the repeated batches' loss falls.
    losses = got[0]["loss"]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]), losses
