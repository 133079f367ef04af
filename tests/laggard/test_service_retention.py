"""Retention: summaries older than --retention and rows beyond --max-rows-per-job are deleted,
periodically, and a job with nothing left is forgotten (SQLite here; PostgreSQL in
test_service_postgres.py runs the same check)."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from laggard.service.app import create_app
from laggard.service.store import Store

DAY_NS = 86400 * 10**9


def check_prune(url: str) -> None:
    """Old rows go, new rows stay, the cap keeps each job's newest, forgotten jobs lose all state."""
    store = Store(url)
    try:
        now = time.time_ns()
        for w in range(10):
            assert store.add_summary("old-job", "n0", w, "{}")
            assert store.add_summary("busy-job", "n0", w, "{}")
        store.add_summary("fresh-job", "n0", 0, "{}")
        store.set_node("old-job", "n0", 4, {0: {"gpu": 0}})
        store.add_groups("old-job", {"dp-0": "0:4:1"})
        store.save_job("old-job", {"status": "healthy", "candidates": []}, {}, "")
        store.save_job("kept-verdict", {"status": "healthy", "candidates": []}, {}, "")
        store._run("UPDATE summaries SET received_ns = ? WHERE job = ?", (now - 8 * DAY_NS, "old-job"))
        store._run("UPDATE summaries SET received_ns = ? WHERE job = ? AND win < 3", (now - 8 * DAY_NS, "busy-job"))
        store._run("UPDATE jobs SET updated_ns = ? WHERE job = ?", (now - 8 * DAY_NS, "old-job"))
        store._run("UPDATE nodes SET seen_ns = ? WHERE job = ?", (now - 8 * DAY_NS, "old-job"))
        gone, forgotten = store.prune(now - 7 * DAY_NS, max_rows_per_job=4, batch=3)  # batches of 3: 13 rows
        assert gone == 10 + 3 + 3 and forgotten == ["old-job"]
        assert store.counts() == {"busy-job": 4, "fresh-job": 1}
        assert _windows(store, "busy-job") == [6, 7, 8, 9]  # the newest
        assert store.job("old-job") is None and store.nodes("old-job") == {} and store.groups("old-job") == {}
        assert store.job("kept-verdict") is not None  # a recent verdict stays, summaries or not
        assert store.prune(now - 7 * DAY_NS, max_rows_per_job=4) == (0, [])  # nothing more to do
    finally:
        store.close()


def _windows(store: Store, job: str) -> list[int]:
    return [int(r[0]) for r in store._all("SELECT win FROM summaries WHERE job = ? ORDER BY id", (job,))]


def test_prune_on_sqlite(tmp_path: Path) -> None:
    check_prune(str(tmp_path / "s.db"))


def test_the_service_prunes_on_its_own_and_counts_it(tmp_path: Path) -> None:
    with TestClient(create_app(tmp_path / "s.db", interval_s=0.2, retention_s=3.0, max_rows_per_job=2)) as c:
        svc = c.app.state.service  # type: ignore[attr-defined]
        for w in range(5):
            svc.store.add_summary("j", "n0", w, "{}")
        svc.next_prune = 0.0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and svc.store.counts().get("j", 0) > 2:
            time.sleep(0.1)
        assert svc.store.counts() == {"j": 2}  # the cap, before the retention's second
        while time.monotonic() < deadline and svc.store.counts():
            time.sleep(0.1)
        assert svc.store.counts() == {}  # then the retention
        assert 'laggard_summaries_pruned_total 5.0' in c.get("/metrics").text
