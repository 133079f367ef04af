"""The service on a real PostgreSQL server (Debian's postgresql, a throwaway cluster this test starts):
the same ingest, fetch and localization as on SQLite, state kept across restarts, and two
service instances (replicas) sharing one database."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from laggard.service.app import create_app
from tests.laggard.agents import agents, localize, sharded_job
from tests.laggard.test_service_retention import check_prune

pytestmark = pytest.mark.slow
pytest.importorskip("psycopg", reason="psycopg not installed (pip install -e .[postgres])")
BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
ROOT = 21


def _as_postgres(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    run_as = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
    return subprocess.run(run_as + cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    if not BIN:
        pytest.skip("PostgreSQL server not installed (apt-get install postgresql)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: initdb refuses to run as root")
    d = Path(tempfile.mkdtemp(prefix="laggard-pg-"))  # not under pytest's 0700 root: the server runs as postgres
    data, sock = d / "data", d / "sock"
    sock.mkdir()
    if os.geteuid() == 0:
        shutil.chown(d, "postgres")
        shutil.chown(sock, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init = _as_postgres([f"{BIN[-1]}/initdb", "-D", str(data), "--auth=trust", "-U", "laggard"])
    assert init.returncode == 0, init.stderr
    start = _as_postgres([f"{BIN[-1]}/pg_ctl", "-D", str(data), "-w", "-l", str(d / "log"), "-o",
                          f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off", "start"])
    assert start.returncode == 0, start.stderr + (d / "log").read_text()
    try:
        yield f"postgresql://laggard@127.0.0.1:{port}/postgres"
    finally:
        _as_postgres([f"{BIN[-1]}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"])
        shutil.rmtree(d, ignore_errors=True)


def _fresh(url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {name}")
        db.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sharded_job(tmp_path_factory.mktemp("pgjob"))


def test_ingest_fetch_localize_and_restart_on_postgres(postgres: str, trace: Path, tmp_path: Path) -> None:
    url = _fresh(postgres, "svc1")
    with TestClient(create_app(url, interval_s=0, confirm_rounds=1)) as c:
        nodes = agents(trace, c, tmp_path / "spool")
        for a in nodes:
            a.step(final=True)
        assert c.post("/v1/summaries", content=b"{", headers={"content-type": "application/json"}).status_code == 400
        verdict = localize(c, "svc-job", nodes)
        assert verdict["candidates"][0]["rank"] == ROOT
        assert c.get("/v1/jobs/svc-job/stats").json() == {"summaries": 12, "nodes": 4, "last_window": 2}
    with TestClient(create_app(url, interval_s=0, confirm_rounds=1)) as c:  # a restart: everything is still there
        assert c.get("/v1/jobs/svc-job").json() == verdict
        m = c.get("/metrics").text
        assert 'laggard_posts_rejected_total{reason="not_json"} 1.0' in m
        assert 'laggard_summaries_received_total{job_name="svc-job"} 12.0' in m


def test_two_replicas_share_one_database(postgres: str, trace: Path, tmp_path: Path) -> None:
    url = _fresh(postgres, "svc2")
    with TestClient(create_app(url, interval_s=0, confirm_rounds=1)) as a, \
            TestClient(create_app(url, interval_s=0, confirm_rounds=1)) as b:
        half = agents(trace, a, tmp_path / "spool-a")[:2]
        other = agents(trace, b, tmp_path / "spool-b")[2:]
        for n in half + other:
            n.step(final=True)
            assert n.posted == 3
        _, body = agents(trace, b, tmp_path / "spool-retry")[0].summarize_new(final=True)[0]
        assert b.post("/v1/summaries", content=body).json()["duplicate"] is True  # stored through a, retried on b
        t0 = time.monotonic()
        verdict = localize(b, "svc-job", agents(trace, b, tmp_path / "spool-c"))  # b sees a's posts too
        assert verdict["candidates"][0]["rank"] == ROOT and time.monotonic() - t0 < 60
        assert a.get("/v1/jobs/svc-job").json()["candidates"][0]["rank"] == ROOT


def test_retention_on_postgres(postgres: str) -> None:
    check_prune(_fresh(postgres, "svc3"))
