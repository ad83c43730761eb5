"""gradlane for PyTorch: a torch.distributed backend and a DDP
communication hook.

The backend: with gradlane installed, ``dist.init_process_group("gradlane")``
finds it through the entry point group ``torch.distributed.backends`` on
torch releases that load it (2.15 does, 2.11 does not); importing this
module registers it on any release. Its collectives run on a
:class:`gradlane.Group` over QUIC: allreduce, broadcast,
allgather, allgather_into_tensor, reduce_scatter, reduce_scatter_tensor,
barrier, on CPU and CUDA tensors (CUDA ones staged through pinned host
buffers); the reductions (SUM, AVG, MAX, MIN) on float32,
bfloat16 and float16, so torch's fp16/bf16 compression hooks and
PowerSGD run over it. Set GRADLANE_CERT_DIR to the certificates
(:func:`gradlane.generate_certs`); torchrun's MASTER_ADDR, RANK,
WORLD_SIZE as usual.

The hook: ``model.register_comm_hook(HookState(loss_tolerance=0.2),
ddp_hook)`` sends each gradient bucket through gradlane's differentiated
allreduce (the important chunks exact, the rest lossy), with any process
group (gradlane or gloo). :func:`powersgd_hook` runs PowerSGD through
it: the warm-up steps' full gradients, then every step's low-rank
factors. :func:`sparse_hook` sends each gradient's largest entries,
log-quantized by gradlane's codec, and keeps the rest for later steps.

Elastic training: with GRADLANE_ON_RANK_FAILURE=continue the ranks left
after a death train on; :mod:`gradlane.torch.elastic` admits a restarted
rank (GRADLANE_REJOIN=1) and hands it the members' state.
"""

from gradlane.torch._backend import (
    BACKEND_NAME,
    GradlaneProcessGroup,
    _register,
    create_process_group,
)
from gradlane.torch._work import GradlaneWork
from gradlane.torch._hook import HookState, ddp_hook
from gradlane.torch._powersgd import PowerSGDHookState, powersgd_hook
from gradlane.torch._sparse_hook import SparseHookState, sparse_hook
from gradlane.torch import elastic

# Importing registers the backend, for torch releases that do not load
# the entry point (registering twice is a no-op).
_register()

__all__ = [
    "BACKEND_NAME",
    "GradlaneProcessGroup",
    "GradlaneWork",
    "HookState",
    "PowerSGDHookState",
    "SparseHookState",
    "create_process_group",
    "ddp_hook",
    "elastic",
    "powersgd_hook",
    "sparse_hook",
]
