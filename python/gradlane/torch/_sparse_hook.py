"""The sparse log-quantized DDP hook (the original documents 000 and 001):
each step keeps the largest entries of every gradient, quantizes them
with gradlane's codec, and exchanges them; what was not sent stays in the
rank's residual (error feedback) and joins its next gradient.

Two exchanges:

- ``"exact"``: each rank's codec frame (keys as bit-packed deltas, a
  sign and a log level a value: about two bytes an entry) is allgathered
  over a process group, gloo's or gradlane's: the frames' lengths first
  (the count negotiation), then the frames, padded to the longest only
  where the lengths differ. Every rank decodes every frame and sums them
  in rank order: the same bits everywhere.
- ``"differentiated"``: gradlane's differentiated allgather
  (``Group.allgather_differentiated``). Each rank's entries, largest
  first, as (key, value) pairs, go to every other rank as a gradlane
  round: the largest entries' chunks exactly, the lower tiers
  (``loss_tolerance`` of the chunks) lossy and, with the hook's deadline,
  cut at it. A chunk any rank missed is dropped at every rank, so every
  rank sums the same entries, and its entries go back into their
  sender's residual. Eight bytes an entry (the codec's values, keys as
  they are): more than the exact frames' two, for an exchange a burst
  cannot hold up past its deadline.
"""

# No `from __future__ import annotations`: DDP checks the hook's return
# annotation as an object.
import math
import time

import numpy as np
import torch
import torch.distributed as dist

from gradlane.codec import DEFAULT_BASE, codec_decode, codec_decode_add, codec_encode
from gradlane.torch._hook import HookState, StepStatistics
from gradlane.torch._staging import future_for

TRANSPORTS = ("exact", "differentiated")
#: Keys travel as float32 in the differentiated exchange: exact below this.
MAX_DIFFERENTIATED_VALUES = 1 << 24


class SparseHookState(StepStatistics):
    """The state of :func:`sparse_hook`: its settings, each bucket's
    residual, and the statistics of the steps so far.

    Settings to tune:

    - ``density`` (default 0.01): the share of each gradient tensor's
      values kept a step, the largest by magnitude (at least one a
      tensor). Lower sends less and leaves more to the residual; 0.001 to
      0.05 is where to look.
    - ``threshold`` (default None): keep every value whose magnitude is
      above it instead of a share (the count then differs from rank to
      rank and from step to step: the exact exchange negotiates it; the
      differentiated one keeps at most ``density``'s count, the largest).
    - ``transport``: ``"exact"`` (default) or ``"differentiated"`` (see
      the module's docs); the latter takes its loss tolerance (the lossy
      tiers' share), deadline and Group from ``hook``.

    Settings to leave alone:

    - ``base`` (default 1.25): the codec's logarithm base. A value decodes
      within +11.8% / -10.6%; the residual keeps the rest.
    - ``process_group``: the group the exact exchange runs on (default:
      the default group, gloo's or gradlane's).
    - ``hook``: a :class:`HookState` for the differentiated exchange (by
      default ``HookState(loss_tolerance=0.5, deadline="adaptive")``); its
      formats are not used (keys must travel exactly).

    Statistics: ``last_stats`` holds the last complete step's sums over
    its buckets: ``entries`` (kept), ``frame_bytes`` (the codec frames'
    length), ``sent_bytes`` (what this rank handed to the exchange:
    the frame, padded where lengths differ, for ``"exact"``; the
    differentiated allreduce's important and lossy bytes and its
    return's otherwise), ``dropped_entries`` (lost in the differentiated
    exchange, back in the residual) and ``hook_ns``; ``totals`` the same
    over ``steps`` steps.
    """

    def __init__(
        self,
        density: float = 0.01,
        *,
        threshold: float | None = None,
        transport: str = "exact",
        base: float = DEFAULT_BASE,
        process_group=None,
        hook: HookState | None = None,
    ):
        if not 0.0 < float(density) <= 1.0:
            raise ValueError(f"gradlane: density {density} is not in (0, 1]")
        if threshold is not None and not (math.isfinite(threshold) and threshold >= 0.0):
            raise ValueError(f"gradlane: threshold {threshold} is not a finite number >= 0")
        if transport not in TRANSPORTS:
            raise ValueError(
                f"gradlane: unknown transport {transport!r}; one of {', '.join(TRANSPORTS)}"
            )
        if not (math.isfinite(base) and base > 1.0):
            raise ValueError(f"gradlane: base {base} is not a finite number above 1")
        if hook is not None and not isinstance(hook, HookState):
            raise TypeError(f"hook must be a gradlane HookState, not {type(hook).__name__}")
        self.density = float(density)
        self.threshold = None if threshold is None else float(threshold)
        self.transport = transport
        self.base = float(base)
        self.process_group = process_group
        if transport == "differentiated" and hook is None:
            hook = HookState(loss_tolerance=0.5, deadline="adaptive")
        self.hook = hook
        #: Per (bucket index, length): what this rank has not sent yet.
        self._residuals: dict[tuple[int, int], torch.Tensor] = {}
        #: Per (bucket index, length): the differentiated slots' bucket id.
        self._slot_buckets: dict[tuple[int, int], tuple[int, int]] = {}
        super().__init__()

    def close(self) -> None:
        """Closes the hook's thread and the Group it joined itself."""
        if self.hook is not None:
            self.hook.close()

    # ---------------------------------------------------------- selection
    def _capacity(self, tensors) -> int:
        """How many entries a bucket keeps at most a step."""
        return sum(max(1, math.ceil(self.density * t.numel())) for t in tensors)

    def _select(self, acc: torch.Tensor, tensors) -> tuple[np.ndarray, np.ndarray]:
        """The kept entries of a bucket's flat values: keys ascending (into
        the bucket), their values; never a zero."""
        keys = []
        at = 0
        for t in tensors:
            n = t.numel()
            part = acc[at : at + n]
            if self.threshold is not None:
                idx = torch.nonzero(part.abs() > self.threshold).reshape(-1)
            else:
                k = min(n, max(1, math.ceil(self.density * n)))
                idx = torch.topk(part.abs(), k, sorted=False).indices
            keys.append(idx + at)
            at += n
        keys = torch.cat(keys) if keys else torch.empty(0, dtype=torch.long)
        keys = keys[acc[keys] != 0]
        keys, _ = torch.sort(keys)
        return keys.numpy().astype(np.uint32), acc[keys].numpy()


