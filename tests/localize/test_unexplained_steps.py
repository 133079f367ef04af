"""Slow steps whose delay no logged operator shows are said to be irregular, with why no device
is named -- never "healthy". A job of the second generator (`bench.altgen`) logging TP rank 0
only, whose slow link carries only the data-parallel ring of ranks that logged nothing: every
logged rank just waits longer at the end-of-step barrier."""

from __future__ import annotations

from pathlib import Path

from bench.altgen import Costs, Fault, JobSpec, Layout, simulate, write_trace
from collector.traceio import Trace
from localize.combine import localize_trace

SLOW = [10, 11, 12]


def test_slow_steps_no_logged_operator_explains_are_irregular_and_say_why(tmp_path: Path) -> None:
    # tp-dp-pp over 4-GPU hosts: TP ranks 4-7 of replica 0 / stage 0 sit on node-1, of replica 1 on node-3
    lay = Layout(tp=8, pp=2, dp=2, gpus_per_host=4, hosts_per_switch=2, order="tp-dp-pp")
    costs = Costs(fwd_chunk_s=2e-3, tp_bytes=16 << 20, act_bytes=16 << 20, grad_bytes=1 << 30, nvlink_Bps=3e11,
                  net_Bps=2.5e10, latency_s=2e-5, compute_sigma=0.03, net_sigma=0.05, optimizer_s=5e-3,
                  a2a_bytes=8 << 20)
    spec = JobSpec(name="unlogged-ring", layout=lay, microbatches=4, steps=20, p2p="rendezvous", dp_mode="all_reduce",
                   step_sync="barrier", logging="tp0", step0=0, naming="megatron", meta_groups=True,
                   meta_parallelism=False, warmup_steps=1, warmup_factor=1.5, costs=costs,
                   fault=Fault("link", 3.0, "persistent", SLOW, hosts=(1, 3)), kind="link", seed=5,
                   logged=list(range(20)))
    rows, step_time = simulate(spec)
    write_trace(spec, tmp_path, rows, step_time)
    assert step_time[SLOW].min() > 1.3 * step_time[3:10].max()
    v = localize_trace(Trace.open(tmp_path), ("commops",))
    assert v.status == "irregular" and v.irregular_steps == SLOW, (v.status, v.irregular_steps, v.extra)
    assert v.onset_step == SLOW[0]
    assert v.candidates == [], [c.device() for c in v.candidates]
    assert "the 28 ranks that logged nothing" in str(v.extra["note"])
