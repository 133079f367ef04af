"""Operators no other logged copy shares (one rank logged per TP group)."""

from __future__ import annotations

import pandas as pd

from localize.ops.features import prepare_ops
from localize.ops.lone import lone_copies, unlogged_peers

GROUPS = {"tp-0": [0, 1, 2, 3], "tp-1": [4, 5, 6, 7], "dp-0": [0, 4]}


def _rows() -> pd.DataFrame:
    rows = []
    for step in range(3):
        t = step * 100
        for group, ranks in (("tp-0", [0]), ("tp-1", [4, 5]), ("dp-0", [0, 4])):
            for r in ranks:
                rows.append({"rank": r, "group": group, "op": "all_reduce", "seq": step, "peer": -1, "nbytes": 1 << 20,
                             "start_ns": t + 10, "end_ns": t + 30, "step": step})
            t += 40
    return pd.DataFrame(rows)


def test_only_the_sole_logged_member_of_a_larger_group_has_lone_copies() -> None:
    ops = prepare_ops(_rows())
    lone = lone_copies(ops, GROUPS)
    groups = ops.groups[ops.group_code]
    assert set(zip(ops.rank[lone].tolist(), groups[lone].tolist(), strict=True)) == {(0, "tp-0")}
    assert lone.sum() == 3  # one per step


def test_groups_not_read_whole_say_nothing() -> None:
    ops = prepare_ops(_rows())
    assert not lone_copies(ops, GROUPS, skip={"tp-0"}).any()
    assert not lone_copies(ops, {}).any()


def test_an_unlisted_group_logged_by_one_rank_is_lone_only_where_every_record_was_read() -> None:
    ops = prepare_ops(_rows())
    lone = lone_copies(ops, {}, unlisted=True)
    groups = ops.groups[ops.group_code]
    assert set(groups[lone].tolist()) == {"tp-0"}  # tp-1 and dp-0 were logged by two ranks
    assert not lone_copies(ops, {}, unlisted=False).any()


def test_the_unlogged_peers_of_a_lone_copy_are_its_groups_other_members() -> None:
    ops = prepare_ops(_rows())
    assert unlogged_peers(ops, GROUPS, lone_copies(ops, GROUPS), world=8) == {0: [1, 2, 3]}


def test_without_listed_groups_the_peers_are_the_ranks_numbered_up_to_the_next_logged_one() -> None:
    """Tensor-parallel ranks are numbered consecutively: rank 0's lone group runs to rank 4, which logged."""
    ops = prepare_ops(_rows())
    assert unlogged_peers(ops, {}, lone_copies(ops, {}, unlisted=True), world=8) == {0: [1, 2, 3]}
