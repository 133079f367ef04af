"""Human-readable timeline: what an on-call engineer needs first, then the per-step detail.

Pure functions from a Timeline to text pieces; the CLI decides between a rich table (terminal)
and plain aligned columns (pipes, files, tests).
"""

from __future__ import annotations

import math

import numpy as np

from timeline.model import Timeline

SPARK = "▁▂▃▄▅▆▇█"
BAR = " ▏▎▍▌▋▊▉█"
#: With more steps than this, the table shows irregular steps and the edges only.
FULL_TABLE_STEPS = 40
HEADERS = ("step", "duration", "baseline", "ratio", "pattern", "")


def fmt_seconds(s: float | None) -> str:
    """0.0813 -> '81.3 ms', 2.5 -> '2.50 s'; None/NaN -> '-'."""
    if s is None or not math.isfinite(s):
        return "-"
    if s < 1.0:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def sparkline(values: np.ndarray, width: int = 80) -> str:
    """One character per step (bucket maxima when there are more steps than `width`)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return ""
    if v.size > width:
        v = np.array([chunk.max() for chunk in np.array_split(v, width)])
    lo, hi = float(v.min()), float(v.max())
    if hi <= lo:
        return SPARK[0] * v.size
    idx = np.round((v - lo) / (hi - lo) * (len(SPARK) - 1)).astype(int)
    return "".join(SPARK[i] for i in idx)


def bar(value: float, top: float, width: int = 20) -> str:
    """A horizontal bar of `value` on a scale whose full width is `top`."""
    if not math.isfinite(value) or top <= 0:
        return ""
    eighths = round(max(value, 0.0) / top * width * 8)
    return "█" * (eighths // 8) + (BAR[eighths % 8] if eighths % 8 else "")


def summary_lines(tl: Timeline) -> list[str]:
    """Status, since when, how much slower, how much time lost, what the job looks like."""
    st = tl.steps
    n = len(st)
    hosts = len(tl.meta.hosts())
    kinds = ", ".join(f"{v} {k}" for k, v in tl.kinds_summary().items()) or "none recognized"
    lines = [f"job {tl.job}: {tl.meta.world_size} GPUs on {hosts} host(s), {n} step(s); groups: {kinds}"]
    if tl.status == "irregular" and tl.slow_from_start:
        lines.append(f"status: SLOW {tl.slow_since()} (~{tl.slowdown:.2f}x) — no step is irregular against its "
                     "neighbours; `laggard localize` names who is slow")
    elif tl.status == "irregular":
        irr = st[st["irregular"]]
        patterns = ", ".join(f"{p} x{c}" for p, c in irr["pattern"].value_counts().items())
        lost = float((irr["duration_s"] - irr["baseline_s"]).sum())
        total = float(np.nansum(st["duration_s"]))
        lines.append(
            f"status: IRREGULAR since step {tl.since()} — {len(irr)} of {n} steps irregular "
            f"({patterns}); irregular steps ran {tl.slowdown:.2f}x their baseline (median)"
        )
        lines.append(
            f"time lost: {fmt_seconds(lost)} of {fmt_seconds(total)} "
            f"({100 * lost / total if total else 0:.1f}%); irregular steps: {_ranges(tl.irregular_steps)}"
        )
    elif tl.status == "hang":
        lines.append("status: HANG — no operator completed; ranks are stuck in the operators they entered")
    else:
        typical = float(np.nanmedian(st["duration_s"])) if n else float("nan")
        calm = st[(st["pattern"] != "warm-up") & st["ratio"].notna()] if n else st
        worst = calm.iloc[int(np.argmax(calm["ratio"].to_numpy(float)))] if len(calm) else None
        if worst is None or float(worst["ratio"]) < tl.delta:
            lines.append(f"status: healthy — no step ran {tl.delta:.2f}x its baseline; typical step {fmt_seconds(typical)}")
        else:  # (a step over δ that `settle` left out: within the job's own noise, or too brief to cost time)
            lines.append(f"status: healthy — no slowdown that lasts: the slowest step ({int(worst['step'])}) ran "
                         f"{float(worst['ratio']):.2f}x its baseline, within this job's step-to-step noise or too "
                         f"brief to lose time; typical step {fmt_seconds(typical)}")
    if tl.expected_step_s is not None:
        lines.append(f"expected step time (model and hardware figures): {fmt_seconds(tl.expected_step_s)}")
    if n:
        lines.append(f"durations: {sparkline(st['duration_s'].to_numpy())}")
    return lines


def step_rows(tl: Timeline) -> list[tuple[str, ...]]:
    """Table rows; long traces show the first and last steps and the irregular ones (long
    unbroken runs of those by their ends), '…' standing for the steps left out."""
    st = tl.steps
    if st.empty:
        return []
    top = float(np.nanmax(st["duration_s"]))
    keep = np.ones(len(st), dtype=bool)
    if len(st) > FULL_TABLE_STEPS:
        irr = st["irregular"].to_numpy()
        keep[:] = False
        keep[:3] = keep[-3:] = True
        # irregular steps, but only the first three and last two of a long unbroken run
        run_start = np.flatnonzero(irr & ~np.r_[False, irr[:-1]])
        run_end = np.flatnonzero(irr & ~np.r_[irr[1:], False])
        for a, b in zip(run_start.tolist(), run_end.tolist(), strict=True):  # one per run
            keep[a:b + 1] = True
            if b - a + 1 > 6:
                keep[a + 3:b - 1] = False
    rows: list[tuple[str, ...]] = []
    last = -1  # index of the previous row shown
    for i in np.flatnonzero(keep).tolist():
        if last >= 0 and i > last + 1:
            rows.append(("…", f"{i - last - 1} steps", "", "", "", ""))
        r = st.iloc[i]
        mark = "!" if r["irregular"] else ""
        rows.append((
            f"{int(r['step'])}{mark}",
            fmt_seconds(float(r["duration_s"])),
            fmt_seconds(float(r["baseline_s"])),
            f"{r['ratio']:.2f}" if math.isfinite(r["ratio"]) else "-",
            str(r["pattern"]),
            bar(float(r["duration_s"]), top),
        ))
        last = i
    return rows


def render_plain(tl: Timeline) -> str:
    """The whole text report as plain aligned columns."""
    out = summary_lines(tl)
    rows = step_rows(tl)
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
        out.append("")
        out.append("  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)).rstrip())
        out.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    if tl.notes:
        out.append("")
        out.extend(f"note: {n}" for n in tl.notes)
    return "\n".join(out)


def _ranges(steps: list[int]) -> str:
    """[3,4,5,9] -> '3-5, 9'."""
    if not steps:
        return "none"
    parts: list[str] = []
    start = prev = steps[0]
    for s in steps[1:]:
        if s != prev + 1:
            parts.append(f"{start}-{prev}" if prev > start else str(start))
            start = s
        prev = s
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ", ".join(parts)
