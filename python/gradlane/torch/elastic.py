"""Training on when ranks die, and bringing a restarted rank back, over the
gradlane backend with ``GRADLANE_ON_RANK_FAILURE=continue``.

When a rank dies, the others agree on who is left and go on from the
collective they were in (docs/DESIGN.md, "Elastic membership"): DDP trains
on without a word from you. A restarted rank (``GRADLANE_REJOIN=1``, the
same RANK, WORLD_SIZE and MASTER_ADDR/PORT) joins where the members admit
it, and takes their state before it trains:

    # every member, at the end of every step
    elastic.admit(ddp, optimizer, extra={"step": step})

    # the restarted rank, instead of DDP's first broadcast
    dist.init_process_group("gradlane")          # waits to be admitted
    ddp = DDP(model, init_sync=False)
    extra = elastic.catch_up(ddp, optimizer)      # the members' state
    step = extra["step"] + 1

``admit`` costs nothing on the network while nobody waits. Register the
DDP's comm hook before ``catch_up``: a PowerSGD hook's step count and
warm-started bases are handed over too. When a rank is
admitted, the lowest member that was already in the group sends the
model's and the optimizer's state (and ``extra``) to every rank: one
broadcast of their bytes. Where ``model`` is a DDP, every rank's reducer
then takes rank 0's buckets at once (as DDP's own Join does), so that the
new rank's first step sums the same values as the members'.
"""

from __future__ import annotations

import io

import torch
import torch.distributed as dist

from gradlane.torch._backend import gradlane_group_of


def _group(group=None):
    g = gradlane_group_of(group)
    if g is None:
        raise RuntimeError(
            "gradlane.torch.elastic needs the gradlane backend: "
            'dist.init_process_group("gradlane") with GRADLANE_ON_RANK_FAILURE=continue'
        )
    return g


def admit(model, optimizer=None, extra=None, group=None) -> list[int]:
    """On every member at the end of every step: admits the ranks waiting
    to rejoin and hands them the state of ``model`` (a module or a DDP),
    ``optimizer`` and ``extra`` (anything picklable: the step, the
    scheduler's state). Returns the ranks admitted (empty where none
    waited: nothing was sent)."""
    g = _group(group)
    joined = list(g.admit())
    if joined:
        _hand_state(g, joined, model, optimizer, extra)
    return joined


def catch_up(model, optimizer=None, group=None):
    """On a rank that rejoined (``GRADLANE_REJOIN=1``), right after
    ``init_process_group``: loads the members' state into ``model`` and
    ``optimizer``, and returns their ``extra``."""
    g = _group(group)
    joined = list(g.joined)
    if g.rank not in joined:
        raise RuntimeError(
            f"gradlane: rank {g.rank} did not rejoin (GRADLANE_REJOIN=1 starts a rank that does)"
        )
    return _hand_state(g, joined, model, optimizer, None)


def _same_buckets(ddp):
    """Gives every rank's DDP the same buckets, now: a new rank's reducer
    would use its initial buckets for its first step (the members' were
    rebuilt in the order their gradients came) and rebuild them after it
    with broadcasts the members would not match. Every rank rebuilds from
    all its parameters at once, taking rank 0's buckets, as DDP's own
    Join does for a rank that ran out of data."""
    ddp._update_process_group(ddp.process_group)
    ddp.reducer._push_all_rebuilt_params()
    ddp.reducer._rebuild_buckets()
    ddp._has_rebuilt_buckets = True


#: What a new rank takes of a PowerSGDState: what must be the same on
#: every rank (the step count, which picks between the full allreduce and
#: the compressed one; the warm-started Q of each bucket, and the
#: generator that draws new ones) and the compression counts. Not its
#: error_dict: each rank's error feedback is its own compression error,
#: and a new rank has made none (likewise gradlane's hook keeps each
#: rank's own lost chunks, which died with the rank it replaces).
_POWERSGD_SHARED = (
    "iter",
    "rng",
    "q_memory_dict",
    "total_numel_before_compression",
    "total_numel_after_compression",
    "next_stats_report",
)


def _powersgd_states(model):
    """The PowerSGDStates of ``model``'s comm hooks (a DDP's, torch's
    powerSGD_hook or gradlane's powersgd_hook), in registration order."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    states = []
    for _hook, state in getattr(model, "_comm_hooks", []):
        state = getattr(state, "powersgd", state)
        if isinstance(state, PowerSGDState):
            states.append(state)
    return states


def _hand_state(g, joined, model, optimizer, extra):
    """The broadcast of the state from the lowest member not among
    ``joined``, loaded where it is new; returns the sender's ``extra``."""
    donor = min(m for m in g.members if m not in joined)
    if g.rank == donor:
        buf = io.BytesIO()
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": None if optimizer is None else optimizer.state_dict(),
                "extra": extra,
                "powersgd": [
                    {k: getattr(s, k) for k in _POWERSGD_SHARED} for s in _powersgd_states(model)
                ],
            },
            buf,
        )
        box = [buf.getvalue()]
    else:
        box = [None]
    dist.broadcast_object_list(box, src=donor)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        _same_buckets(model)
    if g.rank in joined:
        state = torch.load(io.BytesIO(box[0]), weights_only=False)
        model.load_state_dict(state["model"])
        if optimizer is not None and state["optimizer"] is not None:
            optimizer.load_state_dict(state["optimizer"])
        mine = _powersgd_states(model)
        if len(mine) != len(state["powersgd"]):
            raise RuntimeError(
                f"gradlane: the members' DDP has {len(state['powersgd'])} PowerSGD hook "
                f"states, this rank's {len(mine)}: register the same comm hook before "
                "catch_up"
            )
        device = next(model.parameters()).device
        for s, shared in zip(mine, state["powersgd"], strict=True):
            for k, v in shared.items():
                if k == "q_memory_dict":
                    # On this rank's device, not the donor's.
                    v = {bucket: q.to(device) for bucket, q in v.items()}
                setattr(s, k, v)
        return state["extra"]
    return extra
