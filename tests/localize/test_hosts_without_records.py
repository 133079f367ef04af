"""Slow from the first step, one rank logged per TP group: an unlogged GPU's delay shows only as
its logged peer's waits in collectives no other member logged, which no node's summary can count
as such where the group spans hosts (some hosts logged nothing), or where meta.json lists no
groups (a node cannot tell a group whose other members log elsewhere). The summary path judges
one step of every rank's records there, and names the same tie as the full-record path."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.altgen import Fault, Layout
from tests.localize.altgen_jobs import altgen_job, both_paths, written


def test_an_unlogged_gpu_slow_from_the_start_is_the_same_tie_on_both_paths(tmp_path: Path) -> None:
    lay = Layout(tp=8, pp=2, dp=4, gpus_per_host=4, hosts_per_switch=4, order="tp-dp-pp")
    fault = Fault("slow_start", 2.0, "from_start", list(range(16)), rank=13)
    full, summary = both_paths(written(altgen_job("slow-unlogged", lay, fault, steps=16, seed=4, logging="tp0"),
                                       tmp_path), top=20)
    assert not (tmp_path / "summary" / "node-3.parquet").exists()  # ranks 12-15 logged nothing
    for v in (full, summary):
        tie = [c.device() for c in v.candidates if c.score == v.candidates[0].score]
        assert "gpu rank 13 (node-3 gpu 1)" in tie and len(tie) == v.candidates[0].tie, tie
    assert [c.device() for c in summary.candidates[:10]] == [c.device() for c in full.candidates[:10]]


@pytest.mark.parametrize("rank", [5, 6])
def test_without_groups_in_meta_an_unlogged_gpu_slow_from_the_start_is_the_same_tie_on_both_paths(
        tmp_path: Path, rank: int) -> None:
    lay = Layout(tp=4, pp=2, dp=4, gpus_per_host=4, hosts_per_switch=4, order="tp-dp-pp")  # a TP group per host
    fault = Fault("slow_start", 2.0, "from_start", list(range(16)), rank=rank)
    spec = altgen_job("no-groups", lay, fault, steps=16, seed=6, logging="tp0", meta_groups=False)
    full, summary = both_paths(written(spec, tmp_path), top=20)
    for v in (full, summary):
        tie = [c.device() for c in v.candidates if c.score == v.candidates[0].score]
        assert f"gpu rank {rank} (node-1 gpu {rank - 4})" in tie, (v.status, tie)
    assert [c.device() for c in summary.candidates[:5]] == [c.device() for c in full.candidates[:5]]
