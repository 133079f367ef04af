"""Group kinds from operator physics and membership, with and without helpful names."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from collector.trace.traceio import Trace
from simulator.config import SimConfig
from simulator.writer import simulate_trace
from tests.timeline.timeline_factory import kinds_by_members, layout, make_trace
from timeline.build import COLUMNS
from timeline.columns import read_commops
from timeline.groups import infer_group_kinds, membership, sync_groups

LAYOUTS = [
    {"tp": 2, "pp": 2, "dp": 2},
    {"tp": 2, "cp": 2, "dp": 2},
    {"tp": 2, "cp": 2, "ep": 2, "dp": 2, "pp": 2},
    {"tp": 4, "dp": 4},
    {"dp": 8},
    {"pp": 4, "dp": 2},
    {"dp": 4, "ep": 2},
]


def _kinds(tmp: Path, dims: dict[str, int], names: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(inferred, true, notes) group kinds; truth by membership, whatever the names say."""
    trace = make_trace(tmp, dims, [1.0] * 3, names=names)
    by_members = {tuple(m): k for k, m in kinds_by_members(dims)}
    want = {g: by_members[tuple(m)] for g, m in trace.meta.groups.items()}
    notes: list[str] = []
    got = infer_group_kinds(read_commops(trace, COLUMNS), trace.meta, notes)
    return got, want, notes


