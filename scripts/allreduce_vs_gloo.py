"""One allreduce (or one send/recv) through torch.distributed, gloo
against the gradlane backend, alternated in one run on the ranks torchrun
starts.

    GRADLANE_CERT_DIR=certs torchrun --nproc-per-node 2 \\
        scripts/allreduce_vs_gloo.py --sizes-mb 100 0.004
    GRADLANE_CERT_DIR=certs torchrun --nproc-per-node 2 \\
        scripts/allreduce_vs_gloo.py --op send_recv

Every rank joins both process groups (gloo, then gradlane on the same
store); each repetition runs the size once over each, in alternating order,
so that both see the same machine. Rank 0 prints, per size and backend, the
median wall time, the bus bandwidth a rank moves (2 (n-1)/n of the tensor,
as nccl-tests counts it), and the CPU seconds per GB of tensor that this
process spent (every thread: the caller's, gloo's, gradlane's runtime),
which a noisy machine disturbs less than wall time. Then the ratio
gradlane / gloo of each.

With --op send_recv each even rank sends the tensor to the next odd one,
which sends it back (a ping-pong, so that how far apart the barrier let
the two start does not count): the time is half the round trip (the later
of the pair's), the bandwidth the tensor over it, and the CPU both
processes of the pair spent, halved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def timed(group, t: torch.Tensor, op: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one allreduce or send/recv, after a
    barrier so that every rank starts together: this process's for an
    allreduce, the pair's (the later wall, the summed CPU) for a send/recv."""
    dist.barrier(group=group)
    cpu, wall = time.process_time(), time.perf_counter()
    rank = dist.get_rank()
    if op == "allreduce":
        dist.all_reduce(t, group=group)
    elif rank % 2 == 0:
        dist.send(t, dst=rank + 1, group=group)
        dist.recv(t, src=rank + 1, group=group)
    else:
        dist.recv(t, src=rank - 1, group=group)
        dist.send(t, dst=rank - 1, group=group)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if op == "send_recv":
        # Outside the timed part, over gloo: the pair's figures, for one
        # of the two transfers.
        walls = torch.tensor([wall], dtype=torch.float64)
        cpus = torch.tensor([cpu], dtype=torch.float64)
        dist.all_reduce(walls, op=dist.ReduceOp.MAX)
        dist.all_reduce(cpus)
        wall, cpu = float(walls) / 2, float(cpus) / dist.get_world_size()
    return wall, cpu


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--sizes-mb", type=float, nargs="+", default=[100.0, 0.004],
        help="allreduce sizes in MB of float32 (default: 100 0.004, i.e. 100 MB and 4 KB)",
    )
    p.add_argument("--reps", type=int, default=8, help="timed repetitions per size (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed repetitions first (default 2)")
    p.add_argument("--op", choices=["allreduce", "send_recv"], default="allreduce",
                   help="the op timed (send_recv: even ranks send to the next odd one)")
    p.add_argument("--json", help="also write the figures to this file (rank 0)")
    args = p.parse_args()
    import gradlane.torch  # noqa: F401 - registers the backend

    dist.init_process_group("gloo")
    groups = {"gloo": dist.group.WORLD, "gradlane": dist.new_group(backend="gradlane")}
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.op == "send_recv" and world % 2:
        raise SystemExit("send_recv pairs the ranks: run an even number")
    if rank == 0:
        print(f"{args.op} over {world} ranks, gloo and gradlane alternated", flush=True)
    rows = []
    for mb in args.sizes_mb:
        n = max(1, int(mb * 1e6 / 4))
        t = torch.ones(n)
        got = {name: [] for name in groups}
        for rep in range(args.warmup + args.reps):
            order = list(groups) if rep % 2 == 0 else list(groups)[::-1]
            for name in order:
                t.fill_(1.0 + rank)
                wall, cpu = timed(groups[name], t, args.op)
                if rep >= args.warmup:
                    got[name].append((wall, cpu))
                if args.op == "allreduce":
                    want = world * (world + 1) / 2
                else:  # both hold the even rank's 1 + rank, sent and sent back
                    want = rank + 1 - rank % 2
                if not torch.all(t == want):
                    raise SystemExit(f"{name}: got {t[:4].tolist()}, expected {want}")
        gb = n * 4 / 1e9
        row = {"op": args.op, "mb": n * 4 / 1e6, "ranks": world}
        moved = 2 * (world - 1) / world * gb if args.op == "allreduce" else gb
        for name, samples in got.items():
            wall = statistics.median(s[0] for s in samples)
            cpu = statistics.median(s[1] for s in samples)
            row[name] = {
                "ms": wall * 1e3,
                "bus_gbit_s": moved * 8 / wall,
                "cpu_s_per_gb": cpu / gb,
            }
        row["ratio_ms"] = row["gradlane"]["ms"] / row["gloo"]["ms"]
        row["ratio_cpu"] = row["gradlane"]["cpu_s_per_gb"] / row["gloo"]["cpu_s_per_gb"]
        rows.append(row)
        if rank == 0:
            g, q = row["gloo"], row["gradlane"]
            print(
                f"{row['mb']:.3f} MB: gloo {g['ms']:.2f} ms ({g['bus_gbit_s']:.2f} Gbit/s, "
                f"{g['cpu_s_per_gb']:.2f} CPU s/GB), gradlane {q['ms']:.2f} ms "
                f"({q['bus_gbit_s']:.2f} Gbit/s, {q['cpu_s_per_gb']:.2f} CPU s/GB); "
                f"gradlane/gloo: {row['ratio_ms']:.2f}x time, {row['ratio_cpu']:.2f}x CPU",
                flush=True,
            )
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
