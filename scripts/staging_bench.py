"""How long staging a CUDA tensor through gradlane's pinned host buffers
takes (gradlane.torch._staging): the copy to the host and back, no
network, for a few sizes; medians of --repeats. Needs a CUDA device.

    python3 scripts/staging_bench.py --sizes-mb 1,25,100
"""

import argparse
import statistics
import time

import torch

from gradlane.torch._staging import Stager


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mb", default="1,25,100", help="tensor sizes in MB (float32)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per size")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("staging_bench: no CUDA device")
    stager = Stager(stage_cpu=False)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("size MB | round trip ms (median) | GB/s each way | first call ms")
    for mb in (float(s) for s in args.sizes_mb.split(",")):
        t = torch.randn(int(mb * 1e6 / 4), device="cuda")
        times = []
        for i in range(args.repeats + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            call = stager.call([t], reads=[True], writes=[True])
            call.finish()
            call.event.synchronize()
            times.append(time.perf_counter() - start)
        med = statistics.median(times[1:])
        print(f"{mb:g} | {med * 1e3:.2f} | {2 * mb / 1e3 / med:.1f} | {times[0] * 1e3:.2f}")


if __name__ == "__main__":
    main()