@pytest.mark.parametrize("dims", LAYOUTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
@pytest.mark.parametrize("names", ["kind", "opaque"])
def test_kinds_from_physics(tmp_path: Path, dims: dict[str, int], names: str) -> None:
    got, want, notes = _kinds(tmp_path, dims, names)
    assert got == want
    assert not [n for n in notes if "disagree" in n]


def test_misleading_names_lose_to_physics(tmp_path: Path) -> None:
    dims = {"tp": 2, "pp": 2, "dp": 2}
    got, want, notes = _kinds(tmp_path, dims, "swapped")
    assert got == want
    assert any("disagree" in n for n in notes)


SYNC_LAYOUTS = [
    {"tp": 2, "pp": 2, "dp": 2},
    {"tp": 2, "cp": 2, "dp": 2},
    {"tp": 2, "cp": 2, "ep": 2, "dp": 2, "pp": 2},
    {"tp": 4, "dp": 4},
    {"pp": 4, "dp": 2},
    {"cp": 2, "dp": 4},
    {"dp": 4, "ep": 2},
]


def with_syncs(df: pd.DataFrame, dims: dict[str, int]) -> tuple[pd.DataFrame, dict[str, list[int]]]:
    """The records plus a once-a-step all_reduce over each model-parallel group (one replica's
    tp x cp x pp ranks, Megatron's grad-norm) and a barrier over the world, under opaque names."""
    world, _, coords = layout(dims)
    replica = [coords[r]["dp"] + dims.get("dp", 1) * coords[r]["ep"] for r in range(world)]
    syncs = {f"pg-{9000 + d}": [r for r in range(world) if replica[r] == d] for d in sorted(set(replica))}
    syncs = {g: m for g, m in syncs.items() if len(m) > 1}
    syncs["pg-9999"] = list(range(world))
    ends = df.groupby("step")["end_ns"].max()
    rows = [(r, g, "all_reduce" if g != "pg-9999" else "barrier", 0, -1, 8, int(ends[s]) + 1000, int(ends[s]) + 5000, s)
            for s in ends.index for g, members in syncs.items() for r in members]
    extra = pd.DataFrame(rows, columns=list(COLUMNS))
    extra["seq"] = extra.groupby(["rank", "group"]).cumcount()
    return pd.concat([df.astype({"group": str, "op": str}), extra], ignore_index=True), syncs


@pytest.mark.parametrize("dims", SYNC_LAYOUTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
@pytest.mark.parametrize("listed", [True, False], ids=["meta-groups", "no-meta-groups"])
def test_model_parallel_and_world_syncs_are_no_data_parallel(tmp_path: Path, dims: dict[str, int], listed: bool) -> None:
    """A group over a union of others (a replica's model-parallel ranks, the world) is a sync:
    never dp (which would add replicas), never tp (which would merge them); the rest keep their kinds."""
    trace = make_trace(tmp_path, dims, [1.0] * 3, names="opaque")
    df, syncs = with_syncs(read_commops(trace, COLUMNS), dims)
    by_members = {tuple(m): k for k, m in kinds_by_members(dims)}
    want = {g: by_members[tuple(m)] for g, m in trace.meta.groups.items()} | dict.fromkeys(syncs, "sync")
    meta = replace(trace.meta, groups={**trace.meta.groups, **syncs} if listed else {})
    assert infer_group_kinds(df, meta) == want


def test_a_world_that_is_the_data_parallel_group_stays_dp(tmp_path: Path) -> None:
    """With data parallelism alone the world barrier holds the one dp group's ranks: no union of others."""
    trace = make_trace(tmp_path, {"dp": 4}, [1.0] * 3, names="opaque")
    df, _ = with_syncs(read_commops(trace, COLUMNS), {"dp": 4})
    assert set(infer_group_kinds(df, trace.meta).values()) == {"dp"}


def _syncs(groups: dict[str, list[list[int]]], once: list[str]) -> list[str]:
    """The names (keys of `groups`) of the groups `sync_groups` marks; `once`: kind per group in order."""
    names = [k for k, gl in groups.items() for _ in gl]
    code = np.array([i for i, m in enumerate(m for gl in groups.values() for m in gl) for _ in m])
    rank = np.array([r for gl in groups.values() for m in gl for r in m])
    got = sync_groups(code, rank, np.array(once, dtype=object))
    return [k for k, s in zip(names, got, strict=True) if s]


def test_sync_groups_from_membership_alone() -> None:
    """Two replicas of tp=2 x pp=2 (ranks 0-3, 4-7): the dp groups cross each tp/pp group at one rank."""
    groups = {"tp": [[0, 1], [2, 3], [4, 5], [6, 7]], "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
              "dp": [[0, 4], [1, 5], [2, 6], [3, 7]], "mp": [[0, 1, 2, 3], [4, 5, 6, 7]], "world": [list(range(8))]}
    assert _syncs(groups, ["tp"] * 4 + ["pp"] * 4 + ["dp"] * 7) == ["mp", "mp", "world"]
    # context parallelism alone (cp=2, dp=2): the model-parallel group is a cp group's ranks; a dp x cp
    # gradient group holds whole cp groups and the model-parallel ones, and is still the data-parallel sync
    assert _syncs({"cp": [[0, 1], [2, 3]], "mp": [[0, 1], [2, 3]], "dpcp": [[0, 1, 2, 3]]},
                  ["cp", "cp", "dp", "dp", "dp"]) == ["mp", "mp"]
    # two once-a-step groups seen to share one rank: neither holds the other
    assert _syncs({"a": [[0]], "b": [[0]]}, ["dp", "dp"]) == []


def test_membership_bitmap_and_sort_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Who is in each group, from rows in any order with repeats: the bitmap (marked a chunk of rows
    at a time) and the sort give the same pairs."""
    rng = np.random.default_rng(3)
    group, rank = rng.integers(0, 40, 5000), rng.integers(0, 300, 5000)
    want = sorted(set(zip(group.tolist(), rank.tolist(), strict=True)))
    monkeypatch.setattr("timeline.groups._CHUNK", 777)
    got = membership(group, rank)
    monkeypatch.setattr("timeline.groups.BITMAP_CELLS", 0)
    for g, r in (got, membership(group, rank)):
        assert list(zip(g.tolist(), r.tolist(), strict=True)) == want


@pytest.mark.parametrize("dims", [{"tp": 2, "cp": 2, "pp": 2}, {"tp": 1, "pp": 2}], ids=["tp2-cp2-pp2", "tp1-pp2"])
def test_a_data_parallel_sync_in_overlapped_buckets_is_dp_not_context_parallel(tmp_path: Path, dims: dict[str, Any]) -> None:
    """Gradient reduce-scatter in buckets over the backward and the parameter all-gather over
    the forward: six syncs a step, strided, all-gathers and reduce-scatters, as context
    parallelism's are. The physics leaves the tie; the groups' names break it."""
    simulate_trace(SimConfig(gpus=32, steps=4, grad_overlap=True, param_gather_overlap=True, **dims), tmp_path / "t",
                   counterfactual=False)
    trace = Trace.open(tmp_path / "t")
    got = infer_group_kinds(read_commops(trace, COLUMNS), trace.meta)
    assert {g: k for g, k in got.items() if g.startswith("dp")} == {g: "dp" for g in got if g.startswith("dp")}
    assert all(k == "cp" for g, k in got.items() if g.startswith("cp")) and any(g.startswith("dp") for g in got)
