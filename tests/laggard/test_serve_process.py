"""`laggard serve` as a real process on loopback: agents over HTTP, hostile posts, SIGTERM, kill -9."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.laggard.agents import agents, sharded_job

pytestmark = pytest.mark.slow  # a service process and a simulated job: seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stored_bytes(db: Path) -> int:
    """The database's pages, those committed to its write-ahead log included. (The files' sizes
    are no measure of growth: SQLite keeps its log up to about 4 MB between checkpoints.)"""
    with contextlib.closing(sqlite3.connect(db)) as c:
        return int(c.execute("PRAGMA page_count").fetchone()[0]) * int(c.execute("PRAGMA page_size").fetchone()[0])


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "laggard", "serve", "--port", str(port), "--db",
                             str(tmp_path / "s.db"), "--interval", "0.5", "--settle", "2"], env=env, cwd=REPO,
                            stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_hostile_posts_do_not_stop_localization_and_shutdown_is_prompt(tmp_path: Path,
                                                                        serve: tuple[str, subprocess.Popen[str]]) -> None:
    base, proc = serve
    trace = sharded_job(tmp_path / "job")
    with httpx.Client(timeout=10) as client:
        nodes = agents(trace, client, tmp_path / "spool", url=base)
        good = json.loads(nodes[1].summarize_new(final=True)[0][1])
        nodes[1].state.next_step = 0
        db = tmp_path / "s.db"
        size0 = stored_bytes(db)
        # the posts of issue 14: a seq/window past int64, a group of a million ranks
        for hostile in ({**good, "job": "evil", "window": 2**64}, {**good, "job": "evil", "window": 2**63},
                        {**good, "job": "evil", "groups": {"dp-0": "0:1000000:1"}}):
            t0 = time.perf_counter()
            r = client.post(base + "/v1/summaries", json=hostile)
            assert r.status_code == 422 and r.json()["detail"]["reason"] == "invalid", r.text
            assert time.perf_counter() - t0 < 1.0
        for a in nodes:
            a.step(final=True)
            assert a.refused == 0 and not a.spool.items()
        t0 = time.monotonic()
        verdict = None
        while time.monotonic() - t0 < 90:  # the loop localizes, asks, and localizes again on its own
            # (90 s: the worker's first imports take tens of seconds on a loaded 2-core machine)
            for a in nodes:
                a.poll_fetch()
            r = client.get(base + "/v1/jobs/svc-job")
            if r.status_code == 200 and r.json().get("candidates"):
                verdict = r.json()
                break
            time.sleep(0.3)
        assert verdict is not None and verdict["candidates"][0]["rank"] == 21, (r.status_code, r.text[:500])
        assert client.get(base + "/healthz").json() == {"status": "ok"}
        size1 = stored_bytes(db)
        assert size1 - size0 < 5_000_000, (size0, size1)
    kids = children(proc.pid)
    assert kids, "the localization worker runs in a child process"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert time.monotonic() - t0 < 10
    time.sleep(0.5)
    assert not [k for k in kids if alive(k)]


def test_kill_9_leaves_no_process_behind(serve: tuple[str, subprocess.Popen[str]]) -> None:
    _, proc = serve
    kids = children(proc.pid)
    assert kids
    proc.kill()
    proc.wait(timeout=5)
    deadline = time.monotonic() + 20  # a worker still importing exits once it can see its parent is gone
    while time.monotonic() < deadline and [k for k in kids if alive(k)]:
        time.sleep(0.1)
    assert not [k for k in kids if alive(k)], "orphans after kill -9"
