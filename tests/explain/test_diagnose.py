from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.trace.traceio import Trace
from explain.actions.backends import LocalBackend
from explain.actions.probes import CATALOG
from explain.actions.remediation import ACTIONS, AuditLog, Proposal
from explain.diagnose import diagnose
from localize.verdict import Candidate, Verdict
from simulator.virtual_cluster import VirtualCluster
from tests.explain.conftest import gpu_verdict

GPU_FAULT = {"kind": "gpu", "factor": 2.0, "rank": 13, "active_steps": [4, 5], "root": {"kind": "gpu", "rank": 13}}


def _diag(path: Path, verdict: Verdict, **kw):
    audit = AuditLog(path / "audit.jsonl")
    backend = kw.pop("backend", None) or VirtualCluster(path)
    return diagnose(Trace.open(path), verdict, backend=backend, audit=audit, **kw), backend, audit


def _events(audit: AuditLog) -> list[dict]:
    return [json.loads(x) for x in audit.path.read_text().splitlines()] if audit.path.exists() else []


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_gpu_fault_is_confirmed_by_one_probe(trace_factory, seed: int) -> None:
    path = trace_factory([GPU_FAULT], seed=seed)
    d, vc, _ = _diag(path, gpu_verdict())
    assert d.category == "gpu" and d.confirmed
    assert d.cause["entry"] == {"thermal": "gpu-thermal-throttle", "power_cap": "gpu-power-cap",
                                "clocks_locked": "gpu-clocks-locked"}[vc.faults[0]["mechanism"]]
    assert len(d.probes) == 1 and d.probes[0]["args"] == {"gpu": 5}


def test_pcie_fault_needs_a_second_probe(trace_factory) -> None:
    path = trace_factory([{"kind": "pcie", "factor": 4, "rank": 21, "active_steps": [4]}])
    d, _, _ = _diag(path, gpu_verdict(21))
    assert d.cause["entry"] == "pcie-width-downgrade" and d.category == "pcie"
    assert [p["probe"] for p in d.probes] == ["gpu_clocks", "gpu_pcie"]
    assert d.probes[0]["findings"] == []


@pytest.mark.parametrize("fault, cand, category", [
    ({"kind": "host", "factor": 2, "host": "node-2", "active_steps": [4]}, Candidate("host", 0.8, host="node-2"), "host"),
    ({"kind": "nic", "factor": 3, "host": "node-3", "active_steps": [4]}, Candidate("nic", 0.8, host="node-3"), "nic"),
    ({"kind": "link", "factor": 3, "hosts": ["node-0", "node-1"], "active_steps": [4]},
     Candidate("link", 0.7, hosts=["node-0", "node-1"]), "link"),
    ({"kind": "switch", "factor": 3, "switch": "tor-1", "active_steps": [4]}, Candidate("switch", 0.7, switch="tor-1"), "switch"),
    ({"kind": "stage", "factor": 1.6, "stage": 3, "active_steps": [4]}, Candidate("config", 0.7), "config"),
    ({"kind": "seqlen", "factor": 2, "active_steps": [4]}, Candidate("data", 0.7), "data"),
])
def test_each_fault_kind(trace_factory, fault, cand, category) -> None:
    path = trace_factory([fault], seed=11)
    d, _, _ = _diag(path, Verdict("t1", "irregular", [4], 1.5, [cand]))
    assert d.category == category
    assert len(d.probes) <= 2


def test_healthy_job_has_no_cause_and_runs_nothing(trace_factory) -> None:
    path = trace_factory([])
    d, vc, _ = _diag(path, Verdict("t1", "healthy"))
    assert d.cause is None and d.probes == [] and d.remediation == [] and vc.ran == []


def test_dry_run_confirms_nothing_and_executes_nothing(trace_factory) -> None:
    path = trace_factory([GPU_FAULT])
    dry = LocalBackend(dry_run=True)
    d, _, audit = _diag(path, gpu_verdict(), backend=dry, approve=True)
    assert not d.confirmed and d.confidence < 0.5
    assert all(p["summary"] == "not run (dry run)" for p in d.probes)
    assert all(r["status"] in ("proposed", "advice") for r in d.remediation)
    assert not any(e["event"] == "remediation.executed" for e in _events(audit))
    assert any("not confirmed" in f for f in d.flags)


def test_remediation_waits_for_approval(trace_factory) -> None:
    path = trace_factory([GPU_FAULT])
    d, vc, audit = _diag(path, gpu_verdict())
    assert d.remediation and all(r["status"] in ("proposed", "advice") for r in d.remediation)
    control = [argv for host, argv in vc.ran if host is None]
    assert control == []  # nothing but probes ran
    assert [e["event"] for e in _events(audit)].count("remediation.proposed") == len(d.remediation)


