"""Point-to-point for the gradlane process group: send, recv and
recv_anysource (torch's isend, irecv, send, recv and batch_isend_irecv
come through them), on :meth:`gradlane.Group.send` and
:meth:`gradlane.Group.recv`.

A send or a receive does not join the collectives' issue order: two ranks
exchange whenever they choose, and torch lets a rank post an ``irecv``,
run collectives, and wait for it later, or post sends and receives to
each other at once (``batch_isend_irecv``, a pipeline schedule). Each
runs on a lane of its own instead: a thread that runs, in the order they
were posted, the sends to one peer, or the receives from one source with
one tag. So messages keep torch's order per peer and tag, a receive
waiting for its message holds up nothing else, and the Group's
point-to-point messages run beside its collectives (they never take the
Group's lock).

A message is the tensor's bytes; the receiving tensor must have the same
size in bytes (else a ValueError through the Work). Any dtype; a
non-contiguous tensor goes through a contiguous copy; CUDA tensors are
staged through host buffers as the collectives' are.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading

import torch

from gradlane.torch._job_threads import joined, stop_and_join, track
from gradlane.torch._staging import future_for
from gradlane.torch._work import GradlaneWork

log = logging.getLogger(__name__)

#: Seconds a lane gets to end once its Group is closed (a receive waiting
#: on it fails at once then).
LANE_CLOSE_WAIT = 10.0


class PointToPointWork(GradlaneWork):
    """A send's or a receive's Work; a receive's also says where its
    message came from (``dist.recv`` with no source asks it)."""

    def __init__(self, future, result, op):
        super().__init__(future, result, op)
        self.source = -1

    def _source_rank(self):
        self.wait()
        return self.source

    def source_rank(self):
        return self._source_rank()


class _Lane:
    """Runs the jobs given to it one at a time, in order: on a daemon
    thread of its own (made at the first job put to it), or on the
    caller's thread where the caller is about to wait for it anyway
    (:meth:`run_now`)."""

    def __init__(self, name: str):
        self._name = name
        self._jobs: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self._turn = threading.Condition()
        self._given = 0
        #: Every job up to this one has ended.
        self._ended = 0
        self._stopped = False

    def _take_turn(self) -> int:
        with self._turn:
            self._check_running()
            self._given += 1
            return self._given

    def _check_running(self) -> None:
        if self._stopped:
            raise RuntimeError(f"gradlane: {self._name} is shut down; no send or receive runs")

    def _wait_turn(self, turn: int) -> None:
        with self._turn:
            self._turn.wait_for(lambda: self._ended == turn - 1)

    def _end_turn(self, turn: int) -> None:
        with self._turn:
            self._ended = turn
            self._turn.notify_all()

    def put(self, job) -> None:
        """Runs ``job`` on the lane's thread once the jobs before it ended."""
        # One lock for the turn and the queue: the thread takes jobs in the
        # order of their turns.
        with self._turn:
            self._check_running()
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._run, args=(self._jobs,), name=self._name, daemon=True
                )
                self._thread.start()
                track(self)
            self._given += 1
            self._jobs.put((self._given, job))

    def run_now(self, job) -> None:
        """Runs ``job`` here, once the jobs before it ended."""
        turn = self._take_turn()
        self._wait_turn(turn)
        try:
            job()
        finally:
            self._end_turn(turn)

    def _run(self, jobs) -> None:
        while True:
            item = jobs.get()
            if item is None:
                return
            turn, job = item
            self._wait_turn(turn)
            try:
                job()
            except BaseException:  # noqa: BLE001 - a job completes its own Work
                # The lane runs on: the jobs behind this one still have
                # Works to complete.
                log.exception("gradlane: a job on %s raised", self._name)
            finally:
                self._end_turn(turn)

    def stop(self) -> None:
        """Lets the jobs given so far run, then ends the thread; a later
        :meth:`put` or :meth:`run_now` raises."""
        with self._turn:
            if self._stopped:
                return
            self._stopped = True
            if self._jobs is not None:
                self._jobs.put(None)

    def join(self, timeout: float | None) -> bool:
        """Waits for the thread to end after :meth:`stop` (``joined``)."""
        return joined(self._thread, timeout)

    def __repr__(self) -> str:
        return f"_Lane({self._name!r})"


def _blocking_call() -> bool:
    """Whether torch's blocking ``dist.send`` or ``dist.recv`` (not
    ``isend``/``irecv`` alone) is the caller: it waits for the Work at
    once, so the op may run on its thread, sparing a hand-over to the
    lane's thread and back. torch's send and recv go through its isend
    and irecv."""
    torch_module = "torch.distributed.distributed_c10d"
    frame = sys._getframe(1)
    for _ in range(8):
        frame = frame.f_back
        if frame is None:
            return False
        module = frame.f_globals.get("__name__", "")
        if module == torch_module:
            if frame.f_code.co_name in ("isend", "irecv"):
                frame = frame.f_back
                if frame is None or frame.f_globals.get("__name__") != torch_module:
                    return False
            return frame.f_code.co_name in ("send", "recv")
        if not module.startswith("gradlane."):
            return False
    return False


