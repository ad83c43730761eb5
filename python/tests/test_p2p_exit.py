"""A rank whose last act was a receive from any rank ends with exit code 0.

torch completes a Work's future in C++ and runs its callbacks there (a
profiler's, a user's ``then``); with gradlane the receive's lane thread
does that. A daemon thread still inside that code as the interpreter
finalizes is ended with ``pthread_exit``, whose forced unwinding through a
``noexcept`` destructor of torch's is ``std::terminate``: SIGABRT after
the script succeeded (torch's ``test_send_recv_any_source`` at 3 ranks,
now and then). Here that window is held open on purpose: the last
receive's future gets a callback that runs for CALLBACK_SECONDS on the
lane, and rank 0 returns at once. Every rank then checks, in the last
atexit handler before the interpreter finalizes, that no thread of
gradlane's is left: without the process group joining its threads (at
``destroy_process_group`` and at exit) rank 0's lane is still in the
callback there every time, and the process often aborts.

The ranks are scripts (``python -c``), not multiprocessing children, so
that each interpreter finalizes as torchrun's do; the senders end right
after their last send, and a profiler runs throughout, as in torch's
test.
"""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/test.sh installs it)")

WORLD = 3
#: Messages each sender sends rank 0.
ROUNDS = 40
#: How long the last receive's callback holds its lane thread.
CALLBACK_SECONDS = 1.5
RESULT_TIMEOUT = 120.0

RANK_CODE = textwrap.dedent(
    """
    import atexit, os, sys, threading, time

    def threads_left():
        # Registered before gradlane is imported: atexit runs it last,
        # just before the interpreter finalizes.
        left = [t.name for t in threading.enumerate() if t.name.startswith("gradlane")]
        print("gradlane threads at exit:", left, flush=True)

    atexit.register(threads_left)
    import torch, torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rounds, destroy = int(sys.argv[1]), sys.argv[2] == "destroy"
    callback_seconds = float(sys.argv[3])
    dist.init_process_group("gradlane")

    def receive(sources, hold=0.0):
        t = torch.full((10,), -1.0)
        # irecv from any rank: on a lane thread, which completes it.
        work = dist.irecv(t)
        if hold:
            work.get_future().then(lambda f: time.sleep(hold))
        work.wait()
        source = work._source_rank()
        assert bool(t.eq(source).all()), (source, t)
        sources.append(source)

    expected = sorted(list(range(1, world)) * rounds)
    sources = []
    with torch.autograd.profiler.profile():
        if rank == 0:
            for i in range(len(expected) - 1):
                receive(sources)
        else:
            for i in range(rounds - (rank == 1)):
                dist.send(torch.full((10,), float(rank)), 0)
    # The last message, from rank 1, after the profiler's end (which takes
    # long enough to hide the window).
    if rank == 0:
        receive(sources, hold=callback_seconds)
        assert sorted(sources) == expected, sources
    elif rank == 1:
        dist.send(torch.full((10,), 1.0), 0)
    if destroy:
        dist.destroy_process_group()
    print("rank", rank, "returned", flush=True)
    """
)


def free_port(kind=socket.SOCK_STREAM):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_scripts(cert_dir, ending):
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(WORLD),
        GRADLANE_CERT_DIR=cert_dir,
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-P", "-c", RANK_CODE, str(ROUNDS), ending, str(CALLBACK_SECONDS)],
            env=dict(env, RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    outcomes = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=RESULT_TIMEOUT)
        finally:
            p.kill()
        outcomes.append((p.returncode, out))
    return outcomes


@pytest.mark.parametrize("ending", ["destroy", "exit"])
def test_a_rank_whose_last_receive_is_still_completing_exits_cleanly(cert_dir, ending):
    """``destroy``: destroy_process_group, then the script ends; ``exit``:
    the script ends with the process group alive (atexit's path)."""
    outcomes = run_scripts(cert_dir, ending)
    for rank, (code, out) in enumerate(outcomes):
        assert f"rank {rank} returned" in out, f"rank {rank} (exit {code}):\n{out}"
        assert "gradlane threads at exit: []" in out, f"rank {rank}:\n{out}"
        assert "terminate called" not in out, f"rank {rank}:\n{out}"
        # Closed at exit, the group's links go at once: the close does not
        # wait out its bound for the socket (the point-to-point messages
        # held the links there).
        assert "socket still bound" not in out, f"rank {rank}:\n{out}"
        assert code == 0, f"rank {rank} ended with {code}:\n{out}"
