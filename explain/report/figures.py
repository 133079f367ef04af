"""The report's figures, drawn with matplotlib and returned as self-contained SVG data URIs.

Each figure is an SVG in its own data URI, so the page needs no network, no files beside it,
and the element ids of different figures cannot collide. `Figure` is used without pyplot so
drawing keeps no global state (the service renders reports from worker threads).
"""

from __future__ import annotations

import base64
import io

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from explain.report.model import Report

matplotlib.rcParams["svg.hashsalt"] = "laggard"  # deterministic ids: the same report gives the same page
PATTERN_COLOR = {"spike": "#f4a261", "fluctuation": "#e9c46a", "persistent": "#e76f51", "": "#e76f51"}
OP_COLOR = {
    "all_reduce": "#264653", "all_gather": "#2a9d8f", "reduce_scatter": "#8ab17d", "all_to_all": "#e9c46a",
    "broadcast": "#f4a261", "reduce": "#a0522d", "barrier": "#6c757d", "send": "#7b2cbf", "recv": "#c77dff",
}
MAX_HEAT_ROWS = 256


def to_data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def iteration_time(report: Report) -> str | None:
    """Iteration time over steps, the baseline, and the irregular windows shaded."""
    s = report.steps
    if s is None or s.empty:
        return None
    fig = Figure(figsize=(10, 3.2))
    ax = fig.add_subplot()
    for first, last, pattern in report.windows:
        ax.axvspan(first - 0.5, last + 0.5, color=PATTERN_COLOR.get(pattern, "#e76f51"), alpha=0.25, lw=0)
    ax.plot(s["step"], s["duration_s"], color="#264653", lw=1.2, marker=".", ms=3, label="iteration time")
    if "baseline_s" in s:
        ax.plot(s["step"], s["baseline_s"], color="#2a9d8f", lw=1, ls="--", label="baseline")
    irr = s[s["irregular"].astype(bool)]
    ax.scatter(irr["step"], irr["duration_s"], color="#d62828", s=14, zorder=3, label="irregular")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("Iteration time (shaded: irregular windows)", loc="left", fontsize=10)
    ax.legend(loc="upper left", fontsize=8, frameon=False, ncol=3)
    ax.grid(alpha=0.3)
    return to_data_uri(fig)


def wait_heatmap(report: Report) -> str | None:
    """Rank × step operator wait; with many ranks, rows are binned by their maximum."""
    w = report.waits
    if w is None or w.seconds.size == 0:
        return None
    data, ranks = w.seconds, w.ranks
    bin_size = int(np.ceil(len(ranks) / MAX_HEAT_ROWS))
    if bin_size > 1:
        pad = (-len(ranks)) % bin_size
        data = np.pad(data, ((0, pad), (0, 0))).reshape(-1, bin_size, data.shape[1]).max(axis=1)
    fig = Figure(figsize=(10, 4.2))
    ax = fig.add_subplot()
    extent = (float(w.steps[0]) - 0.5, float(w.steps[-1]) + 0.5, float(ranks[-1]) + 0.5, float(ranks[0]) - 0.5)
    im = ax.imshow(data, aspect="auto", cmap="magma", interpolation="nearest", extent=extent)
    fig.colorbar(im, ax=ax, label="wait (s)")
    root = report.root
    if root and root.get("rank") is not None:
        ax.axhline(int(root["rank"]), color="#2ec4b6", lw=0.8, ls=":")
        ax.text(extent[0], int(root["rank"]), f" root: rank {root['rank']}", color="#2ec4b6", fontsize=8,
                va="bottom", ha="left")
    ax.set_xlabel("step")
    ax.set_ylabel("rank" + (f" (bins of {bin_size})" if bin_size > 1 else ""))
    ax.set_title("Operator wait per rank and step (bright = waited long)", loc="left", fontsize=10)
    return to_data_uri(fig)


