"""The torch.distributed backend "gradlane": a Python ProcessGroup over
:class:`gradlane.Group`.

Every collective returns a :class:`GradlaneWork` at once, as gloo's and
NCCL's do, and runs on the process group's own thread
(gradlane.torch._issue_order): one at a time, in the order they were
issued, with the GIL released while the network works. So DDP overlaps
each bucket's allreduce with the rest of backward. ``wait()`` blocks until
the collective is done and raises its error (a
:class:`gradlane.GroupError` such as ``RankFailedError`` naming the rank
that went away); ``get_future()`` completes then, on that thread, which
runs its callbacks: a collective a callback issues runs there at once
(torch's PowerSGD hook issues and waits for two inside its callbacks).
Input checks run in the call itself: bad input raises there, before
anything is sent, and the ranks stay in step.

CUDA tensors are staged through reusable pinned host buffers
(gradlane.torch._staging): the call queues their copies to the host on a
side stream, the thread waits for them, reduces on the host, and queues
the copies back on the side stream; ``wait()`` and the future then make
the caller's stream wait for the copies back, as NCCL's do.

Tensors: CPU or CUDA; a non-contiguous CPU tensor is copied to a
contiguous one and back (a non-contiguous CUDA tensor is a ValueError).
Reductions (allreduce, allreduce_coalesced, reduce, reduce_scatter and
its variants) take float32, bfloat16, float16, float64, int8, int16,
int32, int64, uint8 and bool (complex as its real view, SUM and AVG), with
ReduceOp.SUM, AVG (floats), PRODUCT, MIN, MAX, and BAND, BOR, BXOR
(integers and bool), as gloo. Every value is combined in rank order by
one rank, so every rank ends with the same bits: float32, bfloat16 and
float16 in float32, rounded once (a 16-bit tensor travels as itself);
float64 in float64; integers in their own type, wrapping as torch's do.
Data movement (broadcast, allgather and its coalesced and into-tensor
forms, gather, scatter, all_to_all, all_to_all_single with uneven split
sizes) takes any dtype and moves the bytes. monitored_barrier names the
ranks that did not come, as gloo's. The group reports devices cpu and
cuda and splits (split_group). Those ops live in gradlane.torch._ops.
send, recv and recv_anysource (isend, irecv, batch_isend_irecv) run
beside the collectives, not in their order (gradlane.torch._p2p).
allreduce takes a sparse COO tensor too (SUM, as gloo; _sparse).
What gradlane does not do (other sparse ops, coalescing blocks, windows)
is a NotImplementedError naming it. Bad input is a TypeError or a ValueError
naming the tensor and what is wrong with it.
"""

from __future__ import annotations

import datetime
import os
import socket
import weakref

import numpy as np
import torch
import torch.distributed as dist

import gradlane
from gradlane.torch._environment import (
    join_timeout_from_env,
    _free_udp_port,
    asynchronous_from_env,
    cert_dir_from_env,
    idle_timeout_from_env,
    on_rank_failure_from_env,
    rank_listen_from_env,
    rejoin_from_env,
)
from gradlane.torch._issue_order import IssueOrder
from gradlane.torch._ops import (
    OpsMixin,
    byte_view,
    contiguous_copies,
    delegate_cpu_ops,
    reduction_plan,
    typed_op,
)
from gradlane.torch._p2p import PointToPointMixin
from gradlane.torch._sparse import SparseMixin
from gradlane.torch._staging import Stager, future_for
from gradlane.torch._work import GradlaneWork

BACKEND_NAME = "gradlane"
#: The least time forming a group may take, in seconds, whatever the
#: process group's timeout (which bounds each collective).
MIN_JOIN_TIMEOUT = 60.0
#: Seconds shutdown (destroy_process_group) gives the sends and receives
#: already posted before it closes the Group under them.
SHUTDOWN_GRACE = 2.0
#: The store key under which rank 0 publishes its "ip:port".
ROOT_KEY = "gradlane/root"
#: The store keys (ADDRESS_KEY/RANK) under which every rank publishes the
#: "ip:port" it listens on, for a replacement to rejoin through.
ADDRESS_KEY = "gradlane/address"


