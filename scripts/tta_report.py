"""The report of scripts/tta_bench.sh: a markdown table and two plots.

Reads OUT/runs.csv (one line a run) and OUT/runs/<cell>.csv (each run's
evaluations) and writes:

- OUT/table.md: first, per condition, the best gloo choice against the
  best gradlane choice (by median time to target); then per variant,
  loss and condition, the median over seeds of time to the target
  accuracy (with the spread, min-max), final accuracy, step time p50 and
  p99, bytes sent per step on rank 0's interface, and time to target
  against the best gloo variant of the same cell;
- OUT/accuracy.png: test accuracy against training time, one panel per
  condition and loss rate, one line per run;
- OUT/time_to_target.png: time to target as bars per variant, condition
  and loss (median, min-max as error bars; a run that never reached it is
  drawn at its training time, hatched).

With ``--pick STAGE`` it prints instead the cells that a stage of
scripts/tta_bench.sh's PLAN=full runs next, chosen from the runs so far
(see that script).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

# The order of the table's rows and the plots' legends; variants not
# listed follow, sorted.
VARIANTS = [
    "gloo-cubic",
    "gloo-bbr",
    "gloo-cubic+fp16",
    "gloo-bbr+fp16",
    "gloo-cubic+bf16",
    "gloo-bbr+bf16",
    "gloo-cubic+powersgd",
    "gloo-bbr+powersgd",
    "gloo-cubic+powersgd-fp16",
    "gloo-bbr+powersgd-fp16",
    "gradlane",
    "gradlane+fp16",
    "gradlane+bf16",
    "gradlane+powersgd",
    "hook-zero_fill",
    "hook-rescale",
    "hook-error_feedback",
    "hook-datagrams",
]
# The conditions of the best-against-best table and the goal for each:
# gradlane's best at most this ratio of gloo's best.
KEY_CELLS = [
    ("plain", 0.0, 0.9),
    ("plain", 0.01, 0.7),
    ("plain", 0.02, 0.5),
    ("plain", 0.05, 0.7),
    ("delay20", 0.01, 0.7),
    ("tail1.5", 0.0, 0.6),
    ("tail3", 0.0, 0.5),
]
# The attribution: per compressor, how a variant's name says which path
# carries it (gloo, gradlane's exact backend, gradlane's differentiated
# path), for the same compressor's steps three ways: (marks one of which
# the name holds, marks it must not hold). PowerSGD inside torch's fp16
# wrapper is another compressor (its warm-up in fp16).
COMPRESSORS = {
    "PowerSGD": (("+powersgd",), ("-fp16",)),
    "sparse (codec)": (("+sparse",), ()),
    "fp16": (("+fp16", "hook-f16-"), ()),
}


def compressed_by(variant: str, marks: tuple) -> bool:
    """Whether `variant` runs the compressor of COMPRESSORS' `marks`."""
    holds, lacks = marks
    return any(m in variant for m in holds) and not any(m in variant for m in lacks)


def family(variant: str) -> str:
    return "gloo" if variant.startswith("gloo") else "gradlane"


def torchs_own(variant: str) -> bool:
    """Whether a gloo variant is what a user has without gradlane: gloo
    alone or with one of torch's hooks (gradlane's sparse hook over gloo
    is a row of the attribution, not gloo's best choice)."""
    return "+sparse" not in variant


# The goal's accuracy bar: within this many of gloo's lossless final
# accuracy (0.3 points; the test set's 360 digits make a point 3.6 of them).
ACCURACY_MARGIN = 0.003


def variant_order(v: str) -> tuple:
    return (VARIANTS.index(v), "") if v in VARIANTS else (len(VARIANTS), v)


def color(v: str, every: list[str]) -> str:
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return cmap(sorted(set(every), key=variant_order).index(v) % 20)


def ttt(rs: list[dict]) -> tuple[float | None, int]:
    """Median time to target over the runs that reached it, and how many
    did not (their time counts as infinite in the median)."""
    hit = [float(r["time_to_target_s"]) for r in rs if r["time_to_target_s"]]
    missed = len(rs) - len(hit)
    if missed * 2 >= len(rs):
        return None, missed
    vals = sorted(hit) + [float("inf")] * missed
    return statistics.median(vals), missed


def grouped(runs: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["condition"], float(r["loss"]), r["variant"])].append(r)
    return groups


