"""The Work a gradlane collective returns: its future, its result, and
the two bounds on waiting for it (the process group's timeout, which the
Group enforces, and ``wait(timeout)``'s own)."""

from __future__ import annotations

import datetime
import math
import threading

import torch
import torch.distributed as dist

import gradlane
from gradlane.torch._staging import StagedCall


class GradlaneWork(dist._Work):
    """A collective in flight: ``get_future()`` completes with ``result``
    (what torch expects of the op: the tensors it wrote) once the
    collective is done, or with its error.

    ``wait()`` blocks until then and raises the collective's error; on CUDA
    tensors it also makes the caller's current stream wait for the copies
    back to the device, without blocking the CPU for them, as NCCL's Work
    does. ``is_completed()`` says whether all of that has finished.

    Every collective is bounded by the process group's ``timeout``
    (``init_process_group``/``new_group``): past it, it fails with
    :class:`gradlane.CollectiveTimeoutError` naming the ranks it did not
    hear from. ``wait(timeout)`` bounds the wait itself: past it, a
    CollectiveTimeoutError naming the op, and the collective goes on
    (until the group's own timeout)."""

    def __init__(self, future: torch.futures.Future, result, op: str = "collective"):
        super().__init__()
        self._future = future
        self._result = result
        self._op = op
        self._event = None
        self._error: BaseException | None = None
        self._done = threading.Event()

    def _succeed(self, staged: StagedCall | None = None) -> None:
        if staged is None:
            self._future.set_result(self._result)
        else:
            self._event = staged.event
            staged.complete(self._future, self._result)
        self._done.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._future.set_exception(error)
        self._done.set()

    def wait(self, timeout=None):
        seconds = _wait_seconds(timeout)
        if seconds is not None and not self._done.wait(seconds):
            raise gradlane.CollectiveTimeoutError(
                f"gradlane: {self._op}: Work.wait's timeout of {seconds:g} s passed; the "
                "collective goes on, bounded by the process group's timeout"
            )
        self._future.wait()
        return True

    def is_completed(self):
        if not self._future.done():
            return False
        return self._event is None or self._event.query()

    def is_success(self):
        return self._future.done() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        return self._result

    def get_future(self):
        return self._future


def _wait_seconds(timeout) -> float | None:
    """``Work.wait``'s timeout in seconds, or None for no bound: torch
    passes a timedelta, zero (its kNoTimeout) when none was given."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    return seconds