def _addresses_from_store(store, rank: int, size: int) -> list[str]:
    """Every rank's address for a rank that rejoins: the others' as they
    published them, this rank's own where it listens (GRADLANE_RANK_ADDR;
    port 0 is any)."""
    table = []
    for r in range(size):
        key = f"{ADDRESS_KEY}/{r}"
        if r == rank:
            table.append(rank_listen_from_env())
        elif store.check([key]):
            table.append(store.get(key).decode())
        else:
            raise gradlane.GroupSetupError(
                f"gradlane: GRADLANE_REJOIN=1, but rank {r} never published its address "
                f"in the store ({key}): no group formed there to rejoin (start the job "
                "without GRADLANE_REJOIN, or give the job's own store)"
            )
    return table


# ------------------------------------------------------------ tensors


#: The dtypes gradlane reduces, and the name its Group takes each by.
REDUCED_DTYPES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}


def _check_tensor(t, what, *, reduce):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gradlane: {what} must be a torch.Tensor, not {type(t).__name__}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"gradlane: {what} is on {t.device}; the gradlane backend takes CPU and CUDA tensors"
        )
    if reduce and t.dtype not in REDUCED_DTYPES:
        raise TypeError(
            f"gradlane: {what} is {t.dtype}; gradlane reduces torch.float32, "
            "torch.bfloat16 and torch.float16 tensors"
        )
    if t.is_sparse or t.layout != torch.strided:
        raise NotImplementedError(
            f"gradlane: {what} has layout {t.layout}; gradlane implements dense tensors only"
        )
    if not t.is_contiguous() and t.device.type != "cpu":
        raise ValueError(
            f"gradlane: {what} (shape {tuple(t.shape)}, stride {t.stride()}) is not "
            "contiguous; pass tensor.contiguous() (CPU tensors are copied)"
        )


def values_view(t):
    """A flat numpy view of a checked float tensor's values (no copy) and
    the dtype name :class:`gradlane.Group` takes it with: numpy has no
    bfloat16, so a bfloat16 tensor crosses as its 16-bit integers."""
    flat = t.detach().reshape(-1)
    if t.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    return flat.numpy(), REDUCED_DTYPES[t.dtype]


def _bytes_view(t):
    """A float32 numpy view of a contiguous tensor's bytes, or None when its
    size in bytes is not a multiple of 4 (then the caller pads a copy)."""
    n = t.numel() * t.element_size()
    if n % 4:
        return None
    if n == 0:
        return np.empty(0, np.float32)
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.float32:
        return flat.numpy()
    return flat.view(torch.uint8).view(torch.float32).numpy()


