"""Draws the two pictures of docs/DESIGN.md: the layers and a round's
timeline. They are diagrams, not measurements: the timeline's proportions
are illustrative.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install matplotlib
    /tmp/venv/bin/python docs/diagrams.py
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

HERE = Path(__file__).resolve().parent


def box(ax, x, y, w, h, title, lines, color):
    ax.add_patch(
        FancyBboxPatch(
            (x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="#333", lw=1.2
        )
    )
    ax.text(x + w / 2, y + h - 0.06, title, ha="center", va="top", fontsize=12, weight="bold")
    ax.text(x + w / 2, y + h - 0.2, "\n".join(lines), ha="center", va="top", fontsize=8.5)


def arrow(ax, x0, y0, x1, y1):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=14, lw=1.4))


def layers():
    fig, ax = plt.subplots(figsize=(9, 4.6))
    ax.set_xlim(0, 9)
    ax.set_ylim(0, 4.6)
    ax.axis("off")
    box(ax, 0.2, 3.0, 8.6, 1.4, "gradlane-tools",
        ["sender, receiver, certs   |   round_bench, quinn_baseline, datagram_cost, codec_table",
         "ps_train, ps_bench, ps_sim, offline_round   |   mlp, sim (research code)",
         "criterion benches: core_round, codec"], "#e8eef7")
    box(ax, 0.2, 1.45, 8.6, 1.3, "gradlane  (the QUIC shell; its root is the API)",
        ["Endpoint, Config, Link (send_round / recv_round / close), ps_net, quic",
         "link/: send, receive, close, timing   |   tls   |   framing   |   tuning",
         "socket/: batching, marking (DSCP), faults, route_mtu   |   congestion/: capped_bbr, queue_gated_cubic"],
        "#e9f5e9")
    box(ax, 0.2, 0.05, 8.6, 1.15, "gradlane-core  (deterministic: no sockets, no clock, no async)",
        ["layout, score, classify, wire, encode, reassembly, control, bytes, rng, presets",
         "codec/ (sparse log-quantized)   |   ps/ (OrMo, straggler filter, baselines, messages)"],
        "#fbf1e3")
    arrow(ax, 4.5, 3.0, 4.5, 2.78)
    arrow(ax, 4.5, 1.45, 4.5, 1.23)
    ax.text(8.85, 2.9, "quinn 0.11, rustls, tokio", ha="right", va="top", fontsize=8, style="italic")
    fig.tight_layout()
    fig.savefig(HERE / "layers.png", dpi=110)
    plt.close(fig)


def timeline():
    fig, ax = plt.subplots(figsize=(10, 3.8))
    rows = {"sender: framing": 4, "sender -> network: important lanes": 3,
            "sender -> network: lossy, level 1, 2, 3": 2, "receiver": 1, "control stream": 0}
    for name, y in rows.items():
        ax.text(-0.3, y, name, ha="right", va="center", fontsize=9)
    ax.barh(4, 2.0, left=0.0, height=0.5, color="#8c8c8c")
    ax.barh(3, 5.6, left=0.3, height=0.5, color="#2f6db5")
    for i, c in enumerate(["#e0823b", "#eda06a", "#f5c9a6"]):
        ax.barh(2, 1.1, left=5.9 + 1.1 * i, height=0.5, color=c)
    ax.barh(1, 5.9, left=0.35, height=0.5, color="#b8cfe8")
    ax.barh(1, 3.6, left=6.25, height=0.5, color="#f3d9c3")
    marks = [
        (5.9, 2.62, "release: quinn has sent\nthe important bytes"),
        (6.25, 0.62, "ImportantReceived(r):\nround complete, confirmed"),
        (9.2, 0.62, "LossySent(r)"),
        (9.9, 1.38, "deliver: zero fill,\nlate data to next round"),
    ]
    for x, y, label in marks:
        ax.axvline(x, color="#555", lw=0.8, ls=":")
        ax.text(x + 0.05, y, label, fontsize=8, va="center")
    ax.annotate("", xy=(6.25, 0.2), xytext=(6.25, 1.0), arrowprops=dict(arrowstyle="-|>"))
    ax.annotate("", xy=(9.2, 0.2), xytext=(9.2, 2.0), arrowprops=dict(arrowstyle="-|>"))
    ax.set_ylim(-0.6, 4.6)
    ax.set_xlim(-0.1, 11.6)
    ax.set_yticks([])
    ax.set_xticks([])
    ax.set_xlabel("time (illustrative) ->")
    for s in ["top", "right", "left"]:
        ax.spines[s].set_visible(False)
    ax.set_title("One round on a link: important part first and exact, the lossy levels after it",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "round-timeline.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    layers()
    timeline()
