"""PowerSGD whose every step goes through gradlane's differentiated
allreduce.

torch's ``powerSGD_hook`` compresses each matrix-shaped gradient M to two
thin factors (P = M Q, then Q = M^T P with P orthogonalized) and
allreduces those, plus the tensors not worth compressing (biases, norms)
whole. :func:`powersgd_hook` runs the same algorithm, with torch's own
orthogonalization and compression test, but the allreduces are gradlane's
differentiated ones: the chunks of the factors and of the uncompressed
tensors are scored and classed like any bucket's, the least important
(``loss_tolerance`` of them) travel lossy and, with a ``deadline``, may
be cut. Every rank ends each allreduce with the same bits (the owner's
sum, with the same chunks zero-filled everywhere), so every rank
decompresses identical factors; PowerSGD's error feedback (each rank's
``M - P Q^T``) absorbs what was dropped, as it absorbs what compression
drops. Two allreduces a step: the uncompressed tensors ride with P.

Its first ``start_powerSGD_iter`` steps (torch: a plain allreduce of the
full gradient, so that the model leaves the early phase where low-rank
compression hurts) go through :func:`gradlane.torch.ddp_hook`.
"""

# No `from __future__ import annotations`: DDP checks the hook's return
# annotation as an object.
import time

import torch

from gradlane.torch._hook import HookState, ddp_hook
from gradlane.torch._staging import future_for

#: How the factor buckets' lost chunks are handled: counted as zero, late
#: ones dropped; PowerSGD's own error feedback keeps what was lost.
FACTOR_RECOVERY = "drop"


class PowerSGDHookState:
    """The state of :func:`powersgd_hook`: torch's ``PowerSGDState`` (the
    algorithm's settings and memory) and the :class:`HookState` whose
    Group and settings carry every step.

    Which to tune: ``powersgd``'s ``matrix_approximation_rank`` and
    ``start_powerSGD_iter``, as torch's docs say; ``hook``'s
    ``loss_tolerance``, formats and ``deadline`` as for :func:`ddp_hook`
    (they apply to the warm-up steps and to the factors alike; the
    factors' lost chunks are always counted as zero and their late ones
    dropped, and no compression feedback is kept for them: PowerSGD's own
    error feedback covers both). Leave the rest of torch's state as it is
    (``use_error_feedback`` and ``warm_start`` on).

    ``warmup_steps`` counts the steps that went through :func:`ddp_hook`,
    ``compressed_steps`` those that went through the factors; the hook's
    ``last_stats`` and ``totals`` count the bytes of both.
    """

    def __init__(self, powersgd, hook: HookState):
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        if not isinstance(powersgd, PowerSGDState):
            raise TypeError(
                f"powersgd must be torch's PowerSGDState, not {type(powersgd).__name__}"
            )
        if not isinstance(hook, HookState):
            raise TypeError(f"hook must be a gradlane HookState, not {type(hook).__name__}")
        self.powersgd = powersgd
        self.hook = hook
        #: (DDP bucket index, its tensors' shapes) -> the plan of its steps.
        self._plans: dict[tuple, "_BucketPlan"] = {}
        self.compressed_steps = 0

    @property
    def warmup_steps(self) -> int:
        """Steps whose full gradients went through :func:`ddp_hook`."""
        return self.hook.steps - self.compressed_steps

    def close(self) -> None:
        """Closes the hook's thread and the Group it joined itself."""
        self.hook.close()


