"""What grew in the slow steps: a rank's own compute, or its waiting on members that logged nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd

from localize.commops import compute_growth, lone_excess, unseen_share
from localize.ops.lone import lone_copies, lone_time
from localize.ops.table import prepare_ops

GROUPS = {"tp-0": [0, 1, 2, 3], "tp-1": [4, 5, 6, 7], "dp-0": [0, 4]}
SLOW = np.arange(6, 10)


def _rows(compute_slow: float, wait_slow: float) -> pd.DataFrame:
    """Rank 0 logged alone in tp-0: per step its compute, its lone TP all-reduce (waiting on its
    unlogged peers), then the DP all-reduce with rank 4. In the slow steps each grows as given."""
    rows, t = [], {0: 0, 4: 0}
    for step in range(10):
        slow = step in SLOW
        for r in (0, 4):
            compute = int(100_000 * (compute_slow if slow and r == 0 else 1.0))
            wait = int(20_000 * (wait_slow if slow and r == 0 else 1.0))
            start = t[r] + compute
            rows.append({"rank": r, "group": f"tp-{r // 4}", "op": "all_reduce", "seq": step, "peer": -1,
                         "nbytes": 1 << 20, "start_ns": start, "end_ns": start + wait, "step": step})
            start = start + wait + 10_000
            rows.append({"rank": r, "group": "dp-0", "op": "all_reduce", "seq": step, "peer": -1,
                         "nbytes": 1 << 20, "start_ns": start, "end_ns": start + 5_000, "step": step})
            t[r] = start + 5_000
    return pd.DataFrame(rows)


def share(compute_slow: float, wait_slow: float) -> float:
    ops = prepare_ops(_rows(compute_slow, wait_slow))
    steps = np.arange(10)
    lone = lone_copies(ops, GROUPS)
    more = lone_excess(lone_time(ops, lone, 8, steps), ops.rank[lone], steps, steps[:6])
    return float(unseen_share(compute_growth(ops, 8, steps, steps[:6]), more, np.isin(steps, SLOW))[0])


def test_a_slow_unlogged_peer_grows_the_wait_not_the_compute() -> None:
    assert share(1.0, 4.0) > 0.9


def test_a_slow_host_grows_the_compute_though_the_wait_grows_too() -> None:
    """A whole host slowed 2x: rank 0 computes twice as long, and its lone wait (the spread of its
    peers' speeds) doubles too, by far less. Summed over a step that is the rank's own, not an
    unlogged peer's (compared per operator, each wait against the compute just before it, it read
    as a peer's)."""
    assert share(2.0, 2.0) < 0.3
