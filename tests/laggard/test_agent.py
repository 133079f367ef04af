"""The node agent: spool while the service is unreachable, replay on reconnect, bounded spool,
waiting for the job to appear, refusing bad flags."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from collector.inputs.errors import TraceError
from laggard.agent import Agent, Spool, node_view, wire_group
from laggard.service.app import create_app
from tests.conftest import run_cli
from tests.laggard.agents import sharded_job


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sharded_job(tmp_path_factory.mktemp("agent"))


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens


def test_spools_while_the_service_is_down_and_replays_in_order_when_it_is_back(trace: Path, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    down = Agent(trace, "node-2", _dead_url(), spool, 1 << 26, 5, client=httpx.Client(timeout=1))
    down.view = node_view(trace, "node-2")
    down.step(final=True)
    waiting = sorted(p.name for p in down.spool.items())
    assert len(waiting) == 6 and down.posted == 0 and down.backoff >= 1  # 30 steps in windows of 5
    assert json.loads((spool / "state.json").read_text())["next_step"] == 30
    with TestClient(create_app(tmp_path / "s.db", interval_s=0)) as c:
        # a new agent process (restarted) finds the spool and the state, and sends what is waiting
        back = Agent(trace, "node-2", "", spool, 1 << 26, 5, client=c)
        back.view = node_view(trace, "node-2")
        back.step(final=True)
        assert back.posted == 6 and not back.spool.items()
        assert c.get("/v1/jobs/svc-job/stats").json() == {"summaries": 6, "nodes": 1, "last_window": 5}
        back.step(final=True)  # nothing new: nothing posted twice
        assert back.posted == 6


def test_the_spool_is_bounded_and_says_what_it_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = Spool(tmp_path / "spool", max_bytes=2500)
    for w in range(5):
        s.put(w, b"x" * 1000)
    assert [p.name for p in s.items()] == ["000000000003.json", "000000000004.json"]
    assert s.dropped == 3 and "dropped the 1 oldest" in capsys.readouterr().err


def test_waits_for_the_job_to_appear(trace: Path, tmp_path: Path) -> None:
    root = tmp_path / "late"
    sleeps: list[float] = []

    def appear_later(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 3:
            shutil.copytree(trace, root)
            raise StopIteration  # stop the test here: the agent saw the job

    agent = Agent(root, "node-1", _dead_url(), tmp_path / "spool", 1 << 20, 5, sleep=appear_later)
    with pytest.raises(StopIteration):
        agent.run(poll_s=0.01, wait_s=60, idle_exit_s=1, linger_s=0)
    assert node_view(root, "node-1") is not None and len(sleeps) == 3
    t0 = time.monotonic()
    with pytest.raises(Exception, match="no ranks of host node-9 appeared"):
        Agent(root, "node-9", _dead_url(), tmp_path / "s9", 1 << 20, 5).run(0.05, 0.2, 1, 0)
    assert time.monotonic() - t0 < 5


def test_groups_travel_as_ranges_when_arithmetic() -> None:
    assert wire_group([0, 8, 16, 24]) == "0:25:8"
    assert wire_group([0, 1, 5]) == [0, 1, 5]


@pytest.mark.slow
def test_cli_refuses_bad_agent_flags_in_one_line(trace: Path) -> None:
    for args, words in ((["--follow", "--post", "ftp://x"], "not an http"),
                        (["--post", "http://x"], "--follow"),
                        (["--follow", "--post", "http://x", "--poll", "0"], "--poll"),
                        (["--window", "0"], "--window 0 must be positive"),
                        (["--window", "-3"], "--window -3 must be positive"),
                        (["--follow", "--poll", "-1"], "--poll -1.0 must be positive")):
        p = run_cli("sidecar", "run", trace, *args)
        assert p.returncode == 2 and words in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_the_loggers_shard_age_can_be_lowered_for_live_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    from collector.commops.writer import SHARD_AGE_S, shard_age_s

    monkeypatch.setenv("LAGGARD_COMMOPS_SHARD_AGE_S", "2")
    assert shard_age_s() == 2.0
    for bad in ("soon", "-1", "nan", "0"):
        monkeypatch.setenv("LAGGARD_COMMOPS_SHARD_AGE_S", bad)
        assert shard_age_s() == SHARD_AGE_S


def _pending(root: Path, rank: int, waits_s: list[float], failed: list[bool]) -> None:
    """A pending/ file as the logger writes it: operators entered `waits_s` before it last looked."""
    import pyarrow as pa

    from collector.commops.layout import PENDING_SCHEMA, atomic_write_table

    now, n = time.time_ns(), len(waits_s)
    atomic_write_table(root / "pending" / f"rank-{rank:05d}.parquet", pa.table({
        "rank": pa.array([rank] * n, pa.int32()), "group": ["dp-0"] * n, "op": ["all_reduce"] * n,
        "seq": pa.array(range(n), pa.int64()), "peer": pa.array([-1] * n, pa.int32()),
        "nbytes": pa.array([1024] * n, pa.int64()), "start_ns": [now - int(w * 1e9) for w in waits_s],
        "step": pa.array([29] * n, pa.int32()), "seen_ns": [now] * n, "failed": failed}, schema=PENDING_SCHEMA))


def test_stuck_operators_are_posted_bounded_and_once_more_when_they_clear(trace: Path, tmp_path: Path) -> None:
    root = tmp_path / "trace"
    shutil.copytree(trace, root)
    _pending(root, 16, [10.0, 0.5, 1.0], [False, False, True])  # stuck, in flight a moment, failed
    _pending(root, 17, [5.0 + i for i in range(100)], [False] * 100)  # a flood: the longest 64 travel
    with TestClient(create_app(tmp_path / "s.db", interval_s=0)) as c:
        a = Agent(root, "node-2", "", tmp_path / "spool", 1 << 26, 10, client=c, hang_after_s=3.0)
        a.view = node_view(root, "node-2")
        a.step(final=True)  # the steps' posts: the stuck operators ride on the newest one
        stuck = a.stuck()
        assert len(stuck["rank"]) == 64 and stuck["rank"].count(16) == 0  # 100 of rank 17 wait longer
        (root / "pending" / "rank-00017.parquet").unlink()
        stuck = a.stuck()
        assert sorted(zip(stuck["rank"], stuck["failed"], strict=True)) == [(16, False), (16, True)]
        a.step()  # no new step: a post of its own carries them
        assert a.posted == 4 and c.get("/v1/jobs/svc-job/stats").json()["summaries"] == 4
        (root / "pending" / "rank-00016.parquet").unlink()
        a.step()  # cleared: one more post says so, then nothing
        a.step()
        assert a.posted == 5 and a.refused == 0


def test_the_last_post_says_the_job_ended_only_when_its_ranks_exited(trace: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for alive, ended in ((False, True), (None, False)):  # processes gone; cannot tell (only idle)
        with TestClient(create_app(tmp_path / f"s-{ended}.db", interval_s=0)) as c:
            a = Agent(trace, "node-2", "", tmp_path / f"spool-{ended}", 1 << 26, 10, client=c, sleep=lambda _s: None)
            monkeypatch.setattr(a, "job_alive", lambda alive=alive: alive)
            a.run(poll_s=0.01, wait_s=1, idle_exit_s=0.01, linger_s=0)
            bodies = [json.loads(b) for _, _, b in c.app.state.service.store.rows_since("svc-job", 0)]  # type: ignore[attr-defined]
            assert [b["last_step"] for b in bodies][-1] == 29 and bodies[-1]["rows"]["rank"]
            assert [bool(b.get("ended")) for b in bodies] == [False] * (len(bodies) - 1) + [ended]


@pytest.mark.timeout(30)
def test_a_state_file_that_is_a_fifo_is_refused_not_waited_on(trace: Path, tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    os.mkfifo(tmp_path / "spool" / "state.json")
    with pytest.raises(TraceError, match="not a regular file"):
        Agent(trace, "node-2", _dead_url(), tmp_path / "spool", 1 << 26, 5, client=httpx.Client(timeout=1))
