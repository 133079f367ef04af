"""Groups meta.json leaves out, laid out from the records; group kinds without the timeline's hint."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta, RankInfo
from localize.commops import COLUMNS
from localize.ops.groupkinds import group_kinds, with_observed_groups
from localize.ops.table import Ops, prepare_ops
from localize.waits.ranking import layout_units
from tests.timeline.test_timeline_groups import with_syncs
from tests.timeline.timeline_factory import kinds_by_members, make_trace
from timeline.columns import read_commops

DIMS = {"tp": 2, "pp": 2, "dp": 2}


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


def _job(tmp: Path) -> tuple[Ops, dict[str, list[int]], JobMeta]:
    """tp2 x pp2 x dp2 under opaque names, plus a model-parallel sync per replica and a world barrier."""
    trace = make_trace(tmp, DIMS, [1.0] * 3, names="opaque")
    df, syncs = with_syncs(read_commops(trace, COLUMNS), DIMS)
    return prepare_ops(df[COLUMNS]), syncs, trace.meta


def test_syncs_from_the_records_alone(tmp_path: Path) -> None:
    ops, syncs, meta = _job(tmp_path)
    by_members = {tuple(m): k for k, m in kinds_by_members(DIMS)}
    want = {g: by_members[tuple(m)] for g, m in meta.groups.items()} | dict.fromkeys(syncs, "sync")
    assert group_kinds(ops) == want
    assert group_kinds(ops, dict.fromkeys(syncs, "sync")) == want  # the timeline's sync is taken as given


def test_syncs_neither_split_nor_merge_replicas(tmp_path: Path) -> None:
    """Meta that lists no groups, records with syncs over each replica and the world: the same
    replicas and stages as meta's own groups give (a world group taken for tp would merge them all)."""
    ops, _, meta = _job(tmp_path)
    kinds = group_kinds(ops)
    world = meta.world_size
    _, stage, replica, _ = layout_units(with_observed_groups(replace(meta, groups={}), ops), world, kinds)
    _, want_stage, want_replica, _ = layout_units(meta, world, kinds)
    assert replica.max() + 1 == DIMS["dp"] and stage.max() + 1 == DIMS["pp"]
    assert np.array_equal(stage, want_stage) and np.array_equal(replica, want_replica)


def test_a_stage_that_logged_nothing_keeps_its_place_in_the_pipeline() -> None:
    """A pipeline 0 -> 1 -> 2 -> 3 whose rank 2 logged nothing: its neighbours' transfers name it,
    so rank 3 is the fourth stage, not the third."""
    rows = []
    for step in range(2):
        for src, dst in ((0, 1), (1, 2), (2, 3)):
            for rank, op, peer in ((src, "send", dst), (dst, "recv", src)):
                if rank != 2:
                    rows.append({"rank": rank, "group": "pp-0", "op": op, "seq": step, "peer": peer, "nbytes": 1 << 20,
                                 "start_ns": step * 1000 + 10 * src, "end_ns": step * 1000 + 10 * src + 5, "step": step})
    ops = prepare_ops(pd.DataFrame(rows))
    meta = JobMeta("j", 4, {r: RankInfo(f"node-{r}", 0) for r in range(4)})
    laid = with_observed_groups(meta, ops)
    assert laid.groups["pp-0"] == [0, 1, 2, 3]
    _, stage, _, _ = layout_units(laid, 4, {"pp-0": "pp"})
    assert stage.tolist() == [0, 1, 2, 3]