def best(groups: dict, cond: str, loss: float, fam: str, min_acc: float | None = None) -> str | None:
    """The variant of that family with the least median time to target in
    the cell (ties and misses broken by step time). With `min_acc`, the
    variants whose median final accuracy reaches it come first."""
    cands = [v for (c, l, v) in groups if c == cond and l == loss and family(v) == fam
             and not (fam == "gloo" and not torchs_own(v))]

    def key(v: str) -> tuple:
        rs = groups[(cond, loss, v)]
        med, _ = ttt(rs)
        p50 = statistics.median(float(r["step_p50_s"]) for r in rs)
        acc = statistics.median(float(r["final_acc"]) for r in rs)
        short = min_acc is not None and acc < min_acc - 1e-9
        return (short, med is None, med or 0.0, p50)

    return min(cands, key=key) if cands else None


def cell_name(r: dict) -> str:
    return f"{r['condition']}_{r['variant']}_loss{r['loss']}_seed{r['seed']}"


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    return f" ({min(values):.0f}-{max(values):.0f})"


def table(runs: list[dict], target: float) -> str:
    groups = grouped(runs)
    lines = [
        f"| condition | loss | variant | runs | time to {target} s, median (min-max) "
        "| vs gloo's best | final accuracy | step p50 s | step p99 s | MB sent per step "
        "| measured loss | parameters equal |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    order = sorted(
        groups,
        key=lambda k: (k[0] != "plain", k[0], k[1], variant_order(k[2])),
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
        gloo_runs = [rs2 for (c, l, g), rs2 in groups.items()
                     if c == cond and l == loss and family(g) == "gloo"]
        gloo = [t for t in (ttt(g)[0] for g in gloo_runs) if t is not None]
        vs = "-"
        if family(variant) == "gradlane" and gloo_runs and med is not None:
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
        if cond.startswith("compete"):
            sent_s += " (with the competing flow)"
        measured = statistics.median(float(r["measured_loss"] or 0) for r in rs)
        equal = "yes" if all(r["params_equal"] == "yes" for r in rs) else "NO"
        lines.append(
            f"| {cond} | {loss:g} | {variant} | {len(rs)} | {shown} | {vs} | {final_s} "
            f"| {p50:.2f} | {p99:.2f} | {sent_s} | {measured:.4f} | {equal} |"
        )
    return "\n".join(lines) + "\n"


# PowerSGD's first 10 steps are plain allreduces, and the hook registers
# DDP's rebuilt buckets in step 2: a step's tail is read from the steps
# after them, where every variant runs as it will on.
STEADY_FROM = 12


def steady_steps(out: Path, r: dict) -> list[float]:
    """Seconds of each training step from STEADY_FROM on (the per-step
    CSV's training clock, which stops for evaluations)."""
    rows = evaluations(out, r)
    clock = {int(e["step"]): float(e["train_s"]) for e in rows}
    return [clock[s] - clock[s - 1] for s in sorted(clock) if s >= STEADY_FROM and s - 1 in clock]


def steady(out: Path, r: dict) -> dict | None:
    """A run's steady steps: step p50, p99 and, through gradlane's hook,
    the share of the hook's payload bytes that was lossy."""
    ordered = sorted(steady_steps(out, r))
    if not ordered:
        return None
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    lossy = total = 0
    for e in evaluations(out, r):
        if int(e["step"]) >= STEADY_FROM and e.get("hook_bytes"):
            lossy += int(e["lossy_bytes"])
            total += int(e["hook_bytes"])
    share = lossy / total if total else None
    return {"p50": p50, "p99": p99, "share": share}


def steady_table(out: Path, runs: list[dict], conditions=None) -> str:
    """Step p50, p99 and p99/p50 over the steady steps, and the lossy share
    of the hook's bytes there (medians over seeds; percentiles as
    train_tta's), per cell; `conditions` picks the conditions."""
    groups = grouped([r for r in runs if conditions is None or r["condition"] in conditions])
    lines = [
        "| condition | loss | variant | runs | step p50 s | step p99 s | p99/p50 "
        "| lossy share of the hook's bytes |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for cond, loss, variant in sorted(groups, key=lambda k: (k[0], k[1], variant_order(k[2]))):
        got = [x for x in (steady(out, r) for r in groups[(cond, loss, variant)]) if x]
        if not got:
            continue
        shares = [x["share"] for x in got if x["share"] is not None]
        share = f"{statistics.median(shares):.2f}" if shares else "-"
        p50 = statistics.median(x["p50"] for x in got)
        p99 = statistics.median(x["p99"] for x in got)
        ratio = statistics.median(x["p99"] / x["p50"] for x in got if x["p50"] > 0)
        lines.append(
            f"| {cond} | {loss:g} | {variant} | {len(got)} | {p50:.3f} | {p99:.3f} "
            f"| {ratio:.2f} | {share} |"
        )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def tail_table(out: Path, runs: list[dict]) -> str:
    """The steady table of the tail conditions."""
    return steady_table(out, [r for r in runs if r["condition"].startswith("tail")])


def path_of(variant: str) -> str:
    return "gloo" if variant.startswith("gloo") else (
        "differentiated" if variant.startswith("hook") else "gradlane exact")


def attribution_table(out: Path, runs: list[dict]) -> str:
    """Per compressor and cell, the same compressor over gloo, over
    gradlane's exact backend and over gradlane's differentiated path:
    steady step p50 and p99, time to target, and the differentiated
    path's step against the exact one's."""
    groups = grouped(runs)
    lines = [
        "| compressor | condition | loss | path | variant | runs | steady step p50 s "
        "| steady step p99 s | time to target s | differentiated vs exact, step p50 |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, marks in COMPRESSORS.items():
        cells = sorted({(c, l) for (c, l, v) in groups if compressed_by(v, marks)})
        for cond, loss in cells:
            rows = {}
            for (c, l, v), rs in groups.items():
                if (c, l) != (cond, loss) or not compressed_by(v, marks):
                    continue
                got = [x for x in (steady(out, r) for r in rs) if x]
                if not got:
                    continue
                med, _ = ttt(rs)
                rows[v] = (path_of(v), len(rs), statistics.median(x["p50"] for x in got),
                           statistics.median(x["p99"] for x in got), med)
            if len({r[0] for r in rows.values()}) < 2:
                continue  # one path alone compares nothing
            exact = [r[2] for r in rows.values() if r[0] == "gradlane exact"]
            for v, (path, n, p50, p99, med) in sorted(
                rows.items(), key=lambda kv: (["gloo", "gradlane exact", "differentiated"]
                                              .index(kv[1][0]), kv[0])):
                vs = f"{p50 / min(exact):.2f}x" if path == "differentiated" and exact else ""
                shown = "not reached" if med is None else f"{med:.1f}"
                lines.append(
                    f"| {name} | {cond} | {loss:g} | {path} | {v} | {n} | {p50:.3f} "
                    f"| {p99:.3f} | {shown} | {vs} |"
                )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def evaluations(out: Path, r: dict) -> list[dict]:
    path = out / "runs" / f"{cell_name(r)}.csv"
    if not path.exists():
        return []
    return list(csv.DictReader(path.open()))


def plots(out: Path, runs: list[dict], target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = [r["variant"] for r in runs]
    panels = sorted(
        {(r["condition"], float(r["loss"])) for r in runs},
        key=lambda c: (c[0].startswith("compete"), c[0] != "plain", c[0], c[1]),
    )
    if not panels:
        return
    cols = min(3, len(panels))
    rows_n = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.5 * cols, 4 * rows_n), sharey=True,
                             squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (cond, loss) in zip(flat, panels):
        labelled = set()
        for r in sorted(runs, key=lambda r: variant_order(r["variant"])):
            if r["condition"] != cond or float(r["loss"]) != loss:
                continue
            ev = evaluations(out, r)
            if not ev:
                continue
            v = r["variant"]
            ax.plot(
                [float(e["train_s"]) for e in ev],
                [float(e["test_acc"]) for e in ev],
                color=color(v, every),
                alpha=0.9 if r["seed"] == "0" else 0.45,
                label=None if v in labelled else v,
            )
            labelled.add(v)
        ax.axhline(target, color="black", lw=0.6, ls=":")
        ax.set_title(f"{cond}, loss {loss:g}")
        ax.set_xlabel("training time, s")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=6)
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("test accuracy")
    r0 = runs[0]
    fig.suptitle(
        f"ResNet-18 (width {r0['width']}) on the digits, {r0['ranks']} ranks, "
        f"{r0['rate']} per rank, random loss on input; delay20: 20 ms one way"
    )
    fig.tight_layout()
    fig.savefig(out / "accuracy.png", dpi=110)
    plt.close(fig)

    # One group of bars per condition and loss, one bar per variant run there.
    groups = grouped(runs)
    variants = sorted({v for (_, _, v) in groups}, key=variant_order)
    fig, ax = plt.subplots(figsize=(max(10, 2.2 * len(panels)), 4.5))
    width = 0.85 / len(variants)
    labelled = set()
    for j, (cond, loss) in enumerate(panels):
        for i, v in enumerate(variants):
            rs = groups.get((cond, loss, v))
            if not rs:
                continue
            vals = [
                float(r["time_to_target_s"]) if r["time_to_target_s"] else float(r["train_s"])
                for r in rs
            ]
            missed = any(not r["time_to_target_s"] for r in rs)
            med = statistics.median(vals)
            ax.bar(
                j + (i - len(variants) / 2 + 0.5) * width,
                med,
                width,
                color=color(v, every),
                hatch="//" if missed else None,
                yerr=[[med - min(vals)], [max(vals) - med]] if len(vals) > 1 else None,
                capsize=2,
                label=None if v in labelled else v,
            )
            labelled.add(v)
    ax.set_xticks(range(len(panels)), [f"{c}, loss {x:g}" for c, x in panels], fontsize=8)
    ax.set_ylabel(f"training time to accuracy {target}, s")
    ax.set_title("Time to target (median over seeds, min-max bars; hatched: not reached, "
                 "drawn at its end)", fontsize=10)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "time_to_target.png", dpi=110)
    plt.close(fig)


def best_against_best(runs: list[dict], target: float) -> str:
    """Per key condition: gloo's best choice against gradlane's best."""
    groups = grouped(runs)
    # The accuracy bar: gloo's lossless final accuracy (median over seeds),
    # without compression (the better of cubic and bbr), or of any gloo
    # variant where those did not run.
    lossless = {v: rs for (c, l, v), rs in groups.items()
                if c == "plain" and l == 0.0 and family(v) == "gloo"}
    plain = {v: rs for v, rs in lossless.items() if "+" not in v} or lossless
    accs = [statistics.median(float(r["final_acc"]) for r in rs) for rs in plain.values()]
    gloo_acc = max(accs) if accs else None
    lines = [
        f"| condition | loss | side | best variant | runs | time to {target} s, median "
        "(min-max) | step p50 s | MB sent per step | final accuracy | gradlane / gloo | goal |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for cond, loss, goal in KEY_CELLS:
        meds = {}
        accs_of: dict[str, float] = {}
        for fam in ("gloo", "gradlane"):
            # gradlane's best choice where there is loss is the fastest that
            # meets the goal's accuracy bar, if one does; gloo's, the fastest.
            # The bar for the choice is no higher than the accuracy of the
            # gloo choice it is compared with (a compressor that misses the
            # bar over gloo too is still the one to beat); the verdict
            # below holds gradlane to the bar itself.
            bar = None
            lossy = loss > 0.0 or cond.startswith("tail")
            if fam == "gradlane" and lossy and gloo_acc is not None:
                bar = gloo_acc - ACCURACY_MARGIN
                if "gloo" in accs_of:
                    bar = min(bar, accs_of["gloo"])
            v = best(groups, cond, loss, fam, bar)
            if v is None:
                continue
            rs = groups[(cond, loss, v)]
            med, missed = ttt(rs)
            meds[fam] = med
            hit = [float(r["time_to_target_s"]) for r in rs if r["time_to_target_s"]]
            shown = "not reached" if med is None else f"{med:.1f}{spread(hit)}"
            if missed and med is not None:
                shown += f", {missed} not reached"
            p50 = statistics.median(float(r["step_p50_s"]) for r in rs)
            sent = [float(r["sent_bytes_per_step"]) for r in rs if r["sent_bytes_per_step"]]
            sent_s = f"{statistics.median(sent) / 1e6:.1f}" if sent else "-"
            acc = statistics.median(float(r["final_acc"]) for r in rs)
            accs_of[fam] = acc
            ratio = verdict = ""
            if fam == "gradlane" and meds.get("gloo") and med is not None:
                x = med / meds["gloo"]
                ratio = f"{x:.3f}x"
                # The accuracy bar holds where there is loss; lossless, the
                # goal is the time alone.
                acc_ok = not lossy or gloo_acc is None or acc >= gloo_acc - ACCURACY_MARGIN - 1e-9
                verdict = f"<= {goal:g}x: {'met' if x <= goal else 'missed'}"
                if not acc_ok:
                    verdict += f"; accuracy {acc:.3f} below the bar: missed"
                    if "gloo" in accs_of:
                        verdict += f" (gloo's choice: {accs_of['gloo']:.3f})"
            lines.append(
                f"| {cond} | {loss:g} | {fam} | {v} | {len(rs)} | {shown} | {p50:.2f} "
                f"| {sent_s} | {acc:.3f} | {ratio} | {verdict} |"
            )
    if gloo_acc is not None:
        lines.append("")
        lines.append(f"The goal's accuracy bar: gloo's lossless final accuracy, {gloo_acc:.3f}, "
                     f"less {ACCURACY_MARGIN * 100:g} points.")
    return "\n".join(lines) + "\n"


def pick(runs: list[dict], stage: str) -> list[str]:
    """The cells that stage of tta_bench.sh's PLAN=full runs next."""
    groups = grouped(runs)
    cells: list[str] = []
    if stage == "finalists":
        def score(v: str) -> float:
            t = 1.0
            for loss in (0.0, 0.05):
                rs = groups.get(("plain", loss, v))
                med = ttt(rs)[0] if rs else None
                t *= med if med is not None else 1e6
            return math.sqrt(t)

        for fam in ("gloo", "gradlane"):
            vs = sorted({v for (c, _, v) in groups if c == "plain" and family(v) == fam},
                        key=score)[:2]
            for v in vs:
                cells += [f"{v} 0.01 0 plain", f"{v} 0.01 0 delay20"]
    elif stage == "key":
        for cond, loss, _ in KEY_CELLS:
            for fam in ("gloo", "gradlane"):
                v = best(groups, cond, loss, fam)
                if v is not None:
                    cells += [f"{v} {loss:g} {s} {cond}" for s in (0, 1, 2)]
    elif stage == "compete":
        for fam in ("gloo", "gradlane"):
            v = best(groups, "plain", 0.0, fam)
            if v is not None:
                cells.append(f"{v} 0 0 compete")
        hooks = {v for (c, l, v) in groups if c == "plain" and l == 0.0 and v.startswith("hook")}
        if hooks:
            v = min(hooks, key=lambda v: (ttt(groups[("plain", 0.0, v)])[0] or 1e9))
            cells.append(f"{v} 0 0 compete-dscp")
    else:
        raise SystemExit(f"tta_report: --pick takes finalists, key or compete, not {stage!r}")
    return cells


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="docs/tta", help="scripts/tta_bench.sh's OUT")
    p.add_argument("--target", type=float, default=0.95, help="the runs' target accuracy")
    p.add_argument("--pick", metavar="STAGE", help="print the cells of a stage of PLAN=full")
    args = p.parse_args()
    out = Path(args.out)
    runs = list(csv.DictReader((out / "runs.csv").open()))
    if args.pick:
        print("\n".join(pick(runs, args.pick)))
        return 0
    if not runs:
        print(f"tta_report: no runs in {out / 'runs.csv'}", file=sys.stderr)
        return 1
    md = (
        "Best against best (per condition, the variant of each side with the least "
        "median time to target; gradlane's, where there is loss, the fastest of those "
        "that meet the goal's accuracy bar):\n\n" + best_against_best(runs, args.target)
        + "\nEvery variant:\n\n" + table(runs, args.target)
    )
    steadies = steady_table(out, runs)
    if steadies:
        md += (
            f"\nThe steady steps, {STEADY_FROM} and after (PowerSGD's plain warm-up "
            "steps left out; local SGD's still mix averaging steps with local ones; "
            "medians over seeds), and the share of the hook's payload bytes that "
            "travelled lossy there:\n\n" + steadies
        )
    attribution = attribution_table(out, runs)
    if attribution:
        md += (
            "\nWhat the mechanism adds: each compressor over gloo, over gradlane's "
            "exact backend and over gradlane's differentiated path, in the same cells "
            f"(steady steps, {STEADY_FROM} and after):\n\n" + attribution
        )
    hardware = sorted({r["hardware"] for r in runs if r.get("hardware")})
    if hardware:
        md += "\nHardware: " + "; ".join(hardware) + "\n"
    (out / "table.md").write_text(md)
    print(md)
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError:
        # A GPU host without network has none: the plots are made where the
        # runs are brought back (this script again, on the same OUT).
        print(f"tta_report: wrote {out / 'table.md'}; no matplotlib here, so no plots")
        return 0
    plots(out, runs, args.target)
    print(f"tta_report: wrote {out / 'table.md'}, {out / 'accuracy.png'}, {out / 'time_to_target.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
