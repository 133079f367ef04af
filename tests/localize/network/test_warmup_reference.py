"""A warm-up step is no reference: a NIC fault seen only through TP rings that cross hosts.

4 GPUs per host and TP=8: every tensor-parallel ring spans two hosts, and with dp=1 the TP
rings and the pipeline streams are the job's only inter-host transfers. The first step runs
slow everywhere (warm-up: every inter-host transfer 3x). Counted as a normal step, its slow
transfers made the normal cost of slow transfers exceed the fault's, and the job read healthy
("no operator delay explains it"); an independent generator's job (tp8 over 4-GPU hosts,
40% of steps logged, two warm-up steps) met the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.trace.meta import JobMeta, RankInfo
from collector.trace.traceio import Trace
from localize.combine import localize_trace
from localize.network.devices import resolve_network
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace


@pytest.fixture(scope="module")
def warm_nic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("warm") / "t"
    faults = [FaultSpec.parse("nic:host=node-3,factor=2.5,steps=4:11"),
              FaultSpec.parse("switch:switch=tor-0,factor=3,steps=0:0")]  # the warm-up (4 hosts, one switch)
    simulate_trace(SimConfig(gpus=16, tp=8, pp=2, gpus_per_host=4, steps=12, seed=1, faults=faults, job="warm"), d,
                   counterfactual=False)
    return d


def test_nic_named_through_cross_host_tp_rings_after_a_warm_up(warm_nic: Path) -> None:
    v = localize_trace(Trace.open(warm_nic), ("commops",))
    assert v.status == "irregular", v.extra
    top = v.candidates[0]
    assert (top.kind, top.host) == ("nic", "node-3"), [c.device() for c in v.candidates]
    assert v.onset_step == 4


def test_a_ring_is_network_evidence_by_the_hosts_it_crosses_not_its_kind() -> None:
    # 8 ranks, 4 per host: tp-x crosses node-0/node-1, tp-in stays in node-0
    meta = JobMeta("t", 8, {r: RankInfo(f"node-{r // 4}", r % 4) for r in range(8)},
                   {"tp-x": list(range(8)), "tp-in": [0, 1, 2, 3]}, {}, {})
    units = dict(meta.groups)
    best = resolve_network(units, {"tp-x": 1.0}, meta, top=50)
    assert {c.kind for c in best} >= {"nic", "link"}
    # a ring that never leaves node-0 crosses no NIC, link or switch: only that host's inside and its GPUs' own paths
    inside = resolve_network(units, {"tp-in": 1.0}, meta, top=50)
    assert {(c.kind, c.key) for c in inside} == {("host", ("node-0",))} | {("gpu", r) for r in range(4)}
