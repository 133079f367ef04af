"""The localizer on jobs whose DP sync overlaps the backward (simulator --grad-overlap, and
--param-gather-overlap): physics the localizer was not written against.

DP records then overlap the rank's compute and its TP/PP operators, start at launch and end when
the slowest replica's bucket is ready; with the parameter all-gather overlapped, the first
forward waits for it inside what looks like compute (no record covers the wait).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.trace.traceio import Trace
from localize.combine import localize_trace
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace


def _top(tmp_path: Path, fault: str, **kw: object) -> tuple[str, str]:
    cfg = SimConfig(gpus=64, tp=2, pp=2, steps=14, seed=20_013, hosts_per_switch=16, grad_overlap=True,
                    faults=[FaultSpec.parse(fault)], **kw)  # type: ignore[arg-type]
    simulate_trace(cfg, tmp_path / "t", counterfactual=False)
    v = localize_trace(Trace.open(tmp_path / "t"), ("commops",))
    top = v.candidates[0] if v.candidates else None
    return v.status, top.device() if top else "-"


@pytest.mark.parametrize("gather", [False, True])
def test_a_slow_gpu_is_named_when_its_buckets_overlap_the_backward(tmp_path: Path, gather: bool) -> None:
    status, top = _top(tmp_path, "gpu:rank=37,factor=2.5,steps=5:13", param_gather_overlap=gather)
    assert status == "irregular" and top.startswith("gpu rank 37"), top


@pytest.mark.parametrize("gather", [False, True])
def test_a_slow_host_is_named_when_its_buckets_overlap_the_backward(tmp_path: Path, gather: bool) -> None:
    status, top = _top(tmp_path, "host:host=node-5,factor=2.5,steps=5:13", param_gather_overlap=gather)
    assert status == "irregular" and top.startswith("host node-5"), top


# Two jobs of `python -m bench.matrix --quick --grad-overlap on` (rendezvous link and seqlen cells).
# With the parameter all-gather overlapped too, the DP groups sync six times a step: as often as a
# model-parallel group, and strided, they read as context parallel, so no model replica was laid out
# and the seqlen job's replicas taking turns read as hosts. Their names say dp, which breaks the tie.
SEQLEN = {"gpus": 64, "tp": 8, "pp": 2, "steps": 16, "seed": 1466651479, "hosts_per_switch": 32, "mp_sync": True,
          "clock_skew_ms": 70.0, "drift": -0.07, "fault": "seqlen:factor=2.79,steps=7:15,pattern=fluctuation", "want": "data"}
LINK = {"gpus": 64, "tp": 2, "pp": 2, "cp": 2, "ep": 2, "steps": 16, "seed": 1844568815, "hosts_per_switch": 16,
        "clock_skew_ms": 21.0, "logged_ranks": "one-per-tp", "grad_buckets": 4,
        "fault": "link:hosts=node-6+node-7,factor=2.77,steps=3:15", "want": "link"}


@pytest.mark.parametrize("job", [SEQLEN, LINK], ids=["seqlen", "link"])
@pytest.mark.parametrize("overlap", ["none", "grad", "grad+gather"])
def test_matrix_jobs_with_and_without_overlap(tmp_path: Path, job: dict[str, object], overlap: str) -> None:
    """With the gather overlapped, the link job was named "config: stage 1 computes longer"; a
    slowdown with an onset is never a split of layers, and the link is found; the seqlen job's
    replicas take turns."""
    kw = {k: v for k, v in job.items() if k not in ("fault", "want")}
    cfg = SimConfig(**kw, grad_overlap=overlap != "none", param_gather_overlap=overlap == "grad+gather",  # type: ignore[arg-type]
                    faults=[FaultSpec.parse(str(job["fault"]))])
    simulate_trace(cfg, tmp_path / "t", counterfactual=False)
    v = localize_trace(Trace.open(tmp_path / "t"), ("commops",))
    assert v.status == "irregular" and v.candidates and v.candidates[0].kind == job["want"], \
        [(c.device(), round(c.score, 2)) for c in v.candidates[:3]]
