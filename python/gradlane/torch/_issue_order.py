"""The thread that runs a gradlane Group's collectives, one at a time, in
the order they were issued.

Every rank must run the same collectives in the same order. A caller
issues a collective and goes on (DDP: the rest of backward); the
collective runs on this thread, which releases the GIL while the network
works.

A collective issued *on* this thread runs at once, inline. That is where
a completed collective's future runs its callbacks (torch runs a
future's callbacks on the thread that completes it), and torch's own
hooks issue collectives from callbacks and wait for them there (PowerSGD
allreduces P, then Q, inside its callbacks). Queued behind the running
job, such a collective would wait for itself. Run inline, it also keeps
the order the same on every rank: a callback's collectives run right
after the collective whose callbacks they are, before anything issued
later, whichever thread the callback ran on (a callback attached after
completion runs on the caller's thread, before the caller issues the
next collective).

A collective issued during a backward pass (DDP's reducer issues one per
bucket from autograd's hooks) also makes the end of that backward wait
for it and raise its error. DDP's reducer reads each bucket's future in
C++ once backward ends, and torch's ``Future.set_exception`` from Python
completes a future with the exception as its *value*: the reducer took
that value for the bucket's tensors and crashed the process. A callback
queued on autograd's engine runs before the reducer's (the reducer queues
its own after its last bucket's collective), waits for every collective
issued so far, and raises the first error one of them reported since: the
engine hands a Python exception raised there to the caller of
``backward()`` as itself (a :class:`gradlane.RankFailedError`, not a
RuntimeError), and the reducer never reads the failed future.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from gradlane.torch._job_threads import joined, track

log = logging.getLogger(__name__)

#: Backward passes watched at once, at most (see _watch_backward).
MAX_WATCHED_BACKWARDS = 64


class _Backward:
    """One backward pass that issued collectives: the first error any job
    reported while it was watched."""

    __slots__ = ("graph_task", "error")

    def __init__(self, graph_task: int):
        self.graph_task = graph_task
        self.error: BaseException | None = None


def _graph_task() -> int:
    """The id of the backward pass running on this thread, or -1."""
    import torch

    return torch._C._current_graph_task_id()


def _queue_at_backward_end(callback: Callable[[], None]) -> None:
    from torch.autograd import Variable

    Variable._execution_engine.queue_callback(callback)


class IssueOrder:
    """Runs jobs one at a time in submission order on a thread of its own
    (started by the first job); a job submitted from that thread runs at
    once. A job reports its own outcome (it completes a future); an
    exception escaping one is logged and the thread goes on."""

    def __init__(self, name: str):
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        #: The backward passes that issued collectives and have not ended.
        self._backwards: list[_Backward] = []

    def on_thread(self) -> bool:
        """Whether the caller is this order's thread (inside a job)."""
        return threading.current_thread() is self._thread

    def submit(self, job: Callable[[], None]) -> None:
        """Runs ``job`` after every job submitted before it, or now when
        called from inside a job. After :meth:`close`, a RuntimeError."""
        if self.on_thread():
            job()
            return
        self._watch_backward()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"gradlane: {self._name} is shut down; no collective runs")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
                track(self)
            self._jobs.put(job)

    def failed(self, error: BaseException) -> None:
        """Reports a job's error (it also failed its future): the end of
        each backward pass being watched raises the first one."""
        with self._lock:
            for backward in self._backwards:
                if backward.error is None:
                    backward.error = error

    def _watch_backward(self) -> None:
        """Inside a backward pass, makes its end wait for the jobs issued
        so far and raise the first error reported meanwhile (once per
        pass)."""
        graph_task = _graph_task()
        if graph_task < 0:
            return
        with self._lock:
            if any(b.graph_task == graph_task for b in self._backwards):
                return
            backward = _Backward(graph_task)
            self._backwards.append(backward)
            # A pass that raised before its end never runs its callback:
            # its entry is dropped once this many came after it.
            del self._backwards[:-MAX_WATCHED_BACKWARDS]
        try:
            _queue_at_backward_end(lambda: self._end_backward(backward))
        except BaseException:
            with self._lock:
                self._backwards.remove(backward)
            raise

    def _end_backward(self, backward: _Backward) -> None:
        done = threading.Event()
        try:
            self.submit(done.set)
        except RuntimeError:
            pass  # shut down: what was issued has run
        else:
            done.wait()
        with self._lock:
            if backward in self._backwards:
                self._backwards.remove(backward)
        if backward.error is not None:
            raise backward.error

    def close(self) -> None:
        """Runs the jobs submitted so far, then stops the thread (at once
        when called from inside a job: the thread ends after it)."""
        self.stop()
        self.join(None)

    def stop(self) -> None:
        """Lets the jobs submitted so far run, then ends the thread; a
        later :meth:`submit` raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._thread is not None:
                self._jobs.put(None)

    def join(self, timeout: float | None) -> bool:
        """Waits for the thread to end after :meth:`stop` (``joined``)."""
        return joined(self._thread, timeout)

    def __repr__(self) -> str:
        return f"IssueOrder({self._name!r})"

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except BaseException:  # noqa: BLE001 - a job completes its own future
                log.exception("gradlane: a job on %s raised", self._name)
