"""train_tta.py's DDP communication hooks: gradlane's (the differentiated
hook, its PowerSGD and the sparse hook) and torch's own (fp16, bf16,
PowerSGD, local SGD) as a user turns them on, and the hook's bytes a step
for the CSV."""

from __future__ import annotations

import argparse

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def register_hook(model: DDP, args: argparse.Namespace):
    """The run's DDP communication hook, from --transport and --comm-hook:
    gradlane's (``ddp_hook``, ``powersgd_hook``, ``sparse_hook``) or one of
    torch's. Returns gradlane's HookState and PowerSGDHookState where they
    are used (None otherwise), for the run's statistics."""
    state = None
    compressed = None
    if args.transport == "hook":
        import gradlane.torch as gl

        state = gl.HookState(settings=args.settings)
        if args.comm_hook == "powersgd":
            compressed = gl.PowerSGDHookState(powersgd_state(args), state)
            model.register_comm_hook(compressed, gl.powersgd_hook)
        elif args.comm_hook == "sparse":
            sparse = gl.SparseHookState(args.sparse_density, transport="differentiated", hook=state)
            model.register_comm_hook(sparse, gl.sparse_hook)
        else:
            model.register_comm_hook(state, gl.ddp_hook)
    elif args.comm_hook == "sparse":
        import gradlane.torch as gl

        model.register_comm_hook(gl.SparseHookState(args.sparse_density), gl.sparse_hook)
    elif args.comm_hook != "none":
        register_torch_hook(model, args)
    return state, compressed


def hook_bytes(state) -> tuple[str, str]:
    """Rank 0's payload bytes of the last step through gradlane's hook
    (both halves of every allreduce), and how many of them were lossy;
    empty without the hook."""
    stats = getattr(state, "last_stats", None)
    if not stats:
        return "", ""
    lossy = stats.get("sent_lossy_bytes", 0) + stats.get("return_lossy_bytes", 0)
    total = (stats.get("sent_important_bytes", 0) + stats.get("sent_lossy_bytes", 0)
             + stats.get("return_bytes", 0))
    return str(lossy), str(total)


def register_torch_hook(model: DDP, args: argparse.Namespace) -> None:
    """One of torch's own DDP communication hooks, as a user would turn it on."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    if args.comm_hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.comm_hook == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif args.comm_hook == "localsgd":
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as local

        # A subgroup of one: no allreduce at all once local SGD starts.
        mine, _ = dist.new_subgroups(group_size=1)
        state = local.PostLocalSGDState(
            process_group=None, subgroup=mine, start_localSGD_iter=args.powersgd_start
        )
        model.register_comm_hook(state, local.post_localSGD_hook)
    elif args.comm_hook == "powersgd":
        model.register_comm_hook(powersgd_state(args), powersgd.powerSGD_hook)
    else:
        hook = default_hooks.fp16_compress_wrapper(powersgd.powerSGD_hook)
        model.register_comm_hook(powersgd_state(args), hook)


def local_sgd_averager(args: argparse.Namespace):
    """torch's local SGD, as its docs set it up: ``post_localSGD_hook``
    (plain allreduce for the first --powersgd-start steps, then none) with
    a ``PeriodicModelAverager`` that averages the parameters every
    --localsgd-period steps after that. Each rank is its own local group
    (one process a host). None for other hooks."""
    if args.comm_hook != "localsgd":
        return None
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

    return PeriodicModelAverager(period=args.localsgd_period, warmup_steps=args.powersgd_start)


def powersgd_state(args: argparse.Namespace):
    """torch's PowerSGDState from the command line's settings."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    return powersgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=args.powersgd_rank,
        start_powerSGD_iter=args.powersgd_start,
        random_seed=args.seed,
    )
