"""A rank whose process ends right after its last collective: its peers
still get all of that collective.

QUIC's send buffers live in the process (TCP's in the kernel), so a
process that ends as soon as its last collective returns could take its
last messages with it, and a peer still reading them would wait out its
timeout. gradlane closes every open group as the process exits, at a
script's end (atexit) and at the end of a multiprocessing child (which
skips atexit). Here rank 1's outgoing packets are held 100 ms
(injected_delay), so its last messages are all but surely still unsent
when it returns: without the close at exit, rank 0's last collective
would fail every time.
"""

import json
import socket
import subprocess
import sys
import textwrap

import pytest

from rank_processes import rank_context

# The scenario's bounds: a collective that lost its peer's last messages
# fails after COLLECTIVE_TIMEOUT; the rest only turns a hang into a failure.
COLLECTIVE_TIMEOUT = 20.0
RESULT_TIMEOUT = 120.0
DELAY = 0.1
CALLS = 3
VALUES = 100_000

RANK_CODE = textwrap.dedent(
    """
    import numpy as np
    import gradlane

    def run_rank(rank, root, cert_dir, policy):
        g = gradlane.Group(
            rank, 2, root=f"127.0.0.1:{root}", cert_dir=cert_dir,
            injected_delay=DELAY if rank == 1 else 0.0,
            collective_timeout=COLLECTIVE_TIMEOUT, on_rank_failure=policy,
        )
        try:
            for call in range(CALLS):
                x = np.full(VALUES, float(rank + 1 + call), np.float32)
                g.allreduce(x, op="sum")
            # Rank 1's last act is a send. With "fail" a broadcast's root
            # returns once its data is handed to QUIC; with "continue"
            # every collective ends in an exchange that says each rank
            # holds the result, and rank 1's part of the allreduce's one
            # is what it sends last.
            b = np.full(VALUES, float(rank), np.float32)
            if policy == "fail":
                g.broadcast(1, b)
            else:
                b[:] = 1.0
        except gradlane.GroupError as e:
            return {"error": type(e).__name__, "message": str(e)}
        # Rank 1 returns without closing its group: its process ends here.
        return {"sum": float(x[0]), "broadcast": float(b[-1]), "members": g.members}
    """
)


def free_port():
    """A loopback UDP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def constants():
    return dict(
        DELAY=DELAY, CALLS=CALLS, VALUES=VALUES, COLLECTIVE_TIMEOUT=COLLECTIVE_TIMEOUT
    )


def _child(rank, root, cert_dir, policy, results):
    scope = constants()
    exec(RANK_CODE, scope)  # noqa: S102 - the scenario, shared with the script case
    results.put((rank, scope["run_rank"](rank, root, cert_dir, policy)))


def run_as_multiprocessing_children(root, cert_dir, policy):
    ctx = rank_context()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(r, root, cert_dir, policy, results)) for r in range(2)
    ]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(2):
            rank, out = results.get(timeout=RESULT_TIMEOUT)
            got[rank] = out
    finally:
        for p in procs:
            p.join(timeout=RESULT_TIMEOUT)
            if p.is_alive():
                p.kill()
                p.join()
    return got, [p.exitcode for p in procs]


def run_as_scripts(root, cert_dir, policy):
    script = "\n".join(
        [
            "import json, sys",
            *[f"{k} = {v!r}" for k, v in constants().items()],
            RANK_CODE,
            f"print(json.dumps(run_rank(int(sys.argv[1]), {root}, {cert_dir!r}, {policy!r})))",
        ]
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-P", "-c", script, str(r)], stdout=subprocess.PIPE, text=True
        )
        for r in range(2)
    ]
    got, codes = {}, []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=RESULT_TIMEOUT)
        finally:
            p.kill()
        got[r] = json.loads(out.strip().splitlines()[-1])
        codes.append(p.returncode)
    return got, codes


@pytest.mark.parametrize("policy", ["fail", "continue"])
@pytest.mark.parametrize("started_as", ["script", "multiprocessing"])
def test_a_rank_that_ends_after_its_last_collective_leaves_it_whole(
    cert_dir, started_as, policy
):
    root = free_port()
    run = run_as_scripts if started_as == "script" else run_as_multiprocessing_children
    got, codes = run(root, cert_dir, policy)
    assert codes == [0, 0], (codes, got)
    want = float(sum(r + 1 + CALLS - 1 for r in range(2)))
    for r in range(2):
        assert got[r] == {"sum": want, "broadcast": 1.0, "members": [0, 1]}, (r, got)