def sparse_hook(state: SparseHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the largest entries of each gradient,
    log-quantized by gradlane's codec, exchanged exactly or through the
    differentiated allreduce; the rest kept for the next step (see
    :class:`SparseHookState`). Averages over the ranks in place; every
    rank ends with the same bits. Float32 gradients, CPU or CUDA (CUDA
    ones through host memory)."""
    buf = bucket.buffer()
    if buf.dtype != torch.float32:
        raise TypeError(f"gradlane: sparse_hook takes float32 gradients, the bucket is {buf.dtype}")
    queued = time.perf_counter_ns()
    tensors = bucket.gradients()
    key = (bucket.index(), buf.numel())
    last = bucket.is_last()
    fut = future_for(buf.device)
    if state.transport == "exact":
        try:
            stats = _exact_step(state, key, buf, tensors)
        except BaseException as e:  # noqa: BLE001 - handed to DDP through the future
            fut.set_exception(e)
            return fut.then(lambda f: f.value())
        stats["hook_ns"] = time.perf_counter_ns() - queued
        state._record(stats, last)
        fut.set_result(buf)
        return fut.then(lambda f: f.value())
    hook = state.hook
    try:
        hook._join()
    except BaseException as e:  # noqa: BLE001 - handed to DDP through the future
        return hook._failed_future(fut, e)

    def work():
        stats = _differentiated_step(state, key, buf, tensors)
        state._record(stats, last)
        return stats

    return hook._submit(fut, buf, work, last, queued)


def _host(buf: torch.Tensor) -> torch.Tensor:
    return buf if buf.device.type == "cpu" else buf.to("cpu")


def _residual(state: SparseHookState, key, like: torch.Tensor) -> torch.Tensor:
    r = state._residuals.get(key)
    if r is None:
        r = state._residuals[key] = torch.zeros_like(like)
    return r


def _encode(state: SparseHookState, acc: torch.Tensor, tensors):
    """The kept entries' frame, and their keys and values as decoded."""
    keys, values = state._select(acc, tensors)
    frame = codec_encode(keys, values, acc.numel(), state.base)
    got_keys, got_values, _ = codec_decode(frame)
    keys = torch.from_numpy(np.frombuffer(got_keys, np.uint32).astype(np.int64))
    values = torch.from_numpy(np.frombuffer(got_values, np.float32).copy())
    return frame, keys, values


def _exact_step(state: SparseHookState, key, buf: torch.Tensor, tensors) -> dict[str, int]:
    host = _host(buf)
    acc = host.detach().reshape(-1) + _residual(state, key, host.reshape(-1))
    frame, keys, values = _encode(state, acc, [t for t in tensors])
    # What was not sent, and what quantization took, join the next step.
    residual = acc.clone()
    residual.index_add_(0, keys, -values)
    state._residuals[key] = residual
    group = state.process_group
    world = dist.get_world_size(group)
    # The count negotiation: every frame's length, then the frames, padded
    # to the longest only where the lengths differ.
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(frame)], dtype=torch.int64), group=group)
    lengths = [int(t.item()) for t in lengths]
    longest = max(lengths)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(frame)] = torch.frombuffer(bytearray(frame), dtype=torch.uint8)
    frames = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(frames, mine, group=group)
    out = torch.zeros_like(acc)
    for f, n in zip(frames, lengths, strict=True):
        codec_decode_add(f[:n].numpy(), out.numpy())
    out.div_(world)
    buf.copy_(out.view_as(buf))
    return {
        "entries": len(keys),
        "frame_bytes": len(frame),
        "sent_bytes": longest,
        "dropped_entries": 0,
    }


