"""Chaos soak of the torch backend: DDP over gradlane while ranks are
killed, frozen past the failure bound or cut off from the others, at
random steps, under both failure policies; counts what must never happen.

Each schedule starts RANKS rank processes (forked from a server that
imported torch once) that train a small MLP with DDP for --steps steps.
A seeded plan picks one or two faults, each a victim rank, a step, a
place in that step (before the forward, or inside backward, between two
gradients), and a kind:
  kill       SIGKILL (the victim's own, so it lands where planned);
  freeze     SIGSTOP for the failure bound plus 2 s, then SIGCONT;
  partition  every UDP packet to or from the victim's sockets dropped
             (iptables, in the network namespace chaos_soak.sh makes)
             for the failure bound plus 2 s, then let through again.
With the policy "fail" every rank that meets a fault must raise a
gradlane.GroupError; with "continue" the ranks the group went on with
must end with the same members and bit-identical parameters, and a rank
it left out must raise RemovedError (or NoQuorum's RemovedError) at its
next collective. Under "continue" a killed rank is replaced, as a user
would: a process with its RANK and GRADLANE_REJOIN=1 starts once it is
dead, the members admit it (gradlane.torch.elastic.admit after every
step, training on past --steps until it comes) and it trains with them
to the end, which must again find every member with the same bits. The
ranks meet through a file store, which outlives rank 0, so rank 0 is
replaced as any other. Counted per schedule:
  crash     a rank ended by a signal the plan did not send (SIGSEGV,
            SIGABRT), or raised something other than a GroupError;
  hang      a rank still running --hang-after seconds after the start;
  mismatch  ranks that finished with other parameters or other members,
            a rank that finished although the group went on without it,
            or, with "fail", a rank that trained through a fault.
A failing schedule prints its seed: `--seed S --schedules 1` replays it.

    sudo bash scripts/chaos_soak.sh --schedules 200 --seed 1
    python scripts/chaos_soak.py --help
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback

KINDS = ("kill", "freeze", "partition")
#: Steps the members train after the last replacement is admitted.
AFTER_ADMISSION = 3
#: Seconds past --steps the members train on waiting for a replacement.
WAIT_FOR_REPLACEMENT = 40.0
#: The process group's timeout: a bound on each collective, and on how long
#: a replacement waits to be admitted (far above a step, and the failure
#: bound plus the freezes and partitions, which last it plus 2 s).
GROUP_TIMEOUT = 60.0
PLACES = ("forward", "backward")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="DDP over gradlane under random kills, freezes and partitions: "
        "counts crashes, hangs and mismatched results.",
        epilog="Run it through scripts/chaos_soak.sh (a network namespace of its own, "
        "so that partitions touch nothing outside it; root).",
    )
    p.add_argument("--schedules", type=int, default=100, help="schedules to run (default 100)")
    p.add_argument("--seed", type=int, default=1, help="seed of the first schedule (default 1)")
    p.add_argument("--ranks", type=int, default=4, help="ranks a schedule (default 4)")
    p.add_argument("--steps", type=int, default=14, help="DDP steps a rank trains (default 14)")
    p.add_argument(
        "--policy",
        choices=("fail", "continue", "both"),
        default="both",
        help="GRADLANE_ON_RANK_FAILURE of each schedule; both alternates (default both)",
    )
    p.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="fault kinds to draw from, comma separated (default kill,freeze,partition)",
    )
    p.add_argument(
        "--idle",
        type=float,
        default=3.0,
        help="GRADLANE_IDLE_TIMEOUT, the failure bound in seconds (default 3)",
    )
    p.add_argument(
        "--hang-after",
        type=float,
        default=150.0,
        help="a rank still running this long after the start is a hang (default 150 s: "
        "above the wait for a replacement and the group's timeout)",
    )
    p.add_argument("--json", help="write the summary and every schedule's record here")
    p.add_argument(
        "--cert-dir",
        help="GRADLANE_CERT_DIR (default: certificates made for the run)",
    )
    args = p.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        p.error(f"--kinds {args.kinds!r}: each of {', '.join(KINDS)}")
    if args.ranks < 2 or args.steps < 6 or args.schedules < 1:
        p.error("--ranks at least 2, --steps at least 6, --schedules at least 1")
    if not (args.idle > 0 and args.hang_after > 0):
        p.error("--idle and --hang-after must be positive")
    args.kinds = kinds
    return args


def plan(seed, ranks, steps, policy, kinds):
    """The faults of schedule `seed`: one or two, on distinct victims, at
    steps that leave the others steps to meet them."""
    rng = random.Random(seed)
    count = 1 if ranks < 4 else rng.choice((1, 1, 2))
    victims = rng.sample(range(ranks), count)
    return {
        "seed": seed,
        "policy": policy,
        "faults": [
            {
                "rank": v,
                "kind": rng.choice(kinds),
                "step": rng.randrange(2, steps - 3),
                "place": rng.choice(PLACES),
            }
            for v in victims
        ],
    }


# ------------------------------------------------------------------ a rank


def rank_main(rank, env, schedule, steps, idle, results):
    os.environ.update(env)
    os.environ["RANK"] = str(rank)
    try:
        out = train(rank, schedule, steps, idle)
    except BaseException as e:  # noqa: BLE001 - every outcome is reported
        import gradlane

        out = {
            "error": type(e).__name__,
            "group_error": isinstance(e, gradlane.GroupError),
            "message": str(e)[:400],
            "traceback": traceback.format_exc()[-2000:],
        }
    results.put((rank, out))


def train(rank, schedule, steps, idle):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradlane.torch._backend import gradlane_group_of

    from gradlane.torch import elastic

    replacement = os.environ.get("GRADLANE_REJOIN") == "1"
    # A file store, which outlives any rank: rank 0 can be replaced too.
    dist.init_process_group(
        "gradlane",
        init_method=f"file://{os.environ['CHAOS_STORE_FILE']}",
        rank=rank,
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=datetime.timedelta(seconds=GROUP_TIMEOUT),
    )
    group = gradlane_group_of(None)
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DDP(model, init_sync=not replacement)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    mine = [] if replacement else [f for f in schedule["faults"] if f["rank"] == rank]
    state = {"step": -1}
    elastic_run = schedule["policy"] == "continue"
    # The members wait (train on) for the replacements planned, for a while;
    # a replacement waits for those still to come after its admission, or
    # it would stop at an end the members move on from without it.
    if replacement:
        extra = elastic.catch_up(ddp, opt)
        first, end = extra["step"] + 1, extra["end"]
        waiting = extra["waiting"] - len(group.joined)
    else:
        first, end = 0, steps
        waiting = len(replaced(schedule))
    give_up = None

    def strike(place):
        for f in mine:
            if f["step"] == state["step"] and f["place"] == place:
                fault(f, group, idle)

    weight = next(model.parameters())

    def in_backward(grad):
        strike("backward")
        return grad

    weight.register_hook(in_backward)
    g = torch.Generator().manual_seed(1000 + rank)
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(7)) * 2.0
    step = first
    while True:
        if step >= end:
            if waiting <= 0:
                break
            if give_up is None:
                give_up = time.monotonic() + WAIT_FOR_REPLACEMENT
            elif time.monotonic() > give_up:
                break
        state["step"] = step
        strike("forward")
        y = torch.randint(0, 4, (32,), generator=g)
        x = centers[y] + torch.randn(32, 16, generator=g)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        if elastic_run:
            # Every member ends AFTER_ADMISSION steps after the last rank
            # was admitted; the ones admitted learn it from the state.
            later = max(end, step + 1 + AFTER_ADMISSION)
            joined = elastic.admit(
                ddp, opt, extra={"step": step, "end": later, "waiting": waiting}
            )
            if joined:
                waiting -= len(joined)
                end = later
        step += 1
    params = [p.detach().numpy().tobytes().hex() for p in model.parameters()]
    return {
        "steps": step,
        "params": params,
        "members": list(group.members),
        "replacement": replacement,
    }


def replaced(schedule):
    """The ranks a schedule starts replacements for: those it kills under
    "continue"."""
    if schedule["policy"] != "continue":
        return []
    return [f["rank"] for f in schedule["faults"] if f["kind"] == "kill"]


def fault(f, group, idle):
    """Carries out fault `f` on this rank, now."""
    me = os.getpid()
    hold = idle + 2.0
    if f["kind"] == "kill":
        os.kill(me, signal.SIGKILL)
    elif f["kind"] == "freeze":
        subprocess.Popen(["sh", "-c", f"sleep {hold}; kill -CONT {me}"])
        os.kill(me, signal.SIGSTOP)
    else:
        rules = []
        for port in group.local_ports():
            rules += [["-p", "udp", "--sport", str(port)], ["-p", "udp", "--dport", str(port)]]
        for r in rules:
            subprocess.run(["iptables", "-I", "INPUT", *r, "-j", "DROP"], check=True)
        # The schedule's end may have flushed them already.
        undo = "; ".join(
            "iptables -D INPUT " + " ".join(r) + " -j DROP 2>/dev/null" for r in rules
        )
        subprocess.Popen(["sh", "-c", f"sleep {hold}; {undo}"])


# ------------------------------------------------------------------ a schedule


def run_schedule(ctx, schedule, args, cert_dir, store_dir):
    """Runs one schedule: each rank's outcome and exit code."""
    results = ctx.Queue()
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(args.ranks),
        "GRADLANE_CERT_DIR": cert_dir,
        "GRADLANE_ON_RANK_FAILURE": schedule["policy"],
        "GRADLANE_IDLE_TIMEOUT": str(args.idle),
        "GRADLANE_LOG": os.environ.get("CHAOS_LOG", "error"),
        "CHAOS_STORE_FILE": os.path.join(store_dir, f"store-{schedule['seed']}"),
    }
    procs = [
        ctx.Process(
            target=rank_main, args=(r, env, schedule, args.steps, args.idle, results)
        )
        for r in range(args.ranks)
    ]
    started = time.monotonic()
    for p in procs:
        p.start()
    names = [str(r) for r in range(args.ranks)]
    to_replace = set(replaced(schedule))
    got, hung = {}, []
    while any(p.is_alive() for p in procs) or not results.empty():
        try:
            rank, out = results.get(timeout=0.5)
            got[rank] = out
        except queue.Empty:
            pass
        for r in sorted(to_replace):
            if procs[r].exitcode == -signal.SIGKILL:
                # The command a user runs: the same environment and RANK,
                # GRADLANE_REJOIN=1. It reports under the dead rank's number.
                to_replace.discard(r)
                again = ctx.Process(
                    target=rank_main,
                    args=(r, {**env, "GRADLANE_REJOIN": "1"}, schedule, args.steps, args.idle, results),
                )
                again.start()
                procs.append(again)
                names.append(f"{r}'")
        if time.monotonic() - started > args.hang_after:
            hung = [names[i] for i, p in enumerate(procs) if p.is_alive()]
            for p in procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGCONT)  # a frozen one must die too
                    p.kill()
            break
    for p in procs:
        p.join()
    subprocess.run(["iptables", "-F", "INPUT"], check=False)
    codes = {names[i]: p.exitcode for i, p in enumerate(procs)}
    return got, codes, hung, time.monotonic() - started


