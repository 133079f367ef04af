"""Step table for the localizer: `timeline.build.build_timeline` when present, else a minimal one.

The fallback measures each step on every rank's own clock (end of its last operator of the
step minus end of its last operator of the previous step), takes the median over ranks, and
judges δ-irregularity against the rolling median of the preceding steps. It exists so that
localize/ runs while the timeline stage is unavailable; the timeline stage is preferred.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from collector.meta import JobMeta
from collector.traceio import Trace

WINDOW = 8


@dataclass
class StepView:
    """The part of timeline.model.Timeline the localizer reads."""

    job: str
    meta: JobMeta
    steps: pd.DataFrame  # step, duration_s, baseline_s, ratio, irregular, pattern
    irregular_steps: list[int] = field(default_factory=list)
    slowdown: float = 1.0
    status: str = "healthy"
    group_kind: dict[str, str] = field(default_factory=dict)


def judge(durations: pd.Series, delta: float = 1.1) -> pd.DataFrame:
    """δ-irregular steps: duration over delta x the median of the previous WINDOW normal steps."""
    d = durations.sort_index()
    vals = d.to_numpy(np.float64)
    base = np.full(len(vals), np.nan)
    irregular = np.zeros(len(vals), dtype=bool)
    normal: list[float] = []
    for i, v in enumerate(vals):  # one iteration per training step, not per operator
        ref = normal[-WINDOW:] if normal else list(vals[: min(len(vals), WINDOW)])
        base[i] = float(np.median(ref))
        irregular[i] = v > delta * base[i]
        if not irregular[i]:
            normal.append(float(v))
    return pd.DataFrame({"step": d.index.to_numpy(np.int64), "duration_s": vals, "baseline_s": base,
                         "ratio": vals / base, "irregular": irregular, "pattern": ""})


def step_durations(df: pd.DataFrame) -> pd.Series:
    """Median over ranks of each step's length on the rank's own clock."""
    last = df[df["step"] >= 0].groupby(["rank", "step"])["end_ns"].max().unstack("step").sort_index(axis=1)
    first = df[df["step"] >= 0].groupby(["rank", "step"])["start_ns"].min().unstack("step").sort_index(axis=1)
    dur = last.diff(axis=1)
    dur.iloc[:, 0] = last.iloc[:, 0] - first.iloc[:, 0]
    return (dur.median(axis=0) * 1e-9).rename("duration_s")


def step_view(trace: Trace, df: pd.DataFrame, steps: tuple[int, int] | None) -> StepView:
    """The timeline of the trace: from the timeline stage if installed, else the fallback."""
    try:
        build = importlib.import_module("timeline.build")
    except ImportError:
        build = None
    if build is not None and hasattr(build, "build_timeline"):
        tl = build.build_timeline(trace, steps=steps)
        return StepView(tl.job, tl.meta, tl.steps, list(tl.irregular_steps), float(tl.slowdown), tl.status,
                        dict(tl.group_kind))
    table = judge(step_durations(df)) if len(df) else pd.DataFrame(columns=["step", "duration_s", "baseline_s", "ratio", "irregular", "pattern"])
    irr = [int(s) for s in table.loc[table["irregular"].astype(bool), "step"]]
    normal = table.loc[~table["irregular"].astype(bool), "duration_s"]
    slow = float(table.loc[table["irregular"].astype(bool), "duration_s"].median() / normal.median()) if irr and len(normal) else 1.0
    return StepView(trace.meta.job, trace.meta, table, irr, slow, "irregular" if irr else "healthy", {})
