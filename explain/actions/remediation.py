"""Remediation: proposed from the knowledge base, executed only after a person approves, always audited.

Every action is a fixed argv template (no shell) filled from the inventory. Actions with no
command (`notify_*`) are advice for a person. The audit log is JSONL, appended one line per
event (probe run, proposal, approval, refusal, execution), so it can be tailed and grepped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from explain.actions.inventory import JOB_ID_RE, Inventory


@dataclass(frozen=True)
class ActionSpec:
    name: str
    summary: str
    argvs: tuple[tuple[str, ...], ...]  # templates; {host} {gpu} {job} {reason} are whole-token or key=value
    needs: tuple[str, ...]  # which of host/gpu/job the action needs
    on_host: bool  # run on the target host (True) or on the operator's machine (False)


ACTIONS: dict[str, ActionSpec] = {a.name: a for a in [
    ActionSpec("drain_slurm", "drain the node in Slurm so no new work lands on it",
               (("scontrol", "update", "NodeName={host}", "State=DRAIN", "Reason={reason}"),), ("host",), False),
    ActionSpec("cordon_k8s", "cordon the Kubernetes node", (("kubectl", "cordon", "{host}"),), ("host",), False),
    ActionSpec("drain_k8s", "drain the Kubernetes node",
               (("kubectl", "drain", "{host}", "--ignore-daemonsets", "--delete-emptydir-data"),), ("host",), False),
    ActionSpec("gpu_reset", "reset one GPU (the job must have released it)",
               (("nvidia-smi", "--gpu-reset", "-i", "{gpu}"),), ("host", "gpu"), True),
    ActionSpec("reset_gpu_clocks", "return one GPU's clocks to the default policy",
               (("nvidia-smi", "--reset-gpu-clocks", "-i", "{gpu}"),), ("host", "gpu"), True),
    ActionSpec("restart_excluding", "requeue the job from its last checkpoint without the node",
               (("scontrol", "update", "JobId={job}", "ExcNodeList={host}"), ("scontrol", "requeue", "{job}")),
               ("host", "job"), False),
    ActionSpec("notify_network", "hand the finding to the network team (no command)", (), (), False),
    ActionSpec("notify_owner", "tell the job owner what to change (no command)", (), (), False),
]}


@dataclass
class Proposal:
    action: str
    why: str
    target: dict[str, Any]
    argvs: list[list[str]]
    on_host: bool
    status: str = "proposed"  # proposed | approved | denied | executed | failed | advice
    results: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "why": self.why, "target": self.target, "argvs": self.argvs,
                "status": self.status, "results": self.results}


def build_proposal(action: str, why: str, target: dict[str, Any], inventory: Inventory, reason: str) -> Proposal | None:
    """Fill an action's templates from validated target values; None when the target lacks what it needs."""
    spec = ACTIONS[action]
    host, gpu = target.get("host"), target.get("gpu")
    if "host" in spec.needs and inventory.check_host(host):
        return None
    if "gpu" in spec.needs and inventory.check_gpu(str(host), gpu):
        return None
    if "job" in spec.needs and not JOB_ID_RE.match(inventory.job):
        return None
    values = {"host": host, "gpu": gpu, "job": inventory.job, "reason": "laggard:" + reason}
    argvs = [[_fill(tok, values) for tok in tmpl] for tmpl in spec.argvs]
    keep = {k: target[k] for k in spec.needs if k in target}
    return Proposal(action, why, keep, argvs, spec.on_host, "proposed" if argvs else "advice")


def _fill(tok: str, values: dict[str, Any]) -> str:
    for key, val in values.items():
        tok = tok.replace("{" + key + "}", str(val))
    return tok


class AuditLog:
    """Append-only JSONL record of everything laggard ran or proposed against a cluster."""

    ENV = "LAGGARD_AUDIT_LOG"

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_audit_path()

    def append(self, event: str, **fields: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rec = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": event, "user": os.environ.get("USER", ""), **fields}
        with self.path.open("a") as fh:
            fh.write(json.dumps(rec, default=str) + "\n")


def default_audit_path() -> Path:
    env = os.environ.get(AuditLog.ENV)
    if env:
        return Path(env)
    state = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    return state / "laggard" / "audit.jsonl"


Approver = Callable[[Proposal], bool]


def apply(proposals: Sequence[Proposal], backend: Any, audit: AuditLog, approver: Approver | None,
          job: str, timeout: float = 60.0) -> None:
    """Ask the approver about each proposal; run approved ones through the backend; audit everything.

    No approver means nothing runs: proposals stay proposed.
    """
    for prop in proposals:
        audit.append("remediation.proposed", job=job, **prop.to_dict())
        if prop.status == "advice" or approver is None:
            continue
        if not approver(prop):
            prop.status = "denied"
            audit.append("remediation.denied", job=job, action=prop.action, target=prop.target)
            continue
        prop.status = "approved"
        audit.append("remediation.approved", job=job, action=prop.action, target=prop.target)
        for argv in prop.argvs:
            rc, out = backend.run(prop.target.get("host") if prop.on_host else None, argv, timeout)
            prop.results.append({"argv": argv, "rc": rc, "output": out[-500:]})
            audit.append("remediation.executed", job=job, action=prop.action, argv=argv, rc=rc, backend=backend.name)
            if rc != 0:
                prop.status = "failed"
                break
        else:
            prop.status = "executed"
