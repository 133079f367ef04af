"""Operators no other logged copy shares (one rank logged per TP group)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from localize.ops.lone import (
    lone_copies,
    lone_time,
    own_slow_steps,
    share_among,
    unlogged_members,
    unlogged_peers,
    wait_beside_peers,
    wait_change,
)
from localize.ops.table import prepare_ops

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


def test_wait_change_is_time_in_lone_copies_per_slow_step_over_per_normal_step() -> None:
    waited = np.array([[2.0, 2.0, 2.0, 0.5, 0.5],   # waits far less once slow: it arrives last
                       [1.0, 1.0, 1.0, 3.0, 3.0],   # waits longer: its peers slowed too
                       [0.0, 0.0, 0.0, 0.0, 0.0]])  # no lone copies
    slow = np.array([False, False, False, True, True])
    change = wait_change(waited, slow, ~slow)
    np.testing.assert_allclose(change[:2], [0.25, 3.0])
    assert np.isnan(change[2])
    assert np.isnan(wait_change(waited, slow, np.zeros(5, dtype=bool))).all()


def test_a_spikes_wait_change_is_read_in_the_steps_it_slowed_not_every_slow_step() -> None:
    """A GPU slow in steps 3 and 5 only, among six slow steps (the others noise): over all six its
    lone waits look unchanged; over its own two they fell, as the last arriver's do."""
    waited = np.array([[2.0, 2.0, 2.0, 0.5, 2.0, 0.5, 2.0, 2.0]])
    slow = np.array([False, False, True, True, True, True, True, True])
    by_step = np.array([[0.0, 9.0, 0.1, 8.0, 0.0, 0.0]])  # its blame in each slow step
    assert wait_change(waited, slow, ~slow)[0] == 1.0
    mine = own_slow_steps(by_step, slow)
    assert mine[0].tolist() == [False, False, False, True, False, True, False, False]
    assert wait_change(waited, mine, ~slow)[0] == 0.25
    never = own_slow_steps(np.zeros((1, 6)), slow)  # a rank never blamed: every slow step
    assert (never[0] == slow).all()


def test_slow_from_the_start_a_ranks_lone_wait_is_judged_beside_its_stage_peers() -> None:
    waited = np.array([[1.0, 1.2], [1.1, 0.9], [1.0, 1.0], [0.2, 0.3],  # stage 0: rank 3 waits least
                       [2.0, 2.0], [2.0, 2.0], [7.0, 6.0]])             # stage 1: two ranks only logged
    seen = np.array([True] * 6 + [False])
    stage = np.array([0, 0, 0, 0, 1, 1, 1])
    beside = wait_beside_peers(waited, seen, stage)
    np.testing.assert_allclose(beside[:4], np.array([1.1, 1.0, 1.0, 0.25]) / 0.975)  # (stage median per step: 1.0, 0.95)
    assert np.isnan(beside[4:]).all()  # too few peers to judge by, or not logged


def test_a_lone_copy_counts_only_beyond_what_the_same_operator_took_where_its_peers_logged() -> None:
    """A host without a logger leaves its peers' all-to-alls across hosts lone; the transfer every
    member pays (seen in the same operator elsewhere, 20 ns here) is not waiting on anyone."""
    rows = _rows()
    rows.loc[(rows["group"] == "tp-0") & (rows["step"] == 2), "end_ns"] += 50  # waited 50 ns on its peers
    ops = prepare_ops(rows)
    waited = lone_time(ops, lone_copies(ops, GROUPS), 8, np.arange(3))
    assert np.allclose(waited[0], [0.0, 0.0, 50e-9], rtol=0, atol=1e-12) and not waited[1:].any()


def test_members_that_logged_nothing_share_the_delay_they_caused() -> None:
    ops = prepare_ops(_rows())
    missing = unlogged_members(ops, GROUPS, 8, ())
    by_name = dict(zip(map(str, ops.groups), missing, strict=True))
    assert by_name["tp-0"].tolist() == [1, 2, 3] and by_name["tp-1"].tolist() == [6, 7] and not len(by_name["dp-0"])
    assert not len(dict(zip(map(str, ops.groups), unlogged_members(ops, GROUPS, 8, {"tp-1"}), strict=True))["tp-1"])
    code = {n: i for i, n in enumerate(map(str, ops.groups))}
    blame = share_among(missing, np.array([code["tp-1"], code["tp-1"], code["tp-0"]]), np.array([1.0, 1.0, 3.0]), 8)
    assert blame.tolist() == [0, 1, 1, 1, 0, 0, 1, 1]
