"""The service's state in SQLite: every accepted summary, and the latest verdict and report per job.

A summary is committed before its post is acknowledged, so an acknowledged summary survives a
crash or restart; (job, node, window) is the key, so a sidecar that retries a post does not
count twice. WAL mode lets the localizer read while posts keep being written.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS summaries (
    job TEXT NOT NULL, node TEXT NOT NULL, window INTEGER NOT NULL,
    received_ns INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (job, node, window)
);
CREATE TABLE IF NOT EXISTS jobs (
    job TEXT PRIMARY KEY, updated_ns INTEGER NOT NULL, verdict TEXT NOT NULL,
    report TEXT NOT NULL, markdown TEXT NOT NULL, html TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS groups (
    job TEXT NOT NULL, grp TEXT NOT NULL, members TEXT NOT NULL, PRIMARY KEY (job, grp)
);
CREATE TABLE IF NOT EXISTS rejected (reason TEXT PRIMARY KEY, n INTEGER NOT NULL);
"""


@dataclass
class JobState:
    job: str
    updated_ns: int
    verdict: dict[str, Any]
    report: dict[str, Any]


class Store:
    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def add_summary(self, job: str, node: str, window: int, body: str) -> bool:
        """Store one summary; False when (job, node, window) was already stored (a retry)."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO summaries VALUES (?, ?, ?, ?, ?)", (job, node, window, time.time_ns(), body))
            return cur.rowcount == 1

    def add_groups(self, job: str, groups: dict[str, list[int]]) -> None:
        """Group membership, sent by a sidecar once (or when it changes), kept per job."""
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO groups VALUES (?, ?, ?)",
                                 [(job, g, json.dumps(sorted(m))) for g, m in groups.items()])

    def groups(self, job: str) -> dict[str, list[int]]:
        with self._lock:
            rows = self._db.execute("SELECT grp, members FROM groups WHERE job = ?", (job,)).fetchall()
        return {g: json.loads(m) for g, m in rows}

    def count_rejected(self, reason: str) -> None:
        with self._lock:
            self._db.execute("INSERT INTO rejected VALUES (?, 1) ON CONFLICT(reason) DO UPDATE SET n = n + 1",
                             (reason,))

    def rejected(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT reason, n FROM rejected").fetchall())

    def counts(self) -> dict[str, int]:
        """Summaries stored per job."""
        with self._lock:
            return dict(self._db.execute("SELECT job, COUNT(*) FROM summaries GROUP BY job").fetchall())

    def stats(self, job: str) -> dict[str, int]:
        with self._lock:
            n, nodes, last = self._db.execute(
                "SELECT COUNT(*), COUNT(DISTINCT node), MAX(window) FROM summaries WHERE job = ?", (job,)).fetchone()
        return {"summaries": int(n), "nodes": int(nodes), "last_window": int(last) if last is not None else -1}

    def rows_since(self, job: str, rowid: int) -> list[tuple[int, str]]:
        """(rowid, body) of the job's summaries stored after `rowid`, oldest first."""
        with self._lock:
            return self._db.execute("SELECT rowid, body FROM summaries WHERE job = ? AND rowid > ? ORDER BY rowid",
                                    (job, rowid)).fetchall()

    def jobs_with_summaries(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT DISTINCT job FROM summaries").fetchall()]

    def save_job(self, job: str, verdict: dict[str, Any], report: dict[str, Any], markdown: str) -> None:
        """The latest verdict and report; the HTML is rendered later, when first asked for."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, '')",
                (job, time.time_ns(), json.dumps(verdict), json.dumps(report, default=str), markdown))

    def save_html(self, job: str, updated_ns: int, html: str) -> None:
        """Cache the rendered page, unless a newer verdict arrived meanwhile."""
        with self._lock:
            self._db.execute("UPDATE jobs SET html = ? WHERE job = ? AND updated_ns = ?", (html, job, updated_ns))

    def job(self, job: str) -> JobState | None:
        with self._lock:
            row = self._db.execute("SELECT job, updated_ns, verdict, report FROM jobs WHERE job = ?", (job,)).fetchone()
        return JobState(row[0], row[1], json.loads(row[2]), json.loads(row[3])) if row else None

    def jobs(self) -> list[JobState]:
        with self._lock:
            rows = self._db.execute("SELECT job, updated_ns, verdict, report FROM jobs ORDER BY job").fetchall()
        return [JobState(r[0], r[1], json.loads(r[2]), json.loads(r[3])) for r in rows]

    def rendered(self, job: str, fmt: str) -> str | None:
        col = {"md": "markdown", "html": "html", "json": "report"}[fmt]
        with self._lock:
            row = self._db.execute(f"SELECT {col} FROM jobs WHERE job = ?", (job,)).fetchone()
        return str(row[0]) if row else None

    def close(self) -> None:
        with self._lock:
            self._db.close()