def _padded(t):
    """A zero-padded float32 copy of a tensor's bytes (sizes not a multiple
    of 4 bytes), and its byte count."""
    raw = t.detach().reshape(-1).view(torch.uint8).numpy()
    buf = np.zeros((raw.size + 3) // 4, np.float32)
    buf.view(np.uint8)[: raw.size] = raw
    return buf, raw.size


def _one(tensors, what):
    if len(tensors) != 1:
        raise ValueError(
            f"gradlane: {what} takes one tensor per process (CPU), got {len(tensors)}"
        )
    return tensors[0]


# ------------------------------------------------------------- the group


class GradlaneProcessGroup(OpsMixin, PointToPointMixin, SparseMixin, dist.ProcessGroup):
    """A torch ProcessGroup whose collectives run on a :class:`gradlane.Group`.

    Made by :func:`create_process_group` (the creator torch calls for
    ``init_process_group("gradlane")`` and ``new_group(backend="gradlane")``);
    ``group`` is the joined :class:`gradlane.Group` it owns and closes.
    """

    def __init__(self, group: gradlane.Group, rank: int, size: int, asynchronous: bool = True):
        super().__init__(rank, size)
        self.group = group
        #: False: each call returns once its collective is done (and raises
        #: its error), as gradlane's backend did before it was asynchronous.
        self.asynchronous = asynchronous
        self._rank = rank
        self._size = size
        self._group_name = ""
        self._group_desc = ""
        self._stager = Stager()
        #: The store the group was made with (create_process_group sets
        #: it), for split_group.
        self._store = None
        self._order = IssueOrder(f"gradlane-pg{rank}")
        _GROUPS.add(self)

    # --- identity
    def getBackendName(self):
        return BACKEND_NAME

    def getRank(self):
        return self._rank

    def getSize(self):
        return self._size

    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        return self._group_name

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return self._group_desc

    def __repr__(self):
        return f"GradlaneProcessGroup(rank={self._rank}, size={self._size})"

    # --- issuing
    def _run(self, op, tensors, reads, writes, body, result) -> GradlaneWork:
        """Issues ``body`` (the collective ``op`` on CPU tensors) on ``tensors``:
        queued behind the collectives issued before it, staged through host
        buffers when they are CUDA tensors (``reads`` and ``writes`` say
        which the collective reads and writes). The Work holds ``result``."""
        # Non-contiguous CPU tensors run as contiguous copies, copied back
        # into the ones the collective writes once it is done.
        tensors, back = contiguous_copies(tensors, writes)
        staged = None
        if self._stager.needs_staging(tensors):
            staged = self._stager.call(tensors, reads, writes)
        device = staged.device if staged is not None else torch.device("cpu")
        work = GradlaneWork(future_for(device), result, op)

        def job():
            try:
                if staged is None:
                    body(tensors)
                else:
                    staged.wait_copied_in()
                    body(staged.host)
                    staged.finish()
                for original, copy in back:
                    original.copy_(copy)
            except BaseException as e:  # noqa: BLE001 - handed over through the Work
                if staged is not None:
                    staged.abandon()
                work._fail(e)
                self._order.failed(e)
                return
            work._succeed(staged)

        try:
            self._order.submit(job)
        except BaseException:
            if staged is not None:
                staged.abandon()
            raise
        if not self.asynchronous:
            work.wait()
        return work

    # --- reductions (float32, bfloat16, float16)
    def allreduce(self, tensors, opts=None):
        """Reduces each tensor over the ranks in place (any dtype and op of
        the module's list), or one sparse COO tensor (SUM); every rank
        ends with the same bits."""
        if any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in tensors):
            return self._sparse_allreduce(tensors, opts)
        return self._reduce_any(tensors, opts, "allreduce")

    def allreduce_coalesced(self, tensors, opts=None):
        return self._reduce_any(tensors, opts, "allreduce_coalesced", coalesced=True)

    def _allreduce(self, tensors, op):
        plans = [(None, op)] * len(tensors)
        return self._allreduce_planned(tensors, plans, op, tensors)

    def _allreduce_planned(self, tensors, plans, op, result):
        """Reduces each tensor as its plan (_ops.reduction_plan) says: the
        float path (None, op) or the typed one (dtype, op)."""
        def body(host):
            for t, (typed, name) in zip(host, plans, strict=True):
                if typed is not None:
                    self.group.allreduce_typed(byte_view(t), typed, name)
                else:
                    view, dtype = values_view(t)
                    self.group.allreduce(view, op=name, dtype=dtype)
                contributors = self.group.contributors
                # Integer sums are counts: the survivors' is the answer.
                real = t.is_floating_point() or t.is_complex()
                if name == "sum" and contributors < self._size and real:
                    # Ranks died (GRADLANE_ON_RANK_FAILURE=continue): DDP
                    # divided every gradient by the world it started with,
                    # so the sum of the survivors' is scaled to the world's,
                    # and the step is their mean.
                    t.mul_(self._size / contributors)

        every = [True] * len(tensors)
        return self._run("allreduce", tensors, every, every, body, result)

    def reduce_scatter_single(self, output, input, opts=None):
        """``input`` holds ``size`` equal parts; rank r's ``output`` becomes
        the sum (or mean, ReduceOp.AVG) of every rank's part r."""
        op = self._check_reduce_scatter(output, input, opts)
        return self._run(
            "reduce_scatter",
            [output, input],
            [False, True],
            [True, False],
            lambda h: self._reduce_scatter_host(h[0], h[1], op),
            [output],
        )

    _reduce_scatter_base = reduce_scatter_single

    def _check_reduce_scatter(self, output, input, opts):
        op = typed_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter")
        _check_tensor(input, "reduce_scatter input", reduce=False)
        _check_tensor(output, "reduce_scatter output", reduce=False)
        if input.dtype != output.dtype:
            raise TypeError(
                f"gradlane: reduce_scatter input is {input.dtype}, its output {output.dtype}"
            )
        if input.numel() != output.numel() * self._size:
            raise ValueError(
                f"gradlane: reduce_scatter input has {input.numel()} values, needs "
                f"{output.numel()} x {self._size} ranks = {output.numel() * self._size}"
            )
        return reduction_plan(output, op, "reduce_scatter output")

    def _reduce_scatter_host(self, output, input, plan):
        typed, op = plan
        if typed is not None:
            inb, outb = byte_view(input), byte_view(output)
            if np.shares_memory(inb, outb):
                inb = inb.copy()
            self.group.reduce_scatter_typed(inb, outb, typed, op)
            return
        (inv, dtype), (outv, _) = values_view(input), values_view(output)
        if np.shares_memory(inv, outv):
            inv = inv.copy()  # in place: the Group takes separate buffers
        self.group.reduce_scatter(inv, outv, op=op, dtype=dtype)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """Each rank's ``input_tensors[0]`` is a list of ``size`` tensors;
        rank r's output is the reduction of every rank's r-th one. The
        parts are concatenated into one buffer (a copy)."""
        output = _one(output_tensors, "reduce_scatter")
        inputs = _one(input_tensors, "reduce_scatter")
        _check_tensor(output, "reduce_scatter output", reduce=False)
        if len(inputs) != self._size:
            raise ValueError(
                f"gradlane: reduce_scatter takes {self._size} input tensors, got {len(inputs)}"
            )
        for i, t in enumerate(inputs):
            _check_tensor(t, f"reduce_scatter input {i}", reduce=False)
            if t.numel() != output.numel():
                raise ValueError(
                    f"gradlane: reduce_scatter input {i} has {t.numel()} values, "
                    f"the output {output.numel()}"
                )
        flat = torch.cat([t.reshape(-1) for t in inputs])
        return self.reduce_scatter_single(output, flat, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        ops = [self._check_reduce_scatter(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        n = len(outputs)

        def body(host):
            for k, op in enumerate(ops):
                self._reduce_scatter_host(host[k], host[n + k], op)

        return self._run(
            "reduce_scatter_coalesced",
            list(outputs) + list(inputs), [False] * n + [True] * n, [True] * n + [False] * n,
            body, outputs,
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # --- data movement (any dtype, bit for bit)
    def broadcast(self, tensors, opts=None):
        """Makes each tensor on every rank equal to rank ``opts.rootRank``'s."""
        root = opts.rootRank if opts is not None else 0
        for i, t in enumerate(tensors):
            _check_tensor(t, f"broadcast tensor {i}", reduce=False)

        def body(host):
            for t in host:
                view = _bytes_view(t)
                if view is not None:
                    self.group.broadcast(root, view)
                else:
                    buf, n = _padded(t)
                    self.group.broadcast(root, buf)
                    t.detach().reshape(-1).view(torch.uint8).copy_(
                        torch.from_numpy(buf.view(np.uint8)[:n])
                    )

        # The root's tensors are read, every other rank's written.
        mine = [self._rank == root] * len(tensors)
        theirs = [self._rank != root] * len(tensors)
        return self._run("broadcast", tensors, mine, theirs, body, tensors)

    def all_gather_single(self, output, input, opts=None):
        """``output`` (``size`` times ``input``'s values, same dtype) becomes
        every rank's ``input`` in rank order."""
        self._check_all_gather(output, input)
        return self._run(
            "allgather",
            [output, input], [False, True], [True, False],
            lambda h: self._all_gather_host(h[0], h[1]), [output],
        )

    _allgather_base = all_gather_single

    def _check_all_gather(self, output, input):
        _check_tensor(input, "allgather input", reduce=False)
        _check_tensor(output, "allgather output", reduce=False)
        if output.dtype != input.dtype:
            raise TypeError(
                f"gradlane: allgather output is {output.dtype}, its input {input.dtype}"
            )
        if output.numel() != input.numel() * self._size:
            raise ValueError(
                f"gradlane: allgather output has {output.numel()} values, needs "
                f"{input.numel()} x {self._size} ranks = {input.numel() * self._size}"
            )

    def _all_gather_host(self, output, input):
        inv, outv = _bytes_view(input), _bytes_view(output)
        if inv is not None:
            if np.shares_memory(inv, outv):
                # In place (FSDP2 gathers from its own slot of the output):
                # the Group takes separate buffers, so the input is copied.
                inv = inv.copy()
            self.group.allgather(inv, outv)
        else:
            buf, n = _padded(input)
            gathered = np.empty(buf.size * self._size, np.float32)
            self.group.allgather(buf, gathered)
            parts = gathered.view(np.uint8).reshape(self._size, -1)[:, :n]
            output.detach().reshape(-1).view(torch.uint8).copy_(
                torch.from_numpy(np.ascontiguousarray(parts).reshape(-1))
            )

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs, strict=True):
            self._check_all_gather(o, i)
        n = len(outputs)

        def body(host):
            for k in range(n):
                self._all_gather_host(host[k], host[n + k])

        return self._run(
            "allgather_coalesced",
            list(outputs) + list(inputs), [False] * n + [True] * n, [True] * n + [False] * n,
            body, outputs,
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[0]`` (a list of ``size`` tensors shaped like
        ``input_tensors[0]``) becomes every rank's input, in rank order."""
        outputs = _one(output_tensors, "allgather")
        input = _one(input_tensors, "allgather")
        if len(outputs) != self._size:
            raise ValueError(
                f"gradlane: allgather takes {self._size} output tensors, got {len(outputs)}"
            )
        _check_tensor(input, "allgather input", reduce=False)
        for i, o in enumerate(outputs):
            _check_tensor(o, f"allgather output {i}", reduce=False)
            if o.numel() != input.numel() or o.dtype != input.dtype:
                raise ValueError(
                    f"gradlane: allgather output {i} is {o.numel()} x {o.dtype}, "
                    f"the input {input.numel()} x {input.dtype}"
                )

        def body(host):
            flat = torch.empty(input.numel() * self._size, dtype=input.dtype)
            self._all_gather_host(flat, host[0].reshape(-1))
            for o, part in zip(host[1:], flat.chunk(self._size), strict=True):
                o.copy_(part.view(o.shape))

        n = len(outputs)
        return self._run(
            "allgather",
            [input, *outputs], [True] + [False] * n, [False] + [True] * n, body, output_tensors
        )

    # --- synchronization
    def barrier(self, opts=None):
        """Completes once every rank has called barrier (and every
        collective issued before it has run)."""
        return self._run("barrier", [], [], [], lambda _: self.group.barrier(), [])

    def shutdown(self):
        """Runs the collectives issued so far, gives the sends and
        receives already posted SHUTDOWN_GRACE seconds, then closes the
        gradlane Group (the links to the other ranks): a receive still
        waiting fails with GroupClosedError. Returns once none of the
        group's threads runs (gradlane.torch._job_threads)."""
        self._order.close()
        self._stop_lanes(SHUTDOWN_GRACE, self.group.close)
        self.group.close()

    def abort(self):
        """Closes the gradlane Group as soon as the collective in flight
        (if any) ends: the queued ones, and the sends and receives still
        waiting, fail with GroupClosedError."""
        self.group.close()
        self._order.close()
        self._stop_lanes(0.0, self.group.close)


delegate_cpu_ops(GradlaneProcessGroup)

#: Live process groups, for the hook to find the Group of one.
_GROUPS: weakref.WeakSet[GradlaneProcessGroup] = weakref.WeakSet()


# ------------------------------------------------------------ rendezvous


def create_process_group(store, rank, size, timeout) -> GradlaneProcessGroup:
    """The creator torch calls for backend "gradlane": ``(store, rank, size,
    timeout)``.

    Rendezvous through ``store``: rank 0 listens on MASTER_ADDR (default
    127.0.0.1) at a free UDP port and sets ``gradlane/root`` to that
    "ip:port"; the other ranks read it and listen on GRADLANE_RANK_ADDR
    (an "ip:port" or an IP; default 0.0.0.0:0). Certificates from
    GRADLANE_CERT_DIR. Forming the group may take ``timeout``, and at
    least MIN_JOIN_TIMEOUT (its QUIC handshakes on a loaded host take
    longer than a collective's short bound), or GRADLANE_JOIN_TIMEOUT
    seconds where that is set. GRADLANE_IDLE_TIMEOUT
    (seconds, default 30) is how long after its last packet a rank that
    stopped answering counts as dead.
    GRADLANE_ON_RANK_FAILURE says what happens then: ``fail`` (default)
    raises a GroupError naming the rank that went away on every rank;
    ``continue`` goes on with the survivors (docs/DESIGN.md, "Elastic
    membership"). GRADLANE_REJOIN=1 starts a replacement for a rank the
    others went on without: it joins at their next
    :func:`gradlane.torch.elastic.admit`, through whichever member answers
    at the address it published in the store (so the store must outlive
    the rank replaced: with torch's default env:// store, rank 0 holds it;
    a file store or torchrun's rendezvous does not need it).
    GRADLANE_ASYNC=0 makes each call wait for its collective.
    ``timeout`` also bounds every collective: one that waits longer for
    a rank raises :class:`gradlane.CollectiveTimeoutError` naming it (with
    ``continue``, that rank is removed instead, as a dead one is).
    """
    cert_dir = cert_dir_from_env()
    if isinstance(timeout, datetime.timedelta):
        collective_timeout = timeout.total_seconds()
    else:
        collective_timeout = float(timeout) if timeout else None
    if collective_timeout is not None and collective_timeout <= 0:
        collective_timeout = None  # torch's "no timeout"
    join_timeout = join_timeout_from_env() or max(
        collective_timeout or MIN_JOIN_TIMEOUT, MIN_JOIN_TIMEOUT
    )
    rejoin = rejoin_from_env()
    root = addresses = None
    if rejoin:
        # Through every member's address, not rank 0's alone: any member
        # that answers admits this rank, so rank 0 may be the one it
        # replaces (where the store outlives it).
        addresses = _addresses_from_store(store, rank, size)
        listen = None
    elif rank == 0:
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        try:
            ip = socket.gethostbyname(host)
        except OSError as e:
            raise ValueError(f"gradlane: MASTER_ADDR {host!r} does not resolve: {e}") from e
        root = f"{ip}:{_free_udp_port(ip)}"
        store.set(ROOT_KEY, root)
        listen = root
    else:
        root = store.get(ROOT_KEY).decode()
        listen = rank_listen_from_env()
    group = gradlane.Group(
        rank,
        size,
        root=root,
        addresses=addresses,
        listen=listen or "0.0.0.0:0",
        cert_dir=cert_dir,
        join_timeout=join_timeout,
        idle_timeout=idle_timeout_from_env(),
        on_rank_failure=on_rank_failure_from_env(),
        rejoin=rejoin,
        collective_timeout=collective_timeout,
    )
    store.set(f"{ADDRESS_KEY}/{rank}", group.addresses[rank])
    pg = GradlaneProcessGroup(group, rank, size, asynchronous=asynchronous_from_env())
    pg._store = store
    return pg


def _create_extended(opts, backend_options=None) -> GradlaneProcessGroup:
    """The creator torch calls (its extended API: the options carry the
    group being built). Where that group already has a CPU backend of
    another kind ("cpu:gloo,cuda:gradlane"), CPU tensors go to it."""
    pg = create_process_group(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    outer = getattr(opts, "process_group", None)
    if outer is not None:
        try:
            pg._cpu_backend = outer._get_backend(torch.device("cpu"))
        except RuntimeError:
            pass  # no other CPU backend: gradlane takes CPU tensors
    return pg



def _register():
    """The entry point torch calls (group ``torch.distributed.backends``,
    name "gradlane"): registers the backend for CPU and CUDA tensors."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_extended, extended_api=True, devices=["cpu", "cuda"]
    )


def issue_order_of(group: gradlane.Group) -> IssueOrder | None:
    """The thread that runs the collectives of the torch process group
    whose :class:`gradlane.Group` is ``group``, if one has it."""
    for g in list(_GROUPS):
        if g.group is group:
            return g._order
    return None


def gradlane_group_of(pg) -> gradlane.Group | None:
    """The :class:`gradlane.Group` under a torch process group of backend
    "gradlane" (or the default group when ``pg`` is None), else None."""
    if pg is None:
        if not dist.is_initialized():
            return None
        pg = dist.distributed_c10d._get_default_group()
    if isinstance(pg, GradlaneProcessGroup):
        return pg.group
    for g in list(_GROUPS):
        if g is pg:
            return g.group
    return None
