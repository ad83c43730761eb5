"""Point-to-point under stress: many jobs of torch send/recv over one
backend, each rank a process of its own that ends as a torchrun rank
does, with every rank's exit code checked.

Each job runs a program that every rank derives from the job's seed, so
each knows what the others send:

1. any: one rank receives from any source (recv and irecv, ``_source_rank``
   names the sender) while every other sends to it (send and isend);
   the order per sender is checked;
2. tags: every ordered pair exchanges messages of random tags, received
   in another tag order than sent;
3. batch: ``batch_isend_irecv`` around the ring, several tags a batch;
4. waits: every rank posts an isend to and an irecv from every other,
   then waits for them in a random order;
5. last: every rank but one sends its last message and ends at once
   (destroying its process group or not); the one receives them from any
   source, under a profiler in some jobs, a callback on the last future.

Message sizes run from 1 to 100,000 values. A job passes when every rank
exits with 0, printed its counts and no C++ ``terminate``. Prints a line
per job and a summary, and writes it to --out as JSON.

    python scripts/p2p_stress.py --jobs 30 --ranks 2 3
    python scripts/p2p_stress.py --jobs 5 --backend gloo   # the program itself
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK_PROGRAM = Path(__file__).with_name("p2p_stress_rank.py")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20, help="jobs to run, one after another")
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 3],
                   help="world sizes, taken in turn by the jobs")
    p.add_argument("--seed", type=int, default=1, help="the first job's seed (then +1 a job)")
    p.add_argument("--scale", type=int, default=1,
                   help="multiplies the messages of each phase")
    p.add_argument("--backend", default="gradlane", help="gradlane or gloo")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a job may take")
    p.add_argument("--cert-dir", default=None,
                   help="GRADLANE_CERT_DIR (default: made in a temporary directory)")
    p.add_argument("--out", type=Path, default=None, help="JSON summary")
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(seed: int, world: int, args, cert_dir: str | None) -> dict:
    """One job's ranks as processes; what each printed and how it ended."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world))
    if cert_dir:
        env["GRADLANE_CERT_DIR"] = cert_dir
    cmd = [sys.executable, str(RANK_PROGRAM), "--seed", str(seed), "--scale", str(args.scale),
           "--backend", args.backend]
    procs = [
        subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]
    deadline = time.monotonic() + args.timeout
    ranks = []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            code = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            code = "hung"
        counts = None
        for line in out.splitlines():
            if line.startswith("P2P_STRESS "):
                counts = json.loads(line[len("P2P_STRESS "):])
        ranks.append({
            "rank": r, "exit": code, "counts": counts,
            "terminate": "terminate called" in out,
            "tail": out.splitlines()[-15:] if code != 0 or counts is None else [],
        })
    ok = all(x["exit"] == 0 and x["counts"] is not None and not x["terminate"] for x in ranks)
    return {"seed": seed, "world": world, "ok": ok, "ranks": ranks}


def main(argv=None) -> int:
    args = parse_args(argv)
    cert_dir = args.cert_dir
    if args.backend == "gradlane" and not cert_dir:
        import gradlane

        cert_dir = tempfile.mkdtemp(prefix="p2p-stress-certs-")
        gradlane.generate_certs(cert_dir, ["127.0.0.1"])
    started = time.time()
    jobs = []
    for j in range(args.jobs):
        world = args.ranks[j % len(args.ranks)]
        job = run_job(args.seed + j, world, args, cert_dir)
        jobs.append(job)
        ops = sum((x["counts"] or {}).get("ops", 0) for x in job["ranks"])
        exits = [x["exit"] for x in job["ranks"]]
        print(f"job {j + 1}/{args.jobs} seed {job['seed']} ranks {world}: "
              f"{'ok' if job['ok'] else 'FAILED'}, {ops} operations, exits {exits}", flush=True)
        for x in job["ranks"]:
            if x["tail"]:
                print(f"  rank {x['rank']}:\n    " + "\n    ".join(x["tail"]), flush=True)
    ranks = [x for job in jobs for x in job["ranks"]]
    summary = {
        "backend": args.backend,
        "jobs": len(jobs),
        "jobs_failed": sum(not job["ok"] for job in jobs),
        "rank_processes": len(ranks),
        "operations": sum((x["counts"] or {}).get("ops", 0) for x in ranks),
        "bytes_received": sum((x["counts"] or {}).get("bytes_received", 0) for x in ranks),
        "aborts": sum(1 for x in ranks if x["exit"] in (-6, 134) or x["terminate"]),
        "other_nonzero_exits": sum(
            1 for x in ranks if x["exit"] not in (0, -6, 134) and not x["terminate"]),
        "seconds": round(time.time() - started, 1),
        "seeds": [args.seed, args.seed + args.jobs - 1],
        "world_sizes": args.ranks,
    }
    print("summary: " + json.dumps(summary), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "jobs": jobs}, indent=1))
    return 0 if summary["jobs_failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
