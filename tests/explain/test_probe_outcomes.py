"""Issue #14: a failed probe confirms nothing, log text never confirms, no name reaches a command unchecked.

The cluster is the simulator's virtual cluster (real probe parsers, real argv); where the issue's
scenario needs a host that refuses ssh or a probe that "agrees" with a planted log line, a thin
wrapper changes only that host's or that probe's answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from collector.trace.traceio import Trace
from explain.actions.backends import SSHBackend
from explain.actions.inventory import Inventory, InventoryError
from explain.actions.probes import CATALOG, ProbeCall, interpret
from explain.actions.remediation import AuditLog
from explain.diagnose import diagnose
from localize.verdict import Candidate, Verdict
from simulator.virtual_cluster import VirtualCluster
from tests.explain.conftest import gpu_verdict, write_trace

OPENSSH_REFUSED = "ssh: connect to host node-1 port 22: Connection refused\r\n"


class Refusing(VirtualCluster):
    """The virtual cluster, except that ssh to `down` fails the way OpenSSH does (exit 255)."""

    def __init__(self, path: Path, down: str) -> None:
        super().__init__(path)
        self.down = down

    def run(self, host: str | None, argv: Sequence[str], timeout: float = 10.0) -> tuple[int, str]:
        if host == self.down:
            self.ran.append((host, list(argv)))
            return 255, OPENSSH_REFUSED
        return super().run(host, argv, timeout)


class AgreeingThermal(VirtualCluster):
    """The virtual cluster, except that every GPU reports thermal throttling (the planted line 'agrees')."""

    def run(self, host: str | None, argv: Sequence[str], timeout: float = 10.0) -> tuple[int, str]:
        if host is not None and argv[:1] == ["nvidia-smi"] and any(a.startswith("--query-gpu=index,clocks.sm") for a in argv):
            self.ran.append((host, list(argv)))
            gpu = argv[argv.index("-i") + 1]
            return 0, f"{gpu}, 990, 1980, 92, 585.00, 700.00, 0x0000000000000060\n"
        return super().run(host, argv, timeout)


def _events(audit: AuditLog) -> list[dict]:
    return [json.loads(x) for x in audit.path.read_text().splitlines()] if audit.path.exists() else []


def _call(name: str, **args: object) -> ProbeCall:
    return ProbeCall(name, "node-1", dict(args), [])


@pytest.mark.parametrize("rc, out, outcome", [
    (255, OPENSSH_REFUSED, "unreachable"),
    (255, "ssh: Could not resolve hostname node-1: Name or service not known\n", "unreachable"),
    (255, "Permission denied (publickey,password).\n", "unreachable"),
    (124, "", "error"),
    (127, "bash: nvidia-smi: command not found\n", "error"),
    (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", "error"),
    (0, "garbage that is not csv\n", "error"),
    (-1, "", "not-run"),
    (15, "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost\n", "abnormal"),
    (0, "5, 1980, 1980, 50, 300.00, 700.00, 0x0000000000000000\n", "ok"),
    (0, "5, 990, 1980, 92, 585.00, 700.00, 0x0000000000000060\n", "abnormal"),
])
def test_outcomes_are_typed_and_only_answers_carry_findings(rc: int, out: str, outcome: str) -> None:
    r = interpret(_call("gpu_clocks", gpu=5), rc, out, "P1")
    assert r.outcome == outcome
    assert bool(r.findings) == (outcome == "abnormal")
    assert r.healthy == (outcome == "ok")


def test_every_probe_reads_connection_refused_as_unreachable() -> None:
    for name, spec in CATALOG.items():
        args = {p: (0 if p == "gpu" else "ens1np0") for p in spec.params}
        r = interpret(ProbeCall(name, "node-1", args, []), 255, OPENSSH_REFUSED, "P1")
        assert (r.outcome, r.findings) == ("unreachable", []), name


def test_failed_ssh_on_an_irregular_job_confirms_nothing_and_runs_nothing(tmp_path: Path) -> None:
    """The issue's first finding: 'GPU 5 did not answer' from ssh's exit 255 led to a requeue."""
    path = write_trace(tmp_path / "t", [{"kind": "gpu", "factor": 2.0, "rank": 13, "active_steps": [4, 5]}])
    vc = Refusing(path, down="node-1")
    audit = AuditLog(path / "audit.jsonl")
    d = diagnose(Trace.open(path), gpu_verdict(), approve=True, backend=vc, audit=audit)
    assert d.probes and all(p["outcome"] == "unreachable" for p in d.probes if p["host"] == "node-1")
    assert not d.confirmed and d.confidence < 0.5
    assert "gpu.missing" not in {f for p in d.probes for f in p["findings"]}
    assert any("node-1 could not be probed" in f for f in d.flags)
    assert all(r["status"] == "advice" for r in d.remediation)  # no command offered
    assert [argv for host, argv in vc.ran if host is None] == []
    events = [e["event"] for e in _events(audit)]
    assert "remediation.executed" not in events and "remediation.approved" not in events
    # one attempt at the unreachable host, not one per planned probe
    assert sum(h == "node-1" for h, _ in vc.ran) == 1


def test_the_same_job_with_the_host_reachable_is_confirmed_and_remediated(tmp_path: Path) -> None:
    """The control for the test above: the gate is the probe outcome, not a blanket refusal."""
    path = write_trace(tmp_path / "t", [{"kind": "gpu", "factor": 2.0, "rank": 13, "active_steps": [4, 5]}])
    vc = VirtualCluster(path)
    d = diagnose(Trace.open(path), gpu_verdict(), approve=True, backend=vc, audit=AuditLog(path / "audit.jsonl"))
    assert d.confirmed and any(r["status"] == "executed" for r in d.remediation)


PLANTED = "step 10 ok\n[node-3] GPU 5: thermal slowdown, clocks throttled (HW thermal)\nstep 11 ok\n"
NIC_VERDICT = Verdict("t1", "irregular", [4], 1.5, [Candidate("nic", 0.8, host="node-3", evidence=["all ranks of node-3 wait"])])


@pytest.mark.parametrize("nic_fault", [False, True])
def test_a_planted_log_line_proposes_but_never_confirms(tmp_path: Path, nic_fault: bool) -> None:
    """The issue's third finding: 'thermal slowdown on GPU 5' in a log drained a node on a NIC-fault job,
    with a probe that agreed. Here every GPU probe agrees; the thermal cause may be reported, never acted on."""
    faults = [{"kind": "nic", "factor": 3, "host": "node-3", "active_steps": [4]}] if nic_fault else []
    path = write_trace(tmp_path / "t", faults, logs={"node-3": PLANTED})
    vc = AgreeingThermal(path)
    audit = AuditLog(path / "audit.jsonl")
    d = diagnose(Trace.open(path), NIC_VERDICT, approve=True, backend=vc, audit=audit)
    assert any(e["source"] == "log" for e in d.evidence)
    drains = [argv for host, argv in vc.ran if host is None]
    reasons = [a for argv in drains for a in argv if a.startswith("Reason=")]
    assert not [r for r in reasons if "thermal" in r or "gpu" in r], reasons
    if nic_fault:  # the localizer's NIC story, confirmed by a NIC probe, is what is acted on
        assert d.category == "nic" and d.confirmed and reasons and all("nic" in r for r in reasons)
    else:  # nothing but the planted story: no command runs, and the diagnosis says why
        assert drains == []
        assert not [e for e in _events(audit) if e["event"] == "remediation.executed"]
        if d.category == "gpu":
            assert any("log or alert text" in f for f in d.flags)


@pytest.mark.parametrize("host", ["node[0-999]", "root@evil.example", "--all", "node-1\nnode-2", "node-1\n", "-oProxyCommand=x",
                                  "node 1", "a" * 64])
def test_a_bad_host_name_is_refused_before_anything_runs(tmp_path: Path, host: str) -> None:
    path = write_trace(tmp_path / "t", [])
    meta = json.loads((path / "meta.json").read_text())
    meta["ranks"]["13"]["host"] = host
    (path / "meta.json").write_text(json.dumps(meta))
    from collector.trace.meta import JobMeta

    with pytest.raises(InventoryError, match="rank 13"):
        Inventory.from_meta(JobMeta.load(path / "meta.json"))
    with pytest.raises(ValueError, match="refusing"):
        SSHBackend().command(host, ["dmesg"])


def test_a_nic_named_like_an_option_is_refused(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t", [])
    meta = json.loads((path / "meta.json").read_text())
    meta["topology"]["node-1"]["nics"] = ["-s"]
    (path / "meta.json").write_text(json.dumps(meta))
    from collector.trace.meta import JobMeta

    with pytest.raises(InventoryError, match="NIC '-s'"):
        Inventory.from_meta(JobMeta.load(path / "meta.json"))


def test_cli_explain_refuses_a_dash_host_with_exit_2_and_one_line(tmp_path: Path) -> None:
    """The issue: dash-prefixed hosts crashed explain (exit 3). Now: exit 2, one line, nothing ran."""
    path = write_trace(tmp_path / "t", [])
    meta = json.loads((path / "meta.json").read_text())
    meta["ranks"]["13"]["host"] = "-oProxyCommand=touch /tmp/x"
    (path / "meta.json").write_text(json.dumps(meta))
    verdict = tmp_path / "v.json"
    verdict.write_text(json.dumps(gpu_verdict().to_dict()))
    audit = tmp_path / "audit.jsonl"
    proc = subprocess.run([sys.executable, "-m", "laggard.cli", "explain", str(path), "--verdict", str(verdict),
                           "--probes", "ssh", "--approve", "--no-llm", "--audit", str(audit)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "RFC 1123" in proc.stderr
    assert not audit.exists() or "remediation" not in audit.read_text()


def test_remediation_matrix_runs_nothing_unconfirmed_or_unchecked() -> None:
    """bench.reliability's matrix: 6 fault kinds x 5 transports (healthy, ssh refused, timeouts,
    garbage, tool missing) x planted log line or not, all with --approve."""
    from bench._remediation import run_matrix, whitelisted

    assert whitelisted(["ethtool", "ens1np0"]) and not whitelisted(["ethtool", "-S", "ens1np0", "-s"])  # the matcher
    assert not whitelisted(["scontrol", "update", "NodeName=x", "State=RESUME", "Reason=laggard:x"])
    m = run_matrix()
    assert m["diagnoses"] == 60 and m["probe_commands"] > 100
    assert (m["not_whitelisted"], m["unchecked_names"], m["executed_unconfirmed"]) == (0, 0, 0)
    assert m["executed_confirmed"] > 0 and m["withheld"] > 0  # the gate opens for confirmed causes only


SHAPES = ["[1]", "[null]", "{}", '[{"ifname": "ens1", "stats64": {"tx": {"carrier_changes": "many"}}}]',
          '[{"ifname": "ens1", "flags": ["UP"], "operstate": "UP", "mtu": "big"}]', '[{"stats64": []}]',
          '[{"ifname": "ens1", "stats64": {"rx": {"errors": 1e400}}}]', "0, x, y, z, w, v, u\n",
          "0, 1e400, inf, nan, -1, 0, 0xzz\n", "9" * 5000, "a b c d 99999999999999999999999% /x\n"]


@pytest.mark.parametrize("out", SHAPES)
def test_output_of_another_shape_is_a_failed_probe_not_a_crash(out: str) -> None:
    for name, spec in CATALOG.items():
        args = {p: (5 if p == "gpu" else "ens1np0") for p in spec.params}
        r = interpret(ProbeCall(name, "node-1", args, []), 0, out, "P1")
        assert r.outcome in ("ok", "abnormal", "error"), name
    r = interpret(_call("nic_link", iface="ens1np0"), 0, SHAPES[3], "P1")
    assert (r.outcome, r.findings) == ("error", [])
    assert r.summary.startswith("output not understood")
