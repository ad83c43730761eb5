"""Time to accuracy: a ResNet-18 trained with DDP, one CSV row per evaluation.

A ResNet-18 (BasicBlocks 2-2-2-2, widths 64-128-256-512 at the default
``--width 64``: 11.2M parameters, a 45 MB gradient a step) adapted to the
UCI handwritten digits (1,797 8x8 images that ship inside scikit-learn's
wheel): a 3x3 stem of stride 1 and no max pool, so the 8x8 input becomes
8, 4, 2 and 1 pixels across the four stages. The gradient is that of the
full network, the compute a small part of it, so the network decides how
long a step takes.

Every ``--eval-every`` steps rank 0 measures test accuracy on a held-out
20% split (fixed by ``--seed``) and appends a row to ``--csv``: train time
(seconds of training so far, evaluations excluded), step, bytes this rank's
interface sent, train loss and test accuracy. The run goes on to
``--steps`` steps, or stops once ``--time-limit`` seconds of training are
over (the rows say where it stopped). Every rank prints its parameters'
checksum at the end.

Run it under torchrun or ``scripts/testbed.sh`` (one process per rank)::

    cargo run --release --bin certs -- --out-dir certs --san 127.0.0.1
    GRADLANE_CERT_DIR=$PWD/certs torchrun --nproc-per-node 4 \\
        examples/torch/train_tta.py --transport hook --csv hook.csv

``--transport``: ``gloo`` (torch's backend, the reference), ``gradlane``
(the gradlane backend, every collective exact) or ``hook`` (the gradlane
backend with gradlane's DDP hook: the important chunks exact, the rest
lossy; ``--loss-tolerance``, ``--recovery``, ``--dscp``, ``--overlap``,
``--lossy-carrier``, ``--important-format``, ``--lossy-format``,
``--lossy-return``, ``--deadline``, ``--deadline-factor``, ``--rotation``). ``--comm-hook`` puts one of torch's own DDP hooks
(``fp16``, ``bf16``: ``fp16_compress_hook``, ``bf16_compress_hook``;
``powersgd``: ``powerSGD_hook``, ``--powersgd-rank``,
``--powersgd-start``; ``powersgd-fp16``: ``powerSGD_hook`` inside
``fp16_compress_wrapper``, as torch's docs show it; ``localsgd``: torch's
local SGD, ``post_localSGD_hook`` with a ``PeriodicModelAverager`` of
``--localsgd-period`` after ``--powersgd-start`` steps) over the gloo or
gradlane backend, as a PyTorch user would turn one on; ``sparse`` is
gradlane's ``sparse_hook`` (``--sparse-density``) exchanging its codec
frames exactly over that backend. With ``--transport hook``,
``--comm-hook powersgd`` is gradlane's ``powersgd_hook``: PowerSGD whose
warm-up steps and low-rank factors go through gradlane's differentiated
allreduce; ``sparse`` is ``sparse_hook`` through the differentiated
allgather. Rank 0's CSV says, for the hook, each step's payload bytes
and how many of them were lossy. Needs
``pip install "./python[torch]" scikit-learn``.

Failure and recovery (``scripts/elastic_bench.sh``): ``--kill-rank R
--kill-step S`` makes rank R SIGKILL itself at the start of step S, in
its first life only (not as a replacement, not with ``--resume``).
``--elastic`` (``--transport gradlane`` with
``GRADLANE_ON_RANK_FAILURE=continue``) calls
``gradlane.torch.elastic.admit`` at the end of every step, so the members
train on without the dead rank and admit a restarted one; started with
``GRADLANE_REJOIN=1`` this process is that replacement: it takes the
members' model, optimizer, learning-rate schedule and step
(``elastic.catch_up``) and trains on from the step after. The
checkpoint-restart way (any transport): ``--checkpoint-every N
--checkpoint-dir D`` has rank 0 save the model, optimizer, schedule and
step to ``D/checkpoint.pt`` every N steps, and ``--resume`` starts every
rank from there (torchrun's restart of the whole job). A rank that
resumes or rejoins draws the same batches a rank that never died would
have. ``--clock FILE`` keeps rank 0's training time on one clock across
its restarts: the first life writes when its first step began to FILE
(with the evaluations' time so far, kept up to date), a life started
with ``--resume`` reads it, so the CSV's ``train_s`` is the wall time
since the first step, evaluations excluded, with the failure, its
detection and the restart (new processes, rendezvous, checkpoint load,
the steps done again) counted in. Rank 0 reports each such event on a
line of its own (``failure:``, ``resume:``, ``elastic:``), its time in
parentheses on that clock.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib
import json
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# The example's other files sit beside it; a run loaded by path (the tests
# load it with importlib) has no script directory on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tta_args import parse_args  # noqa: E402
from tta_hooks import hook_bytes, local_sgd_averager, register_hook  # noqa: E402
from tta_model import ResNet18, digits  # noqa: E402


def checksum(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def sent_bytes(iface: str) -> int | None:
    try:
        with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


class Clock:
    """Rank 0's training time across its lives (``--clock``): the wall time
    since the first step of the first life began, less the evaluations'.

    The first life starts it at its first step and writes FILE; each
    evaluation's time is added to the excluded total there as it ends. A
    life started with ``--resume`` reads FILE, so everything between the
    last evaluation of the life before and now (the steps after it, the
    failure, its detection, the new processes, their rendezvous, the
    checkpoint's load) counts as training time. The interface's sent bytes
    at the start are kept there too, so the CSV's count goes on as well."""

    def __init__(self, path: str, restart: bool) -> None:
        self.path = path
        self.t0: float | None = None
        self.excluded = 0.0
        self.sent0: int | None = None
        if restart and os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            self.t0, self.excluded, self.sent0 = saved["t0"], saved["excluded"], saved["sent0"]

    def start(self, sent0: int | None) -> None:
        """At this life's first step: starts the clock unless a life before did."""
        if self.t0 is None:
            self.t0, self.sent0 = time.time(), sent0
            self._save()

    def now(self) -> float:
        return time.time() - self.t0 - self.excluded

    def exclude(self, since: float) -> None:
        """Leaves the time from ``since`` (a time.time()) to now out."""
        self.excluded += time.time() - since
        self._save()

    def _save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"t0": self.t0, "excluded": self.excluded, "sent0": self.sent0}, f)
        os.replace(tmp, self.path)