def _differentiated_step(state: SparseHookState, key, buf: torch.Tensor, tensors) -> dict[str, int]:
    hook = state.hook
    g = hook._join()
    world, rank = g.world, g.rank
    n = buf.numel()
    if n > MAX_DIFFERENTIATED_VALUES:
        raise ValueError(
            f"gradlane: sparse_hook's differentiated exchange takes buckets of at most "
            f"{MAX_DIFFERENTIATED_VALUES} values (keys travel as float32); this one has {n}: "
            "lower DDP's bucket_cap_mb"
        )
    cap = state._capacity(tensors)
    registered = state._slot_buckets.get(key)
    if registered is None:
        slots = [(f"sparse{key[0]}.rank{r}", [2 * cap], "dense") for r in range(world)]
        settings = hook.settings.replace(
            important_format="f32", lossy_format="f32", lossy_return=False,
            compression_feedback=False,
        )
        bid = g.register_bucket(slots, "drop", dtype="float32", settings=settings, gather=True)
        registered = state._slot_buckets[key] = (bid, cap)
    bid, cap = registered
    host = _host(buf)
    acc = host.detach().reshape(-1) + _residual(state, key, host.reshape(-1))
    frame, keys, values = _encode(state, acc, tensors)
    # The largest first: their chunks rank highest, and travel exactly.
    order = torch.argsort(values.abs(), descending=True, stable=True)[:cap]
    keys, values = keys[order], values[order]
    residual = acc.clone()
    residual.index_add_(0, keys, -values)
    # A key travels as the bits of its integer (a float32 far below any
    # gradient value, so that a chunk ranks by its values): the allgather
    # moves bits, it sums nothing.
    slots = torch.zeros(world, cap, 2)
    slots[rank, : len(keys), 0] = keys.to(torch.int32).view(torch.float32)
    slots[rank, : len(keys), 1] = values
    sent = slots[rank].clone()
    stats = g.allgather_differentiated(bid, slots.reshape(-1).numpy())
    # Every rank's entries, in rank order: the same sum everywhere. A
    # chunk lost is (0, 0) pairs, which add nothing.
    out = torch.zeros_like(acc)
    for r in range(world):
        out.index_add_(0, slots[r, :, 0].view(torch.int32).to(torch.int64), slots[r, :, 1])
    out.div_(world)
    # This rank's entries that some rank missed are zero in its own slot
    # too: they go back to its residual.
    arrived = (slots[rank].view(torch.int32) == sent.view(torch.int32)).all(dim=1)
    dropped = ~arrived[: len(keys)]
    residual.index_add_(0, keys[dropped], values[dropped])
    state._residuals[key] = residual
    buf.copy_(out.view_as(buf))
    stats.update(
        entries=len(keys),
        frame_bytes=len(frame),
        sent_bytes=stats["return_bytes"],
        dropped_entries=int(dropped.sum()),
    )
    return stats
