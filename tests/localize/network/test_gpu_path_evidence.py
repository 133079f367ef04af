"""A GPU's own communication path is told from its host's NIC only by the host's other GPUs: where
none of them logged (one rank per TP group, the group filling the host), the two are a tie and
the evidence says why, never that the other GPUs communicate normally."""

from __future__ import annotations

from pathlib import Path

from bench.altgen import Fault, Layout
from localize.combine import localize_trace
from tests.localize.altgen_jobs import altgen_job, written


def test_a_hosts_one_logged_gpu_ties_its_path_with_the_nic_and_says_why(tmp_path: Path) -> None:
    lay = Layout(tp=4, pp=2, dp=4, gpus_per_host=4, hosts_per_switch=2, order="tp-dp-pp")
    fault = Fault("nic", 3.0, "persistent", list(range(10, 20)), host=1)
    v = localize_trace(written(altgen_job("nic-tp0", lay, fault, steps=20, seed=2, logging="tp0"), tmp_path),
                       ("commops",))
    top = [c for c in v.candidates if c.score == v.candidates[0].score]
    assert {c.device() for c in top} == {"gpu rank 4 (node-1 gpu 0)", "nic node-1"}, [c.device() for c in v.candidates]
    gpu = next(c for c in top if c.kind == "gpu")
    assert "no other GPU of node-1 logged" in " ".join(gpu.evidence)
    assert not any("communicate normally" in e for e in gpu.evidence)
