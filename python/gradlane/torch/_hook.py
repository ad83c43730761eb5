"""A DDP communication hook over gradlane's differentiated allreduce."""


import os
import time

import torch
import torch.distributed as dist

import gradlane
from gradlane.torch._backend import cert_dir_from_env, gradlane_group_of, rank_listen_from_env

RECOVERIES = ("zero_fill", "rescale", "error_feedback")


class HookState:
    """The state of :func:`ddp_hook`: its gradlane Group, the layout of
    every bucket, and the statistics of the steps so far.

    Settings to tune:

    - ``loss_tolerance`` (default 0.2): the share of each gradient's chunks,
      the least important by magnitude, that travel lossy (no
      retransmission). 0 sends everything exactly; higher saves more time on
      a lossy network and loses more of the small gradient values. 0.1-0.3
      is where to look.
    - ``recovery``: what becomes of a lossy chunk that did not arrive.
      ``"zero_fill"`` (default) leaves it zero; ``"rescale"`` scales what
      arrived so that the expected sum is unbiased; ``"error_feedback"``
      keeps what was lost on the sender and adds it to the next step's
      gradient (best when loss is sustained, costs a bucket-sized buffer).

    Settings to leave alone:

    - ``group``: by default the hook uses the gradlane Group of the
      default process group when it is "gradlane" and its settings match,
      and otherwise joins its own Group: rank 0 listens on MASTER_ADDR at
      GRADLANE_PORT (default MASTER_PORT + 1), the ranks and world from
      the default process group (or RANK and WORLD_SIZE), certificates
      from GRADLANE_CERT_DIR. Pass a :class:`gradlane.Group` only to share
      one you made.
    - ``injected_loss`` and ``seed``: drop that share of this rank's
      outgoing packets, seeded; for tests and demos only. Non-zero values
      make the hook join its own Group.
    - ``dscp``: mark the hook's packets by class (important DSCP 56, the
      lossy levels below), for a network whose queues serve the important
      class first (Linux). True makes the hook join its own Group.

    Statistics: ``last_stats`` holds the sum over the buckets of the last
    complete step of what ``allreduce_differentiated`` reported (bytes sent
    exact and lossy, lossy bytes zero-filled, ranges lost and missing,
    late chunks); ``totals`` the same summed over all ``steps`` steps.
    Two of the keys are times in nanoseconds: ``hook_ns``, the time spent
    inside the hook, and ``network_ns``, the part of it spent in the Rust
    allreduce; the difference is what the Python side costs.
    """

    def __init__(
        self,
        loss_tolerance: float = 0.2,
        recovery: str = "zero_fill",
        group: gradlane.Group | None = None,
        *,
        injected_loss: float = 0.0,
        seed: int = 0,
        dscp: bool = False,
    ):
        if not 0.0 <= float(loss_tolerance) <= 1.0:
            raise ValueError(f"gradlane: loss_tolerance {loss_tolerance} is not in [0, 1]")
        if recovery not in RECOVERIES:
            raise ValueError(
                f"gradlane: unknown recovery {recovery!r}; one of {', '.join(RECOVERIES)}"
            )
        if not 0.0 <= float(injected_loss) < 1.0:
            raise ValueError(f"gradlane: injected_loss {injected_loss} is not in [0, 1)")
        if group is not None and (injected_loss or dscp):
            raise ValueError(
                "gradlane: injected_loss and dscp are settings of the Group the hook "
                "joins itself; a Group passed in keeps its own (make it with them)"
            )
        self.loss_tolerance = float(loss_tolerance)
        self.recovery = recovery
        self.injected_loss = float(injected_loss)
        self.seed = int(seed)
        self.dscp = bool(dscp)
        self.group = group
        self._own_group = False
        # (bucket index, shapes) -> gradlane bucket id. DDP rebuilds its
        # buckets after the first step, so the shapes are part of the key.
        self._buckets: dict[tuple, int] = {}
        self._step: dict[str, int] = {}
        self.last_stats: dict[str, int] = {}
        self.totals: dict[str, int] = {}
        self.steps = 0

    # ------------------------------------------------------------ group
    def _join(self) -> gradlane.Group:
        if self.group is not None:
            return self.group
        if self.injected_loss == 0.0 and self.loss_tolerance == 0.2 and not self.dscp:
            # The backend's Group was made with the default settings.
            g = gradlane_group_of(None)
            if g is not None:
                self.group = g
                return g
        if dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        if "GRADLANE_PORT" in os.environ:
            port = int(os.environ["GRADLANE_PORT"])
        elif "MASTER_PORT" in os.environ:
            port = int(os.environ["MASTER_PORT"]) + 1
        else:
            raise ValueError(
                "gradlane: the hook's own Group needs GRADLANE_PORT or MASTER_PORT "
                "(rank 0 listens on MASTER_ADDR at that port, or MASTER_PORT + 1)"
            )
        listen = f"{host}:{port}" if rank == 0 else rank_listen_from_env()
        self.group = gradlane.Group(
            rank,
            world,
            root=f"{host}:{port}",
            listen=listen,
            cert_dir=cert_dir_from_env(),
            loss_tolerance=self.loss_tolerance,
            injected_loss=self.injected_loss,
            seed=self.seed,
            dscp=self.dscp,
        )
        self._own_group = True
        return self.group

    def close(self) -> None:
        """Closes the Group the state joined itself (not one it was given)."""
        if self._own_group and self.group is not None:
            self.group.close()

    # ----------------------------------------------------------- layout
    def _bucket_id(self, g: gradlane.Group, bucket) -> int:
        params = bucket.parameters()
        shapes = tuple(tuple(p.shape) for p in params)
        key = (bucket.index(), shapes)
        bid = self._buckets.get(key)
        if bid is None:
            layout = [
                (f"b{bucket.index()}.p{i}", list(s), "conv2d" if len(s) == 4 else "dense")
                for i, s in enumerate(shapes)
            ]
            bid = g.register_bucket(layout, recovery=self.recovery)
            self._buckets[key] = bid
        return bid

    def _record(self, stats: dict[str, int], last: bool) -> None:
        for k, v in stats.items():
            self._step[k] = self._step.get(k, 0) + int(v)
        if last:
            self.last_stats = self._step
            for k, v in self._step.items():
                self.totals[k] = self.totals.get(k, 0) + v
            self._step = {}
            self.steps += 1


def ddp_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averages the bucket's gradients over the
    ranks with gradlane's differentiated allreduce (per conv kernel and
    per 1 KiB block of other tensors, the important chunks exact and the
    rest lossy), in place, and returns a completed future of the buffer.

    Register with ``ddp.register_comm_hook(HookState(...), ddp_hook)``.
    Takes CPU float32 gradients.
    """
    started = time.perf_counter_ns()
    buf = bucket.buffer()
    if buf.device.type != "cpu" or buf.dtype != torch.float32:
        raise TypeError(
            f"gradlane: ddp_hook takes CPU float32 gradients, the bucket is "
            f"{buf.dtype} on {buf.device}"
        )
    g = state._join()
    bid = state._bucket_id(g, bucket)
    stats = g.allreduce_differentiated(bid, buf.detach().numpy().reshape(-1), op="mean")
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    stats["hook_ns"] = time.perf_counter_ns() - started
    state._record(stats, bucket.is_last())
    return fut
