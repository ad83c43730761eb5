"""PowerSGD with its warm-up through gradlane's hook.

torch's ``powerSGD_hook`` sends the full gradient with a plain allreduce
for its first ``start_powerSGD_iter`` steps (so that the model leaves the
early phase, where low-rank compression hurts, before it starts). On a
slow link those steps cost most of a short run: each moves all the bytes
that PowerSGD later saves. :func:`powersgd_hook` sends them through
:func:`gradlane.torch.ddp_hook` instead (bf16 important chunks, log8
lossy ones, whatever its :class:`HookState` says), then hands every later
step to torch's ``powerSGD_hook`` unchanged.
"""

import torch

from gradlane.torch._hook import HookState, ddp_hook


class PowerSGDWarmup:
    """The state of :func:`powersgd_hook`: torch's ``PowerSGDState`` and
    the :class:`HookState` that carries its warm-up steps.

    Which to tune: ``powersgd``'s ``start_powerSGD_iter`` (how many steps
    go through gradlane's hook) and ``matrix_approximation_rank``, as
    torch's docs say; ``warmup``'s formats and loss tolerance as for
    :func:`ddp_hook`. The rest of both states, leave.

    ``warmup_steps`` counts the steps that went through gradlane's hook.
    """

    def __init__(self, powersgd, warmup: HookState):
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        if not isinstance(powersgd, PowerSGDState):
            raise TypeError(
                f"powersgd must be torch's PowerSGDState, not {type(powersgd).__name__}"
            )
        if not isinstance(warmup, HookState):
            raise TypeError(f"warmup must be a gradlane HookState, not {type(warmup).__name__}")
        self.powersgd = powersgd
        self.warmup = warmup

    @property
    def warmup_steps(self) -> int:
        """Steps whose gradients went through gradlane's hook."""
        return self.warmup.steps


def powersgd_hook(state: PowerSGDWarmup, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: PowerSGD, its warm-up steps through
    gradlane's hook.

    Register with ``ddp.register_comm_hook(PowerSGDWarmup(PowerSGDState(
    process_group=None, start_powerSGD_iter=10), HookState(important_format="bf16",
    lossy_format="log8")), powersgd_hook)``. While
    ``state.powersgd.iter`` is under its ``start_powerSGD_iter``, a
    bucket goes through :func:`ddp_hook` with ``state.warmup`` (and the
    step is counted as PowerSGD counts it); from then on through torch's
    ``powerSGD_hook``, whose allreduces run on the process group.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

    ps = state.powersgd
    if ps.iter < ps.start_powerSGD_iter:
        # What powerSGD_hook does itself before its start, but with
        # gradlane's hook in place of the plain allreduce.
        ps.maybe_increase_iter(bucket)
        return ddp_hook(state.warmup, bucket)
    return torch_powersgd.powerSGD_hook(ps, bucket)