def wait_graph(report: Report) -> str | None:
    """The wait-graph path: boxes of waiting ranks, level by level, down to the root cause."""
    if not report.path:
        return None
    hops = list(reversed(report.path))  # most distant waiters on the left, the root on the right
    fig = Figure(figsize=(2.6 * len(hops) + 0.4, 2.4))
    ax = fig.add_subplot()
    ax.set_xlim(0, len(hops))
    ax.set_ylim(0, 1)
    ax.axis("off")
    root = report.root
    for i, hop in enumerate(hops):
        is_root = hop.level == 0
        if is_root:
            label = root["device"] if root else f"rank {hop.ranks[0]}"
            label = f"ROOT CAUSE\n{label}\n{len(hop.ranks)} rank(s)"
        else:
            shown = ", ".join(map(str, hop.ranks[:4])) + (" …" if len(hop.ranks) > 4 else "")
            via = ", ".join(hop.groups) or "?"
            label = f"{len(hop.ranks)} rank(s) waited\nvia {via} groups\n{hop.wait_s:.2f} s total\nranks {shown}"
        box = FancyBboxPatch((i + 0.06, 0.12), 0.8, 0.76, boxstyle="round,pad=0.02",
                             fc="#fde2e4" if is_root else "#e9f5f2", ec="#d62828" if is_root else "#2a9d8f", lw=1.4)
        ax.add_patch(box)
        ax.text(i + 0.46, 0.5, label, ha="center", va="center", fontsize=8, wrap=True)
        if i < len(hops) - 1:
            ax.annotate("", xy=(i + 1.06, 0.5), xytext=(i + 0.86, 0.5),
                        arrowprops={"arrowstyle": "-|>", "color": "#264653", "lw": 1.5})
    ax.set_title("Wait graph: who waited on whom (arrows point to the rank waited on)", loc="left", fontsize=10)
    return to_data_uri(fig)


def gantt(report: Report) -> str | None:
    """One slow iteration beside one normal iteration, on the same time scale."""
    if report.gantt_steps is None or report.gantt_slow is None or report.gantt_normal is None:
        return None
    slow_step, normal_step = report.gantt_steps
    frames = ((report.gantt_normal, f"normal step {normal_step}"), (report.gantt_slow, f"slow step {slow_step}"))
    present = set(report.gantt_slow["rank"]) | set(report.gantt_normal["rank"])
    on_path = [r for hop in report.path for r in hop.ranks if r in present]
    ranks = list(dict.fromkeys([*on_path, *sorted(present)]))  # root first, then its waiters
    roots = set(report.path[0].ranks) if report.path else set()
    ypos = {r: i for i, r in enumerate(ranks)}
    fig = Figure(figsize=(11, 0.35 * len(ranks) + 1.6))
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    seen: set[str] = set()
    for ax, (df, title) in zip(axes, frames, strict=True):
        for op, part in df.groupby("op"):
            y = part["rank"].map(ypos).to_numpy()
            ax.barh(y, (part["t1"] - part["t0"]).to_numpy(), left=part["t0"].to_numpy(), height=0.7,
                    color=OP_COLOR.get(str(op), "#999999"), label=None if op in seen else str(op), lw=0)
            seen.add(str(op))
        ax.set_title(title, loc="left", fontsize=10)
        ax.set_xlabel("seconds since the rank's step start")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(ranks)), [f"rank {r}" + (" (root)" if r in roots else "") for r in ranks], fontsize=8)
    axes[0].invert_yaxis()
    fig.legend(loc="lower center", ncol=max(1, min(len(seen), 9)), fontsize=8, frameon=False, bbox_to_anchor=(0.5, 1.0))
    return to_data_uri(fig)


def flow_chart(report: Report) -> str | None:
    f = report.flows
    if f is None or not f.hosts:
        return None
    fig = Figure(figsize=(10, 0.25 * len(f.hosts) + 1.2))
    ax = fig.add_subplot()
    colors = ["#d62828" if h in f.flagged else "#2a9d8f" for h in f.hosts]
    ax.barh(range(len(f.hosts)), f.gbps, color=colors)
    ax.set_yticks(range(len(f.hosts)), f.hosts, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("median burst throughput leaving the host (Gbit/s)")
    ax.set_title("Flow evidence: slowest hosts (red: well below the job's typical host)", loc="left", fontsize=10)
    return to_data_uri(fig)


def log_chart(report: Report) -> str | None:
    lg = report.logs
    if lg is None or not lg.hosts or not any(lg.counts):
        return None
    fig = Figure(figsize=(10, 0.25 * len(lg.hosts) + 1.2))
    ax = fig.add_subplot()
    ax.barh(range(len(lg.hosts)), lg.counts, color="#e76f51")
    ax.set_yticks(range(len(lg.hosts)), lg.hosts, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("suspicious log lines (errors, warnings, timeouts, hardware events)")
    ax.set_title("Log evidence per host", loc="left", fontsize=10)
    return to_data_uri(fig)


FIGURES = (
    ("Iteration time", iteration_time),
    ("Operator wait, rank × step", wait_heatmap),
    ("Wait graph to the root cause", wait_graph),
    ("Slow iteration beside a normal one", gantt),
    ("Network flows", flow_chart),
    ("Logs", log_chart),
)
