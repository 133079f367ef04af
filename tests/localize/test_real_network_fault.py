"""A real network fault, localized from the CommOps logger alone.

Four gloo ranks, each in its own network namespace and UTS namespace (its own host and NIC,
as pods would be), joined by a bridge: tensor-parallel-like pairs, pipeline-like pairs and a
DDP group all cross hosts (tests/collector/jobs/dist_train.py). Mid-run, host-1's NIC is
rate-limited (tc tbf on its egress) for ten steps. No capture: the sidecar's shards alone must
put host-1's NIC first, because host-1's groups slowed and the groups avoiding it did not. The
sender on a throttled egress finishes first (its data is queued in the kernel), so the only sign
on the pipeline pair is that data arrived late although it was sent on time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from tests.collector.netns_job import NetnsLab, ensure_tools
from tests.conftest import REPO, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]

LAB = NetnsLab(tag="lgnf")
JOB = REPO / "tests" / "collector" / "jobs" / "dist_train.py"
SLOW_HOST, FAULT_STEPS, STEPS = 1, (15, 25), 40


def _last_step(log: Path) -> int:
    lines = log.read_text().split() if log.exists() else []
    return int(lines[-1]) if lines else -1


def run_job(out: Path, timeout: float = 120.0) -> None:
    """torchrun's environment by hand, one rank per namespace; throttle during FAULT_STEPS."""
    log = out / "steps.log"
    procs = []
    for r in range(LAB.n):
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", RANK=str(r), LOCAL_RANK="0",
                   WORLD_SIZE=str(LAB.n), MASTER_ADDR=LAB.ip(0), MASTER_PORT="29531",
                   GLOO_SOCKET_IFNAME="eth0", LAGGARD_COMMOPS_DIR=str(out / "trace"),
                   LAGGARD_COMMOPS_FLUSH_S="0.5")
        cmd = [sys.executable, "-m", "collector.commops.run", str(JOB), "--steps", str(STEPS),
               "--compute-ms", "20", "--step-log", str(log)]
        procs.append(subprocess.Popen(LAB.argv(r, cmd), env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    actions = [(FAULT_STEPS[0] - 1, lambda: LAB.throttle(SLOW_HOST, "1mbit")),
               (FAULT_STEPS[1] - 1, lambda: LAB.unthrottle(SLOW_HOST))]
    deadline = time.time() + timeout
    try:
        while any(p.poll() is None for p in procs):
            assert time.time() < deadline, "the job did not finish in time"
            while actions and _last_step(log) >= actions[0][0]:
                actions.pop(0)[1]()
            time.sleep(0.01)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    bad = [(r, p.returncode, (p.stderr.read() if p.stderr else "")[-600:]) for r, p in enumerate(procs) if p.returncode]
    for p in procs:
        if p.stderr:
            p.stderr.close()
    assert not bad, bad


def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of the job in the namespaces, node-1's NIC throttled in FAULT_STEPS: its trace."""
    ensure_tools()
    out = tmp_path_factory.mktemp("netfault")
    try:
        LAB.up()
        run_job(out)
    finally:
        LAB.down()
    return out / "trace"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_run(tmp_path_factory)


def test_hosts_are_the_namespaces(trace: Path) -> None:
    meta = json.loads((trace / "meta.json").read_text())
    assert sorted({r["host"] for r in meta["ranks"].values()}) == [f"host-{i}" for i in range(4)]


def test_slow_nic_is_named_from_commops(trace: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Judged as the real-job tests judge (`test_real_jobs.on_real_runs`): one run answered wrong
    is judged again on a fresh run, and only wrong twice fails. In about one run in five here the
    8 KiB TP all-reduce out of host-1 is late in too few of its copies to be called slow; weighed
    as partly slow (`localize.network.devices.split_slow`) it still puts host-1 first, where as
    healthy it tied host-3's devices with host-1's (3 of 14 runs before; 10 of 10 right since)."""
    try:
        _judge_nic(trace)
    except AssertionError as first:
        warnings.warn(f"the first real run was answered wrong; judged again on a fresh run:\n{first}", stacklevel=2)
        _judge_nic(real_run(tmp_path_factory))


def _judge_nic(trace: Path) -> None:
    v = json.loads(run_cli("localize", trace, "--format", "json", check=True).stdout)
    assert v["status"] == "irregular", v
    assert len(set(range(*FAULT_STEPS)) & set(v["irregular_steps"])) >= 7, v["irregular_steps"]
    # one GPU per host here: host-1's NIC and rank 1's own NIC port are one device, so CommOps
    # may list both, tied first; so may a link out of host-1, when in a run on this busy machine
    # only one peer's transfers from it were judged slow. Nothing without host-1 may share first place
    best = v["candidates"][0]["score"]
    first = [c for c in v["candidates"] if c["score"] >= best - 1e-9]
    slow = f"host-{SLOW_HOST}"
    assert all(c.get("host") == slow or slow in (c.get("hosts") or []) for c in first), v["candidates"][:4]
    assert any(c["kind"] == "nic" for c in first), v["candidates"][:4]