def checkpoint_path(args: argparse.Namespace) -> str:
    return os.path.join(args.checkpoint_dir, "checkpoint.pt")


def save_checkpoint(args, net, opt, schedule, step: int) -> None:
    """Rank 0's checkpoint, written whole or not at all."""
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    path = checkpoint_path(args)
    state = {
        "model": net.state_dict(),
        "optimizer": opt.state_dict(),
        "schedule": schedule.state_dict(),
        "step": step,
    }
    torch.save(state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    backend = "gloo" if args.transport == "gloo" else "gradlane"
    if backend == "gradlane":
        # Registers the backend on torch releases that do not load its
        # entry point (torch.distributed.backends) by themselves.
        import gradlane.torch  # noqa: F401
    # A replacement (GRADLANE_REJOIN=1, --elastic): init_process_group
    # returns once the members admitted it.
    rejoin = args.elastic and os.environ.get("GRADLANE_REJOIN", "0").strip() == "1"
    # The data and the model before the group: a replacement is admitted
    # in init_process_group, and the members wait in admit until it takes
    # their state (catch_up), so it comes ready.
    device = torch.device("cpu")
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = (t.to(device) for t in digits(args.seed))
    net = ResNet18(args.width).to(device)
    params = sum(p.numel() for p in net.parameters())
    saved = None
    if args.resume and os.path.exists(checkpoint_path(args)):
        saved = torch.load(checkpoint_path(args), map_location=device, weights_only=False)
        net.load_state_dict(saved["model"])
    if rejoin:
        # DDP's constructor imports torch._dynamo the first time (seconds
        # of the members' wait, on a busy host): before being admitted.
        importlib.import_module("torch._dynamo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.kill_rank is not None and args.kill_rank >= world:
        raise SystemExit(f"train_tta: --kill-rank {args.kill_rank} is not a rank of {world}")
    ddp_args = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    if device.type == "cuda":
        ddp_args["device_ids"] = [device.index]
    if rejoin:
        # The members' parameters come with catch_up, not DDP's broadcast.
        ddp_args["init_sync"] = False
    model = DDP(net, **ddp_args)
    state, compressed = register_hook(model, args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    averager = local_sgd_averager(args)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 5) * 0.5 * (1 + math.cos(math.pi * s / args.steps))
    )
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    group = None
    if args.elastic:
        from gradlane.torch import elastic
        from gradlane.torch._backend import gradlane_group_of

        group = gradlane_group_of(None)
    done = 0  # the steps before this life's first
    if saved is not None:
        opt.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        done = saved["step"]
    if rejoin:
        extra = elastic.catch_up(model, opt)
        schedule.load_state_dict(extra["schedule"])
        done = extra["step"]
        print(f"elastic: rank {rank} rejoined after step {done}", flush=True)
    # The batches a rank that never died would draw from here on.
    for _ in range(done):
        torch.randint(len(y_train), (args.batch,), generator=gen)
    first_life = not (args.resume or rejoin)
    clock = Clock(args.clock, restart=not first_life) if rank == 0 and args.clock else None
    out = None
    if rank == 0:
        print(
            f"{args.transport} (torch hook {args.comm_hook}): {world} ranks on {device.type}, "
            f"{params / 1e6:.2f}M parameters "
            f"({params * 4 / 1e6:.1f} MB a step)",
            flush=True,
        )
        if args.csv:
            append = args.resume and os.path.exists(args.csv) and os.path.getsize(args.csv) > 0
            out = open(args.csv, "a" if append else "w", newline="")
            rows = csv.writer(out)
            if not append:
                rows.writerow(
                    ["train_s", "step", "sent_bytes", "train_loss", "test_acc", "lossy_bytes",
                     "hook_bytes"]
                )
    sent0 = sent_bytes(args.iface)
    if clock is not None:
        clock.start(sent0)
        sent0 = clock.sent0
    if args.resume and rank == 0:
        what = f"step {done}" if saved is not None else "no checkpoint, step 0"
        when = f" ({clock.now():.3f} s)" if clock is not None else ""
        print(f"resume: {what}, from {args.checkpoint_dir}{when}", flush=True)
    train_s, reached, step_s = 0.0, None, []
    stop = torch.zeros(1)
    view = None if group is None else group.epoch
    step = done
    try:
        for step in range(done + 1, args.steps + 1):
            if first_life and rank == args.kill_rank and step == args.kill_step:
                print(f"kill: rank {rank} SIGKILLs itself at the start of step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            started = time.monotonic()
            model.train()
            idx = torch.randint(len(y_train), (args.batch,), generator=gen).to(device)
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if averager is not None:
                averager.average_parameters(model.parameters())
            schedule.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the step's kernels are timed too
            took = time.monotonic() - started
            step_s.append(took)
            train_s += took
            if clock is not None:
                train_s = clock.now()
            if not step % args.eval_every or step == args.steps:
                evaluated = time.time()
                # Only rank 0 evaluates (every rank holds the same parameters); the
                # others wait for its verdict in the broadcast.
                if rank == 0:
                    model.eval()
                    with torch.no_grad():
                        correct = (model.module(x_test).argmax(1) == y_test).sum().item()
                    # A ratio of ints: 342 of 360 is 0.95 exactly, as the CSV says.
                    acc = correct / len(y_test)
                    sent = sent_bytes(args.iface)
                    sent = "" if sent is None or sent0 is None else sent - sent0
                    if out is not None:
                        lossy, total = hook_bytes(state)
                        rows.writerow(
                            [f"{train_s:.3f}", step, sent, f"{loss.item():.4f}", f"{acc:.4f}",
                             lossy, total]
                        )
                        out.flush()
                    if reached is None and acc >= args.target_acc:
                        reached = train_s
                    print(
                        f"step {step}: {train_s:.1f} s, step {took:.2f} s, train loss "
                        f"{loss.item():.3f}, test accuracy {acc:.3f}",
                        flush=True,
                    )
                    over = args.time_limit > 0 and train_s >= args.time_limit
                    stop.fill_(1.0 if over else 0.0)
                dist.broadcast(stop, 0)
                if clock is not None:
                    clock.exclude(evaluated)
                if stop.item():
                    break
            if step == args.steps or not (args.checkpoint_every or args.elastic):
                continue
            # After the evaluation, so that a rank admitted here starts with
            # the members' next step. Training time, and the step's.
            started = time.monotonic()
            if args.checkpoint_every and not step % args.checkpoint_every and rank == 0:
                save_checkpoint(args, net, opt, schedule, step)
            if args.elastic:
                joined = elastic.admit(
                    model, opt, extra={"step": step, "schedule": schedule.state_dict()}
                )
                if group.epoch != view and rank == 0:
                    now = clock.now() if clock is not None else train_s
                    if joined:
                        print(f"elastic: admitted {joined} after step {step} ({now:.3f} s)", flush=True)
                    print(
                        f"elastic: view {group.epoch}, members {list(group.members)}, "
                        f"after step {step} ({now:.3f} s)",
                        flush=True,
                    )
                view = group.epoch
            took = time.monotonic() - started
            step_s[-1] += took
            train_s += took
    except Exception as e:
        if rank == 0:
            now = clock.now() if clock is not None else train_s
            why = (str(e).strip().splitlines() or [""])[0][:200]
            print(f"failure: {type(e).__name__} in step {step}: {why} ({now:.3f} s)", flush=True)
        raise
    if rank == 0:
        # The first step sets up every transport's connections and DDP's
        # buckets: the step percentiles are of the steps after it (the
        # training time keeps it).
        ordered = sorted(step_s[1:] or step_s) or [0.0]
        p50 = ordered[len(ordered) // 2]
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        target = "not reached" if reached is None else f"{reached:.1f} s"
        print(
            f"summary: {step} steps in {train_s:.1f} s, step p50 {p50:.3f} s p99 "
            f"{p99:.3f} s, target {args.target_acc} {target}",
            flush=True,
        )
        if state is not None and state.steps:
            t = state.totals
            print(
                f"hook: {t.get('hook_ns', 0) / 1e9:.2f} s in the hook, "
                f"{t.get('network_ns', 0) / 1e9:.2f} s in the Rust allreduce "
                f"({t.get('reduce_ns', 0) / 1e9:.2f} s to the owners, "
                f"{t.get('return_ns', 0) / 1e9:.2f} s back), "
                f"zero-filled {t.get('zero_filled_lossy_bytes', 0)} B, "
                f"late {t.get('late_lossy_bytes', 0)} B, "
                f"{t.get('at_deadline', 0)} buckets cut at their deadline "
                f"over {state.steps} steps",
                flush=True,
            )
        if compressed is not None:
            print(
                f"powersgd: {compressed.warmup_steps} warm-up steps, "
                f"{compressed.compressed_steps} steps of factors, all through the "
                f"differentiated allreduce",
                flush=True,
            )
        if out is not None:
            out.close()
    print(f"rank {rank} of {world}: parameters {checksum(model.module)}", flush=True)
    if state is not None:
        state.close()
    # With --elastic the ranks that leave are the group's members now.
    leave_together(rank, world if group is None else len(group.members))
    dist.destroy_process_group()
    return 0


def leave_together(rank: int, world: int) -> None:
    """Returns once every rank is through with the group's transport.

    gloo can fail a rank that destroys its context right after a barrier
    while another still finishes it (pytorch/gloo#155: the rank aborts
    with "terminate called without an active exception"). So after the
    barrier the ranks also meet in the rendezvous store: each says it is
    through and waits for all; rank 0, which hosts the store, goes last.
    ``world`` is the number of ranks that leave (with ``--elastic``, the
    group's members now).
    """
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()

    def wait_for(key: str, count: int) -> None:
        deadline = time.monotonic() + 60
        while store.add(key, 0) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"train_tta: ranks missing at teardown ({key})")
            time.sleep(0.01)

    store.add("train_tta/through", 1)
    wait_for("train_tta/through", world)
    if rank != 0:
        store.add("train_tta/gone", 1)
    else:
        wait_for("train_tta/gone", world - 1)


if __name__ == "__main__":
    sys.exit(main())
