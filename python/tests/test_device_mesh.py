"""gradlane as one dimension of a 2-D DeviceMesh: FSDP2's HSDP, the
parameters sharded over gloo within a replica and the replicas'
gradients reduced over gradlane, as a job spread over sites would run it
(the fast links inside a site, gradlane between sites).

Four ranks in a 2 x 2 mesh train the same model from the same weights on
the same batches twice in one process: once on a mesh all gloo, once on a
mesh whose "replicate" dimension is gradlane (`backend_override`). Both
must end with the same bits on every rank.
"""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (scripts/test.sh installs it into the venv)"
)

from test_torch import bits, run_ranks  # noqa: E402

RANKS = 4
STEPS = 3


def hsdp_steps(mesh, rank):
    """Three steps of FSDP2 over `mesh`; the full parameters after."""
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step * 10 + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.full_tensor().detach().numpy().copy() for p in model.parameters()]


def scenario_hsdp(rank):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import gradlane.torch  # noqa: F401 - registers it where torch lacks the entry points

    dist.init_process_group("gloo")
    names = ("replicate", "shard")
    gloo_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    mixed_mesh = init_device_mesh(
        "cpu", (2, 2), mesh_dim_names=names, backend_override={"replicate": "gradlane"}
    )
    out = {
        "gloo": hsdp_steps(gloo_mesh, rank),
        "mixed": hsdp_steps(mixed_mesh, rank),
        "replicate_backend": dist.get_backend(mixed_mesh.get_group("replicate")),
        "shard_backend": dist.get_backend(mixed_mesh.get_group("shard")),
        "replicate_ranks": dist.get_process_group_ranks(mixed_mesh.get_group("replicate")),
    }
    dist.destroy_process_group()
    return out


def test_hsdp_with_replicas_over_gradlane_equals_all_gloo(cert_dir):
    got = run_ranks(scenario_hsdp, cert_dir, world=RANKS)
    for r in range(RANKS):
        assert got[r]["replicate_backend"] == "gradlane"
        assert got[r]["shard_backend"] == "gloo"
        # Rank r's replica peer is the rank in the other row of the mesh.
        assert sorted(got[r]["replicate_ranks"]) == sorted({r % 2, r % 2 + 2})
        for mixed, gloo in zip(got[r]["mixed"], got[r]["gloo"], strict=True):
            assert np.array_equal(bits(mixed), bits(gloo)), f"rank {r}"
        for mine, rank0 in zip(got[r]["mixed"], got[0]["mixed"], strict=True):
            assert np.array_equal(bits(mine), bits(rank0)), f"rank {r} against rank 0"
