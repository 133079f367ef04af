"""An operator's normal time, from its own history: its slot's median and quartiles over the
reference (normal) steps, and the step-time baseline that drift-normalizes them.

A slot occurs once per step, so its history is one row of a slots x steps matrix (filled by
chunks: no row-sized gathers beside it). The detector, the transfers' judgement and the wait
graph all measure "slow" against these figures.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from localize.ops.grouping import unique
from localize.ops.table import _CHUNK, Ops, _step_codes, in_steps


def slot_history(ops: Ops, ref_steps: np.ndarray | None, scale: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row (median, q1, q3) of the row's slot over reference steps (normal iterations).

    `scale` (per row) divides elapsed first: the rolling step-time baseline, so slow drift
    of iteration time does not read as abnormal (auto-tuning without retraining).
    """
    e = ops.elapsed if scale is None else ops.elapsed / scale
    m, a, b = slot_quantiles(ops, e, ref_steps)
    # slots never seen in reference steps fall back to the instance minimum (transfer time)
    miss = np.isnan(m)
    if miss.any():
        fb = ops.inst_min[ops.inst] if scale is None else ops.inst_min[ops.inst] / scale
        m, a, b = np.where(miss, fb, m), np.where(miss, fb, a), np.where(miss, fb, b)
    return m, a, b


