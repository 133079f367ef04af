"""The Slurm example run for real: a single-node Slurm (Debian's slurm-wlm and munge, started by this
test in a scratch directory), `sbatch deploy/slurm/laggard-train.sbatch` running a 4-rank gloo job
with rank 1 slowed and a node agent, and `laggard serve` naming rank 1."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.verdict import serve
from tests.conftest import REPO

pytestmark = pytest.mark.slow
NEEDED = ("slurmctld", "slurmd", "sbatch", "munged", "mungekey", "runuser")
SCRIPT = REPO / "deploy" / "slurm" / "laggard-train.sbatch"
TRAIN = REPO / "tests" / "collector" / "jobs" / "dist_train.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _installed(name: str) -> str:
    """The path of one of NEEDED, which the fixture has found installed."""
    path = _which(name)
    assert path is not None, name
    return path


@pytest.fixture(scope="module")
def slurm() -> Iterator[dict[str, str]]:
    missing = [n for n in NEEDED if _which(n) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        pytest.skip("starting munged and slurmd needs root")
    d = Path(tempfile.mkdtemp(prefix="laggard-slurm-"))
    d.chmod(0o755)
    munge, key = d / "munge", d / "munge" / "key"
    key.mkdir(parents=True)
    munge.chmod(0o755)
    key.chmod(0o700)
    (d / "state").mkdir()
    (d / "spool").mkdir()
    subprocess.run([_installed("mungekey"), "-c", "-f", "-k", str(key / "munge.key")], check=True, capture_output=True)
    for p in (munge, key, key / "munge.key"):
        shutil.chown(p, "munge")
    subprocess.run(["runuser", "-u", "munge", "--", _installed("munged"), "--socket", str(munge / "sock"),
                    "--key-file", str(key / "munge.key"), "--pid-file", str(munge / "pid"),
                    "--log-file", str(munge / "log"), "--seed-file", str(munge / "seed")], check=True, timeout=30)
    host = socket.gethostname()
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=laggardtest
SlurmctldHost={host}
SlurmctldPort={_port()}
SlurmdPort={_port()}
AuthType=auth/munge
AuthInfo=socket={munge / 'sock'}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
    env = dict(os.environ, SLURM_CONF=str(conf))
    try:
        subprocess.run([_installed("slurmctld"), "-f", str(conf)], check=True, env=env, timeout=30)
        subprocess.run([_installed("slurmd"), "-f", str(conf)], check=True, env=env, timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env).stdout
            if out.strip() == "idle":
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"slurm did not come up: {(d / 'slurmctld.log').read_text()[-2000:]}")
        yield {"SLURM_CONF": str(conf), "dir": str(d)}
    finally:
        for pid_file in (d / "slurmd.pid", d / "slurmctld.pid", munge / "pid"):
            if pid_file.exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid_file.read_text().split()[0]), 15)
        time.sleep(1)
        shutil.rmtree(d, ignore_errors=True)


def test_sbatch_example_runs_the_job_and_the_agent_and_the_service_names_the_rank(
        slurm: dict[str, str], tmp_path: Path) -> None:
    work = Path(slurm["dir"]) / "work"
    work.mkdir()
    # a device is shown once two rounds on new summaries agree, or once the agents have been quiet
    # for --settle: a short job ends after a round or two, so a short settle, within the agents' linger
    with serve(tmp_path / "state.db", 1.0, ("--settle", "3")) as base:
        env = dict(os.environ, SLURM_CONF=slurm["SLURM_CONF"], LAGGARD_URL=base, LAGGARD_PYTHON=sys.executable,
                   PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", NPROC_PER_NODE="4", RDZV_PORT=str(_port()),
                   LAGGARD_COMMOPS_DIR=str(work / "run"), LAGGARD_JOB="slurm-demo")
        p = subprocess.Popen(["sbatch", "--wait", "--chdir", str(work), "--output", str(work / "job.out"), str(SCRIPT),
                              str(TRAIN), "--steps", "50", "--slow-rank", "1", "--slow-steps", "15:50", "--slow-ms",
                              "60"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work)
        tops: list[int | None] = []  # the top candidate over time: the verdict is redone as posts arrive
        last: dict[str, object] = {}  # the service's last answer, shown if the rank is never named
        deadline = time.monotonic() + 400
        ended: float | None = None
        while time.monotonic() < deadline and (ended is None or time.monotonic() < ended + 15):
            if ended is None and p.poll() is not None:
                ended = time.monotonic()  # the job and its agents are done: the last rounds may still be due
            r = httpx.get(f"{base}/v1/jobs/slurm-demo", timeout=5)
            if r.status_code == 200:
                last = r.json()
                cands = r.json().get("candidates") or []
                top = cands[0].get("rank") if cands else None
                if not tops or tops[-1] != top:
                    tops.append(top)
                if top == 1 and r.json()["status"] == "irregular":
                    break
            time.sleep(0.3)
        _, err = p.communicate(timeout=400)
        out = (work / "job.out").read_text() if (work / "job.out").exists() else ""
        assert p.returncode == 0, err + out[-3000:]
        assert 1 in tops, (tops, _brief(last), (tmp_path / "state.log").read_text()[-2000:], out[-3000:])
        deadline = time.monotonic() + 60
        while "summary(ies) posted" not in out and time.monotonic() < deadline:  # the agent's last line
            time.sleep(0.5)
            out = (work / "job.out").read_text()
        assert "summary(ies) posted" in out, out[-3000:]



def _brief(verdict: dict[str, object]) -> str:
    """What a failed assertion shows of the service's last verdict (status, steps, candidates, why)."""
    return json.dumps(verdict, default=str)[:3000]
