"""L4 on logs in real-world vocabulary (simulator/reallogs.py, held-out dialect): the node comes from the
line's origin, the kind from what the stack printed, and the failure lines are the ones the fault caused."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.logs import parse_logs
from collector.trace.traceio import Trace
from localize.logs.analysis import analyze_logs, localize_logs
from localize.logs.pool import EventPool
from simulator.cluster import Layout
from simulator.config import SimConfig
from simulator.reallogs import emit_real_logs


def make(root: Path, name: str, seed: int, failure: str | None, hosts: int = 8, **kw: object) -> Trace:
    d = root / name
    d.mkdir(parents=True)
    Layout.build(SimConfig(gpus=8 * hosts, tp=8, job=name).resolved()).meta().save(d / "meta.json")
    emit_real_logs(d, seed, failure, "heldout", **kw)  # type: ignore[arg-type]
    return Trace.open(d)


@pytest.fixture(scope="module")
def site_pool(tmp_path_factory: pytest.TempPathFactory) -> EventPool:
    """The shipped pool plus `laggard logs learn` on three successful jobs of the same site."""
    root = tmp_path_factory.mktemp("ok")
    pool = EventPool.default()
    for s in range(3):
        t = make(root, f"ok{s}", 800_100 + s, None, hosts=4)
        pool.add(parse_logs(t.log_files(), root=t.path), f"ok{s}")
    return pool


def test_ib_retry_exceeded_names_the_peer_nic_not_config(tmp_path: Path, site_pool: EventPool) -> None:
    """The issue's case: eight hosts, peers report IB completion errors against one node, and every rank
    times out in its collective. That is the named node's NIC, not a configuration problem."""
    trace = make(tmp_path, "ib", 71_001, "ib_retry", aggregated=False)
    truth = (trace.truth() or {})["log_failures"][0]
    v = localize_logs(trace, top=3, pool=site_pool)
    c = v.candidates[0]
    assert v.status == "irregular" and (c.kind, c.host) == ("nic", truth["host"])
    assert any("named by" in e for e in c.evidence)


def test_aggregated_slurm_output_lines_go_to_their_node(tmp_path: Path, site_pool: EventPool) -> None:
    trace = make(tmp_path, "agg", 71_002, "gpu_lost", aggregated=True)
    truth = (trace.truth() or {})["log_failures"][0]
    assert any(p.name.startswith("slurm-") for p in trace.log_files())
    a = analyze_logs(trace, site_pool)
    assert a.nodes[0].host == truth["host"] and a.kind == "gpu"
    slurm = [i for i in range(len(a.logs)) if a.logs.where(i).startswith("logs/slurm-")]
    # every line of the aggregated file went to the node its rank label names
    for i in slurm[:200]:
        rank = int(a.logs.text(i).split(":", 1)[0])
        assert a.logs.hosts[int(a.logs.host[i])] == trace.meta.ranks[rank].host
    assert set(a.failure_lines()) == set(truth["lines"])


@pytest.mark.parametrize("failure", ["host_oom", "pcie_aer", "node_lost", "cuda_oom"])
def test_failure_lines_are_the_ones_the_fault_caused(tmp_path: Path, site_pool: EventPool, failure: str) -> None:
    trace = make(tmp_path, failure, 71_010, failure, hosts=6)
    truth = (trace.truth() or {})["log_failures"][0]
    a = analyze_logs(trace, site_pool)
    pred, gold = set(a.failure_lines()), set(truth["lines"])
    tp = len(pred & gold)
    f1 = 2 * tp / (len(pred) + len(gold))
    assert f1 >= 0.95, sorted(pred ^ gold)[:5]
    if truth["host"]:
        assert a.node_found and a.nodes[0].host == truth["host"]
    else:
        assert not a.node_found or a.kind not in ("gpu", "nic", "host")


def test_healthy_site_job_is_healthy(tmp_path: Path, site_pool: EventPool) -> None:
    assert analyze_logs(make(tmp_path, "ok", 71_020, None, hosts=4), site_pool).kind is None
