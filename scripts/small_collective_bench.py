"""The fixed cost of one collective: the latency of small allreduces over
torch.distributed, gloo against the gradlane backend, on the ranks
torchrun starts (one host or several).

    GRADLANE_CERT_DIR=certs torchrun --nproc-per-node 3 \\
        scripts/small_collective_bench.py --backend gradlane

Rank 0 prints p50 and p90 per size. A PowerSGD step is about a dozen
allreduces of a few KB to a few hundred KB, so this cost, not bytes per
second, sets its time on a fast path.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["gloo", "gradlane"], required=True)
    p.add_argument(
        "--sizes-kb", type=int, nargs="+", default=[4, 64, 1024],
        help="allreduce sizes in KB of float32 (default: 4 64 1024)",
    )
    p.add_argument("--iters", type=int, default=200, help="timed allreduces per size")
    p.add_argument("--warmup", type=int, default=20, help="untimed allreduces per size first")
    args = p.parse_args()
    if args.backend == "gradlane":
        import gradlane.torch  # noqa: F401 - registers the backend
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    if rank == 0:
        print(f"{args.backend}, {dist.get_world_size()} ranks: allreduce latency", flush=True)
    for kb in args.sizes_kb:
        t = torch.ones(kb * 256)
        for _ in range(args.warmup):
            dist.all_reduce(t)
        times = []
        for _ in range(args.iters):
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        times.sort()
        if rank == 0:
            p50 = times[len(times) // 2] * 1e6
            p90 = times[len(times) * 9 // 10] * 1e6
            print(f"{args.backend} {kb} KB: p50 {p50:.0f} us, p90 {p90:.0f} us", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
