"""Recurrent latecomers: a rank that arrives last at a collective step after step.

The wait graph takes a collective as a suspect when the detector flagged its waiting copies.
On a job whose operators are noisy (gloo on busy CPUs, a profiler's steps), a waiting copy of
tens of milliseconds can sit inside its slot's normal spread, and nothing is flagged even when
one rank made its peers wait in every slow step. What no single instance shows, the irregular
steps show together: the same rank last, by far more than a normal step's last arriver keeps
its peers, in (almost) every instance of its group. Such instances are suspects too; the wait
graph then asks, as for any suspect, whether the rank's own compute explains the delay.
"""

from __future__ import annotations

import numpy as np

from localize.ops.grouping import group_quantile
from localize.ops.table import Ops

#: share of a group's instances in the irregular steps that must have the same last arriver
CONSISTENT = 0.75
#: instances (in the irregular steps) a group needs before its latecomer counts
MIN_INSTANCES = 3
#: the latecomer's typical delay must sit this many interquartile ranges above the group's normal
#: delay's upper quartile (the normal steps' last arrivers, whoever they were)
SPREAD = 3.0
#: and be at least this long (s): below it, the difference is scheduling noise
MIN_DELAY_S = 1e-3


def recurrent_latecomers(ops: Ops, delay: np.ndarray, unit_of_inst: np.ndarray, irr: np.ndarray, ref: np.ndarray,
                         complete: np.ndarray) -> np.ndarray:
    """Per instance: a collective of an irregular step whose last arriver is its unit's recurrent
    latecomer, keeping its peers waiting far longer than in normal steps.

    `delay`: per instance, the others' mean wait beyond their slots' normal waiting (the wait
    graph's); `unit_of_inst`: the unit (group or p2p stream) of each instance; `complete`: every
    expected copy is present (a lost copy may have been the late one)."""
    n = ops.n_inst
    out = np.zeros(n, dtype=bool)
    if not len(irr) or not len(ref):
        return out
    use = ~ops.inst_p2p & (ops.inst_size >= 2) & complete & (ops.late_row >= 0)
    in_irr = use & np.isin(ops.inst_step, irr)
    in_ref = use & np.isin(ops.inst_step, ref)
    if not in_irr.any() or not in_ref.any():
        return out
    n_units = int(unit_of_inst.max(initial=-1)) + 1
    world = int(ops.rank.max(initial=0)) + 1
    late_rank = np.where(ops.late_row >= 0, ops.rank[np.maximum(ops.late_row, 0)], 0)
    key = unit_of_inst.astype(np.int64) * world + late_rank
    # per unit: the normal steps' delay distribution, whoever arrived last (two delays at least)
    ref_unit, ref_delay = unit_of_inst[in_ref], delay[in_ref]
    known = np.bincount(ref_unit, minlength=n_units) >= 2
    q1, q3 = (np.where(known, group_quantile(ref_unit, n_units, ref_delay, q), np.nan) for q in (0.25, 0.75))
    threshold = np.maximum(q3 + SPREAD * (q3 - q1), MIN_DELAY_S)
    # per unit: how many irregular instances, and per (unit, last arriver) how many and how long
    n_irr_unit = np.bincount(unit_of_inst[in_irr], minlength=n_units)
    irr_idx = np.flatnonzero(in_irr)
    k = key[irr_idx]
    kcode, kinv = np.unique(k, return_inverse=True)
    count = np.bincount(kinv)
    med = group_quantile(kinv, len(kcode), delay[irr_idx], 0.5)
    unit_k = kcode // world
    ok = ((count >= MIN_INSTANCES) & (count >= CONSISTENT * n_irr_unit[unit_k])
          & np.isfinite(threshold[unit_k]) & (med > threshold[unit_k]))
    out[irr_idx] = ok[kinv] & (delay[irr_idx] > threshold[unit_of_inst[irr_idx]])
    return out
