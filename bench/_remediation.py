"""Remediation safety matrix for bench/reliability.py (issue #14): is anything ever run on a cause no
successful probe confirmed, or with a name that did not pass the one name check?

Every fault kind the simulator's virtual cluster emulates, each under five transports (healthy;
the blamed host refusing ssh as OpenSSH does; every probe timing out; every probe printing
garbage; the tool missing) and with or without a planted "thermal slowdown" log line, is
diagnosed with --approve. Counted: probe and remediation commands run, the ones naming an
unchecked host/GPU/NIC, and remediation executed without a confirming (abnormal) probe answer.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collector.inputs.names import gpu_problem, host_problem, nic_problem
from collector.trace.traceio import Trace
from explain.actions.probes import CATALOG
from explain.actions.remediation import ACTIONS, AuditLog
from explain.diagnose import diagnose
from localize.verdict import Candidate, Verdict
from simulator.virtual_cluster import VirtualCluster

PLANTED = "[node-1] GPU 5: thermal slowdown, clocks throttled (HW thermal)\n"
FAULTS: dict[str, tuple[dict[str, Any], Candidate]] = {
    "gpu": ({"kind": "gpu", "factor": 2.0, "rank": 13, "active_steps": [4]}, Candidate("gpu", 0.9, rank=13, host="node-1", gpu=5)),
    "pcie": ({"kind": "pcie", "factor": 3.0, "rank": 13, "active_steps": [4]}, Candidate("gpu", 0.9, rank=13, host="node-1", gpu=5)),
    "host": ({"kind": "host", "factor": 2, "host": "node-2", "active_steps": [4]}, Candidate("host", 0.9, host="node-2")),
    "nic": ({"kind": "nic", "factor": 3, "host": "node-3", "active_steps": [4]}, Candidate("nic", 0.8, host="node-3")),
    "link": ({"kind": "link", "factor": 3, "hosts": ["node-0", "node-2"], "active_steps": [4]},
             Candidate("link", 0.7, hosts=["node-0", "node-2"])),
    "switch": ({"kind": "switch", "factor": 2, "switch": "tor-1", "active_steps": [4]}, Candidate("switch", 0.7, switch="tor-1")),
}
TRANSPORTS = ("healthy", "blamed-host-refuses-ssh", "timeouts", "garbage", "tool-missing")


def write_trace(root: Path, fault: dict[str, Any], log: str | None) -> Path:
    root.mkdir(parents=True)
    ranks = {str(r): {"host": f"node-{r // 8}", "gpu": r % 8} for r in range(32)}
    topo = {f"node-{h}": {"switch": f"tor-{h // 2}", "nics": ["ens1np0", "ens2np0"]} for h in range(4)}
    (root / "meta.json").write_text(json.dumps({"job": "j1", "world_size": 32, "ranks": ranks, "topology": topo}))
    row = {"rank": 0, "group": "tp-0", "op": "all_reduce", "seq": 0, "peer": -1, "nbytes": 1, "start_ns": 1,
           "end_ns": 2, "step": 0}
    (root / "commops.jsonl").write_text(json.dumps(row) + "\n")
    (root / "truth.json").write_text(json.dumps({"job": "j1", "seed": 3, "faults": [fault], "irregular_steps": [4]}))
    if log:
        (root / "logs").mkdir()
        (root / "logs" / "node-1.log").write_text("step 3 ok\n" + log + "step 4 ok\n")
    return root


class Transport(VirtualCluster):
    """The virtual cluster behind a transport that may fail the way real ones do."""

    def __init__(self, path: Path, mode: str, blamed: str | None) -> None:
        super().__init__(path)
        self.mode = mode
        self.blamed = blamed

    def run(self, host: str | None, argv: Sequence[str], timeout: float = 10.0) -> tuple[int, str]:
        if host is not None:
            if self.mode == "blamed-host-refuses-ssh" and host == self.blamed:
                self.ran.append((host, list(argv)))
                return 255, f"ssh: connect to host {host} port 22: Connection refused\r\n"
            if self.mode == "timeouts":
                self.ran.append((host, list(argv)))
                return 124, ""
            if self.mode == "garbage":
                self.ran.append((host, list(argv)))
                return 0, "\x00\x1b[2J<html>502 Bad Gateway</html>\n"
            if self.mode == "tool-missing":
                self.ran.append((host, list(argv)))
                return 127, f"bash: {argv[0]}: command not found\n"
        return super().run(host, argv, timeout)


def _unchecked_names(host: str | None, argv: list[str]) -> list[str]:
    """Names in a command that fail the one name check (ssh target, NodeName=, -i GPU, NIC argument)."""
    bad = []
    if host is not None and host_problem(host):
        bad.append(host)
    for i, tok in enumerate(argv):
        if tok.startswith("NodeName=") and host_problem(tok.split("=", 1)[1]):
            bad.append(tok)
        if i and argv[i - 1] == "-i" and gpu_problem(int(tok) if tok.isdigit() else tok):
            bad.append(tok)
        if argv[0] == "ethtool" and i == len(argv) - 1 and nic_problem(tok):
            bad.append(tok)
    return bad


TEMPLATES = [s.argv for s in CATALOG.values()] + [t for a in ACTIONS.values() for t in a.argvs]


def whitelisted(argv: list[str]) -> bool:
    """The argv is one of the fixed templates with only its placeholders filled."""
    def fits(tmpl: tuple[str, ...]) -> bool:
        return len(tmpl) == len(argv) and all(
            a == t or ("{" in t and a.startswith(t.split("{", 1)[0])) for t, a in zip(tmpl, argv, strict=True))
    return any(fits(t) for t in TEMPLATES)


def run_matrix() -> dict[str, int]:
    out = {"diagnoses": 0, "probe_commands": 0, "remediation_commands": 0, "not_whitelisted": 0,
           "unchecked_names": 0, "executed_unconfirmed": 0, "executed_confirmed": 0, "withheld": 0}
    with tempfile.TemporaryDirectory(prefix="laggard-remed-") as tmp:
        n = 0
        for fault, cand in FAULTS.values():
            for mode in TRANSPORTS:
                for log in (None, PLANTED):
                    n += 1
                    path = write_trace(Path(tmp) / f"t{n}", fault, log)
                    blamed = cand.host or (cand.hosts[0] if cand.hosts else None)
                    backend = Transport(path, mode, blamed)
                    audit = AuditLog(path / "audit.jsonl")
                    v = Verdict("j1", "irregular", [4], 1.6, [cand])
                    d = diagnose(Trace.open(path), v, approve=True, backend=backend, audit=audit)
                    out["diagnoses"] += 1
                    for host, argv in backend.ran:
                        out["probe_commands" if host is not None else "remediation_commands"] += 1
                        out["not_whitelisted"] += not whitelisted(argv)
                        out["unchecked_names"] += bool(_unchecked_names(host, argv))
                    events = [json.loads(x) for x in audit.path.read_text().splitlines()]
                    executed = [e for e in events if e["event"] == "remediation.executed"]
                    answered = {p["id"] for p in d.probes if p["outcome"] == "abnormal"}
                    confirmed = d.confirmed and any(c for c in d.claims if set(c["evidence"]) & answered)
                    out["executed_confirmed" if confirmed else "executed_unconfirmed"] += len(executed)
                    out["withheld"] += sum(e["event"] == "remediation.withheld" for e in events)
    return out
