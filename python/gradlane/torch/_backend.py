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
ranks that did not come, as gloo's. Those ops live in gradlane.torch._ops,
the checks and views of their tensors in gradlane.torch._tensors. The
group reports devices cpu and cuda and splits (split_group).
send, recv and recv_anysource (isend, irecv, batch_isend_irecv) run
beside the collectives, not in their order (gradlane.torch._p2p).
allreduce takes a sparse COO tensor too (SUM, as gloo; _sparse).
What gradlane does not do (other sparse ops, coalescing blocks, windows)
is a NotImplementedError naming it. Bad input is a TypeError or a ValueError
naming the tensor and what is wrong with it.
"""

from __future__ import annotations

import datetime
import sys
import weakref

import numpy as np
import torch
import torch.distributed as dist

import gradlane
from gradlane.torch._environment import asynchronous_from_env
from gradlane.torch._issue_order import IssueOrder
from gradlane.torch._ops import OpsMixin, delegate_cpu_ops
from gradlane.torch._p2p import PointToPointMixin
from gradlane.torch._rendezvous import join_through_store
from gradlane.torch._sparse import SparseMixin
from gradlane.torch._staging import Stager, future_for
from gradlane.torch._tensors import (
    apart,
    byte_view,
    check_parts,
    check_tensor,
    check_whole,
    contiguous_copies,
    one,
    padded_words,
    reduction_plan,
    typed_op,
    values_view,
    word_view,
)
from gradlane.torch._work import GradlaneWork

BACKEND_NAME = "gradlane"
#: Seconds shutdown (destroy_process_group) gives the sends and receives
#: already posted before it closes the Group under them.
SHUTDOWN_GRACE = 2.0


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

    # --- torch's plumbing
    @property
    def _device_types(self):
        """The devices the group takes tensors on: torch asks before a
        monitored_barrier (which needs "cpu") and when it splits."""
        # torch's flight recorder attaches to a group with devices, through
        # C++ state a Python ProcessGroup does not have (it fails there;
        # torch's own comment says such a group cannot be recorded): to it,
        # the group has none, as before.
        if sys._getframe(1).f_code.co_name == "_maybe_attach_flight_recorder":
            return []
        return [torch.device("cpu"), torch.device("cuda")]

    def _get_backend(self, device=None):
        """The group is its own backend on every device it takes."""
        return self

    get_backend = _get_backend

    @property
    def supports_splitting(self):
        """split_group makes a new gradlane group of the ranks it names."""
        return True

    def split_group(
        self, ranks, timeout=None, opts=None, group_name=None, group_desc=None, device_types=None
    ):
        """A new gradlane group of ``ranks`` (ranks of this group), joined
        through this group's store; None on a rank not among them."""
        if self._rank not in ranks:
            return None
        if self._store is None:
            raise NotImplementedError(
                "gradlane: split_group needs the store the group was made with"
            )
        store = dist.PrefixStore(f"gradlane-split/{group_name}", self._store)
        if timeout is None:
            timeout = datetime.timedelta(minutes=30)
        pg = create_process_group(store, list(ranks).index(self._rank), len(ranks), timeout)
        if group_name:
            pg.setGroupName(group_name)
        if group_desc:
            pg.setGroupDesc(group_desc)
        return pg

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

    def _run_moving(self, op, ins, outs, body, result) -> GradlaneWork:
        """:meth:`_run` for a collective that reads ``ins`` and writes
        ``outs``: ``body`` gets their host tensors in that order."""
        reads = [True] * len(ins) + [False] * len(outs)
        return self._run(op, [*ins, *outs], reads, [not r for r in reads], body, result)

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
        return self._run_moving(
            "reduce_scatter", [input], [output],
            lambda h: self._reduce_scatter_host(h[1], h[0], op), [output],
        )

    _reduce_scatter_base = reduce_scatter_single

    def _check_reduce_scatter(self, output, input, opts):
        op = typed_op(opts, "reduce_scatter")
        check_whole(input, output, self._size, "reduce_scatter", "input", "output")
        return reduction_plan(output, op, "reduce_scatter output")

    def _reduce_scatter_host(self, output, input, plan):
        typed, op = plan
        if typed is not None:
            outb = byte_view(output)
            (inb,) = apart([byte_view(input)], [outb])
            self.group.reduce_scatter_typed(inb, outb, typed, op)
            return
        (inv, dtype), (outv, _) = values_view(input), values_view(output)
        (inv,) = apart([inv], [outv])
        self.group.reduce_scatter(inv, outv, op=op, dtype=dtype)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """Each rank's ``input_tensors[0]`` is a list of ``size`` tensors;
        rank r's output is the reduction of every rank's r-th one. The
        parts are concatenated into one buffer (a copy)."""
        output = one(output_tensors, "reduce_scatter output")
        check_tensor(output, "reduce_scatter output")
        inputs = one(input_tensors, "reduce_scatter input list")
        inputs = check_parts(inputs, output, self._size, "reduce_scatter", "input", "output")
        flat = torch.cat([t.reshape(-1) for t in inputs])
        return self.reduce_scatter_single(output, flat, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        ops = [self._check_reduce_scatter(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        n = len(outputs)

        def body(host):
            for k, op in enumerate(ops):
                self._reduce_scatter_host(host[n + k], host[k], op)

        return self._run_moving("reduce_scatter_coalesced", inputs, outputs, body, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # --- data movement (any dtype, bit for bit)
    def broadcast(self, tensors, opts=None):
        """Makes each tensor on every rank equal to rank ``opts.rootRank``'s."""
        root = opts.rootRank if opts is not None else 0
        for i, t in enumerate(tensors):
            check_tensor(t, f"broadcast tensor {i}")

        def body(host):
            for t in host:
                view = word_view(t)
                if view is not None:
                    self.group.broadcast(root, view)
                else:
                    buf, n = padded_words(t)
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
        check_whole(output, input, self._size, "allgather", "output", "input")
        return self._run_moving(
            "allgather", [input], [output], lambda h: self._all_gather_host(h[1], h[0]), [output]
        )

    _allgather_base = all_gather_single

    def _all_gather_host(self, output, input):
        inv, outv = word_view(input), word_view(output)
        if inv is not None:
            # In place (FSDP2 gathers from its own slot of the output):
            # the Group takes separate buffers, so the input is copied.
            (inv,) = apart([inv], [outv])
            self.group.allgather(inv, outv)
        else:
            buf, n = padded_words(input)
            gathered = np.empty(buf.size * self._size, np.float32)
            self.group.allgather(buf, gathered)
            parts = gathered.view(np.uint8).reshape(self._size, -1)[:, :n]
            output.detach().reshape(-1).view(torch.uint8).copy_(
                torch.from_numpy(np.ascontiguousarray(parts).reshape(-1))
            )

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs, strict=True):
            check_whole(o, i, self._size, "allgather", "output", "input")
        n = len(outputs)

        def body(host):
            for k in range(n):
                self._all_gather_host(host[n + k], host[k])

        return self._run_moving("allgather_coalesced", inputs, outputs, body, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather(self, output_tensors, input_tensors, opts=None):
        """``output_tensors[0]`` (a list of ``size`` tensors shaped like
        ``input_tensors[0]``) becomes every rank's input, in rank order."""
        input = one(input_tensors, "allgather input")
        check_tensor(input, "allgather input")
        outputs = one(output_tensors, "allgather output list")
        outputs = check_parts(outputs, input, self._size, "allgather", "output", "input")

        def body(host):
            flat = torch.empty(input.numel() * self._size, dtype=input.dtype)
            self._all_gather_host(flat, host[0].reshape(-1))
            for o, part in zip(host[1:], flat.chunk(self._size), strict=True):
                o.copy_(part.view(o.shape))

        return self._run_moving("allgather", [input], outputs, body, output_tensors)

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
    GRADLANE_CERT_DIR (gradlane.torch._rendezvous forms the group). Forming
    the group may take ``timeout``, and at least MIN_JOIN_TIMEOUT (its QUIC
    handshakes on a loaded host take
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
    pg = GradlaneProcessGroup(
        join_through_store(store, rank, size, timeout), rank, size,
        asynchronous=asynchronous_from_env(),
    )
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
