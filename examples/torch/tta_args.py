"""train_tta.py's command line: every flag, its default and its checks;
the hook's flags become one gradlane.Settings."""

from __future__ import annotations

import argparse
import os

import gradlane


def seconds_or_adaptive(word: str) -> str | float:
    """--deadline's value: "adaptive" or a number of seconds."""
    return word if word == "adaptive" else float(word)


def none_or_word(word: str) -> str | None:
    """A choice whose "none" is Python's None."""
    return None if word == "none" else word


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--transport", choices=["gloo", "gradlane", "hook"], default="hook")
    # The hook's knobs, each by its gradlane.Settings name (dest "hook.NAME")
    # and with the Settings' default: parsed into one Settings for HookState.
    hook = p.add_argument_group("hook", "gradlane's DDP hook's settings (--transport hook)")
    defaults = gradlane.Settings()

    def knob(flag: str, help: str, **how) -> None:
        name = flag.removeprefix("--").replace("-", "_")
        if how.get("action") != "store_true":
            how["default"] = getattr(defaults, name)
        hook.add_argument(flag, dest=f"hook.{name}", help=help, **how)

    knob("--recovery", "what a lost chunk becomes",
         choices=["zero_fill", "rescale", "error_feedback"])
    knob("--loss-tolerance", "the lossy share", type=float)
    knob("--dscp", "mark packets by class (priority queues)", action="store_true")
    knob("--overlap", "allreduce each bucket on a thread while backward goes on",
         action="store_true")
    knob("--lossy-carrier", "what carries the lossy chunks", choices=["adaptive", "datagrams"])
    knob("--important-format", "the wire format of the important chunks",
         choices=["f32", "bf16", "f16"])
    knob("--lossy-format",
         "the wire format of the lossy chunks (log8 keeps compression feedback)",
         choices=["f32", "bf16", "f16", "log8"])
    knob("--rotation", "rotate each bucket before it is chunked: none or hadamard",
         type=none_or_word, choices=[None, "hadamard"])
    knob("--lossy-return",
         "the owners return the sum's least important chunks in the lossy format",
         action="store_true")
    knob("--deadline",
         "a deadline for each bucket's lossy part, 'adaptive' or seconds (use it with "
         "--recovery error_feedback)",
         type=seconds_or_adaptive)
    knob("--deadline-factor", "with --deadline adaptive, the budget over the median recent step",
         type=float)
    p.add_argument(
        "--comm-hook",
        choices=["none", "fp16", "bf16", "powersgd", "powersgd-fp16", "localsgd", "sparse"],
        default="none",
        help="gloo or gradlane: one of torch's DDP communication hooks, or gradlane's "
        "sparse_hook exchanging exactly over the backend; hook: powersgd (gradlane's "
        "powersgd_hook, every step through the differentiated allreduce) or sparse "
        "(gradlane's sparse_hook through the differentiated allgather)",
    )
    p.add_argument(
        "--sparse-density",
        type=float,
        default=0.01,
        help="sparse: the share of each gradient's values kept a step",
    )
    p.add_argument(
        "--powersgd-rank",
        type=int,
        default=4,
        help="powersgd: matrix_approximation_rank (the low-rank factors' width)",
    )
    p.add_argument(
        "--powersgd-start",
        type=int,
        default=10,
        help="powersgd: start_powerSGD_iter (plain allreduce for the steps before)",
    )
    p.add_argument(
        "--localsgd-period",
        type=int,
        default=4,
        help="localsgd: steps between model averages (PeriodicModelAverager's period), "
        "after --powersgd-start steps of plain allreduce",
    )
    p.add_argument(
        "--bucket-cap-mb",
        type=float,
        default=None,
        help="DDP's bucket_cap_mb (torch's default 25, with a first bucket of 1 MB); "
        "set, it also caps the first bucket, so a value above the model's size makes "
        "one bucket",
    )
    p.add_argument(
        "--width", type=int, default=64, help="channels of the first stage (64 is ResNet-18's)"
    )
    p.add_argument("--steps", type=int, default=120, help="training steps")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    p.add_argument(
        "--lr",
        type=float,
        default=0.05,
        help="peak SGD learning rate (momentum 0.9; 5 steps of warm-up, then cosine to 0)",
    )
    p.add_argument("--seed", type=int, default=0, help="model, data split and batch seed")
    p.add_argument("--eval-every", type=int, default=5, help="steps between evaluations")
    p.add_argument(
        "--target-acc", type=float, default=0.95, help="accuracy whose time is reported"
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=0.0,
        help="stop once this many seconds of training are over (0: no limit)",
    )
    p.add_argument("--csv", help="rank 0 writes its evaluations here")
    p.add_argument(
        "--iface",
        default=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        help="interface whose sent bytes the CSV reports",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the model trains: cuda puts rank r on GPU LOCAL_RANK mod the GPU count",
    )
    fail = p.add_argument_group(
        "failure and recovery", "a rank that dies, and the two ways back (scripts/elastic_bench.sh)"
    )
    fail.add_argument(
        "--kill-rank",
        type=int,
        default=None,
        metavar="R",
        help="rank R SIGKILLs itself at the start of step --kill-step, in its first life only "
        "(not when it rejoins, GRADLANE_REJOIN=1, nor with --resume)",
    )
    fail.add_argument(
        "--kill-step", type=int, default=None, metavar="S", help="the step --kill-rank dies in"
    )
    fail.add_argument(
        "--elastic",
        action="store_true",
        help="gradlane with GRADLANE_ON_RANK_FAILURE=continue: call "
        "gradlane.torch.elastic.admit at every step's end (the members train on without a "
        "dead rank and admit a restarted one); with GRADLANE_REJOIN=1 this rank is the "
        "replacement: elastic.catch_up, then on from the members' next step",
    )
    fail.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="N",
        help="rank 0 saves model, optimizer, schedule and step to --checkpoint-dir every N "
        "steps (0: never)",
    )
    fail.add_argument(
        "--checkpoint-dir", metavar="D", help="where the checkpoint is (D/checkpoint.pt)"
    )
    fail.add_argument(
        "--resume",
        action="store_true",
        help="a restart: every rank starts from --checkpoint-dir's checkpoint (from step 1 "
        "if there is none yet), rank 0 appends to --csv and goes on with --clock",
    )
    fail.add_argument(
        "--clock",
        metavar="FILE",
        help="rank 0's training time on one clock across restarts: the first life writes "
        "when its first step began (and the evaluations' time so far) to FILE, a life with "
        "--resume goes on from it, counting the time between its lives as training",
    )
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.eval_every < 1 or args.width < 1:
        p.error("--steps, --batch, --eval-every and --width must be positive")
    if not 0.0 < args.target_acc <= 1.0:
        p.error("--target-acc must be in (0, 1]")
    knobs = {
        name.removeprefix("hook."): value
        for name, value in vars(args).items()
        if name.startswith("hook.")
    }
    try:
        args.settings = gradlane.Settings(**knobs)
    except ValueError as e:
        p.error(str(e))
    changed = [name for name, value in knobs.items() if value != getattr(defaults, name)]
    if changed and args.transport != "hook":
        flags = ", ".join("--" + name.replace("_", "-") for name in changed)
        p.error(f"{flags}: the hook's settings; it needs --transport hook")
    if args.comm_hook not in ("none", "powersgd", "sparse") and args.transport == "hook":
        p.error(
            "--transport hook takes --comm-hook powersgd or sparse (gradlane's own); torch's "
            "other hooks go over a backend: use --transport gloo or gradlane"
        )
    if not 0.0 < args.sparse_density <= 1.0:
        p.error("--sparse-density must be in (0, 1]")
    if args.localsgd_period < 1:
        p.error("--localsgd-period must be positive")
    if args.powersgd_rank < 1 or args.powersgd_start < 1:
        p.error("--powersgd-rank and --powersgd-start must be positive")
    if (args.kill_rank is None) != (args.kill_step is None):
        p.error("--kill-rank and --kill-step go together")
    if args.kill_rank is not None and (args.kill_rank < 0 or not 1 <= args.kill_step <= args.steps):
        p.error("--kill-rank must be a rank (>= 0) and --kill-step a step in 1..--steps")
    if args.elastic:
        if args.transport != "gradlane":
            p.error("--elastic needs --transport gradlane (the backend's elastic membership)")
        if args.comm_hook.startswith("powersgd"):
            p.error("--elastic hands over model and optimizer only, not PowerSGD's state")
        if os.environ.get("GRADLANE_ON_RANK_FAILURE", "").strip().lower() != "continue":
            p.error("--elastic needs GRADLANE_ON_RANK_FAILURE=continue in the environment")
    if os.environ.get("GRADLANE_REJOIN", "0").strip() == "1" and not args.elastic:
        p.error("GRADLANE_REJOIN=1 starts a replacement rank: it needs --elastic to catch up")
    if args.checkpoint_every < 0:
        p.error("--checkpoint-every must be 0 (never) or positive")
    if (args.checkpoint_every or args.resume) and not args.checkpoint_dir:
        p.error("--checkpoint-every and --resume need --checkpoint-dir")
    if args.checkpoint_every and args.comm_hook.startswith("powersgd"):
        p.error("--checkpoint-every saves model and optimizer only, not PowerSGD's state")
    return args