def judge(schedule, got, codes, hung):
    """The schedule's verdict: lists of crashes and mismatches, by rank."""
    crashes, mismatches = [], []
    killed = {str(f["rank"]) for f in schedule["faults"] if f["kind"] == "kill"}
    for name, code in codes.items():
        if name in hung:
            continue
        if code != 0 and not (name in killed and code == -signal.SIGKILL):
            crashes.append(f"rank {name} exit code {code}")
    for r in range(len(codes)):
        # A replacement reports under its rank, as the rank it replaces
        # never did.
        if codes.get(str(r)) == 0 or codes.get(f"{r}'") == 0:
            if r not in got:
                crashes.append(f"rank {r} exited without a result")
    for r, out in got.items():
        if "error" in out and not out["group_error"]:
            crashes.append(f"rank {r} raised {out['error']}: {out['message']}")
    finished = {r: o for r, o in got.items() if "params" in o}
    if schedule["policy"] == "fail":
        for r in finished:
            mismatches.append(f"rank {r} trained through a fault under fail")
    else:
        for r, o in finished.items():
            if o["params"] != next(iter(finished.values()))["params"]:
                mismatches.append(f"rank {r}'s parameters differ")
            if sorted(finished) != o["members"]:
                mismatches.append(f"rank {r} ended with members {o['members']}, finished {sorted(finished)}")
        # A replacement finds no group to join where the others lost their
        # quorum (two of four killed at once, rank 0 among the dead).
        expected = ("RemovedError", "RankFailedError") + (() if finished else ("JoinTimeoutError",))
        for r, o in got.items():
            if "error" in o and o["error"] not in expected:
                if o["group_error"]:
                    mismatches.append(f"rank {r} raised {o['error']} under continue: {o['message']}")
    return crashes, mismatches


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    args = parse_args(argv)
    import gradlane

    cert_dir = args.cert_dir
    if cert_dir is None:
        cert_dir = tempfile.mkdtemp(prefix="chaos-certs-")
        gradlane.generate_certs(cert_dir, ["127.0.0.1"])
    # c10d warns on every connect that the namespace has no hostname; its
    # level is read once, when torch loads, in the server the ranks fork from.
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    store_dir = tempfile.mkdtemp(prefix="chaos-stores-")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["numpy", "torch", "torch.distributed", "torch.nn.functional"])
    totals = {"schedules": 0, "crashes": 0, "hangs": 0, "mismatches": 0}
    by_kind: dict[str, int] = {}
    records = []
    t0 = time.monotonic()
    for i in range(args.schedules):
        seed = args.seed + i
        policy = args.policy if args.policy != "both" else ("fail", "continue")[seed % 2]
        schedule = plan(seed, args.ranks, args.steps, policy, args.kinds)
        got, codes, hung, took = run_schedule(ctx, schedule, args, cert_dir, store_dir)
        crashes, mismatches = judge(schedule, got, codes, hung)
        totals["schedules"] += 1
        totals["crashes"] += bool(crashes)
        totals["hangs"] += bool(hung)
        totals["mismatches"] += bool(mismatches)
        for f in schedule["faults"]:
            by_kind[f"{policy}/{f['kind']}"] = by_kind.get(f"{policy}/{f['kind']}", 0) + 1
        faults = " ".join(f"{f['kind']}:r{f['rank']}@{f['step']}{f['place'][0]}" for f in schedule["faults"])
        ok = not (crashes or hung or mismatches)
        outcomes = " ".join(
            f"r{r}{chr(39) if o.get('replacement') else ''}:"
            f"{'ok' if 'params' in o else o.get('error', '?')}"
            for r, o in sorted(got.items())
        )
        print(
            f"[{i + 1}/{args.schedules}] seed {seed} {policy:8} {faults:40} "
            f"{took:5.1f} s  {'ok' if ok else 'FAILED'}  {outcomes}",
            flush=True,
        )
        for line in crashes + mismatches + [f"rank {r} hung" for r in hung]:
            print(f"    {line}  (replay: --seed {seed} --schedules 1 --policy {policy})", flush=True)
        if not ok:
            for r, o in sorted(got.items()):
                if "traceback" in o and not o["group_error"]:
                    print(o["traceback"], flush=True)
        records.append(
            {**schedule, "seconds": took, "codes": codes, "hung": hung, "crashes": crashes,
             "mismatches": mismatches,
             "outcomes": {r: ("finished" if "params" in o else o.get("error")) for r, o in got.items()}}
        )
    elapsed = time.monotonic() - t0
    print(
        f"\n{totals['schedules']} schedules in {elapsed:.0f} s: {totals['crashes']} with a crash, "
        f"{totals['hangs']} with a hang, {totals['mismatches']} with a mismatch"
    )
    print("faults:", ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"totals": totals, "faults": by_kind, "seconds": elapsed,
                       "args": {k: v for k, v in vars(args).items()}, "schedules": records}, f, indent=1)
    return 0 if totals["crashes"] == totals["hangs"] == totals["mismatches"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
