"""No thread of gradlane's may still run a job when the interpreter ends.

gradlane's Python threads (a process group's issue order, its
point-to-point lanes, a hook's own issue order) complete torch futures.
torch completes one in C++ with the GIL released and takes the GIL back in
a ``noexcept`` destructor, and a future's callbacks (a profiler's, a
user's ``then``) run there too. A daemon thread that takes the GIL back
once the interpreter has begun to finalize is ended with
``pthread_exit``, whose forced unwinding through that destructor is
``std::terminate``: the process dies with SIGABRT ("terminate called
without an active exception") after the script itself succeeded. A rank
that received its last message on a lane and then returned hit it now
and then (torch's ``test_send_recv_any_source``).

So each such thread is tracked here. A process group's shutdown joins its
own (``destroy_process_group``), and as the interpreter ends (atexit, run
before gradlane's own hook that closes every Group) every one still alive
is stopped and joined: first for ``EXIT_GRACE`` seconds, so that jobs
already queued finish (a send hands its bytes to the link), then, the
Groups closed so that a receive still waiting fails at once, for
``EXIT_CLOSE_WAIT`` more. A thread still alive after that is logged.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Protocol

log = logging.getLogger(__name__)

#: Seconds the jobs already queued get to finish as the process ends,
#: before the Groups close under them.
EXIT_GRACE = 2.0
#: Seconds a job gets to end once its Group is closed.
EXIT_CLOSE_WAIT = 10.0


class JobThread(Protocol):
    """A thread of jobs: ``stop`` lets the jobs given so far run and ends
    the thread after them; ``join`` waits for that, at most ``timeout``
    seconds, and says whether the thread has ended."""

    def stop(self) -> None: ...

    def join(self, timeout: float | None) -> bool: ...


_LIVE: weakref.WeakSet[JobThread] = weakref.WeakSet()


def track(worker: JobThread) -> None:
    """Joins ``worker`` as the process ends (called when its thread starts)."""
    _LIVE.add(worker)


def joined(thread: threading.Thread | None, timeout: float | None) -> bool:
    """Waits at most ``timeout`` seconds (None: no bound) for ``thread``
    to end; says whether it has (or never started). From the thread
    itself, True at once: it ends once its current job returns."""
    if thread is None or thread is threading.current_thread():
        return True
    thread.join(timeout)
    return not thread.is_alive()


def join_until(workers, deadline: float) -> list[JobThread]:
    """Waits for each of ``workers`` until the monotonic ``deadline``;
    returns those still running."""
    return [w for w in workers if not w.join(max(0.0, deadline - time.monotonic()))]


def stop_and_join(workers, grace: float, close, close_wait: float) -> list[JobThread]:
    """Stops ``workers``, waits ``grace`` seconds for their queued jobs,
    then calls ``close`` (which makes a job that still waits fail) and
    waits ``close_wait`` more; returns those still running."""
    workers = list(workers)
    for w in workers:
        w.stop()
    running = join_until(workers, time.monotonic() + grace)
    if running:
        close()
        running = join_until(running, time.monotonic() + close_wait)
    return running


def _close_every_group() -> None:
    from gradlane._native import close_groups_at_exit

    close_groups_at_exit()


def _join_at_exit() -> None:
    running = stop_and_join(list(_LIVE), EXIT_GRACE, _close_every_group, EXIT_CLOSE_WAIT)
    for w in running:
        log.warning("gradlane: %r still runs a job as the process ends; it may abort the exit", w)


# Registered after gradlane's own (gradlane is imported first), so it runs
# before the Groups are closed at exit.
atexit.register(_join_at_exit)