def _flat_bytes(t: torch.Tensor):
    """A contiguous CPU tensor's bytes as a flat numpy uint8 view."""
    return t.detach().reshape(-1).view(torch.uint8).numpy()


class PointToPointMixin:
    """send, recv and recv_anysource of GradlaneProcessGroup (which gives
    ``group``, ``_rank``, ``_size``, ``_stager`` and ``asynchronous``)."""

    def _lane(self, key) -> _Lane:
        """The lane of ``key``, made at its first job; after
        :meth:`_stop_lanes`, a RuntimeError."""
        lanes = self.__dict__.setdefault("_p2p_lanes", {})
        lock = self.__dict__.setdefault("_p2p_lock", threading.Lock())
        with lock:
            if self.__dict__.get("_p2p_stopped"):
                raise RuntimeError(
                    f"gradlane: rank {self._rank}'s process group is shut down; no send or "
                    "receive runs"
                )
            lane = lanes.get(key)
            if lane is None:
                lane = lanes[key] = _Lane(f"gradlane-pg{self._rank}-{key[0]}")
            return lane

    def _stop_lanes(self, grace: float, close) -> None:
        """Stops every lane, gives the jobs already given them ``grace``
        seconds, then calls ``close`` (a receive still waiting fails) and
        waits for the lanes to end: none may still complete a Work once
        the interpreter ends (gradlane.torch._job_threads). Later sends
        and receives raise."""
        lock = self.__dict__.setdefault("_p2p_lock", threading.Lock())
        with lock:
            self.__dict__["_p2p_stopped"] = True
            lanes = list(self.__dict__.get("_p2p_lanes", {}).values())
        running = stop_and_join(lanes, grace, close, LANE_CLOSE_WAIT)
        for lane in running:
            log.warning("gradlane: %r still runs after its group closed", lane)

    def _check_peer(self, what: str, rank: int) -> None:
        if not 0 <= rank < self._size or rank == self._rank:
            raise ValueError(
                f"gradlane: {what} {rank} is not another rank of this group of {self._size} "
                f"(this is rank {self._rank})"
            )

    def _one_tensor(self, tensors, op):
        if len(tensors) != 1:
            raise ValueError(f"gradlane: {op} takes one tensor, not {len(tensors)}")
        t = tensors[0]
        if t.is_sparse or t.layout != torch.strided:
            raise NotImplementedError(
                f"gradlane: {op} tensor has layout {t.layout}; gradlane implements dense "
                "tensors only"
            )
        return t

    def _point_to_point(self, op, tensor, key, body, reads, writes) -> PointToPointWork:
        """Runs ``body(cpu_tensor, work)`` on the lane ``key``: on the
        tensor itself, a contiguous copy of it (copied back if written), or
        its staged host buffer. ``reads`` and ``writes`` (one flag each)
        say whether the op reads or writes the tensor."""
        target = tensor if tensor.is_contiguous() else tensor.contiguous()
        staged = None
        if self._stager.needs_staging([target]):
            staged = self._stager.call([target], reads, writes)
        device = staged.device if staged is not None else torch.device("cpu")
        work = PointToPointWork(future_for(device), [tensor], op)

        def job():
            try:
                if staged is None:
                    body(target, work)
                else:
                    staged.wait_copied_in()
                    body(staged.host[0], work)
                    staged.finish()
                if target is not tensor and writes[0]:
                    tensor.copy_(target)
            except BaseException as e:  # noqa: BLE001 - handed over through the Work
                if staged is not None:
                    staged.abandon()
                work._fail(e)
                return
            work._succeed(staged)

        lane = self._lane(key)
        if _blocking_call() and staged is None:
            lane.run_now(job)
        else:
            lane.put(job)
        if not self.asynchronous:
            work.wait()
        return work

    def send(self, tensors, dstRank, tag=0):
        """Sends the tensor's bytes to ``dstRank`` (torch's send and isend)."""
        t = self._one_tensor(tensors, "send")
        self._check_peer("send: destination", dstRank)

        def body(host, work):
            self.group.send(dstRank, tag, _flat_bytes(host))

        return self._point_to_point("send", t, ("send", dstRank), body, [True], [False])

    def recv(self, tensors, srcRank, tag=0):
        """Receives ``srcRank``'s next message with ``tag`` into the tensor
        (torch's recv and irecv)."""
        t = self._one_tensor(tensors, "recv")
        self._check_peer("recv: source", srcRank)
        return self._receive(t, srcRank, tag)

    def recv_anysource(self, tensors, tag=0):
        """Receives the next message with ``tag`` from any rank; the Work's
        ``_source_rank()`` says which."""
        t = self._one_tensor(tensors, "recv")
        return self._receive(t, None, tag)

    def _receive(self, t, source, tag):
        def body(host, work):
            work.source = self.group.recv(source, tag, _flat_bytes(host))

        return self._point_to_point("recv", t, ("recv", source, tag), body, [False], [True])
