"""Group kinds from operator physics, with and without helpful names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.timeline.timeline_factory import kinds_by_members, make_trace
from timeline.build import COLUMNS
from timeline.columns import read_commops
from timeline.groups import infer_group_kinds

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
