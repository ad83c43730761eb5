"""Train a small CNN on the UCI handwritten digits with DDP over gradlane.

The digits (1,797 8x8 images, 10 classes) ship inside scikit-learn's wheel,
so nothing is downloaded. Run it under torchrun, one process per rank, with
the job's certificates::

    cargo run --release --bin certs -- --out-dir certs --san 127.0.0.1
    GRADLANE_CERT_DIR=$PWD/certs torchrun --nproc-per-node 2 \\
        examples/torch/train_digits.py --transport hook --injected-loss 0.05

``--transport`` chooses what carries the gradients:

- ``gloo``: torch's gloo backend, the reference;
- ``gradlane``: the gradlane backend, every collective exact;
- ``hook``: the gradlane backend with gradlane's DDP hook: each bucket's
  important chunks exact, the rest lossy (``--loss-tolerance``,
  ``--recovery``).

Every rank prints its parameters' checksum at the end: they must agree.
Needs ``pip install "./python[torch]" scikit-learn``.
"""

from __future__ import annotations

import argparse
import hashlib
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--transport", choices=["gloo", "gradlane", "hook"], default="hook")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch size (default 32)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="model and data seed (default 0)")
    p.add_argument("--eval-every", type=int, default=50, help="steps between evaluations")
    # Unset, the hook's knobs keep gradlane.Settings' defaults.
    p.add_argument(
        "--loss-tolerance", type=float, help="hook: lossy share (unset: the hook's default)"
    )
    p.add_argument(
        "--recovery",
        choices=["zero_fill", "rescale", "error_feedback"],
        help="hook: what a lost chunk becomes (unset: the hook's default)",
    )
    p.add_argument(
        "--injected-loss",
        type=float,
        default=0.0,
        help="hook: loss injected on each rank's sends (a demo of a lossy path)",
    )
    return p.parse_args()


class DigitsNet(nn.Module):
    """Two conv layers and a classifier: conv kernels become gradlane chunks."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def digits(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The digits, scaled to [0, 1], split 80/20 with a fixed seed."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    return x[train], y[train], x[test], y[test]


def checksum(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    args = parse_args()
    backend = "gloo" if args.transport == "gloo" else "gradlane"
    if backend == "gradlane":
        # Registers the backend on torch releases that do not load its
        # entry point (torch.distributed.backends) by themselves.
        import gradlane.torch  # noqa: F401
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = digits(args.seed)
    model = DDP(DigitsNet())
    state = None
    if args.transport == "hook":
        import gradlane.torch as gl

        state = gl.HookState(
            loss_tolerance=args.loss_tolerance,
            recovery=args.recovery,
            injected_loss=args.injected_loss,
            seed=args.seed + rank,
        )
        model.register_comm_hook(state, gl.ddp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Each rank draws its own batches from the same shuffled stream.
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    started = time.monotonic()
    for step in range(1, args.steps + 1):
        idx = torch.randint(len(y_train), (args.batch,), generator=gen)
        loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.eval_every == 0 or step == args.steps:
            with torch.no_grad():
                acc = (model(x_test).argmax(1) == y_test).float().mean().item()
            if rank == 0:
                extra = ""
                if state is not None and state.last_stats:
                    s = state.last_stats
                    extra = f", zero-filled {s.get('zero_filled_lossy_bytes', 0)} B last step"
                print(
                    f"step {step}: {time.monotonic() - started:.1f} s, "
                    f"train loss {loss.item():.3f}, test accuracy {acc:.3f}{extra}",
                    flush=True,
                )
    print(f"rank {rank} of {world}: parameters {checksum(model.module)}", flush=True)
    # Every rank reaches the teardown together: gloo's aborted a rank
    # ("terminate called without an active exception") when one got there
    # well before the other.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
