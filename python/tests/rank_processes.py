"""Where the tests' rank processes start from.

Each rank is a process of its own, as under torchrun, started by
multiprocessing's fork server rather than by "spawn". The server imports
torch and numpy once and every rank is forked from it with them loaded;
under "spawn" each rank started an interpreter and imported torch again,
which was most of these tests' CPU time.

The server imports nothing of gradlane, so a rank imports gradlane (and
torch.distributed finds the backend through its entry point) as a
training script does. It initialises no CUDA, so a forked rank may. A
module the server cannot import (torch where it is not installed) is
left out, and the ranks import it themselves.

It also holds what the tests that start ranks share: a free port, and
collecting the ranks' reports and ending their processes.
"""

import multiprocessing
import socket

PRELOADED = ["numpy", "torch", "torch.distributed", "torch.nn.functional"]


def rank_context():
    """The multiprocessing context to start ranks from."""
    ctx = multiprocessing.get_context("forkserver")
    # Takes effect when the server starts (at the first rank); later calls
    # name the same modules.
    ctx.set_forkserver_preload(PRELOADED)
    return ctx


def free_port(kind=socket.SOCK_STREAM):
    """A loopback port (TCP by default, UDP with SOCK_DGRAM) that was free
    a moment ago."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collect(procs, results, count, timeout, check=True, done=None):
    """Starts `procs` and returns the first `count` of their `reports`.
    Then sets `done` where given (an Event the ranks wait on before they
    close) and ends the processes (`stop`)."""
    for p in procs:
        p.start()
    try:
        return reports(results, count, timeout, check)
    finally:
        if done is not None:
            done.set()
        stop(procs)


def reports(results, count, timeout, check=True):
    """The next `count` reports on `results`, by rank, waiting `timeout`
    seconds at most for each. A report is `(rank, status, out)`; with
    `check` each status must be "ok" and the rank's value is `out`,
    without it `(status, out)`."""
    got = {}
    for _ in range(count):
        rank, status, out = results.get(timeout=timeout)
        if check:
            assert status == "ok", f"rank {rank} failed:\n{out}"
            got[rank] = out
        else:
            got[rank] = (status, out)
    return got


def stop(procs, timeout=30):
    """Waits up to `timeout` seconds for each of `procs` to end, and kills
    one that has not."""
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()
            p.join()
