"""Network faults CommOps cannot pin down alone: the verdict says so, and flows decide.

One dp ring per GPU index over every host, nothing else crossing hosts (no pipeline): a slow
NIC, link or switch slows every ring the same way, so CommOps can only name the set of devices
the rings cross. The verdict lists them with equal scores and one evidence line; the flows
added to the same trace pick the faulty one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.altgen import Fault, Layout
from collector.trace.traceio import Trace
from localize.combine import localize_trace
from simulator.config import FaultSpec, SimConfig
from simulator.flows import emit_flows
from simulator.writer import simulate_trace
from tests.localize.altgen_jobs import altgen_job, both_paths, written

pytestmark = pytest.mark.slow

FAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "nic": ("nic:host=node-5,factor=3,steps=5:11", {"kind": "nic", "host": "node-5"}),
    "link": ("link:hosts=node-2+node-3,factor=3,steps=5:11", {"kind": "link", "hosts": ["node-2", "node-3"]}),
    "switch": ("switch:switch=tor-1,factor=3,steps=5:11", {"kind": "switch", "switch": "tor-1"}),
}


def _is(c: object, want: dict) -> bool:
    return all(getattr(c, k) == v for k, v in want.items())


@pytest.fixture(scope="module")
def ring_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ties")
    out = {}
    for name, (spec, _) in FAULTS.items():
        d = root / name
        simulate_trace(SimConfig(gpus=64, tp=8, steps=12, seed=21, faults=[FaultSpec.parse(spec)], job=name), d,
                       counterfactual=False)
        emit_flows(d, pcap=False)
        out[name] = d
    return out


@pytest.mark.parametrize("name", list(FAULTS))
def test_commops_reports_the_tie_and_flows_break_it(ring_traces: dict[str, Path], name: str) -> None:
    want = FAULTS[name][1]
    trace = Trace.open(ring_traces[name])
    v = localize_trace(trace, ("commops",), top=50)
    assert v.status == "irregular"
    n_tie = v.extra["network_tie"]
    tied = [c for c in v.candidates if c.score >= v.candidates[0].score - 1e-9]
    assert n_tie == len(tied) == 18  # 8 NICs, 8 ring links, 2 switches: the rings cross them all
    assert any(_is(c, want) for c in tied)
    assert all("cannot tell apart 18 devices" in c.evidence[-1] for c in tied)
    both = localize_trace(Trace.open(ring_traces[name]), None, top=5)
    assert _is(both.candidates[0], want), [c.device() for c in both.candidates]
    assert both.candidates[0].source == "commops+flows"
    # the decision shows in the scores: the devices flows did not name fall below the one they did
    assert both.candidates[0].tie is None and max(c.score for c in both.candidates[1:]) < both.candidates[0].score


def test_a_barrier_on_time_clears_no_link_of_the_slow_ring_it_shares(tmp_path: Path) -> None:
    """A link of a DP ring loses bandwidth; each step ends with a barrier over every rank, whose
    ring crosses all of that DP ring's links but its wrap-around. The barrier's 4 bytes pass the
    slow link on time, and counted as a healthy transfer they cleared every ring link but the
    wrap-around, named alone at 0.96 (independent generator, seed 9, alt042): the ring's links
    are a tie that holds the slow one."""
    lay = Layout(tp=2, pp=2, dp=4, gpus_per_host=2, hosts_per_switch=8, order="tp-dp-pp")
    fault = Fault("link", 3.0, "persistent", list(range(10, 20)), hosts=(1, 2))
    v = localize_trace(written(altgen_job("ring-link", lay, fault, steps=20, seed=4, step_sync="barrier"), tmp_path),
                       ("commops",))
    top = [c.device() for c in v.candidates if c.score == v.candidates[0].score]
    assert "link node-1<->node-2" in top and len(top) > 1, [(c.device(), c.score) for c in v.candidates[:6]]


@pytest.mark.parametrize("path", ["localize", "sidecar"])
def test_a_scalar_all_reduce_waiting_on_unlogged_peers_is_no_transfer(tmp_path: Path, path: str) -> None:
    """One rank logged per TP group (a host); the stage-1 DP rings cross a slow link inside their
    rack. The step-end grad-norm all-reduce (4 bytes, each stage-0 host with its stage-1 partner
    across the racks) waits on the unlogged TP peers whose own rings ran long: read as slow
    transfers, those pairs named the rack's switch alone (independent generator, seeds 10606 and
    10808). The DP ring's links are the tie that holds the slow one."""
    lay = Layout(tp=8, pp=2, dp=4, gpus_per_host=8, hosts_per_switch=4, order="tp-dp-pp")
    fault = Fault("link", 2.5, "persistent", list(range(8, 16)), hosts=(4, 5))
    trace = written(altgen_job("scalar-sync", lay, fault, steps=16, seed=7, logging="tp0", meta_groups=False), tmp_path)
    full, summary = both_paths(trace, top=10)
    v = full if path == "localize" else summary
    top = [c.device() for c in v.candidates if c.score == v.candidates[0].score]
    assert "link node-4<->node-5" in top and not any(d.startswith("switch") for d in top), \
        [(c.device(), c.score) for c in v.candidates[:6]]
