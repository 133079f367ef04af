"""A device slow on and off: its slow steps lie far apart, and the first of them is the onset
(not the densest run of them, which the step times alone would pick). Jobs of the second,
independent generator (`bench.altgen`: rendezvous p2p, skewed clocks), judged on both paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.altgen import Costs, Fault, JobSpec, Layout, simulate, write_trace
from collector.traceio import Trace
from localize.combine import localize_trace
from localize.summary import localize_from_summary, write_summaries

ACTIVE = [8, 14, 20, 21, 22, 28]  # the densest run (20-22) is not the first
STEP0 = 1000


def on_and_off_job(fault: Fault) -> JobSpec:
    lay = Layout(tp=2, pp=2, dp=4, gpus_per_host=4, hosts_per_switch=2, order="tp-dp-pp")
    costs = Costs(fwd_chunk_s=2e-3, tp_bytes=16 << 20, act_bytes=16 << 20, grad_bytes=1 << 30, nvlink_Bps=3e11,
                  net_Bps=2.5e10, latency_s=2e-5, compute_sigma=0.03, net_sigma=0.05, optimizer_s=5e-3,
                  a2a_bytes=8 << 20)
    return JobSpec(name="on-and-off", layout=lay, microbatches=4, steps=32, p2p="rendezvous", dp_mode="all_reduce",
                   step_sync="mp", logging="all", step0=STEP0, naming="megatron", meta_groups=True,
                   meta_parallelism=False, warmup_steps=1, warmup_factor=1.5, costs=costs, fault=fault,
                   kind=fault.kind, seed=11, logged=list(range(32)))


@pytest.mark.parametrize(("fault", "device"), [
    (Fault("host", 2.5, "random", ACTIVE, host=1), "host node-1"),
    (Fault("gpu", 2.5, "random", ACTIVE, rank=6), "gpu rank 6 (node-1 gpu 2)"),
])
def test_the_onset_of_a_device_slow_on_and_off_is_its_first_slow_step(tmp_path: Path, fault: Fault,
                                                                      device: str) -> None:
    spec = on_and_off_job(fault)
    rows, step_time = simulate(spec)
    write_trace(spec, tmp_path, rows, step_time)
    trace = Trace.open(tmp_path)
    full = localize_trace(trace, ("commops",), top=5)
    write_summaries(trace)
    summary = localize_from_summary(trace, top=5)[0]
    for v in (full, summary):
        assert v.status == "irregular"
        assert v.candidates[0].device() == device, [c.device() for c in v.candidates]
        assert v.onset_step == STEP0 + ACTIVE[0], (v.onset_step, v.irregular_steps)
