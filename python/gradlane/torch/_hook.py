"""A DDP communication hook over gradlane's differentiated allreduce."""


import os
import threading
import time

import torch
import torch.distributed as dist

import gradlane
from gradlane.torch._backend import gradlane_group_of, issue_order_of
from gradlane.torch._environment import (
    cert_dir_from_env,
    idle_timeout_from_env,
    on_rank_failure_from_env,
    hook_port_from_env,
    rank_listen_from_env,
)
from gradlane.torch._issue_order import IssueOrder
from gradlane.torch._staging import Stager, future_for
from gradlane.torch._tensors import REDUCED_DTYPES, values_view

#: Values a Hadamard rotation mixes: a lost chunk spreads over this many.
HADAMARD_BLOCK = 4096


class StepStatistics:
    """A hook state's statistics: ``last_stats``, the sums over the
    buckets of the last complete step; ``totals``, over all ``steps``."""

    def __init__(self):
        self._step: dict[str, int] = {}
        self.last_stats: dict[str, int] = {}
        self.totals: dict[str, int] = {}
        self.steps = 0

    def _record(self, stats: dict[str, int], last: bool) -> None:
        """Adds one bucket's ``stats``; ``last``: the step's last bucket."""
        for k, v in stats.items():
            self._step[k] = self._step.get(k, 0) + int(v)
        if last:
            self.last_stats = self._step
            for k, v in self._step.items():
                self.totals[k] = self.totals.get(k, 0) + v
            self._step = {}
            self.steps += 1


