"""The gradlane backend's ops beyond allreduce, broadcast, allgather and
reduce_scatter on floats: the reductions over every dtype gloo reduces,
reduce, gather, scatter, all-to-all, the coalesced allgather,
monitored_barrier, a clear NotImplementedError for what gradlane does
not do, and the hand-over of CPU tensors to a CPU backend of another
kind ("cpu:gloo,cuda:gradlane").

:class:`OpsMixin` is a base of :class:`GradlaneProcessGroup`
(gradlane.torch._backend): its methods issue through the group's
``_run`` like the others, so they run in issue order on the group's
thread and CUDA tensors are staged the same way. The data moves as bytes
(a uint8 view of each contiguous tensor) through
:class:`gradlane.Group`'s gather, scatter, all_to_all, allreduce_typed,
reduce and reduce_scatter_typed; the checks and views are
gradlane.torch._tensors'.
"""

from __future__ import annotations

import datetime
import functools

import torch

import gradlane
from gradlane.torch._tensors import (
    TYPED_DTYPES,
    apart,
    byte_parts,
    byte_view,
    check_tensor,
    check_whole,
    one,
    real_view,
    reduction_plan,
    root_of,
    rooted_parts,
    same,
    splits,
    typed_op,
)


class OpsMixin:
    """The ops of issue 55, for :class:`GradlaneProcessGroup`."""

    #: The CPU backend of another kind the group was built beside
    #: ("cpu:gloo,cuda:gradlane"): CPU tensors go to it
    #: (:func:`delegate_cpu_ops`). None: gradlane takes CPU tensors too.
    _cpu_backend = None

    # --- reductions over every dtype
    def _reduce_any(self, tensors, opts, what, coalesced=False):
        op = typed_op(opts, what)
        views, plans = [], []
        for i, t in enumerate(tensors):
            check_tensor(t, f"{what} tensor {i}")
            v = real_view(t, op, f"{what} tensor {i}")
            plans.append(reduction_plan(v, op, f"{what} tensor {i}"))
            views.append(v)
        if coalesced and len({(t.dtype, t.device) for t in tensors}) > 1:
            raise TypeError(f"gradlane: {what} takes tensors of one dtype and device")
        return self._allreduce_planned(views, plans, op, result=tensors)

    def reduce(self, tensors, opts=None):
        """Reduces ``tensors[0]`` over the ranks into rank ``opts.rootRank``'s
        (any dtype and op allreduce takes); the others' stay as they were."""
        t = one(tensors, "reduce tensor")
        op = typed_op(opts, "reduce")
        root = root_of(opts, self._size)
        check_tensor(t, "reduce tensor")
        v = real_view(t, op, "reduce tensor")
        plan = reduction_plan(v, op, "reduce tensor")
        dtype, name = plan if plan[0] is not None else (TYPED_DTYPES[v.dtype], op)

        def body(host):
            self.group.reduce(root, byte_view(host[0]), dtype, name)

        mine = [self._rank == root]
        return self._run("reduce", [v], [True], mine, body, tensors)

    # --- data movement (any dtype, bit for bit)
    def gather(self, output_tensors, input_tensors, opts=None):
        """Rank ``opts.rootRank``'s ``output_tensors[0]`` (``size`` tensors
        like the input) becomes every rank's ``input_tensors[0]``, in rank
        order; the others pass no outputs."""
        root = root_of(opts, self._size)
        input, outputs = rooted_parts(
            input_tensors, output_tensors, at_root=self._rank == root, size=self._size,
            op="gather", one_what="input", parts_what="output",
        )

        def body(host):
            outs = [byte_view(o) for o in host[1:]] if self._rank == root else None
            (mine,) = apart([byte_view(host[0])], outs or [])
            self.group.gather(root, mine, outs)

        return self._run_moving("gather", [input], outputs, body, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        """Rank r's ``output_tensors[0]`` becomes the r-th of rank
        ``opts.rootRank``'s ``input_tensors[0]``; the others pass no inputs."""
        root = root_of(opts, self._size)
        output, inputs = rooted_parts(
            output_tensors, input_tensors, at_root=self._rank == root, size=self._size,
            op="scatter", one_what="output", parts_what="input",
        )

        def body(host):
            out = byte_view(host[-1])
            ins = apart([byte_view(t) for t in host[:-1]], [out]) if self._rank == root else None
            self.group.scatter(root, ins, out)

        return self._run_moving("scatter", inputs, [output], body, output_tensors)

    def gather_into_tensor(self, output, input, opts=None):
        """Rank ``opts.rootRank``'s ``output`` (``size`` times the input's
        values) becomes every rank's ``input`` in rank order."""
        root = root_of(opts, self._size)
        check_tensor(input, "gather input")
        outputs = []
        if self._rank == root:
            check_whole(output, input, self._size, "gather", "output", "input")
            outputs = [output]
        n = len(outputs)

        def body(host):
            outs = None
            if n:
                whole = byte_view(host[1])
                step = whole.size // self._size
                outs = [whole[r * step:(r + 1) * step] for r in range(self._size)]
            (mine,) = apart([byte_view(host[0])], outs or [])
            self.group.gather(root, mine, outs)

        return self._run_moving("gather", [input], outputs, body, [output])

    gather_single = gather_into_tensor

    def _wait_for_pending_works(self):
        """Waits for every collective issued so far."""
        self._run("flush", [], [], [], lambda _: None, []).wait()

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """all_to_all_single: ``input``'s rows (dim 0) split among the ranks
        by ``input_split_sizes`` (equal parts when empty) go to them; their
        parts for this rank fill ``output``'s rows, split likewise."""
        check_tensor(input, "all_to_all input")
        check_tensor(output, "all_to_all output")
        if input.dtype != output.dtype:
            raise TypeError(
                f"gradlane: all_to_all output is {output.dtype}, its input {input.dtype}"
            )
        in_rows = splits(input_split_sizes, input.shape[0] if input.dim() else 1,
                         self._size, "all_to_all input")
        out_rows = splits(output_split_sizes, output.shape[0] if output.dim() else 1,
                          self._size, "all_to_all output")
        in_row = input[0].numel() * input.element_size() if input.dim() and len(input) else 0
        out_row = output[0].numel() * output.element_size() if output.dim() and len(output) else 0
        if input.dim() == 0:
            in_row = out_row = input.element_size()

        def body(host):
            i, o = host
            outs = byte_parts(byte_view(o), out_rows, out_row)
            self.group.all_to_all(apart(byte_parts(byte_view(i), in_rows, in_row), outs), outs)

        return self._run_moving("all_to_all", [input], [output], body, [output])

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """all_to_all: ``input_tensors[r]`` goes to rank r; ``output_tensors[r]``
        becomes what rank r sent this one (any sizes, one dtype)."""
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise ValueError(
                f"gradlane: all_to_all takes {self._size} input and output tensors, got "
                f"{len(input_tensors)} and {len(output_tensors)}"
            )
        for i, t in enumerate([*input_tensors, *output_tensors]):
            check_tensor(t, f"all_to_all tensor {i}")
            if t.dtype != input_tensors[0].dtype:
                raise TypeError(f"gradlane: all_to_all tensors of several dtypes ({t.dtype})")
        n = self._size

        def body(host):
            outs = [byte_view(t) for t in host[n:]]
            self.group.all_to_all(apart([byte_view(t) for t in host[:n]], outs), outs)

        return self._run_moving("all_to_all", input_tensors, output_tensors, body, output_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """all_gather_coalesced: ``output_lists[r][k]`` becomes rank r's
        ``input_list[k]`` (``size`` lists, each shaped like the inputs)."""
        if len(output_lists) != self._size:
            raise ValueError(
                f"gradlane: allgather_coalesced takes {self._size} output lists, got "
                f"{len(output_lists)}"
            )
        for k, t in enumerate(input_list):
            check_tensor(t, f"allgather_coalesced input {k}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise ValueError(
                    f"gradlane: allgather_coalesced output list {r} has {len(outs)} tensors "
                    f"for {len(input_list)} inputs"
                )
            for k, (o, t) in enumerate(zip(outs, input_list, strict=True)):
                check_tensor(o, f"allgather_coalesced output {r}.{k}")
                same(o, t, f"allgather_coalesced output {r}.{k}", f"its input {k}")
        flat_outs = [o for outs in output_lists for o in outs]
        n = len(input_list)

        def body(host):
            for k in range(n):
                t = host[k]
                flat = torch.empty(t.numel() * self._size, dtype=t.dtype)
                self._all_gather_host(flat, t.reshape(-1))
                for r, part in enumerate(flat.chunk(self._size)):
                    o = host[n + r * n + k]
                    o.copy_(part.view(o.shape))

        return self._run_moving("allgather_coalesced", input_list, flat_outs, body, output_lists)

    # --- synchronization
    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """A barrier that names who did not come, as gloo's: rank 0 waits at
        most ``timeout`` for every other rank and raises a
        :class:`MonitoredBarrierError` saying "Rank r failed to pass
        monitoredBarrier in N ms" (``wait_all_ranks``: "Ranks r, s ..."). It
        blocks until then. After a failure the group is unusable (as after
        any timeout with GRADLANE_ON_RANK_FAILURE=fail); with ``continue``
        the silent ranks are removed instead and the barrier passes."""
        if timeout is None:
            seconds = 1800.0
        elif isinstance(timeout, datetime.timedelta):
            seconds = timeout.total_seconds()
        else:
            seconds = float(timeout)
        ms = int(seconds * 1000)
        if seconds <= 0:
            # gloo's: no time at all is a timeout at once, on this rank
            # alone (nothing is sent, so the ranks stay in step).
            raise MonitoredBarrierError(
                f"Rank {self._rank} timed out in monitoredBarrier after {ms} ms (gradlane)"
            )

        def not_released(e):
            # As gloo's: this rank came, rank 0 did not let it pass.
            err = MonitoredBarrierError(
                f"Rank {self._rank} successfully reached monitoredBarrier, but "
                f"received errors while waiting for send/recv from rank 0 (gradlane: {e})"
            )
            err.missing = [0]
            err.rank = 0
            return err

        def body(_):
            try:
                self.group.monitored_barrier(seconds)
            except gradlane.RankFailedError as e:
                # Rank 0 gave up on another rank and closed its links before
                # this rank's own wait ended (which is longer, or merely
                # later): the same failure as a timeout here.
                if self._rank != 0 and e.rank == 0:
                    raise not_released(e) from e
                raise
            except gradlane.CollectiveTimeoutError as e:
                missing = list(e.missing or [])
                if self._rank != 0:
                    raise not_released(e) from e
                if not missing:
                    raise
                if wait_all_ranks:
                    who = "Ranks " + ", ".join(str(r) for r in missing)
                else:
                    who = f"Rank {missing[0]}"
                err = MonitoredBarrierError(
                    f"{who} failed to pass monitoredBarrier in {ms} ms (gradlane)"
                )
                err.missing = missing
                err.rank = missing[0]
                raise err from e

        work = self._run("monitored_barrier", [], [], [], body, [])
        work.wait()
        return work

    # --- what gradlane does not do
    def _unsupported(self, op):
        raise NotImplementedError(f"gradlane: the gradlane backend does not implement {op}")

    def _register_on_completion_hook(self, hook):
        self._unsupported("completion hooks (_register_on_completion_hook)")

    def reconfigure(self, *args, **kwargs):
        self._unsupported("reconfigure")

    def get_reconfigure_handle(self, *args, **kwargs):
        self._unsupported("get_reconfigure_handle")

    @property
    def supports_abort_hooks(self):
        return False

    @property
    def supports_completion_hooks(self):
        return False

    @property
    def supports_window(self):
        return False

    def new_window(self, *args, **kwargs):
        self._unsupported("new_window (symmetric memory windows)")

    def merge_remote_group(self, *args, **kwargs):
        self._unsupported("merge_remote_group")

    def _start_coalescing(self, device=None):
        self._unsupported("coalescing (_start_coalescing)")

    def _end_coalescing(self, device=None):
        self._unsupported("coalescing (_end_coalescing)")


#: The ops a CPU backend of another kind takes for CPU tensors, and its
#: name for each where it differs.
DELEGATED = {
    name: name for name in [
        "allreduce", "allreduce_coalesced", "broadcast", "allgather", "_allgather_base",
        "all_gather_single", "all_gather_single_coalesced", "allgather_coalesced", "reduce",
        "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
        "reduce_scatter_single_coalesced", "gather", "gather_single", "gather_into_tensor",
        "scatter", "alltoall", "alltoall_base", "all_to_all_single", "send", "recv",
        "recv_anysource", "monitored_barrier",
    ]
}
DELEGATED["allgather_into_tensor_coalesced"] = "all_gather_single_coalesced"
DELEGATED["reduce_scatter_tensor_coalesced"] = "reduce_scatter_single_coalesced"


def _tensors_in(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors_in(a)


def delegate_cpu_ops(cls):
    """Wraps ``cls``'s ops so that, on a group with a ``_cpu_backend``,
    calls on CPU tensors (and monitored_barrier, a CPU op) go to it: in
    "cpu:gloo,cuda:gradlane" torch builds gloo for CPU first, then takes
    gradlane's Python ProcessGroup as the whole group, and gloo would
    otherwise be dropped."""
    for name, target in DELEGATED.items():
        method = getattr(cls, name, None)
        if method is None:
            continue

        def op(self, *args, _method=method, _name=name, _target=target, **kwargs):
            cpu = self._cpu_backend
            if cpu is not None:
                tensors = list(_tensors_in(args))
                if _name == "monitored_barrier" or (
                    tensors and all(t.device.type == "cpu" for t in tensors)
                ):
                    return getattr(cpu, _target)(*args, **kwargs)
            return _method(self, *args, **kwargs)

        setattr(cls, name, functools.wraps(method)(op))
    return cls


class MonitoredBarrierError(gradlane.CollectiveTimeoutError, RuntimeError):
    """Raised by monitored_barrier: on rank 0 when ranks did not come in
    time (``missing`` lists them, ``rank`` is the first), on the others
    when rank 0 did not let them pass (``rank`` is 0). A RuntimeError too,
    as gloo's error is."""
