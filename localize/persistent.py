"""Slow from the first step: imbalance that no δ-irregular iteration reveals.

A fault present from the start (a GPU that was always slow, a pipeline stage with more layers)
makes every iteration equally long, so there is no normal iteration to compare with. Workers
of the same role do the same work, though: each rank's compute per step (the gaps between its
operators, on its own clock) is compared with its peers of the same pipeline stage in the same
step. One worker, or one host's workers, much slower than its stage peers is a device (gpu,
host); a whole stage slower than the other stages is the job's configuration; slowness that
moves between model replicas from step to step is the data (sequence-length imbalance).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.meta import JobMeta
from localize.features import Ops, prepare_ops
from localize.groupkinds import group_kinds
from localize.ranking import COVERAGE, RankUnit, explain_rank_blame, layout_units

MIN_EXCESS = 0.15  # a worker must compute at least this much longer than its stage peers
STAGE_EXCESS = 0.25  # a stage must compute this much longer than the fastest stage
SLOW_REPLICA_STEPS = 0.3  # data: replicas slow in at least this share of the steps, all told
OWN_STEPS = 0.5  # ... while no replica is slow in more than this share (else it is a device)


def compute_table(ops: Ops, world: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank × step compute (s, own clock) and which ranks logged anything. The first step holds
    the job's warm-up and is left out when there are more than two."""
    scode, steps = pd.factorize(ops.step, sort=True)
    n_steps = len(steps)
    comp = np.bincount(ops.rank.astype(np.int64) * n_steps + scode, weights=ops.gap, minlength=world * n_steps)
    comp = comp[: world * n_steps].reshape(world, n_steps)
    seen = np.bincount(ops.rank, minlength=world)[:world] > 0
    return (comp[:, 1:] if n_steps > 2 else comp), seen


def stage_reference(comp: np.ndarray, seen: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Stage × step: the low quartile of the stage's workers' compute (a slow worker or two
    cannot move it)."""
    n_stage = int(stage.max()) + 1 if stage.size else 1
    ref = np.full((n_stage, comp.shape[1]), np.nan)
    for s in range(n_stage):  # one iteration per pipeline stage
        mine = seen & (stage == s)
        if mine.any():
            ref[s] = np.quantile(comp[mine], 0.25, axis=0)
    return ref


def _stage_units(ref: np.ndarray, stage: np.ndarray, seen: np.ndarray) -> list[tuple[RankUnit, float]]:
    """Stages that compute clearly longer than the fastest stage, each with its blame (s/step)."""
    if ref.shape[0] < 2 or not np.isfinite(ref).any():
        return []
    fastest = np.nanmin(ref, axis=0)
    y = np.nanmedian(ref / np.maximum(fastest, 1e-9), axis=1)
    out = []
    for s in np.flatnonzero(y > 1 + STAGE_EXCESS):
        ranks = np.flatnonzero(seen & (stage == s)).tolist()
        blame = float((y[s] - 1) * np.nanmedian(fastest))
        out.append((RankUnit("config", ranks, 0.0, 1.0, f"pipeline stage {int(s)}", {"stage": int(s)}), blame))
    return out


def _data_unit(ratio: np.ndarray, seen: np.ndarray, replica: np.ndarray, typical: float) -> list[tuple[RankUnit, float]]:
    """Model replicas that take turns being slow (most of their workers at once, in different
    steps), with the blame of the slowest replica per step (s/step)."""
    n_rep = int(replica.max()) + 1 if replica.size else 0
    if n_rep < 2 or ratio.shape[1] < 3:
        return []
    slow = (ratio > 1 + MIN_EXCESS) & seen[:, None]
    members = np.bincount(replica[seen], minlength=n_rep)
    hits = np.zeros((n_rep, ratio.shape[1]))
    np.add.at(hits, replica[seen], slow[seen].astype(np.float64))
    rep_slow = (hits >= COVERAGE * np.maximum(members, 1)[:, None]) & (members[:, None] > 0)
    share = rep_slow.mean(axis=1)
    turns = np.flatnonzero(share > 0)
    if len(turns) < 2 or share.max() > OWN_STEPS or rep_slow.any(axis=0).mean() < SLOW_REPLICA_STEPS:
        return []
    excess = np.where(slow, ratio - 1, 0.0).max(axis=0)
    ranks = np.flatnonzero(np.isin(replica, turns) & seen).tolist()
    unit = RankUnit("data", ranks, 0.0, float(share[turns].mean()), f"{len(turns)} model replicas", {"replicas": len(turns)})
    return [(unit, float(excess.mean() * typical))]


def persistent_imbalance(df: pd.DataFrame, meta: JobMeta, top: int = 5,
                         hint: dict[str, str] | None = None) -> tuple[list[RankUnit], np.ndarray, float]:
    """Units that compute clearly longer than their peers in most steps, best explained first
    (each `share` of all the excess); per rank its compute over its stage peers' (1 = typical);
    the typical compute per step (s). Empty when balanced."""
    world = max(meta.world_size, int(df["rank"].max()) + 1) if len(df) else meta.world_size
    if len(df) == 0:
        return [], np.ones(world), 0.0
    ops = prepare_ops(df)
    comp, seen = compute_table(ops, world)
    return imbalance(comp, seen, meta, group_kinds(ops, hint), top)


def imbalance(comp: np.ndarray, seen: np.ndarray, meta: JobMeta, kinds: dict[str, str],
              top: int = 5) -> tuple[list[RankUnit], np.ndarray, float]:
    """`persistent_imbalance` on a rank × step compute table (full records, or the summaries'
    per-host and outlier-rank compute)."""
    world = comp.shape[0]
    _, stage, replica, _ = layout_units(meta, world, kinds)
    ref = stage_reference(comp, seen, stage)
    ratio = comp / np.maximum(ref[stage], 1e-9)
    x = np.where(seen, np.median(ratio, axis=1), 1.0)
    typical = float(np.nanmedian(ref))
    own = np.nanmedian(ref[stage], axis=1)
    worker_blame = np.where(seen, np.maximum(x - 1 - MIN_EXCESS, 0.0) * own, 0.0)
    workers = [u for u in explain_rank_blame(worker_blame, meta, kinds, top=top, logged=seen) if u.kind in ("gpu", "host")]
    found = [(u, u.share * float(worker_blame.sum())) for u in workers]
    found += _stage_units(ref, stage, seen) + _data_unit(ratio, seen, replica, typical)
    total = sum(b for _, b in found)
    if total <= 0:
        return [], x, typical
    for u, b in found:
        u.share = b / total
    units = sorted((u for u, _ in found), key=lambda u: -u.share)
    return units[:top], x, typical
