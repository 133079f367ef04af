from __future__ import annotations

import json
from pathlib import Path

from collector.trace.meta import JobMeta
from explain.actions.inventory import Inventory
from explain.actions.remediation import (
    AuditLog,
    Proposal,
    apply,
    build_proposal,
    default_audit_path,
)
from tests.explain.conftest import write_trace


class Recorder:
    name = "recorder"

    def __init__(self, rc: int = 0) -> None:
        self.rc = rc
        self.ran: list[tuple[str | None, list[str]]] = []

    def run(self, host, argv, timeout):
        self.ran.append((host, list(argv)))
        return self.rc, ""


def _inv(tmp_path: Path) -> Inventory:
    return Inventory.from_meta(JobMeta.load(write_trace(tmp_path / "t", []) / "meta.json"))


def test_proposals_are_filled_from_the_inventory_only(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    p = build_proposal("gpu_reset", "why", {"host": "node-1", "gpu": 5}, inv, "gpu-ecc-uncorrectable")
    assert p is not None and p.argvs == [["nvidia-smi", "--gpu-reset", "-i", "5"]] and p.on_host
    assert build_proposal("gpu_reset", "why", {"host": "node-1", "gpu": 12}, inv, "x") is None
    assert build_proposal("drain_slurm", "why", {"host": "node-1;reboot"}, inv, "x") is None
    d = build_proposal("drain_slurm", "why", {"host": "node-3"}, inv, "nic-link-flap")
    assert d is not None and d.argvs[0][2:] == ["NodeName=node-3", "State=DRAIN", "Reason=laggard:nic-link-flap"]
    assert build_proposal("notify_owner", "tell them", {}, inv, "x").status == "advice"  # type: ignore[union-attr]


def test_nothing_runs_without_an_approver(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    props = [build_proposal("cordon_k8s", "w", {"host": "node-0"}, inv, "x")]
    rec, audit = Recorder(), AuditLog(tmp_path / "a.jsonl")
    apply([p for p in props if p], rec, audit, None, "t1")
    assert rec.ran == [] and props[0].status == "proposed"  # type: ignore[union-attr]
    assert json.loads(audit.path.read_text())["event"] == "remediation.proposed"


def test_failed_step_stops_the_action(tmp_path: Path) -> None:
    inv = _inv(tmp_path)
    p = build_proposal("restart_excluding", "w", {"host": "node-0"}, inv, "x")
    assert isinstance(p, Proposal)
    rec = Recorder(rc=1)
    apply([p], rec, AuditLog(tmp_path / "a.jsonl"), lambda _p: True, "t1")
    assert p.status == "failed" and len(rec.ran) == 1 and rec.ran[0][0] is None


def test_audit_path_defaults(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LAGGARD_AUDIT_LOG", str(tmp_path / "x.jsonl"))
    assert default_audit_path() == tmp_path / "x.jsonl"
    monkeypatch.delenv("LAGGARD_AUDIT_LOG")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_audit_path() == tmp_path / "laggard" / "audit.jsonl"
