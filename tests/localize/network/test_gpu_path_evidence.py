"""A GPU's own communication path is told from its host's NIC only by the host's other GPUs: where
none of them logged (one rank per TP group, the group filling the host), the two are a tie and
the evidence says why, never that the other GPUs communicate normally."""

from __future__ import annotations

from pathlib import Path

from bench.altgen import Costs, Fault, JobSpec, Layout, simulate, write_trace
from collector.traceio import Trace
from localize.combine import localize_trace


def test_a_hosts_one_logged_gpu_ties_its_path_with_the_nic_and_says_why(tmp_path: Path) -> None:
    lay = Layout(tp=4, pp=2, dp=4, gpus_per_host=4, hosts_per_switch=2, order="tp-dp-pp")
    costs = Costs(fwd_chunk_s=2e-3, tp_bytes=16 << 20, act_bytes=64 << 20, grad_bytes=1 << 30, nvlink_Bps=3e11,
                  net_Bps=2.5e10, latency_s=2e-5, compute_sigma=0.03, net_sigma=0.05, optimizer_s=5e-3,
                  a2a_bytes=8 << 20)
    spec = JobSpec(name="nic-tp0", layout=lay, microbatches=4, steps=20, p2p="rendezvous", dp_mode="all_reduce",
                   step_sync="mp", logging="tp0", step0=0, naming="megatron", meta_groups=True, meta_parallelism=False,
                   warmup_steps=1, warmup_factor=1.5, costs=costs, fault=Fault("nic", 3.0, "persistent",
                   list(range(10, 20)), host=1), kind="nic", seed=2, logged=list(range(20)))
    rows, step_time = simulate(spec)
    write_trace(spec, tmp_path, rows, step_time)
    v = localize_trace(Trace.open(tmp_path), ("commops",))
    top = [c for c in v.candidates if c.score == v.candidates[0].score]
    assert {c.device() for c in top} == {"gpu rank 4 (node-1 gpu 0)", "nic node-1"}, [c.device() for c in v.candidates]
    gpu = next(c for c in top if c.kind == "gpu")
    assert "no other GPU of node-1 logged" in " ".join(gpu.evidence)
    assert not any("communicate normally" in e for e in gpu.evidence)
