"""Groups meta.json leaves out, laid out from the records."""

from __future__ import annotations

import pandas as pd

from collector.meta import JobMeta, RankInfo
from localize.ops.features import prepare_ops
from localize.ops.groupkinds import with_observed_groups
from localize.waits.ranking import layout_units


def test_stages_and_replicas_come_from_the_groups_the_records_show() -> None:
    """Two pipelines of two stages (ranks 0->2 and 1->3), data parallel over {0, 1} and {2, 3}."""
    rows = []
    for step in range(2):
        t = step * 1000
        for src, dst, g in ((0, 2, "pp-0"), (1, 3, "pp-1")):
            for rank, op, peer in ((src, "send", dst), (dst, "recv", src)):
                rows.append({"rank": rank, "group": g, "op": op, "seq": step, "peer": peer, "nbytes": 1 << 20,
                             "start_ns": t + 10, "end_ns": t + 50, "step": step})
        for g, members in (("dp-0", (0, 1)), ("dp-1", (2, 3))):
            for rank in members:
                rows.append({"rank": rank, "group": g, "op": "all_reduce", "seq": step, "peer": -1, "nbytes": 1 << 24,
                             "start_ns": t + 100, "end_ns": t + 200, "step": step})
    ops = prepare_ops(pd.DataFrame(rows))
    meta = JobMeta("j", 4, {r: RankInfo(f"node-{r}", 0) for r in range(4)})
    kinds = {"pp-0": "pp", "pp-1": "pp", "dp-0": "dp", "dp-1": "dp"}
    _, stage, replica, _ = layout_units(with_observed_groups(meta, ops), 4, kinds)
    assert stage.tolist() == [0, 0, 1, 1]
    assert replica[0] == replica[2] != replica[1] == replica[3]
    assert with_observed_groups(meta, ops).groups["dp-1"] == [2, 3]
    listed = JobMeta("j", 4, meta.ranks, {"dp-1": [2, 3, 5]})
    assert with_observed_groups(listed, ops).groups["dp-1"] == [2, 3, 5]  # what meta.json says wins