def test_approved_remediation_runs_is_audited_and_verified(trace_factory) -> None:
    path = trace_factory([GPU_FAULT], seed=3)
    d, vc, audit = _diag(path, gpu_verdict(), approve=True)
    events = [e["event"] for e in _events(audit)]
    assert "remediation.approved" in events and "remediation.executed" in events
    assert any(r["status"] == "executed" for r in d.remediation)
    assert d.dot["nodes"][-1]["type"] == "verification"  # the re-check after remediation
    for _host, argv in vc.ran:
        name = argv[0]
        assert name in {s.argv[0] for s in CATALOG.values()} | {t[0] for a in ACTIONS.values() for t in a.argvs}


def test_interactive_denial_is_audited(trace_factory) -> None:
    path = trace_factory([GPU_FAULT])
    asked: list[str] = []

    def approver(p: Proposal) -> bool:
        asked.append(p.action)
        return False

    d, vc, audit = _diag(path, gpu_verdict(), approver=approver)
    assert asked and all(r["status"] in ("denied", "advice") for r in d.remediation)
    assert "remediation.denied" in [e["event"] for e in _events(audit)]
    assert not [a for h, a in vc.ran if h is None]


def test_log_lines_become_cited_evidence(trace_factory) -> None:
    path = trace_factory([GPU_FAULT], logs={"node-1": "ok\n[x] NVRM: Xid (PCI:0000:3b:00): 48, DBE ECC error\nok\n"})
    d, _, _ = _diag(path, gpu_verdict())
    logs = [e for e in d.evidence if e["source"] == "log"]
    assert logs and logs[0]["id"] == "L1" and "gpu-ecc-uncorrectable" in logs[0]["entries"]
    assert "xid:48" in d.keys["error_codes"]
    assert any(h["entry"] == "gpu-ecc-uncorrectable" for h in d.hypotheses)


def test_diagnosis_to_dict_is_json(trace_factory) -> None:
    path = trace_factory([GPU_FAULT])
    d, _, _ = _diag(path, gpu_verdict(), alert="rank 13 on node-1 slow, ssh -p 2222")
    out = json.loads(json.dumps(d.to_dict()))
    assert out["keys"]["ports"] == [2222] and out["dot_xml"].startswith("<dot")
    assert {n["type"] for n in out["dot"]["nodes"]} >= {"proposition", "critique", "verification", "refinement"}


@pytest.mark.parametrize("n_cands", [1, 4])
def test_a_slow_host_blamed_on_its_gpus_is_corrected_by_probes(trace_factory, n_cands: int) -> None:
    path = trace_factory([{"kind": "host", "factor": 2, "host": "node-2", "active_steps": [4]}], seed=5)
    cands = [Candidate("gpu", 0.9 - 0.01 * i, rank=16 + i, host="node-2", gpu=i) for i in range(n_cands)]
    d, _, _ = _diag(path, Verdict("t1", "irregular", [4], 1.5, cands))
    assert d.category == "host" and d.confirmed
    assert any(p["probe"] == "cpu_top" for p in d.probes)


def test_slow_since_the_start_with_clean_hardware_is_configuration(trace_factory) -> None:
    path = trace_factory([{"kind": "stage", "factor": 1.6, "stage": 1, "active_steps": [0, 1, 2]}])
    v = Verdict("t1", "irregular", [], 1.3, [Candidate("host", 1.0, host="node-1", evidence=["more compute in every step"])],
                extra={"persistent": True})
    d, _, _ = _diag(path, v)
    assert d.cause["entry"] == "config-pipeline-stage-imbalance" and not d.confirmed
    assert d.probes and all(p["findings"] == [] for p in d.probes)
    # the same verdict with a real host fault behind it stays a host diagnosis
    path2 = trace_factory([{"kind": "host", "factor": 2, "host": "node-1", "active_steps": [0, 1, 2]}], seed=7)
    d2, _, _ = _diag(path2, v)
    assert d2.category == "host" and d2.confirmed


def test_hang_verdict_proposes_hang_causes_and_reads_logs(trace_factory) -> None:
    log = "[rank 13] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=881, OpType=ALLREDUCE) ran for 600000 ms\n"
    path = trace_factory([], logs={"node-1": log})
    v = Verdict("t1", "hang", [], 1.0, [Candidate("gpu", 0.9, rank=13, host="node-1", gpu=5, evidence=["rank 13 never entered all_reduce seq 881"])])
    d, _, _ = _diag(path, v)
    assert d.hypotheses[0]["entry"] == "hang-nccl-timeout"
    assert {h["entry"] for h in d.hypotheses} & {"gpu-fallen-off-bus", "hang-rank-crash", "host-oom-kill"}
    assert any(e["source"] == "log" and "hang-nccl-timeout" in e["entries"] for e in d.evidence)
