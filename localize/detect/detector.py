"""Abnormal-operator detection (Holmes): a random forest over own-history and peer features.

A cascade keeps it fast: a cheap screen passes operators that are clearly normal — as long
as they usually take (within 10% or 0.2 ms of their drift-normalized own median) in an
instance in line with the same operator of its sibling groups — and only the rest reach
the forest. The screen's bounds were calibrated on held-out simulator jobs so that recall
does not drop (`training.evaluate` scores the cascade as shipped).

Drift is handled by auto-tuning, not retraining: features are normalized against the rolling
step-time baseline (`history.step_scale`), and the decision threshold is re-tuned on the
recent normal iterations of the trace at hand, so that at most `fpr` of their operators are
flagged. The 3-sigma rule on elapsed time sits beside it as the classic baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from localize.detect.forest import ArrayForest
from localize.ops.features import Basis, detector_matrix, feature_basis
from localize.ops.history import slot_history, step_scale
from localize.ops.table import Ops, in_steps

DEFAULT_THRESHOLD = 0.5
SCREEN_RATIO = 1.1  # elapsed over the slot's own (drift-normalized) median
SCREEN_EXCESS_S = 2e-4  # ...or at most this much over it (the labels' bound for "clearly longer")
SCREEN_PEER = (0.8, 1.1)  # instance minimum over the sibling groups' (min_vs_peer_groups)
CLEAR_RATIO = 5.0  # a row this many times its own median...
CLEAR_SIGMAS = 20.0  # ...and this many robust sigmas above it is abnormal whatever the forest says
#: rows per chunk of the screen (row-wise: by chunks, no row-sized float scratch beside the basis)
_CHUNK = 1 << 18


@dataclass
class Detection:
    abnormal: np.ndarray  # bool per row
    proba: np.ndarray  # abnormal probability (or score) per row; 0 where the screen passed the row
    threshold: float
    method: str


def label_rows(ops: Ops, clean_elapsed: np.ndarray, rel: float = 0.2, abs_s: float = 2e-4) -> np.ndarray:
    """Ground truth for training: a row is abnormal when a fault made it clearly longer than
    the same row in the fault-free twin run (same seed, same noise)."""
    return (ops.elapsed > clean_elapsed * (1 + rel)) & (ops.elapsed - clean_elapsed > abs_s)


def tune_threshold(proba: np.ndarray, normal: np.ndarray, base: float = DEFAULT_THRESHOLD, fpr: float = 0.01) -> float:
    """Auto-tuning: raise the threshold until recent normal rows are flagged at most `fpr`."""
    if not normal.any():
        return base
    q = float(np.quantile(proba[normal], 1 - fpr, overwrite_input=True))  # (partitions its own copy: no second one)
    return float(min(max(base, q + 1e-6), 0.95))


def clearly_normal(ops: Ops, basis: Basis) -> np.ndarray:
    """The cascade's screen: per row, True when the forest need not look — close to its own
    history, and its instance in line with the same operator of its sibling groups."""
    out = np.empty(len(ops.rank), dtype=bool)
    for c in range(0, len(out), _CHUNK):
        at = slice(c, c + _CHUNK)
        en, med = ops.elapsed_at(at) / basis.scale(ops, at), basis.med(ops, at)  # elapsed over the step-time baseline
        close = (en <= SCREEN_RATIO * med) | (en - med <= SCREEN_EXCESS_S)
        peer = basis.peer[ops.inst[at]]
        out[at] = close & (peer >= SCREEN_PEER[0]) & (peer <= SCREEN_PEER[1])
    return out


def clearly_abnormal(ops: Ops, basis: Basis, rows: np.ndarray | None = None) -> np.ndarray:
    """The screen's other side: rows (all, or those given) far outside their own history. Trees
    are constant beyond the feature ranges they were trained on, so the forest's probability for
    an operator 17x its usual time (a throttled NIC in a real job) can sit below a threshold that
    auto-tuning raised on a noisy job; such rows need no model to be called abnormal."""
    en = (ops.elapsed if rows is None else ops.elapsed_at(rows)) / basis.scale(ops, rows)
    med = basis.med(ops, rows)
    q1, q3 = basis.quartiles(ops, rows)
    sigma = np.maximum((q3 - q1) / 1.349, 0.02 * med)
    return (en >= CLEAR_RATIO * med) & (en - med >= CLEAR_SIGMAS * sigma) & (en - med > SCREEN_EXCESS_S)


class ForestDetector:
    """The screen, then the random forest (as arrays, `localize.detect.forest`) on `features.FEATURES`."""

    def __init__(self, model: ArrayForest) -> None:
        self.model = model

    def detect(self, ops: Ops, steps: pd.DataFrame | None, ref_steps: np.ndarray | None) -> Detection:
        basis = feature_basis(ops, steps, ref_steps)
        proba = np.zeros(len(ops.rank))
        rest = np.flatnonzero(~clearly_normal(ops, basis))
        if rest.size:
            x = detector_matrix(ops, steps, ref_steps, rest, basis)
            proba[rest] = self.model.predict_proba(x, settle=DEFAULT_THRESHOLD)  # tune_threshold never goes below
        normal = in_steps(ops, ref_steps) if ref_steps is not None and len(ref_steps) else np.zeros(len(proba), bool)
        thr = tune_threshold(proba, normal)
        abnormal = proba >= thr
        for c in range(0, rest.size, _CHUNK):  # the screen passed none of them (by chunks: its figures are a few per row)
            part = rest[c:c + _CHUNK]
            abnormal[part] |= clearly_abnormal(ops, basis, part)
        return Detection(abnormal, proba, thr, "random-forest")


def three_sigma(ops: Ops, ref_steps: np.ndarray | None, k: float = 3.0) -> Detection:
    """Baseline: elapsed above mean + k*std of the same operator slot over normal steps."""
    step = ops.step
    use = np.isin(step, ref_steps) if ref_steps is not None and len(ref_steps) else np.ones(len(step), bool)
    g = pd.Series(ops.elapsed[use]).groupby(ops.slot[use]).agg(["mean", "std"])
    n_slot = int(ops.slot.max(initial=-1)) + 1
    mean = np.full(n_slot, np.nan)
    std = np.full(n_slot, np.nan)
    mean[g.index.to_numpy(np.int64)] = g["mean"].to_numpy()
    std[g.index.to_numpy(np.int64)] = g["std"].fillna(0).to_numpy()
    m, s = mean[ops.slot], std[ops.slot]
    score = (ops.elapsed - m) / np.maximum(s, 1e-9)
    score = np.where(np.isnan(m), 0.0, score)
    return Detection(score > k, score, k, "3-sigma")


def rule_detect(ops: Ops, steps: pd.DataFrame | None, ref_steps: np.ndarray | None) -> Detection:
    """Fallback when no model is shipped: clearly above the slot's own history (robust z > 4
    and 20% over its median, drift-normalized)."""
    scale = step_scale(ops, steps)
    med, q1, q3 = slot_history(ops, ref_steps, scale)
    en = ops.elapsed / scale
    sigma = np.maximum((q3 - q1) / 1.349, 0.02 * med)
    score = (en - med) / np.maximum(sigma, 1e-9)
    return Detection((score > 4) & (en > 1.2 * med) & (en - med > 5e-5), score, 4.0, "robust-rule")
