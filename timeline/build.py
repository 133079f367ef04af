"""Build a job's Timeline from its CommOps: group kinds, step durations, δ-irregular steps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

from collector.inputs.errors import TraceError, UserError
from collector.trace.meta import JobMeta, coverage_note
from collector.trace.traceio import Trace
from timeline.columns import read_commops
from timeline.groups import infer_group_kinds
from timeline.model import Timeline, empty_steps
from timeline.steps import (
    clock_offsets_by_step,
    extent_step_durations,
    first_step_whole,
    infer_steps,
    judge_window,
    slowdown,
    spread,
    step_rank_extent,
    warmup_note,
)

COLUMNS = ("rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step")
#: What step durations need of every row; the other columns are read for sampled steps only.
NARROW = ("rank", "group", "step", "start_ns", "end_ns")
#: Steps sampled for group kinds and clock offsets (first, middle, last).
SAMPLED_STEPS = 5


def build_timeline(trace: Trace, steps: tuple[int, int] | None = None, delta: float = 1.1) -> Timeline:
    """The timeline of one job, optionally only steps A..B (inclusive).

    Reads only the CommOps columns it needs. Step numbers are inferred when the trace has none.
    """
    if delta <= 1.0:
        raise UserError(f"--delta {delta} must be above 1", "use e.g. --delta 1.1 (10% slower than typical)")
    if not trace.has("commops"):
        raise TraceError(
            f"{trace.path}: the timeline needs commops evidence",
            "add commops.parquet (sidecar, import or simulate); for flow-only traces use `laggard localize --flows`",
        )
    notes: list[str] = [n] if (n := coverage_note(trace.meta)) else []
    df = _read(trace, steps, NARROW)
    if df.empty and steps is None and (stuck := _pending_ops(trace)):
        return Timeline(job=trace.meta.job, meta=trace.meta, group_kind={}, steps=empty_steps(), status="hang",
                        delta=delta, notes=[
                            f"no operator completed: the trace holds only the {stuck} operator(s) its ranks entered and "
                            "never finished (a hang snapshot); `laggard localize` names the ranks they wait on"])
    if trace.meta.extra.get("source") == "flight-recorder" and (stuck := _pending_ops(trace)):
        notes.append(f"the dump also holds {stuck} operator(s) entered and never completed: the job is stuck after "
                     "these steps; `laggard localize` names the ranks they wait on")
    if df.empty:
        raise UserError(f"{trace.path}: no operator rows" + (f" in steps {steps[0]}:{steps[1]}" if steps else ""),
                        "check --steps against the steps the trace holds")
    if (df["step"].to_numpy() < 0).all():
        df = _read(trace, steps, COLUMNS)  # inference needs every column of every row
        df["step"] = infer_steps(df)
        notes.append(
            f"step numbers were not recorded: inferred {int(df['step'].max()) + 1} steps from each rank's "
            "repeating operator pattern"
        )
        if steps is not None:
            df = df[(df["step"] >= steps[0]) & (df["step"] <= steps[1] + 1)]
    step_col = df["step"].to_numpy()
    known = step_col >= 0
    every = bool(known.all())  # (then no row-sized copy is taken below)
    all_steps = np.unique(step_col if every else step_col[known])
    rank_col = df["rank"].to_numpy()
    whole = len(all_steps) > 0 and first_step_whole(step_col if every else step_col[known],
                                                    rank_col if every else rank_col[known],
                                                    int(all_steps[0]), len(all_steps))
    del rank_col
    # what the step times need of every row, taken before the sample is read: the rows' times
    # and ranks are not held beside it
    extent = step_rank_extent(df if every else df[known])
    del step_col, known
    if not set(COLUMNS) <= set(df.columns):
        df = df[["step", "group"]]
    sample = _sample(trace, df, spread(all_steps, SAMPLED_STEPS))
    del df
    kinds = infer_group_kinds(sample, trace.meta, notes)
    offsets = clock_offsets_by_step(sample, trace.meta, all_steps, SAMPLED_STEPS)
    durations = extent_step_durations(extent, trace.meta, offsets)
    if steps is not None:
        durations = durations[(durations.index >= steps[0]) & (durations.index <= steps[1])]
    if len(durations) and len(durations) < 3:
        notes.append(f"only {len(durations)} step(s): too few for a rolling baseline")
    from_start = steps is None or (len(all_steps) > 0 and steps[0] <= int(all_steps[0]))
    table, warmup, onset = judge_window(durations, delta, warmup=from_start, first_whole=whole) if len(durations) else (empty_steps(), [], None)
    if warmup:
        notes.append(warmup_note(warmup))
    noise = table.loc[table["pattern"] == "noise", "step"].astype(int).tolist()
    if noise:
        notes.append(f"{len(noise)} step(s) ran slightly slow now and then ({', '.join(map(str, noise[:5]))}): "
                     "too little time lost to call the job irregular")
    irregular = [int(s) for s in table.loc[table["irregular"], "step"]]
    notes.append(_clock_note(offsets))
    expected = expected_step_seconds(trace.meta)
    if expected is None:
        notes.append("no expected step time: meta has no model {params, tokens_per_step} and "
                     "hardware {peak_tflops, mfu} figures")
    elif len(table):
        typical = float(np.nanmedian(table["baseline_s"]))
        notes.append(f"expected step time {expected:.3g}s from model and hardware figures; "
                     f"typical measured {typical:.3g}s ({typical / expected:.2f}x)")
    return Timeline(
        job=trace.meta.job,
        meta=trace.meta,
        group_kind=kinds,
        steps=table,
        irregular_steps=irregular,
        slowdown=slowdown(table) if len(table) else 1.0,
        status="irregular" if irregular else "healthy",
        expected_step_s=expected,
        notes=[n for n in notes if n],
        delta=delta,
        onset_step=onset,
        warmup_steps=warmup,
    )


def expected_step_seconds(meta: JobMeta) -> float | None:
    """6 · params · tokens per step / (GPUs · peak FLOP/s · MFU), when meta carries the figures."""
    model: Any = meta.extra.get("model")
    hw: Any = meta.extra.get("hardware")
    if not isinstance(model, dict) or not isinstance(hw, dict):
        return None
    try:
        params = float(model["params"])
        tokens = float(model["tokens_per_step"])
        peak = float(hw["peak_tflops"]) * 1e12
        mfu = float(hw.get("mfu", 0.4))
    except (KeyError, TypeError, ValueError):
        return None
    if min(params, tokens, peak, mfu, meta.world_size) <= 0:
        return None
    return 6.0 * params * tokens / (meta.world_size * peak * mfu)


def _pending_ops(trace: Trace) -> int:
    """Operators entered and never completed (a Flight Recorder snapshot or the logger's pending files)."""
    from collector.commops.layout import read_pending

    pending = read_pending(trace.path)
    return pending.num_rows if pending is not None else 0


def _read(trace: Trace, steps: tuple[int, int] | None, columns: tuple[str, ...]) -> pd.DataFrame:
    """Some columns; with a step range, that range plus the next step (to close the last one)
    and any rows without a step number (so hidden steps can still be inferred)."""
    if steps is None:
        return read_commops(trace, columns)
    hi = min(steps[1] + 1, 2**31 - 1)
    expr = (ds.field("step") < 0) | ((ds.field("step") >= steps[0]) & (ds.field("step") <= hi))
    return read_commops(trace, columns, expr=expr)


def _sample(trace: Trace, df: pd.DataFrame, picks: np.ndarray) -> pd.DataFrame:
    """Every column of a few sampled steps (every step runs the same groups), plus every row of
    any group they miss: group kinds and clock offsets cost a few steps' rows, not the trace's."""
    step = df["step"].to_numpy()
    chosen = np.isin(step, picks)
    group = df["group"]
    missing = [str(g) for g in pd.unique(group[~group.isin(pd.unique(group[chosen])).to_numpy()])]
    if set(COLUMNS) <= set(df.columns):
        return df[chosen | group.isin(missing).to_numpy()]
    expr = ds.field("step").isin([int(s) for s in picks])
    if missing:
        expr = expr | ds.field("group").isin(missing)
    return read_commops(trace, COLUMNS, expr=expr)


def _clock_note(offsets: pd.DataFrame) -> str:
    """How far apart host clocks are (informational: durations are measured on aligned clocks)."""
    if offsets.empty or offsets.shape[1] < 2:
        return ""
    span = float((offsets.max(axis=1) - offsets.min(axis=1)).max()) / 1e6
    if span < 1.0:
        return ""
    return (f"host clocks disagree by up to {span:.0f} ms; step times are measured after aligning "
            "them on the operators hosts share")
