"""The report as Markdown that reads well in a terminal (`cat`, `less`) as well as rendered.

Lines stay under 100 columns; the iteration-time figure becomes a sparkline with the
irregular steps marked underneath.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np

from collector.inputs.text import safe_text
from explain.report.model import Report, tied_root

BARS = "▁▂▃▄▅▆▇█"
WIDTH = 80  # sparkline columns
LINE = 100  # wrap prose here
NBSP = "\x00"  # stands for a space inside a `command` while wrapping


def sparkline(values: np.ndarray, width: int = WIDTH) -> str:
    """Values squeezed into `width` columns (each the max of its bin) as block characters."""
    n = len(values)
    bins = np.array_split(np.arange(n), min(width, n))
    peaks = np.array([values[b].max() for b in bins])
    lo, hi = float(peaks.min()), float(peaks.max())
    level = np.zeros(len(peaks), dtype=int) if hi <= lo else np.round((peaks - lo) / (hi - lo) * 7).astype(int)
    return "".join(BARS[i] for i in level)


def render_markdown(report: Report) -> str:
    """The report; control characters from inputs are shown as \\xNN, as in every terminal output."""
    r = report
    root = r.root
    out = [f"# laggard report: {r.job}", "", f"**{r.headline()}**", ""]
    status = {"healthy": "no", "hang": "STUCK (a collective never completed)"}.get(
        r.status, "slow from the first step (no normal iteration to compare with)" if r.from_start else "YES")
    out += [
        f"- **Irregular?** {status}"
        + (f" — {len(r.irregular_steps)} irregular step(s)" if r.irregular_steps else ""),
        "- **Since when?** " + (f"step {r.since_step}" + (f" ({r.since_utc})" if r.since_utc else "")
                                 if r.since_step is not None else "—"),
        (f"- **Time lost:** unknown — ~{r.slowdown:.2f}× its peers from the first step, no normal step to compare"
         if r.from_start else f"- **Time lost:** slowdown {r.slowdown:.2f}×, {r.lost_s:.1f} s extra × {r.world_size} GPUs"
         f" = **{r.gpu_hours_text()} GPU-hours**"),
        "- **Root cause:** " + (f"**{root['device']}** ({root.get('kind')}), confidence **{r.confidence}**"
                                 f" (score {root['score']:.2f})" if root else "none found") + _tie(r),
    ]
    if r.windows:
        out.append("- **Irregular windows:** " + ", ".join(
            f"{a}–{b}" + (f" ({p})" if p else "") if a != b else f"{a}" + (f" ({p})" if p else "")
            for a, b, p in r.windows))
    out += ["", "## Evidence", "", *_bullets(r.evidence, "no evidence: the job looks healthy")]
    out += ["", "## What to check", "", *_bullets(r.checks, "nothing to check")]
    out += ["", "## What to do", "", *_bullets(r.actions, "nothing to do")]
    if r.explanation:
        out += ["", "## Explanation", ""]
        out += [w for para in r.explanation.splitlines() for w in (textwrap.wrap(para, LINE) or [""])]
    if r.steps is not None and not r.steps.empty:
        durations = r.steps["duration_s"].to_numpy(dtype=float)
        line = sparkline(durations)
        irr = r.steps["irregular"].astype(bool).to_numpy()
        bins = np.array_split(np.arange(len(durations)), len(line))
        marks = "".join("^" if irr[b].any() else " " for b in bins)
        steps = r.steps["step"].to_numpy()
        out += ["", "## Iteration time", "", "```",
                f"{line}  max {durations.max():.3f} s",
                f"{marks.rstrip()}",
                f"step {steps[0]} … {steps[-1]}   (^ = irregular; min {durations.min():.3f} s)", "```"]
    if r.path:
        out += ["", "## Wait path (who waited on whom)", ""]
        for hop in sorted(r.path, key=lambda h: -h.level):
            if hop.level == 0:
                out.append(f"- root: {root['device'] if root else 'rank ' + str(hop.ranks[0])}")
            else:
                shown = ", ".join(map(str, hop.ranks[:8])) + (" …" if len(hop.ranks) > 8 else "")
                out.append(f"- {len(hop.ranks)} rank(s) waited via {', '.join(hop.groups) or '?'} "
                           f"({hop.wait_s:.2f} s): {shown}  ↓")
    if r.candidates:
        out += ["", "## Candidates", "", "| # | device | kind | score | source |", "|---|---|---|---|---|"]
        out += [f"| {i} | {c['device']} | {c.get('kind')} | {c['score']:.3f} | {c.get('source') or ''} |"
                for i, c in enumerate(r.candidates, 1)]
    if r.flows and r.flows.flagged:
        out += ["", "## Flow evidence", "", "Hosts well below the typical throughput: " + ", ".join(r.flows.flagged)]
    if r.logs and r.logs.lines:
        out += ["", "## Log excerpts", "", "```", *[f"{h}: {ln}"[:160] for h, ln in r.logs.lines], "```"]
    if r.notes:
        out += ["", "## Notes", "", *_bullets(r.notes, "")]
    return safe_text("\n".join(out) + "\n")


def _bullets(items: list[str], empty: str) -> list[str]:
    """Bullets wrapped to the terminal width, continuation lines indented under the text."""
    if not items:
        return [f"_{empty}_"] if empty else []
    # a `command` is never split: its spaces are held together while the prose around it wraps
    held = [re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", NBSP), i) for i in items]
    return [line.replace(NBSP, " ") for i in held
            for line in textwrap.wrap(i, LINE, initial_indent="- ", subsequent_indent="  ",
                                      break_on_hyphens=False, break_long_words=False)]


def _tie(r: Report) -> str:
    """The diagnosis's word on a tied root: which device a probe decided on, or that none was."""
    said = tied_root(r.diagnosis) if r.root else None
    return f"; diagnosis: **{said[0]}** ({said[1]})" if said else ""
