"""Slow from the first step with hosts none of whose ranks logged (one rank per TP group, TP over
two 4-GPU hosts): an unlogged GPU's delay shows only as its logged peer's waits in collectives
across hosts, which no node's summary can count. The summary path judges one step of every
rank's records, and names the same tie as the full-record path."""

from __future__ import annotations

from pathlib import Path

from bench.altgen import Costs, Fault, JobSpec, Layout, simulate, write_trace
from collector.traceio import Trace
from localize.combine import localize_trace
from localize.summary import localize_from_summary, write_summaries


def test_an_unlogged_gpu_slow_from_the_start_is_the_same_tie_on_both_paths(tmp_path: Path) -> None:
    lay = Layout(tp=8, pp=2, dp=4, gpus_per_host=4, hosts_per_switch=4, order="tp-dp-pp")
    costs = Costs(fwd_chunk_s=2e-3, tp_bytes=16 << 20, act_bytes=16 << 20, grad_bytes=1 << 30, nvlink_Bps=3e11,
                  net_Bps=2.5e10, latency_s=2e-5, compute_sigma=0.03, net_sigma=0.05, optimizer_s=5e-3,
                  a2a_bytes=8 << 20)
    spec = JobSpec(name="slow-unlogged", layout=lay, microbatches=4, steps=16, p2p="rendezvous", dp_mode="all_reduce",
                   step_sync="mp", logging="tp0", step0=0, naming="megatron", meta_groups=True, meta_parallelism=False,
                   warmup_steps=1, warmup_factor=1.5, costs=costs,
                   fault=Fault("slow_start", 2.0, "from_start", list(range(16)), rank=13), kind="slow_start", seed=4,
                   logged=list(range(16)))
    rows, step_time = simulate(spec)
    write_trace(spec, tmp_path, rows, step_time)
    trace = Trace.open(tmp_path)
    full = localize_trace(trace, ("commops",), top=20)
    write_summaries(trace)
    summary = localize_from_summary(trace, top=20)[0]
    assert not (tmp_path / "summary" / "node-3.parquet").exists()  # ranks 12-15 logged nothing
    for v in (full, summary):
        tie = [c.device() for c in v.candidates if c.score == v.candidates[0].score]
        assert "gpu rank 13 (node-3 gpu 1)" in tie and len(tie) == v.candidates[0].tie, tie
    assert [c.device() for c in summary.candidates[:10]] == [c.device() for c in full.candidates[:10]]
