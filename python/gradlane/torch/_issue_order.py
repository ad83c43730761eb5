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
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


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

    def on_thread(self) -> bool:
        """Whether the caller is this order's thread (inside a job)."""
        return threading.current_thread() is self._thread

    def submit(self, job: Callable[[], None]) -> None:
        """Runs ``job`` after every job submitted before it, or now when
        called from inside a job. After :meth:`close`, a RuntimeError."""
        if self.on_thread():
            job()
            return
        with self._lock:
            if self._closed:
                raise RuntimeError(f"gradlane: {self._name} is shut down; no collective runs")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._jobs.put(job)

    def close(self) -> None:
        """Runs the jobs submitted so far, then stops the thread (at once
        when called from inside a job: the thread ends after it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._jobs.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except BaseException:  # noqa: BLE001 - a job completes its own future
                log.exception("gradlane: a job on %s raised", self._name)
