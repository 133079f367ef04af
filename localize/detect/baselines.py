"""Published localization baselines, for the comparison table of bench/localize.py.

Each names one rank from the CommOps of the irregular steps, as its method prescribes:

- 3-sigma: flag operators whose elapsed exceeds mean + 3 std of the same operator over the
  normal steps; blame the rank with the most flagged operators.
- slowest total communication: blame the rank that spent the most time in communication.
- Megatron min/max rank timing: Megatron's timers report, per timer, the min and max over
  ranks; blame the rank with the max compute time (time between its operators).
- HTA late start: pick the collective with the most variable duration; for each of its
  instances, the rank that entered it last (by the raw start timestamps, as HTA reads them);
  blame the rank that was last most often.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from localize.detect.detector import three_sigma
from localize.ops.table import Ops

BASELINES = ("3-sigma", "slowest-comm", "megatron-minmax", "hta-late-start")


def _argmax_rank(values: np.ndarray, ranks: np.ndarray) -> int | None:
    if len(values) == 0:
        return None
    s = pd.Series(values).groupby(ranks).sum()
    return int(s.index[int(np.argmax(s.to_numpy()))]) if len(s) and s.max() > 0 else None


def baseline_ranks(ops: Ops, irregular: np.ndarray, ref: np.ndarray) -> dict[str, int | None]:
    """The rank each baseline blames for the irregular steps."""
    step = ops.step
    rank = ops.rank
    irr = np.isin(step, irregular)
    out: dict[str, int | None] = {}
    flagged = three_sigma(ops, ref).abnormal & irr
    out["3-sigma"] = _argmax_rank(flagged.astype(np.float64)[irr], rank[irr])
    out["slowest-comm"] = _argmax_rank(ops.elapsed[irr], rank[irr])
    out["megatron-minmax"] = _argmax_rank(ops.gap[irr], rank[irr])
    coll = irr & ~ops.inst_p2p[ops.inst]
    if coll.any():
        g = ops.group_code[coll]
        var = pd.Series(ops.elapsed[coll]).groupby(g).std().fillna(0)
        target = int(var.index[int(np.argmax(var.to_numpy()))])
        sel = np.flatnonzero(coll & (ops.group_code == target))
        start = ops.times.start(sel)
        last = pd.Series(start).groupby(ops.inst[sel]).idxmax().to_numpy(np.int64)
        counts = pd.Series(rank[sel][last]).value_counts()
        out["hta-late-start"] = int(counts.index[0])
    else:
        out["hta-late-start"] = None
    return out
