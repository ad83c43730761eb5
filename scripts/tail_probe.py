"""The tail a shared network gives a collective: a plain gloo allreduce of
a model's gradient, timed many times on the ranks torchrun (or
scripts/testbed.sh) starts; rank 0 prints the step-time percentiles and
p99/p50, the figure OptiReduce calibrates its background tenants by.

    TENANTS=4 TENANT_ON_MS=300 TENANT_OFF_MS=700 RANK_SCRIPT=scripts/tail_probe.py \\
        PY=.venv-test/bin/python RATE=100mbit sudo -E bash scripts/testbed.sh -- \\
        bash scripts/tta_rank.sh --mb 11.2 --reps 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mb", type=float, default=11.2,
                   help="the gradient in MB of float32 (default 11.2: ResNet-18 of width 32)")
    p.add_argument("--reps", type=int, default=100, help="timed allreduces (default 100)")
    p.add_argument("--warmup", type=int, default=3, help="untimed ones first (default 3)")
    p.add_argument("--json", help="rank 0 also writes the figures here")
    args = p.parse_args()
    dist.init_process_group("gloo")
    t = torch.ones(max(1, int(args.mb * 1e6 / 4)))
    times = []
    for i in range(args.warmup + args.reps):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        q = statistics.quantiles(times, n=100, method="inclusive")
        row = {"mb": args.mb, "reps": args.reps, "p50_s": q[49], "p90_s": q[89], "p99_s": q[98],
               "p99_over_p50": q[98] / q[49]}
        print(f"tail_probe: {args.reps} allreduces of {args.mb} MB: p50 {q[49]:.3f} s, "
              f"p90 {q[89]:.3f} s, p99 {q[98]:.3f} s, p99/p50 {q[98] / q[49]:.2f}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(row, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