class HookState(StepStatistics):
    """The state of :func:`ddp_hook`: its gradlane Group, the layout of
    every bucket, and the statistics of the steps so far.

    Its knobs come as keywords (``loss_tolerance`` and ``recovery`` also
    first, by position), or as a :class:`gradlane.Settings` in
    ``settings`` (the keywords then change it); ``state.settings`` holds
    them, and each reads as an attribute (``state.loss_tolerance``). The
    defaults are the Settings' own (``gradlane.Settings()``).

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
    - ``important_format`` (default ``"f32"``): how the important chunks
      travel. ``"bf16"`` halves their bytes and the summed gradient's on
      the way back, at bfloat16's 8 bits of precision: what torch's
      ``bf16_compress_hook`` does to every value. Choose it where the
      network binds (a slow or lossy link); keep ``"f32"`` where the CPU
      does (a fast LAN, loopback). ``"f16"`` overflows above 65504.
      Buckets of bfloat16 or float16 gradients always travel in their own
      dtype.
    - ``lossy_format`` (default ``"f32"``): how the lossy chunks travel.
      ``"log8"`` sends one byte a value (within 4.9%, values below
      1/160,000 of their chunk's largest become 0) and a 4-byte scale per
      chunk: a quarter of the f32 bytes for the least important chunks,
      where precision matters least. ``"bf16"`` halves them.
    - ``compression_feedback`` (default None: on for ``"log8"``): each rank
      keeps what rounding took from its gradient and adds it to its next
      step's (as EF-SGD does). Leave it on; off only for ablations.
    - ``lossy_return`` (default False): the least important chunks of
      the summed gradient (``loss_tolerance`` of each tensor's) come back
      in the lossy format too: fewer bytes on the way back, at the lossy
      format's error on those sums. Worth it where the network binds.
    - ``overlap`` (default False): return from the hook at once and let
      each bucket's allreduce run while backward computes the next buckets
      (as gloo does), instead of waiting for it inside the hook. Worth it
      where the host has cores to spare for the network; where every core
      is busy computing, the two compete and steps take longer
      (docs/RESULTS.md, "The asynchronous backend: overlap with
      backward", 4 ranks sharing 2 cores). Either way the
      allreduces run on the thread that runs the Group's collectives in
      issue order: the backend's, when the hook shares its Group.
    - ``deadline`` (default None): a bound on each half of a bucket's
      allreduce, for a network whose other tenants make some steps far
      slower than most (a shared cloud). ``"adaptive"`` follows recent
      steps: ``deadline_factor`` (default 1.25) times the median of the
      half's last 16 steps, after 3 steps without. A number is a fixed
      deadline in seconds, for each half. Lossy chunks of the first half
      still on their way at the deadline count as missing, for
      ``recovery`` to handle: use ``"error_feedback"`` with it, so that
      what was cut is added into the next step, not lost. The return
      half is bounded too: the least important chunks of the summed
      gradient travel lossy, a chunk any rank missed is zero at every
      rank, and its owner adds it into the next step (every rank keeps
      the same bits). The important chunks are never cut, so raise
      ``loss_tolerance`` (0.3-0.5) for more of each step to be
      boundable. ``deadline_factor`` nearer 1 cuts more steps and bounds
      the tail more tightly. The halves cut are counted in the
      statistics' ``at_deadline`` and ``return_at_deadline``.
    - ``rotation`` (default None): ``"hadamard"`` rotates each float32
      bucket before it is chunked, by a seeded randomized Hadamard
      transform (random signs, then a Walsh-Hadamard transform over
      blocks of 4096 values), and back after the allreduce (OptiReduce's):
      a lost chunk then becomes small noise spread over its block instead
      of a hole. It also spreads importance evenly, so the important
      chunks no longer hold the largest values; and it costs two passes
      of 12 butterflies a step (docs/RESULTS.md, "The mechanism in every
      step": slower to the target there, where the CPU binds).
    - ``lossy_carrier``: what carries the lossy chunks. ``"adaptive"``
      (default) sends them on low-priority streams while the path loses
      nothing and as datagrams after a loss; cheapest in CPU.
      ``"datagrams"`` always uses datagrams: lossy data is never
      retransmitted, not even before the first loss is seen, at more CPU.
      Non-default makes the hook join its own Group.

    Settings to leave alone:

    - ``group``: by default the hook uses the gradlane Group of the
      default process group when it is "gradlane" and its settings match,
      and otherwise joins its own Group: rank 0 listens on MASTER_ADDR at
      GRADLANE_PORT (default MASTER_PORT + 1), the ranks and world from
      the default process group (or RANK and WORLD_SIZE), certificates
      from GRADLANE_CERT_DIR, GRADLANE_IDLE_TIMEOUT as the backend reads
      it. Pass a :class:`gradlane.Group` only to share one you made.
    - ``injected_loss`` and ``seed``: drop that share of this rank's
      outgoing packets, seeded; for tests and demos only. Non-zero values
      make the hook join its own Group.
    - ``dscp``: mark the hook's packets by class (important DSCP 56, the
      lossy levels below), for a network whose queues serve the important
      class first (Linux). True makes the hook join its own Group.

    A failed allreduce fails its bucket's future, so backward raises a
    RuntimeError naming the :class:`gradlane.GroupError` (such as
    ``RankFailedError: rank 1: ...``), and every later bucket fails with
    the same error at once: the Group is not used again.

    Statistics: ``last_stats`` holds the sum over the buckets of the last
    complete step of what ``allreduce_differentiated`` reported (bytes sent
    on the wire in each class's format: ``sent_important_bytes``,
    ``sent_lossy_bytes`` and ``return_bytes``, the summed shards sent
    back; lossy bytes zero-filled, ranges lost and missing, late chunks);
    ``totals`` the same summed over all ``steps`` steps.
    Some of the keys are times in nanoseconds: ``hook_ns``, how long the
    buckets' allreduces took, Python side included; ``network_ns``, the
    part of that spent in the Rust allreduce (the difference is what the
    Python side costs), itself split into ``reduce_ns`` and
    ``return_ns``, its two halves; ``wait_ns``, how long buckets waited
    on the thread for the collectives issued before them. With a
    ``deadline``: ``budget_ns`` and ``return_budget_ns``, the halves'
    budgets (0 in warm-up), ``at_deadline`` and ``return_at_deadline``,
    how many ran to theirs and were cut, ``return_lossy_bytes``, the
    return's lossy part, and ``return_missed_values``, the values some
    rank missed (zero everywhere, carried into the next step).
    """

    def __init__(
        self,
        loss_tolerance: float | None = None,
        recovery: str | None = None,
        group: gradlane.Group | None = None,
        *,
        settings: gradlane.Settings | None = None,
        **knobs,
    ):
        # Every knob is checked, and every default held, by gradlane.Settings
        # (in Rust); the two that come first by position are left out where
        # not given, so that the default is the Settings' own.
        given = {
            name: value
            for name, value in (("loss_tolerance", loss_tolerance), ("recovery", recovery))
            if value is not None
        }
        base = settings if settings is not None else gradlane.Settings()
        #: The hook's knobs, every one of them (see the class's docs), as
        #: its Group and buckets take them.
        self.settings = base.replace(**given, **knobs)
        if group is not None and self.settings.needs_own_group:
            raise ValueError(
                "gradlane: injected_loss, dscp and lossy_carrier are settings of the Group "
                "the hook joins itself; a Group passed in keeps its own (make it with them)"
            )
        # Per (bucket key, length): the rotation's signs.
        self._signs: dict[tuple, torch.Tensor] = {}
        self.group = group
        self._own_group = False
        # (bucket index, parameter shapes) -> gradlane bucket id.
        self._buckets: dict[tuple, int] = {}
        super().__init__()
        # The thread that runs the Group's collectives in issue order (the
        # backend's when the Group is its), chosen when the Group is
        # joined. The first failure, which every later bucket gets too.
        self._order: IssueOrder | None = None
        self._own_order = False
        self._failed: BaseException | None = None
        # CUDA buckets go through pinned host buffers (see _staging).
        self._stager = Stager()

    def __getattr__(self, name: str):
        """Each knob reads as an attribute: ``state.loss_tolerance`` is
        ``state.settings.loss_tolerance``."""
        if name.startswith("_") or name == "settings":
            raise AttributeError(name)
        return getattr(self.settings, name)

    # ------------------------------------------------------------ group
    def _join(self) -> gradlane.Group:
        """The Group, joined at the first call, and the issue order its
        collectives run in (the backend's when the Group is its)."""
        g = self._join_group()
        if self._order is None:
            self._order = issue_order_of(g)
            if self._order is None:
                self._order = IssueOrder("gradlane-hook")
                self._own_order = True
        return g

    def _join_group(self) -> gradlane.Group:
        if self.group is not None:
            return self.group
        g = gradlane_group_of(None)
        if g is not None and self.settings.links_match(g.settings):
            # The backend's Group carries the hook's links: shared.
            self.group = g
            return g
        if dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        port = hook_port_from_env()
        listen = f"{host}:{port}" if rank == 0 else rank_listen_from_env()
        self.group = gradlane.Group(
            rank,
            world,
            root=f"{host}:{port}",
            listen=listen,
            cert_dir=cert_dir_from_env(),
            settings=self.settings.replace(
                idle_timeout=idle_timeout_from_env(), on_rank_failure=on_rank_failure_from_env()
            ),
        )
        self._own_group = True
        return self.group

    def close(self) -> None:
        """Stops the state's thread (not the backend's, when the Group is
        the backend's) and closes the Group the state joined itself (not
        one it was given)."""
        if self._own_order and self._order is not None:
            self._order.close()
        if self._own_group and self.group is not None:
            self.group.close()

    def _submit(self, fut, value, work, last: bool, queued_ns: int, staged=None):
        """Runs ``work()`` (one bucket's allreduces, which return their
        statistics) on the thread of the Group's issue order, then
        completes ``fut`` with ``value``; returns the future DDP reads.
        Waits for it here unless ``overlap``. With ``staged`` (a CUDA
        bucket), ``work`` runs once the copies to the host are in, and the
        future completes once the copies back are queued."""
        done = threading.Event()

        def job():
            try:
                self._run(fut, value, work, last, queued_ns, staged)
            finally:
                done.set()

        self._order.submit(job)
        if not self.overlap:
            done.wait()
        # DDP reads a future's value in C++, where an exception set from
        # Python is only a value that is not a tensor ("Unable to cast ...
        # to Tensor"); reading it in a callback makes it the chained
        # future's error.
        return fut.then(lambda f: f.value())

    def _failed_future(self, fut, error: BaseException):
        """``fut`` failed with ``error`` before any work was issued."""
        self._failed = self._failed or error
        fut.set_exception(error)
        return fut.then(lambda f: f.value())

    def _run(self, fut, value, work, last: bool, queued_ns: int, staged) -> None:
        started = time.perf_counter_ns()
        try:
            if self._failed is not None:
                raise self._failed
            if staged is not None:
                staged.wait_copied_in()
            stats = work()
        except BaseException as e:  # noqa: BLE001 - handed to DDP through the future
            if self._failed is None:
                self._failed = e
            if staged is not None:
                staged.abandon()
            fut.set_exception(e)
            self._order.failed(e)
            return
        stats["hook_ns"] = time.perf_counter_ns() - started
        stats["wait_ns"] = started - queued_ns
        self._record(stats, last)
        if staged is None:
            fut.set_result(value)
        else:
            staged.finish()
            staged.complete(fut, value)

    def _rotation_signs(self, key: tuple, n: int) -> torch.Tensor:
        """The random signs of a bucket's rotation: the same on every rank
        (seeded by the bucket's index) and at every step, so that a
        residual kept in rotated values stays valid."""
        signs = self._signs.get((key, n))
        if signs is None:
            g = torch.Generator().manual_seed(0x6A4E + 7919 * key[0])
            signs = torch.randint(0, 2, (n,), generator=g, dtype=torch.int8)
            signs = signs.to(torch.float32).mul_(2).sub_(1)
            self._signs[(key, n)] = signs
        return signs

    # ----------------------------------------------------------- layout
    def _bucket_id(self, g: gradlane.Group, key: tuple, shapes: tuple) -> int:
        bid = self._buckets.get(key)
        if bid is None:
            index = key[0]
            layout = [
                (f"b{index}.p{i}", list(s), "conv2d" if len(s) == 4 else "dense")
                for i, s in enumerate(shapes)
            ]
            bid = g.register_bucket(layout, dtype=key[-1], settings=self.settings)
            self._buckets[key] = bid
        return bid


