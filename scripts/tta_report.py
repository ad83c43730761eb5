"""The report of scripts/tta_bench.sh: a markdown table and two plots.

Reads OUT/runs.csv (one line a run) and OUT/runs/<cell>.csv (each run's
evaluations) and writes:

- OUT/table.md: per variant, loss and condition, the median over seeds of
  time to the target accuracy (with the spread, min-max), final accuracy,
  step time p50 and p99, bytes sent per step on rank 0's interface, and
  time to target against gloo's better congestion control;
- OUT/accuracy.png: test accuracy against training time, one panel per
  loss rate (plain condition), one line per run;
- OUT/time_to_target.png: time to target as bars per variant and loss,
  and under the competing flow (median, min-max as error bars; a run that
  never reached it is drawn at its training time, hatched).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

VARIANTS = [
    "gloo-cubic",
    "gloo-bbr",
    "gradlane",
    "hook-zero_fill",
    "hook-rescale",
    "hook-error_feedback",
    "hook-datagrams",
]
COLORS = {
    "gloo-cubic": "#d62728",
    "gloo-bbr": "#ff7f0e",
    "gradlane": "#7f7f7f",
    "hook-zero_fill": "#1f77b4",
    "hook-rescale": "#2ca02c",
    "hook-error_feedback": "#9467bd",
    "hook-datagrams": "#17becf",
}


def cell_name(r: dict) -> str:
    return f"{r['condition']}_{r['variant']}_loss{r['loss']}_seed{r['seed']}"


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    return f" ({min(values):.0f}-{max(values):.0f})"


def table(runs: list[dict], target: float) -> str:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["condition"], float(r["loss"]), r["variant"])].append(r)

    def ttt(rs: list[dict]) -> tuple[float | None, int]:
        """Median time to target over the runs that reached it, and how
        many did not (their time counts as infinite in the median)."""
        hit = [float(r["time_to_target_s"]) for r in rs if r["time_to_target_s"]]
        missed = len(rs) - len(hit)
        if missed * 2 >= len(rs):
            return None, missed
        vals = sorted(hit) + [float("inf")] * missed
        return statistics.median(vals), missed

    lines = [
        f"| condition | loss | variant | runs | time to {target} s, median (min-max) "
        "| vs gloo's better | final accuracy | step p50 s | step p99 s | MB sent per step "
        "| measured loss | parameters equal |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    order = sorted(
        groups,
        key=lambda k: (k[0] != "plain", k[0], k[1], VARIANTS.index(k[2])),
    )
    for cond, loss, variant in order:
        rs = groups[(cond, loss, variant)]
        med, missed = ttt(rs)
        hit = [float(r["time_to_target_s"]) for r in rs if r["time_to_target_s"]]
        if med is None:
            longest = max(float(r["train_s"]) for r in rs)
            shown = f"not reached in {longest:.0f}"
        else:
            shown = f"{med:.0f}{spread(hit)}"
        if missed and med is not None:
            shown += f", {missed} of {len(rs)} not reached"
        gloo_runs = [groups[(cond, loss, g)] for g in ("gloo-cubic", "gloo-bbr")
                     if (cond, loss, g) in groups]
        gloo = [t for t in (ttt(g)[0] for g in gloo_runs) if t is not None]
        vs = "-"
        if variant.startswith(("gradlane", "hook")) and gloo_runs and med is not None:
            if gloo:
                vs = f"{med / min(gloo):.2f}x"
            else:
                # gloo never got there: its training time bounds its time
                # to target from below, so the ratio from above.
                least = min(float(r["train_s"]) for g in gloo_runs for r in g)
                vs = f"< {med / least:.2f}x"
        final = statistics.median(float(r["final_acc"]) for r in rs)
        stopped = [r for r in rs if int(r["steps_run"]) < max(int(x["steps_run"]) for x in runs)]
        final_s = f"{final:.3f}" + (f" (stopped at step {stopped[0]['steps_run']})" if stopped else "")
        p50 = statistics.median(float(r["step_p50_s"]) for r in rs)
        p99 = statistics.median(float(r["step_p99_s"]) for r in rs)
        sent = [float(r["sent_bytes_per_step"]) for r in rs if r["sent_bytes_per_step"]]
        sent_s = f"{statistics.median(sent) / 1e6:.1f}" if sent else "-"
        if cond != "plain":
            sent_s += " (with the competing flow)"
        measured = statistics.median(float(r["measured_loss"] or 0) for r in rs)
        equal = "yes" if all(r["params_equal"] == "yes" for r in rs) else "NO"
        lines.append(
            f"| {cond} | {loss:g} | {variant} | {len(rs)} | {shown} | {vs} | {final_s} "
            f"| {p50:.2f} | {p99:.2f} | {sent_s} | {measured:.4f} | {equal} |"
        )
    return "\n".join(lines) + "\n"


def evaluations(out: Path, r: dict) -> list[dict]:
    path = out / "runs" / f"{cell_name(r)}.csv"
    if not path.exists():
        return []
    return list(csv.DictReader(path.open()))


def plots(out: Path, runs: list[dict], target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plain = [r for r in runs if r["condition"] == "plain"]
    losses = sorted({float(r["loss"]) for r in plain})
    if not losses:
        return
    fig, axes = plt.subplots(1, len(losses), figsize=(5 * len(losses), 4), sharey=True)
    axes = [axes] if len(losses) == 1 else list(axes)
    for ax, loss in zip(axes, losses):
        labelled = set()
        for r in plain:
            if float(r["loss"]) != loss:
                continue
            ev = evaluations(out, r)
            if not ev:
                continue
            v = r["variant"]
            ax.plot(
                [float(e["train_s"]) for e in ev],
                [float(e["test_acc"]) for e in ev],
                color=COLORS[v],
                alpha=0.9 if r["seed"] == "0" else 0.45,
                label=None if v in labelled else v,
            )
            labelled.add(v)
        ax.axhline(target, color="black", lw=0.6, ls=":")
        ax.set_title(f"loss {loss:g}")
        ax.set_xlabel("training time, s")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[-1].legend(loc="lower right", fontsize=8)
    r0 = runs[0]
    fig.suptitle(
        f"ResNet-18 (width {r0['width']}) on the digits, {r0['ranks']} ranks, "
        f"{r0['rate']} per rank, random loss on input"
    )
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=110)
    plt.close(fig)

    # One group of bars per loss rate (plain), then one for the competing
    # flow, where the DSCP run stands beside the others.
    groups = [(f"loss {x:g}", "plain", x) for x in losses]
    if any(r["condition"] != "plain" for r in runs):
        groups.append(("competing TCP flow, lossless", "compete", 0.0))
    bars = VARIANTS + ["hook-zero_fill, dscp"]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(bars)
    labelled = set()
    for j, (_, cond, loss) in enumerate(groups):
        for i, v in enumerate(bars):
            if v.endswith(", dscp"):
                rs = [r for r in runs if r["condition"] == cond + "-dscp"
                      and r["variant"] == v.split(",")[0] and float(r["loss"]) == loss]
            else:
                rs = [r for r in runs if r["condition"] == cond and r["variant"] == v
                      and float(r["loss"]) == loss]
            if not rs:
                continue
            vals = [
                float(r["time_to_target_s"]) if r["time_to_target_s"] else float(r["train_s"])
                for r in rs
            ]
            missed = any(not r["time_to_target_s"] for r in rs)
            med = statistics.median(vals)
            ax.bar(
                j + (i - len(bars) / 2 + 0.5) * width,
                med,
                width,
                color=COLORS.get(v, "#aec7e8"),
                hatch="//" if missed else None,
                yerr=[[med - min(vals)], [max(vals) - med]] if len(vals) > 1 else None,
                capsize=2,
                label=None if v in labelled else v,
            )
            labelled.add(v)
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_ylabel(f"training time to accuracy {target}, s")
    ax.set_title("Time to target (median over seeds, min-max bars; hatched: not reached, drawn at its end)",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "time_to_target.png", dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="docs/tta", help="scripts/tta_bench.sh's OUT")
    p.add_argument("--target", type=float, default=0.95, help="the runs' target accuracy")
    args = p.parse_args()
    out = Path(args.out)
    runs = list(csv.DictReader((out / "runs.csv").open()))
    if not runs:
        print(f"tta_report: no runs in {out / 'runs.csv'}", file=sys.stderr)
        return 1
    md = table(runs, args.target)
    (out / "table.md").write_text(md)
    print(md)
    plots(out, runs, args.target)
    print(f"tta_report: wrote {out / 'table.md'}, {out / 'accuracy.png'}, {out / 'time_to_target.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
