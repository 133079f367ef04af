"""`laggard capture`: pcap, flow records and live capture into a flows trace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from collector.trace.traceio import Trace
from tests.conftest import run_cli
from tests.flows_sims import sim_flows


def test_read_pcap_with_meta(tmp_path: Path) -> None:
    src = sim_flows("small-a", pcap=True)
    out = tmp_path / "t"
    proc = run_cli("capture", "--read", src / "capture.pcap", "--meta", src / "meta.json", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "bursts between" in proc.stdout and proc.stderr == ""
    t = Trace.open(out)
    assert t.meta.job == "job-a" and t.has("flows") and len(t.flows()) > 10
    assert run_cli("validate", out).returncode == 0


def test_read_damaged_pcap_warns_and_keeps_the_rest(tmp_path: Path) -> None:
    src = sim_flows("small-a", pcap=True) / "capture.pcap"
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(src.read_bytes()[:-100])
    proc = run_cli("capture", "--read", cut, "--out", tmp_path / "t")
    assert proc.returncode == 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "warning" in lines[0] and "truncated" in lines[0]
    assert len(Trace.open(tmp_path / "t").flows()) > 0


def test_read_flow_records(tmp_path: Path) -> None:
    csv = tmp_path / "exporter.csv"
    pd.DataFrame({"flowStartMilliseconds": [1760000000000, 1760000000100], "flowEndMilliseconds": [1760000000050, 1760000000150],
                  "sourceIPv4Address": ["10.0.0.10", "10.0.1.10"], "destinationIPv4Address": ["10.0.1.10", "10.0.0.10"],
                  "destinationTransportPort": [4791, 4791], "protocolIdentifier": [17, 17],
                  "octetDeltaCount": [10**8, 10**8], "packetDeltaCount": [25000, 25000]}).to_csv(csv, index=False)
    proc = run_cli("capture", "--read", csv, "--out", tmp_path / "t")
    assert proc.returncode == 0, proc.stderr
    f = Trace.open(tmp_path / "t").flows()
    assert list(f["proto"]) == ["roce", "roce"]


@pytest.mark.parametrize("args,what", [
    (["--read", "/nonexistent/x.pcap"], "no such capture file"),
    (["--read", "/nonexistent/x.csv"], "no such flow-record file"),
    (["--iface", "lgf-no-such-if0", "--duration", "1"], "capture on 'lgf-no-such-if0' failed"),
])
def test_user_errors_are_one_line(tmp_path: Path, args: list[str], what: str) -> None:
    if args[0] == "--iface" and shutil.which("tshark") is None:
        pytest.skip("tshark not installed")
    proc = run_cli("capture", *args, "--out", tmp_path / "t")
    assert proc.returncode == 2
    assert what in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("meta, what", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"job": 1' + b"0" * 5000 + b"}", "not valid JSON"),
    (bytes(range(128, 256)), "not valid JSON"),
    (None, "not a regular file"),
])
def test_a_bad_meta_for_capture_is_one_line(tmp_path: Path, meta: bytes | None, what: str) -> None:
    csv = tmp_path / "flows.csv"
    csv.write_text("start,src_ip,dst_ip,bytes\n1,10.0.0.1,10.0.0.2,100\n2,10.0.0.2,10.0.0.1,100\n")
    path = tmp_path / "meta.json"
    if meta is None:
        os.mkfifo(path)
    else:
        path.write_bytes(meta)
    proc = run_cli("capture", "--read", csv, "--meta", path, "--out", tmp_path / "t", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert what in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tshark") is None, reason="needs root and tshark")
def test_live_capture_in_a_namespace(tmp_path: Path) -> None:
    """tshark on the loopback of a private namespace while RoCEv2-port UDP traffic runs there."""
    ns = "lgft-live"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        sender = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c",
                                   "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                                   "end=time.time()+40\nwhile time.time()<end:\n"
                                   " s.sendto(bytes(12)+b'x'*1000,('127.0.0.1',4791)); time.sleep(0.001)\n"])
        try:
            time.sleep(0.5)
            proc = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "laggard", "capture", "--iface", "lo",
                                   "--duration", "4", "--out", str(tmp_path / "t")],
                                  capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[3])
        finally:
            sender.kill()
        assert proc.returncode == 0, proc.stderr
        f = Trace.open(tmp_path / "t").flows()
        assert len(f) and set(f["proto"]) == {"roce"} and f["packets"].sum() > 100
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