def ddp_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averages the bucket's gradients over the
    ranks with gradlane's differentiated allreduce (per conv kernel and
    per 1 KiB block of other tensors, the important chunks exact and the
    rest lossy), in place. Returns a future of the buffer that the thread
    of the Group's collectives completes: already complete, or with
    ``overlap`` at once (see :class:`HookState`).

    Register with ``ddp.register_comm_hook(HookState(...), ddp_hook)``.
    Takes CPU or CUDA gradients of float32, bfloat16 or float16. A CUDA
    bucket is copied to a pinned host buffer (on a side stream, waited
    for on that thread), reduced there and copied back on the side stream; the
    future completes with those copies enqueued, and DDP's wait on it
    makes its stream wait for them.
    """
    queued = time.perf_counter_ns()
    buf = bucket.buffer()
    if buf.device.type not in ("cpu", "cuda") or buf.dtype not in REDUCED_DTYPES:
        raise TypeError(
            f"gradlane: ddp_hook takes CPU or CUDA float32, bfloat16 or float16 gradients, "
            f"the bucket is {buf.dtype} on {buf.device}"
        )
    fut: torch.futures.Future[torch.Tensor] = future_for(buf.device)
    try:
        g = state._join()
    except BaseException as e:  # noqa: BLE001 - handed to DDP through the future
        return state._failed_future(fut, e)
    shapes = tuple(tuple(p.shape) for p in bucket.parameters())
    staged = state._stager.call([buf], [True], [True]) if state._stager.needs_staging([buf]) else None
    flat, dtype = values_view(staged.host[0] if staged is not None else buf)
    # DDP rebuilds its buckets after the first step, so the shapes are
    # part of the key.
    key = (bucket.index(), shapes, dtype)

    rotate = state.rotation == "hadamard" and dtype == "float32"

    def work():
        bid = state._bucket_id(g, key, shapes)
        if not rotate:
            return g.allreduce_differentiated(bid, flat, op="mean")
        values = torch.from_numpy(flat)
        signs = state._rotation_signs(key, values.numel())
        hadamard_(values, signs, inverse=False)
        stats = g.allreduce_differentiated(bid, flat, op="mean")
        hadamard_(values, signs, inverse=True)
        return stats

    return state._submit(fut, buf, work, bucket.is_last(), queued, staged)


def hadamard_(values: torch.Tensor, signs: torch.Tensor, inverse: bool) -> None:
    """A randomized Hadamard rotation of ``values`` (float32, flat) in
    place, by blocks of HADAMARD_BLOCK: ``H D x`` forward, ``D H y``
    inverse, with ``D`` the diagonal of ``signs`` and ``H`` the
    orthonormal Walsh-Hadamard matrix (its own inverse). The values past
    the last whole block stay as they are.

    Forward, ``H`` is two products with a 64 x 64 Hadamard matrix (``H``
    of 4096 is its Kronecker square), twice as fast as butterflies; its
    bits may differ from machine to machine, which is harmless before
    the allreduce. The inverse, applied by every rank to the same sum,
    is butterflies of additions alone, which round the same everywhere."""
    n = values.numel() // HADAMARD_BLOCK * HADAMARD_BLOCK
    if n == 0:
        return
    v = values[:n].view(-1, HADAMARD_BLOCK)
    d = signs[:n].view(-1, HADAMARD_BLOCK)
    if not inverse:
        v.mul_(d)
        side = _hadamard_matrix(64)
        blocks = v.view(-1, 64, 64)
        blocks.copy_(side @ blocks @ side).mul_(1 / 64)
        return
    h = 1
    while h < HADAMARD_BLOCK:
        pairs = v.view(v.shape[0], -1, 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        total = a + b
        b.sub_(a).neg_()
        a.copy_(total)
        h *= 2
    v.mul_(HADAMARD_BLOCK**-0.5)
    v.mul_(d)


def _hadamard_matrix(n: int) -> torch.Tensor:
    """Sylvester's n x n Hadamard matrix of ones and minus ones."""
    m = torch.ones(1, 1)
    while m.shape[0] < n:
        m = torch.cat([torch.cat([m, m], 1), torch.cat([m, -m], 1)], 0)
    return m
