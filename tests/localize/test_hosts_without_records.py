"""Slow from the first step with hosts none of whose ranks logged (one rank per TP group, TP over
two 4-GPU hosts): an unlogged GPU's delay shows only as its logged peer's waits in collectives
across hosts, which no node's summary can count. The summary path judges one step of every
rank's records, and names the same tie as the full-record path."""

from __future__ import annotations

from pathlib import Path

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
