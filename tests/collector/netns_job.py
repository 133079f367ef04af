"""A lab of network namespaces for real-capture tests: 4 hosts on one bridge, a gloo DDP job, tcpdump.

Every rank runs in its own namespace with its own address from 198.18.77.0/24 (the RFC 2544
benchmarking range, used only inside these namespaces); veth pairs join them to a bridge that
lives in a namespace of its own, so no packet touches the machine's real interfaces. tcpdump
captures on that bridge with snap length 128.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

JOB = Path(__file__).with_name("ddp_job.py")
SUBNET = "198.18.77"
TOOLS = {"ip": "iproute2", "tc": "iproute2", "tcpdump": "tcpdump"}


def missing_tools() -> list[str]:
    return sorted({pkg for cmd, pkg in TOOLS.items() if shutil.which(cmd) is None})


def ensure_tools() -> None:
    """Install tcpdump/iproute2 with apt when missing (root, Debian); skip where apt cannot (a
    machine with no package registry: `make setup-full` installs them where it can)."""
    pkgs = missing_tools()
    if not pkgs:
        return
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *pkgs]):
        if subprocess.run(cmd, capture_output=True, env=env).returncode != 0:
            pytest.skip(f"needs {', '.join(pkgs)}, which `{' '.join(cmd[:2])}` could not install here")


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


class NetnsLab:
    """n rank namespaces plus a bridge namespace; `down()` removes everything it made.

    `racks` (lists of hosts): one bridge per rack, a top-of-rack switch, each joined to a spine
    bridge by its own uplink (a veth pair), instead of one bridge for all."""

    def __init__(self, n: int = 4, tag: str = "lgf", racks: list[list[int]] | None = None) -> None:
        self.n, self.tag = n, tag
        self.br_ns = f"{tag}-br"
        self.rank_ns = [f"{tag}-r{i}" for i in range(n)]
        self.racks = racks or [list(range(n))]

    def switch(self, rank: int) -> str:
        return next(f"tor-{k}" for k, hosts in enumerate(self.racks) if rank in hosts)

    def ip(self, rank: int) -> str:
        return f"{SUBNET}.{10 + rank}"

    def host(self, rank: int) -> str:
        return f"host-{rank}"

    def up(self) -> None:
        self.down()
        _sh("ip", "netns", "add", self.br_ns)
        for bridge in ["br0", *(f"tor{k}" for k in range(len(self.racks)) if len(self.racks) > 1)]:
            _sh("ip", "-n", self.br_ns, "link", "add", bridge, "type", "bridge")
            _sh("ip", "-n", self.br_ns, "link", "set", bridge, "up")
        if len(self.racks) > 1:  # br0 is the spine; each rack's uplink a veth pair tor side -> spine side
            for k in range(len(self.racks)):
                _sh("ip", "-n", self.br_ns, "link", "add", f"up{k}", "type", "veth", "peer", "name", f"dn{k}")
                _sh("ip", "-n", self.br_ns, "link", "set", f"up{k}", "master", f"tor{k}")
                _sh("ip", "-n", self.br_ns, "link", "set", f"dn{k}", "master", "br0")
                for end in (f"up{k}", f"dn{k}"):
                    _sh("ip", "-n", self.br_ns, "link", "set", end, "up")
        for i, ns in enumerate(self.rank_ns):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", f"{self.tag}v{i}", "netns", ns, "type", "veth", "peer", "name", f"{self.tag}p{i}", "netns", self.br_ns)
            _sh("ip", "-n", ns, "link", "set", f"{self.tag}v{i}", "name", "eth0")
            _sh("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            rack = "br0" if len(self.racks) == 1 else self.switch(i).replace("tor-", "tor")
            _sh("ip", "-n", self.br_ns, "link", "set", f"{self.tag}p{i}", "master", rack)
            _sh("ip", "-n", self.br_ns, "link", "set", f"{self.tag}p{i}", "up")

    def down(self) -> None:
        for ns in [*self.rank_ns, self.br_ns]:
            _sh("ip", "netns", "del", ns, check=False)

    def meta(self, job: str) -> dict:
        """meta.json of the job: each namespace is a host with one NIC, one switch for all."""
        return {"job": job, "world_size": self.n,
                "ranks": {str(i): {"host": self.host(i), "gpu": 0, "ip": self.ip(i)} for i in range(self.n)},
                "topology": self.topology()}

    def topology(self) -> dict[str, dict[str, str]]:
        """meta.json's topology: each host's switch (its rack's bridge, or the one bridge)."""
        return {self.host(i): {"switch": "bridge-0" if len(self.racks) == 1 else self.switch(i)} for i in range(self.n)}

    def argv(self, rank: int, cmd: list[str]) -> list[str]:
        """`cmd` run inside rank's namespace with its own hostname (a UTS namespace), as in a pod."""
        return ["ip", "netns", "exec", self.rank_ns[rank], "unshare", "--uts", "sh", "-c",
                f'hostname {self.host(rank)} && exec "$@"', "sh", *cmd]

    def throttle(self, rank: int, rate: str = "80mbit") -> None:
        """Token-bucket rate limit on a rank's egress (netem is not available on every kernel)."""
        _sh("ip", "netns", "exec", self.rank_ns[rank], "tc", "qdisc", "add", "dev", "eth0", "root",
            "tbf", "rate", rate, "burst", "64kb", "latency", "500ms")

    def unthrottle(self, rank: int) -> None:
        _sh("ip", "netns", "exec", self.rank_ns[rank], "tc", "qdisc", "del", "dev", "eth0", "root", check=False)

    def throttle_path(self, a: int, b: int, rate: str = "80mbit") -> None:
        """Rate limit on the traffic between two hosts only, both ways (an htb class for the peer's
        address, chosen by a u32 filter; the rest unlimited): one degraded link."""
        for src, dst in ((a, b), (b, a)):
            tc = ["ip", "netns", "exec", self.rank_ns[src], "tc"]
            _sh(*tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "2")
            _sh(*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate", rate)
            _sh(*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:2", "htb", "rate", "100gbit")
            _sh(*tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                "match", "ip", "dst", f"{self.ip(dst)}/32", "flowid", "1:1")

    def throttle_uplink(self, rack: int, rate: str = "80mbit") -> None:
        """Token-bucket rate limit on a rack's uplink, both ways: a degraded top-of-rack switch port."""
        for end in (f"up{rack}", f"dn{rack}"):
            _sh("ip", "netns", "exec", self.br_ns, "tc", "qdisc", "add", "dev", end, "root",
                "tbf", "rate", rate, "burst", "64kb", "latency", "500ms")

    def run(self, out: Path, steps: int = 30, slow_rank: int = -1, slow_from: int = 10**9, slow_s: float = 0.0,
            at_step: list[tuple[int, Callable[[], None]]] | None = None, timeout: float = 150.0) -> list[list[dict]]:
        """Run the DDP job under tcpdump on the bridge; returns each rank's step log.

        `at_step` actions run once rank 0 has logged that step (e.g. throttle a link).
        """
        out.mkdir(parents=True, exist_ok=True)
        pcap = out / "capture.pcap"
        dump = subprocess.Popen(["ip", "netns", "exec", self.br_ns, "tcpdump", "-i", "br0", "-s", "128", "-U",
                                 "-w", str(pcap)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs = []
        try:
            time.sleep(1.0)  # tcpdump attaches
            for i, ns in enumerate(self.rank_ns):
                cmd = ["ip", "netns", "exec", ns, sys.executable, str(JOB), "--rank", str(i), "--world", str(self.n),
                       "--master", self.ip(0), "--steps", str(steps), "--log", str(out / f"rank{i}.jsonl"),
                       "--slow-rank", str(slow_rank), "--slow-from", str(slow_from), "--slow-s", str(slow_s)]
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            deadline = time.time() + timeout
            pending = sorted(at_step or [], key=lambda a: a[0])
            while any(p.poll() is None for p in procs):
                if time.time() > deadline:
                    raise TimeoutError("the DDP job did not finish in time")
                while pending and _last_step(out / "rank0.jsonl") >= pending[0][0]:
                    pending.pop(0)[1]()
                time.sleep(0.02)
            bad = [(i, p.returncode, (p.stderr.read() if p.stderr else "")[-400:]) for i, p in enumerate(procs) if p.returncode]
            if bad:
                raise RuntimeError(f"ranks failed: {bad}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            time.sleep(0.3)
            dump.send_signal(signal.SIGINT)
            try:
                dump.wait(timeout=10)
            except subprocess.TimeoutExpired:
                dump.kill()
        return [[json.loads(x) for x in (out / f"rank{i}.jsonl").read_text().splitlines()] for i in range(self.n)]


def _last_step(log: Path) -> int:
    try:
        lines = log.read_text().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else -1
    except (OSError, ValueError, KeyError):
        return -1


def iteration_errors(ends_ns: np.ndarray, logs: list[list[dict]]) -> np.ndarray:
    """Relative error of each reconstructed iteration against the ranks' own step times.

    Each rank logs when its gradient all-reduce finished; the reference step end is the median
    over ranks. Reconstructed iteration ends are matched to the nearest reference end, and
    durations are compared between consecutive matches.
    """
    ref = np.median(np.array([[x["synced_ns"] for x in log] for log in logs], dtype=np.float64), axis=0)
    ends = np.asarray(ends_ns, dtype=np.float64)
    idx = np.abs(ref[None, :] - ends[:, None]).argmin(axis=1)
    ok = np.diff(idx) == 1
    got = np.diff(ends)[ok]
    want = np.diff(ref[idx])[ok]
    return np.abs(got - want) / want