def powersgd_hook(state: PowerSGDHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: PowerSGD over gradlane's differentiated
    allreduce in every step.

    Register with ``ddp.register_comm_hook(PowerSGDHookState(PowerSGDState(
    process_group=None, matrix_approximation_rank=8, start_powerSGD_iter=10),
    HookState(important_format="bf16", lossy_format="log8")), powersgd_hook)``.
    While ``state.powersgd.iter`` is under its ``start_powerSGD_iter`` a
    bucket goes whole through :func:`ddp_hook`; from then on as PowerSGD's
    factors. Float32 gradients on CPU or CUDA (CUDA ones: the factors are
    computed on the device and reduced through host memory).
    """
    ps = state.powersgd
    if ps.iter < ps.start_powerSGD_iter:
        ps.maybe_increase_iter(bucket)
        return ddp_hook(state.hook, bucket)
    buf = bucket.buffer()
    if buf.dtype != torch.float32:
        raise TypeError(
            f"gradlane: powersgd_hook compresses float32 gradients, the bucket is {buf.dtype}"
        )
    queued = time.perf_counter_ns()
    hook = state.hook
    fut: torch.futures.Future[torch.Tensor] = future_for(buf.device)
    try:
        hook._join()
    except BaseException as e:  # noqa: BLE001 - handed to DDP through the future
        return hook._failed_future(fut, e)
    tensors = bucket.gradients()
    index, last = bucket.index(), bucket.is_last()
    key = (index, tuple(tuple(t.shape) for t in tensors))

    def work():
        plan = state._plans.get(key)
        if plan is None:
            plan = state._plans[key] = _BucketPlan(state, index, tensors)
        stats = plan.run(state, buf, tensors)
        if last:
            state.compressed_steps += 1
        ps.maybe_increase_iter(bucket)
        return stats

    return hook._submit(fut, buf, work, last, queued)


class _BucketPlan:
    """One DDP bucket's compressed steps: which tensors are compressed (at
    what rank), where their factors live, and the two gradlane buckets
    their allreduces use: the uncompressed tensors with P, then Q."""

    def __init__(self, state: PowerSGDHookState, index: int, tensors):
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

        ps = state.powersgd
        self.index = index
        self.compressed: list[int] = []
        self.uncompressed: list[int] = []
        p_size = q_size = 0
        for i, t in enumerate(tensors):
            n, m = _matrix(t).shape
            rank = min(n, m, ps.matrix_approximation_rank)
            if _should_compress(n, m, rank, ps.min_compression_rate)[0]:
                self.compressed.append(i)
                p_size += n * rank
                q_size += m * rank
            else:
                self.uncompressed.append(i)
        self.u_size = sum(tensors[i].numel() for i in self.uncompressed)
        self.p_size, self.q_size = p_size, q_size
        # Tensors of one shape go through one batched product, as torch's
        # batch_tensors_with_same_shape does.
        self.groups: dict[tuple, list[int]] = {}
        for i in self.compressed:
            shape = tuple(_matrix(tensors[i]).shape)
            self.groups.setdefault(shape if ps.batch_tensors_with_same_shape else (i,), []).append(i)
        self.first_bucket: "int | None" = None
        self.second_bucket: "int | None" = None

    def _register(self, hook: HookState):
        """The two gradlane buckets: [uncompressed | P] and Q, each a dense
        tensor of its own so that its chunks are ranked together."""
        g = hook._join()
        settings = hook.settings.replace(compression_feedback=False)
        options = dict(dtype="float32", settings=settings)
        first = []
        if self.u_size:
            first.append((f"powersgd{self.index}.uncompressed", [self.u_size], "dense"))
        if self.p_size:
            first.append((f"powersgd{self.index}.p", [self.p_size], "dense"))
        self.first_bucket = g.register_bucket(first, FACTOR_RECOVERY, **options)
        if self.q_size:
            self.second_bucket = g.register_bucket(
                [(f"powersgd{self.index}.q", [self.q_size], "dense")], FACTOR_RECOVERY, **options
            )

    def run(self, state: PowerSGDHookState, buf: torch.Tensor, tensors) -> dict[str, int]:
        """One compressed step of the bucket, in place; returns the two
        allreduces' statistics, summed."""
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

        ps, hook = state.powersgd, state.hook
        g = hook._join()
        if self.first_bucket is None:
            self._register(hook)
        world = g.world
        index = self.index
        # Error feedback, as torch's: the residual of the last step added in.
        input_cp = None
        if ps.use_error_feedback:
            error = ps.error_dict.get(index)
            if error is None:
                error = ps.error_dict[index] = torch.zeros_like(buf)
            buf.add_(error)
            input_cp = buf.detach().clone()
        fresh = not ps.warm_start or index not in ps.p_memory_dict
        if fresh:
            ps.p_memory_dict[index] = torch.empty(self.p_size, device=buf.device)
            ps.q_memory_dict[index] = torch.empty(self.q_size, device=buf.device)
        matrices, ps_views, qs_views = self._views(ps, tensors)
        if fresh:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(ps.rng.randint(1_000_000_000))
                for q in qs_views:
                    q.copy_(torch.randn(*q.shape, device="cpu"))
                    _orthogonalize(q, ps.orthogonalization_epsilon)
        else:
            for q in qs_views:
                _orthogonalize(q, ps.orthogonalization_epsilon)
        for m, q, p in zip(matrices, qs_views, ps_views):
            torch.bmm(m, q, out=p)
        # 1. The uncompressed tensors and P, summed.
        first = torch.cat(
            [tensors[i].reshape(-1) for i in self.uncompressed] + [ps.p_memory_dict[index]]
        )
        stats = _reduce(g, self.first_bucket, first)
        at = 0
        for i in self.uncompressed:
            t = tensors[i]
            t.copy_(first[at : at + t.numel()].view_as(t)).div_(world)
            at += t.numel()
        ps.p_memory_dict[index].copy_(first[at:])
        # 2. P orthogonalized, Q = M^T P summed, and the product back.
        for p in ps_views:
            _orthogonalize(p, ps.orthogonalization_epsilon)
        for m, p, q in zip(matrices, ps_views, qs_views):
            torch.bmm(m.transpose(1, 2), p, out=q)
        if self.second_bucket is not None:
            second = _reduce(g, self.second_bucket, ps.q_memory_dict[index])
            for k, v in second.items():
                stats[k] = stats.get(k, 0) + v
            ps.q_memory_dict[index].div_(world)
        for p, q, m in zip(ps_views, qs_views, matrices):
            torch.bmm(p, q.transpose(1, 2), out=m)
        self._unbatch(matrices, tensors)
        if input_cp is not None:
            ps.error_dict[index] = input_cp - buf
        if not ps.warm_start:
            ps.p_memory_dict.clear()
            ps.q_memory_dict.clear()
        return stats

    def _views(self, ps, tensors):
        """Each group of compressed tensors as one batch of matrices, and
        its P and Q as views of the bucket's factor memory."""
        p_mem, q_mem = ps.p_memory_dict[self.index], ps.q_memory_dict[self.index]
        matrices, p_views, q_views = [], [], []
        p_at = q_at = 0
        for members in self.groups.values():
            mats = [_matrix(tensors[i]) for i in members]
            batch = mats[0].unsqueeze(0) if len(mats) == 1 else torch.stack(mats)
            b, n, m = batch.shape
            rank = min(n, m, ps.matrix_approximation_rank)
            matrices.append(batch)
            p_views.append(p_mem[p_at : p_at + b * n * rank].view(b, n, rank))
            q_views.append(q_mem[q_at : q_at + b * m * rank].view(b, m, rank))
            p_at += b * n * rank
            q_at += b * m * rank
        return matrices, p_views, q_views

    def _unbatch(self, matrices, tensors):
        """Copies the stacked batches' products back into their tensors (a
        single tensor's batch is a view of it already)."""
        for batch, members in zip(matrices, self.groups.values()):
            if len(members) > 1:
                for k, i in enumerate(members):
                    tensors[i].copy_(batch[k].view_as(tensors[i]))


def _matrix(t: torch.Tensor) -> torch.Tensor:
    """A gradient as PowerSGD sees it: rows by its first dimension."""
    return t.view(t.shape[0], -1) if t.dim() else t.view(1, 1)


def _reduce(g, bucket_id: int, t: torch.Tensor) -> dict[str, int]:
    """Sums ``t`` (float32) over the ranks through gradlane bucket
    ``bucket_id``, in place; a CUDA tensor through host memory."""
    host = t if t.device.type == "cpu" else t.to("cpu")
    stats = g.allreduce_differentiated(bucket_id, host.reshape(-1).numpy(), op="sum")
    if host is not t:
        t.copy_(host)
    return stats

