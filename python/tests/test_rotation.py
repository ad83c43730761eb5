"""The hook's Hadamard rotation: an orthonormal rotation that its inverse
undoes, that spreads a lost chunk over its block, and through which DDP
under loss keeps every rank's bits and trains."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

from test_torch import bits, run_ranks, train_steps, wide_cnn  # noqa: E402


def test_the_rotation_is_orthonormal_and_spreads_a_lost_chunk():
    from gradlane.torch._hook import HADAMARD_BLOCK, hadamard_

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3 * HADAMARD_BLOCK + 77, generator=g)
    signs = torch.randint(0, 2, (x.numel(),), generator=g).float().mul_(2).sub_(1)
    rotated = x.clone()
    hadamard_(rotated, signs, inverse=False)
    np.testing.assert_allclose(rotated.norm().item(), x.norm().item(), rtol=1e-5)
    # The tail past the last whole block is left alone.
    assert torch.equal(rotated[3 * HADAMARD_BLOCK :], x[3 * HADAMARD_BLOCK :])
    back = rotated.clone()
    hadamard_(back, signs, inverse=True)
    np.testing.assert_allclose(back.numpy(), x.numpy(), atol=1e-5)
    # A chunk of 256 rotated values lost: the error lands on all 4096
    # values of its block, each far smaller than a hole would be.
    lost = rotated.clone()
    lost[256:512] = 0
    hadamard_(lost, signs, inverse=True)
    error = (lost - x).abs()
    assert int((error[:HADAMARD_BLOCK] > 0).sum()) == HADAMARD_BLOCK
    assert float(error[HADAMARD_BLOCK:].max()) < 1e-5
    assert float(error.max()) < 0.5 * float(x[:HADAMARD_BLOCK].abs().max())


def test_rotation_is_a_checked_setting():
    import gradlane.torch as gl

    with pytest.raises(ValueError, match="rotation"):
        gl.HookState(rotation="fourier")


def scenario_rotated(rank, steps, loss):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradlane.torch as gl

    dist.init_process_group("gloo")
    model = wide_cnn(seed=7)
    ddp = DDP(model)
    state = gl.HookState(
        loss_tolerance=0.3, injected_loss=loss, seed=500 + rank, lossy_carrier="datagrams",
        recovery="error_feedback", rotation="hadamard",
    )
    ddp.register_comm_hook(state, gl.ddp_hook)
    out = train_steps(ddp, model, steps, lambda: state.last_stats, batches=4)
    state.close()
    dist.destroy_process_group()
    return out


def test_a_rotated_hook_under_loss_keeps_replicas_equal_and_trains(cert_dir):
    steps, ranks = 12, 3
    got = run_ranks(scenario_rotated, cert_dir, steps, 0.2, world=ranks)
    for r in range(ranks):
        for step in range(steps):
            for a, b in zip(got[r]["params"][step], got[0]["params"][step], strict=True):
                assert np.array_equal(bits(a), bits(b)), f"step {step}: rank {r} vs 0"
    stats = [s for o in got.values() for s in o["stats"]]
    assert sum(s["lost_values"] for s in stats) > 0
    losses = got[0]["loss"]
    assert np.mean(losses[-4:]) < np.mean(losses[:4]), losses