def slot_quantiles(ops: Ops, e: np.ndarray, ref_steps: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row (median, q1, q3) of any per-row value over the row's slot in reference steps
    (NaN where the slot has none)."""
    med, q1, q3 = slot_stats(ops, e, ref_steps)
    return med[ops.slot], q1[ops.slot], q3[ops.slot]


def _history_matrix(ops: Ops, e: np.ndarray, use: np.ndarray, keep: np.ndarray | None,
                    pick: np.ndarray | None = None, n_pick: int = 0) -> np.ndarray:
    """The slots x steps matrix of `e` over the rows `use` selects (NaN where a slot has no row
    of a step, or its row is not kept), one column per step those rows hold, in step order.
    Filled chunk by chunk in row order: no row-sized gathers of the selected rows' values,
    slots and step codes beside the matrix (numpy widens fancy indices to intp, too). `pick`:
    per slot, its row of the matrix (-1: left out; `n_pick` rows), else one row per slot.
    `use` is consumed."""
    step, slot = ops.step, ops.slot
    n = len(step)
    n_slot = int(slot.max(initial=-1)) + 1 if pick is None else n_pick
    if pick is not None:
        for c in range(0, n, _CHUNK):
            use[c:c + _CHUNK] &= pick[slot[c:c + _CHUNK]] >= 0
    lo = int(step.min(initial=0))
    span = int(step.max(initial=0)) - lo + 1
    if span > 4 * n + 4096:  # widely spread step numbers: coded by a sort of the selected ones
        scode, n_cols = _step_codes(step[use])
        mat = np.full((n_slot, max(n_cols, 1)), np.nan)
        vals = e[use]
        if keep is not None:
            vals[~keep[use]] = np.nan
        mat[_rows_of(ops.slot[use], pick), scode] = vals  # NaN values (unmeasurable) do not count
        return mat
    present = np.zeros(span, dtype=bool)
    for c in range(0, n, _CHUNK):
        present[step[c:c + _CHUNK][use[c:c + _CHUNK]] - lo] = True
    col = np.cumsum(present, dtype=np.int32)  # step - lo -> its column
    col -= 1
    mat = np.full((n_slot, max(int(present.sum()), 1)), np.nan)
    for c in range(0, n, _CHUNK):
        u = use[c:c + _CHUNK]
        vals = e[c:c + _CHUNK][u]
        if keep is not None:
            vals[~keep[c:c + _CHUNK][u]] = np.nan
        mat[_rows_of(ops.slot[c:c + _CHUNK][u], pick), col[step[c:c + _CHUNK][u] - lo]] = vals
    return mat


def _rows_of(slots: np.ndarray, pick: np.ndarray | None) -> np.ndarray:
    """The history matrix's rows of some rows' slots (`_history_matrix`'s `pick`)."""
    return slots if pick is None else pick[slots]


def slot_stats(ops: Ops, e: np.ndarray, ref_steps: np.ndarray | None,
               keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per slot: (median, q1, q3) of a per-row value over reference steps (NaN where none).
    A slot occurs once per step, so its history is one row of a slots x steps matrix.
    `keep` (per row, bool): only those rows' values count, as if the others were NaN (without
    a row-sized masked copy of `e`)."""
    med, q1, q3 = _slot_quantiles(ops, e, ref_steps, keep, (0.5, 0.25, 0.75))
    return med, q1, q3


def slot_median(ops: Ops, e: np.ndarray, ref_steps: np.ndarray | None, keep: np.ndarray | None = None,
                slots: np.ndarray | None = None) -> np.ndarray:
    """`slot_stats`' median alone (the wait graph's passes read no quartile: two slot-sized
    arrays fewer near its peak); of the slots `slots` alone, in that order, when given (the
    history matrix then holds only their rows: the p2p senders' own history, not every slot's)."""
    if slots is None:
        return _slot_quantiles(ops, e, ref_steps, keep, (0.5,))[0]
    pick = np.full(int(ops.slot.max(initial=-1)) + 1, -1, dtype=np.int64)
    wanted = unique(slots)
    pick[wanted] = np.arange(len(wanted))
    mat = _history_matrix(ops, e, in_steps(ops, ref_steps), keep, pick, len(wanted))
    return _quantiles(mat, (0.5,))[0][pick[slots]]


def _slot_quantiles(ops: Ops, e: np.ndarray, ref_steps: np.ndarray | None, keep: np.ndarray | None,
                    ps: tuple[float, ...]) -> list[np.ndarray]:
    """Per slot: the quantiles `ps` of `slot_stats`."""
    return _quantiles(_history_matrix(ops, e, in_steps(ops, ref_steps), keep), ps)


def _quantiles(mat: np.ndarray, ps: tuple[float, ...]) -> list[np.ndarray]:
    """Per row of a slots x steps history matrix (consumed: sorted in place): the quantiles `ps`
    of its values, NaN ignored (NaN where it has none)."""
    n_slot = len(mat)
    mat.sort(axis=1)  # NaN last
    k = (~np.isnan(mat)).sum(axis=1)
    rows = np.arange(n_slot)

    def q(p: float) -> np.ndarray:
        pos = np.maximum(k - 1, 0) * p
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(k - 1, 0))
        w = pos - lo
        out = mat[rows, lo]  # (in place: the same products and sum as mat[rows, lo] * (1 - w) + mat[rows, hi] * w)
        out *= 1 - w
        w *= mat[rows, hi]
        out += w
        return out

    return [q(p) for p in ps]


def step_scale(ops: Ops, steps: pd.DataFrame | None, rows: np.ndarray | None = None) -> np.ndarray:
    """Per row (of `rows`, default all): the step's rolling baseline duration over the run's
    median (1 without steps)."""
    return per_row(scale_table(ops, steps), ops, rows)


def scale_table(ops: Ops, steps: pd.DataFrame | None) -> tuple[int, np.ndarray]:
    """`step_scale` per step: (the first step, each step's value from it), read by `per_row` a
    chunk of rows at a time where a row-sized array of it would stand at a peak."""
    if steps is None or steps.empty or "baseline_s" not in steps:
        return _step_table(ops, pd.Series(dtype=np.float64))
    base = steps.set_index("step")["baseline_s"].astype(float)
    med = float(np.nanmedian(base.to_numpy())) or 1.0
    return _step_table(ops, (base / med).astype(np.float64))


def per_row(table: tuple[int, np.ndarray], ops: Ops, rows: slice | np.ndarray | None = None) -> np.ndarray:
    """Per row (of `rows`: a slice or indices, default all): its step's value in a `_step_table`."""
    lo, lut = table
    return lut[(ops.step if rows is None else ops.step[rows]) - lo]


def scaled_elapsed(ops: Ops, scales: tuple[int, np.ndarray]) -> np.ndarray:
    """Per row: elapsed over its step's scale (`scale_table`), a fresh array divided in place a
    chunk at a time (the same quotients as `ops.elapsed / step_scale(...)`, without its divisor)."""
    e = ops.elapsed
    for c in range(0, len(e), _CHUNK):
        e[c:c + _CHUNK] /= per_row(scales, ops, slice(c, c + _CHUNK))
    return e


def _step_table(ops: Ops, values: pd.Series) -> tuple[int, np.ndarray]:
    """Per step from the first of the rows' and `values`' steps: the value of that step (1.0 where
    unknown, not finite or not positive)."""
    idx = values.index.to_numpy(np.int64)
    lo = int(idx.min(initial=int(ops.step.min(initial=0))))
    hi = int(idx.max(initial=int(ops.step.max(initial=0))))
    lut = np.ones(hi - lo + 1)
    v = values.to_numpy(np.float64)
    lut[idx - lo] = np.where(np.isfinite(v) & (v > 0), v, 1.0)
    return lo, lut


def step_ratio(ops: Ops, steps: pd.DataFrame | None, rows: np.ndarray | None = None) -> np.ndarray:
    """Per row (of `rows`, default all): its step's duration over the step-time baseline."""
    n = len(ops.rank) if rows is None else len(rows)
    if steps is None or steps.empty or "ratio" not in steps:
        return np.ones(n)
    return per_row(_step_table(ops, steps.set_index("step")["ratio"].astype(np.float64)), ops, rows)
