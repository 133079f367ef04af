"""The detector's features: one row of `FEATURES` per operator, from its own history
(`localize.ops.history`), its instance's copies, its sibling groups, its size, type and step.

Shared by the detector's screen and forest (`localize.detect.detector`) and its training
(`localize.detect.training`), so the model is trained and run on the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from localize.ops.grouping import dense_codes, group_median
from localize.ops.history import per_row, scale_table, scaled_elapsed, slot_stats, step_ratio
from localize.ops.table import Ops

#: detector feature names, in column order of `detector_matrix`
FEATURES = (
    "log_elapsed_norm",
    "ratio_own_median",
    "z_own",
    "quartile_pos",
    "iqr_dist",
    "rank_in_instance",
    "ratio_instance_median",
    "ratio_instance_min",
    "wait_frac",
    "log_nbytes",
    "op_code",
    "is_p2p",
    "step_ratio",
    "min_vs_peer_groups",
)


def peer_group_min_ratio(ops: Ops) -> np.ndarray:
    """Per instance: its smallest copy against the same operator of other groups of its kind.

    Groups of one kind do the same operator with the same payload at the same step; if
    every copy of one group is slow while its sibling groups are not, the transfer itself is.
    """
    gkind = pd.Series(ops.groups.astype(str)).str.replace(r"[-_]?\d+$", "", regex=True)
    kcode = pd.factorize(gkind)[0].astype(np.int64)[ops.inst_group]
    nbytes = np.zeros(ops.n_inst, dtype=np.int64)
    nbytes[ops.inst] = ops.nbytes
    opc = np.zeros(ops.n_inst, dtype=np.int64)
    opc[ops.inst] = ops.opcode
    key, n_key = dense_codes(((kcode * 16 + opc) * 1_000_003 + ops.inst_step) * 7_919 + (nbytes % 7_919), by_first=False)
    return ops.inst_min / np.maximum(group_median(key, n_key, ops.inst_min), 1e-9)[key]


@dataclass
class Basis:
    """What the detector's screen and its features share, computed once: per step, slot and
    instance (read per row where they are used, a chunk or the screened rows at a time: two
    row-sized float64 arrays held through the detection were its peak)."""

    scales: tuple[int, np.ndarray]  # per step: its rolling baseline over the run's median (drift; `scale_table`)
    slot_med: np.ndarray  # per slot: drift-normalized median over reference steps (NaN: no reference)
    slot_q1: np.ndarray  # per slot: drift-normalized quartiles (NaN: no reference)
    slot_q3: np.ndarray
    peer: np.ndarray  # per instance: `peer_group_min_ratio`

    def scale(self, ops: Ops, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Per row (of `rows`, default all): its step's scale."""
        return per_row(self.scales, ops, rows)

    def med(self, ops: Ops, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Per row (of `rows`, default all): its slot's median, as `slot_history` gives it."""
        return self._fill(ops, rows, self.slot_med[ops.slot if rows is None else ops.slot[rows]])[0]

    def quartiles(self, ops: Ops, rows: slice | np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(q1, q3) of the given rows' slots, as `slot_history` gives them."""
        slot = ops.slot if rows is None else ops.slot[rows]
        q1, q3 = self._fill(ops, rows, self.slot_q1[slot], self.slot_q3[slot])
        return q1, q3

    def _fill(self, ops: Ops, rows: slice | np.ndarray | None, *values: np.ndarray) -> list[np.ndarray]:
        """`values` (per row of `rows`) with slots never seen in reference steps (NaN) falling back
        on the instance minimum (the transfer time), drift-normalized."""
        miss = np.isnan(values[0])
        if not miss.any():
            return list(values)
        fb = ops.inst_min[ops.inst if rows is None else ops.inst[rows]] / self.scale(ops, rows)
        return [np.where(miss, fb, v) for v in values]


def feature_basis(ops: Ops, steps: pd.DataFrame | None, ref_steps: np.ndarray | None) -> Basis:
    """The step scale, and per-slot median and quartiles, as `slot_history` computes them."""
    scales = scale_table(ops, steps)
    med, q1, q3 = slot_stats(ops, scaled_elapsed(ops, scales), ref_steps)
    return Basis(scales, med, q1, q3, peer_group_min_ratio(ops))


def detector_matrix(ops: Ops, steps: pd.DataFrame | None, ref_steps: np.ndarray | None,
                    rows: np.ndarray | None = None, basis: Basis | None = None) -> np.ndarray:
    """The feature matrix of the detector (docs/design.md): own history, group peers, size, type, step.

    `rows` (indices) limits it to those rows — the ones a screen did not pass; `basis`
    reuses what the screen computed. Column-major float32 (features x rows, transposed view
    returned) so each feature is written once, in place.
    """
    b = basis if basis is not None else feature_basis(ops, steps, ref_steps)

    def at(v: np.ndarray) -> np.ndarray:
        return v if rows is None else v[rows]

    e, scale, med = (ops.elapsed if rows is None else ops.elapsed_at(rows)), b.scale(ops, rows), b.med(ops, rows)
    q1, q3 = b.quartiles(ops, rows)
    en = e / scale
    iqr = np.maximum(q3 - q1, 1e-6 + 0.02 * med)
    eps = 1e-9
    inst = at(ops.inst)
    imin = ops.inst_min[inst]
    out = np.empty((len(FEATURES), len(e)), dtype=np.float32)
    out[0] = np.log10(en + 1e-7)  # elapsed against the rolling step-time baseline
    out[1] = en / np.maximum(med, eps)
    out[2] = (en - med) / (iqr / 1.349)
    out[3] = (en - q1) / iqr
    out[4] = np.maximum(en - q3, 0) / iqr
    out[5] = (e - imin) / np.maximum(ops.inst_max - ops.inst_min, eps)[inst]
    out[6] = e / np.maximum(ops.inst_mean, eps)[inst]
    out[7] = e / np.maximum(imin, eps)
    out[8] = (e - imin) / np.maximum(e, eps)  # the rows' wait (`Ops.wait`)
    out[9] = np.log10(at(ops.nbytes).astype(np.float64) + 1)
    out[10] = at(ops.opcode)
    out[11] = ops.inst_p2p[inst]
    out[12] = step_ratio(ops, steps, rows)
    out[13] = b.peer[inst]
    bad = ~np.isfinite(out)  # as np.nan_to_num(nan=0, posinf=1e3, neginf=-1e3), without its slow inf tests
    if bad.any():
        v = out[bad]
        out[bad] = np.where(np.isnan(v), 0.0, np.where(v > 0, 1e3, -1e3))
    return out.T
