"""Step table for the localizer: `timeline.build.build_timeline` when present, else a minimal one.

The fallback measures each step on every rank's own clock (end of its last operator of the
step minus end of its last operator of the previous step), takes the median over ranks, and
judges δ-irregularity against the rolling median of the preceding steps. It exists so that
localize/ runs while the timeline stage is unavailable; the timeline stage is preferred.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta
from collector.trace.traceio import Trace
from localize.ops.grouping import dense_codes, group_max, group_min
from timeline.steps import judge_from_fast_half


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
    onset_step: int | None = None


def infer_steps(df: pd.DataFrame) -> np.ndarray:
    """Per row: the training step, for records logged without step markers (step = -1).

    The gradient sync — the collectives with the largest payload — closes every step; on each
    rank's own clock, a step ends where a run of those operators ends.
    """
    rank = df["rank"].to_numpy(np.int64)
    start = df["start_ns"].to_numpy(np.int64)
    order = np.lexsort((start, rank))
    is_coll = ~df["op"].isin(["send", "recv"]).to_numpy(bool)
    nbytes = df["nbytes"].to_numpy(np.int64)
    big = nbytes[is_coll].max(initial=0)
    anchor = (is_coll & (nbytes == big))[order]
    r = rank[order]
    last_of_rank = np.r_[r[1:] != r[:-1], True]
    nxt_anchor = np.r_[anchor[1:], False]
    burst_end = anchor & (~nxt_anchor | last_of_rank)
    ends_before = np.cumsum(burst_end) - burst_end
    first = np.r_[True, r[1:] != r[:-1]]
    base = np.maximum.accumulate(np.where(first, ends_before, 0))
    out = np.empty(len(df), dtype=np.int64)
    out[order] = ends_before - base
    return out


def with_steps(df: pd.DataFrame) -> pd.DataFrame:
    """The records with a usable step column (inferred when the logger wrote none)."""
    if len(df) and (df["step"].to_numpy() < 0).all() and {"op", "nbytes"} <= set(df.columns):
        df = df.copy()
        try:  # the timeline stage's inference, so step numbers agree with its step table
            infer = importlib.import_module("timeline.steps").infer_steps
            df["step"] = np.asarray(infer(df)).astype(np.int32)
        except (ImportError, AttributeError, KeyError):
            df["step"] = infer_steps(df).astype(np.int32)
    return df


def step_durations(df: pd.DataFrame) -> pd.Series:
    """Median over ranks of each step's length on the rank's own clock: end of the rank's last
    operator of the step minus that of the previous step (the first step: minus its first
    start). Ranks missing a step do not count for it or the next one."""
    step = df["step"].to_numpy(np.int64)
    keep = step >= 0
    step = step[keep]
    if len(step) == 0:
        return pd.Series(np.zeros(0), index=pd.Index(step, name="step"), name="duration_s")
    scode, n_steps = dense_codes(step, by_first=False)  # in step order
    steps = np.empty(n_steps, dtype=np.int64)
    steps[scode] = step
    rank, n_rank = dense_codes(df["rank"].to_numpy(np.int64)[keep], by_first=False)
    start = df["start_ns"].to_numpy(np.int64)[keep]
    t0 = int(start.min())
    cell = rank * len(steps) + scode
    last = group_max(cell, n_rank * len(steps), (df["end_ns"].to_numpy(np.int64)[keep] - t0).astype(np.float64))
    first = group_min(cell, n_rank * len(steps), (start - t0).astype(np.float64))
    last = np.where(np.isfinite(last), last, np.nan).reshape(n_rank, len(steps))
    first = np.where(np.isfinite(first), first, np.nan).reshape(n_rank, len(steps))
    dur = np.empty_like(last)
    dur[:, 0] = last[:, 0] - first[:, 0]
    dur[:, 1:] = last[:, 1:] - last[:, :-1]
    with warnings.catch_warnings():  # a step no rank has in full has no duration (NaN)
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(dur, axis=0)
    return pd.Series(med * 1e-9, index=pd.Index(steps, name="step"), name="duration_s")


#: the CommOps columns the fallback reads
FALLBACK_COLUMNS = ["rank", "step", "start_ns", "end_ns", "op", "nbytes"]


def step_view(trace: Trace, steps: tuple[int, int] | None) -> StepView:
    """The timeline of the trace: from the timeline stage if installed, else the fallback (which
    reads its own columns: the timeline stage reads what it needs, so no frame waits beside it)."""
    try:
        build = importlib.import_module("timeline.build")
    except ImportError:
        build = None
    if build is not None and hasattr(build, "build_timeline"):
        tl = build.build_timeline(trace, steps=steps)
        return StepView(tl.job, tl.meta, tl.steps, list(tl.irregular_steps), float(tl.slowdown), tl.status,
                        dict(tl.group_kind), tl.onset_step)
    df = with_steps(trace.commops(columns=FALLBACK_COLUMNS, steps=steps))
    table = judge_from_fast_half(step_durations(df)) if len(df) else pd.DataFrame(columns=["step", "duration_s", "baseline_s", "ratio", "irregular", "pattern"])
    irr = [int(s) for s in table.loc[table["irregular"].astype(bool), "step"]]
    normal = table.loc[~table["irregular"].astype(bool), "duration_s"]
    slow = float(table.loc[table["irregular"].astype(bool), "duration_s"].median() / normal.median()) if irr and len(normal) else 1.0
    return StepView(trace.meta.job, trace.meta, table, irr, slow, "irregular" if irr else "healthy", {})
