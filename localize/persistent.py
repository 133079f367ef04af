"""Slow from the first step: imbalance that no δ-irregular iteration reveals.

A fault present from the start (a pipeline stage with more layers, a GPU that was always
slow) makes every iteration equally long, so there is no normal iteration to compare with.
Ranks that do the same work should compute for the same time, though: each rank's compute
(the gaps between its operators, on its own clock) is compared with the job's typical rank,
step by step, and ranks that compute clearly longer in most steps are blamed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.meta import JobMeta
from localize.features import Ops, prepare_ops
from localize.groupkinds import group_kinds
from localize.ranking import RankUnit, explain_rank_blame

MIN_EXCESS = 0.15  # a rank must compute at least this much longer than the typical rank


def compute_excess(ops: Ops, world: int) -> tuple[np.ndarray, float]:
    """Per rank: median over steps of its compute time over the typical rank's (1 = typical),
    and the typical rank's compute per step (seconds)."""
    rank = ops.rank
    step = ops.step
    scode, steps = pd.factorize(step, sort=True)
    n_steps = len(steps)
    comp = np.bincount(rank * n_steps + scode, weights=ops.gap, minlength=world * n_steps).reshape(world, n_steps)
    seen = np.bincount(rank, minlength=world)[:world] > 0
    comp = comp[:, 1:] if n_steps > 2 else comp  # the first step holds the job's warm-up
    ref = np.quantile(comp[seen], 0.25, axis=0)
    ratio = comp / np.maximum(ref, 1e-9)
    x = np.where(seen, np.median(ratio, axis=1), 1.0)
    return x, float(np.median(ref))


def persistent_imbalance(df: pd.DataFrame, meta: JobMeta, top: int = 5,
                         hint: dict[str, str] | None = None) -> tuple[list[RankUnit], np.ndarray, float]:
    """Units that compute clearly longer than the rest in most steps (empty when balanced)."""
    world = max(meta.world_size, int(df["rank"].max()) + 1) if len(df) else meta.world_size
    if len(df) == 0:
        return [], np.ones(world), 0.0
    ops = prepare_ops(df)
    x, typical = compute_excess(ops, world)
    blame = np.maximum(x - 1 - MIN_EXCESS, 0.0) * typical
    if blame.sum() <= 0:
        return [], x, typical
    return explain_rank_blame(blame, meta, group_kinds(ops, hint), top=top), x, typical
