"""The service's state: accepted summaries, fetched records, fetch requests, the latest verdict per job.

A summary is committed before its post is acknowledged, so an acknowledged summary survives a
crash or restart; (job, node, window) is the key, so an agent that retries a post does not
count twice. `prune` bounds what is kept: summaries older than the retention, rows of a job
beyond its cap, and everything of a job that has neither summaries nor a recent verdict. SQLite (WAL, the embedded default) or PostgreSQL (`postgresql://...`, when several
replicas share state): the same SQL, only the placeholders and the key column differ.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLES = """
CREATE TABLE IF NOT EXISTS summaries (
    id {serial}, job TEXT NOT NULL, node TEXT NOT NULL, win BIGINT NOT NULL,
    received_ns BIGINT NOT NULL, body TEXT NOT NULL, UNIQUE (job, node, win)
);
CREATE INDEX IF NOT EXISTS summaries_job ON summaries (job, id);
CREATE INDEX IF NOT EXISTS summaries_received ON summaries (received_ns);
CREATE TABLE IF NOT EXISTS nodes (
    job TEXT NOT NULL, node TEXT NOT NULL, world_size BIGINT NOT NULL, ranks TEXT NOT NULL,
    seen_ns BIGINT NOT NULL, PRIMARY KEY (job, node)
);
CREATE TABLE IF NOT EXISTS groups (job TEXT NOT NULL, grp TEXT NOT NULL, spec TEXT NOT NULL, PRIMARY KEY (job, grp));
CREATE TABLE IF NOT EXISTS fetches (
    job TEXT PRIMARY KEY, request BIGINT NOT NULL, plan TEXT NOT NULL, upto BIGINT NOT NULL, created_ns BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS records (
    job TEXT NOT NULL, request BIGINT NOT NULL, node TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (job, request, node)
);
CREATE TABLE IF NOT EXISTS jobs (
    job TEXT PRIMARY KEY, updated_ns BIGINT NOT NULL, verdict TEXT NOT NULL,
    report TEXT NOT NULL, markdown TEXT NOT NULL, html TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS failures (job TEXT PRIMARY KEY, reason TEXT NOT NULL, at_ns BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS rejected (reason TEXT PRIMARY KEY, n BIGINT NOT NULL);
"""


@dataclass
class JobState:
    job: str
    updated_ns: int
    verdict: dict[str, Any]
    report: dict[str, Any]


@dataclass
class Fetch:
    """Full records the localizer asked for: per node, ranks and steps; summaries up to `upto`."""

    request: int
    plan: dict[str, dict[str, list[int]]]
    upto: int
    created_ns: int


class Store:
    def __init__(self, url: Path | str) -> None:
        self.url = str(url)
        self.postgres = self.url.startswith(("postgresql://", "postgres://"))
        self._lock = threading.Lock()
        if self.postgres:
            import psycopg

            self._db: Any = psycopg.connect(self.url, autocommit=True)
            serial = "BIGSERIAL PRIMARY KEY"
        else:
            self._db = sqlite3.connect(self.url, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=10000")
            serial = "INTEGER PRIMARY KEY AUTOINCREMENT"
        with self._lock:
            for stmt in TABLES.format(serial=serial).split(";"):
                if stmt.strip():
                    self._db.execute(stmt)

    @property
    def path(self) -> str:
        return self.url

    def _q(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(self._q(sql), args).fetchall())

    def _one(self, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        with self._lock:
            row = self._db.execute(self._q(sql), args).fetchone()
        return tuple(row) if row is not None else None

    def _run(self, sql: str, args: Sequence[Any] = ()) -> int:
        with self._lock:
            return int(self._db.execute(self._q(sql), args).rowcount)

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock:
            if self.postgres:
                with self._db.transaction():
                    yield self._db
            else:
                self._db.execute("BEGIN")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")

    # -- ingest -----------------------------------------------------------------------------

    def add_summary(self, job: str, node: str, window: int, body: str) -> bool:
        """Store one summary; False when (job, node, window) was already stored (a retry)."""
        return self._run("INSERT INTO summaries (job, node, win, received_ns, body) VALUES (?, ?, ?, ?, ?) "
                         "ON CONFLICT DO NOTHING", (job, node, window, time.time_ns(), body)) == 1

    def set_node(self, job: str, node: str, world_size: int, ranks: dict[int, dict[str, Any]]) -> None:
        self._run("INSERT INTO nodes VALUES (?, ?, ?, ?, ?) ON CONFLICT (job, node) DO UPDATE SET "
                  "world_size = excluded.world_size, ranks = excluded.ranks, seen_ns = excluded.seen_ns",
                  (job, node, world_size, json.dumps({str(r): v for r, v in ranks.items()}), time.time_ns()))

    def nodes(self, job: str) -> dict[str, tuple[int, dict[int, dict[str, Any]]]]:
        rows = self._all("SELECT node, world_size, ranks FROM nodes WHERE job = ?", (job,))
        return {n: (int(w), {int(r): v for r, v in json.loads(ranks).items()}) for n, w, ranks in rows}

    def add_groups(self, job: str, groups: dict[str, str]) -> None:
        """Group membership as posted (a JSON list or a 'start:stop:step' range), kept per job."""
        with self._tx() as db:
            for g, spec in groups.items():
                db.execute(self._q("INSERT INTO groups VALUES (?, ?, ?) ON CONFLICT (job, grp) DO UPDATE "
                                   "SET spec = excluded.spec"), (job, g, spec))

    def groups(self, job: str) -> dict[str, str]:
        return dict(self._all("SELECT grp, spec FROM groups WHERE job = ?", (job,)))  # type: ignore[arg-type]

    def count_rejected(self, reason: str) -> None:
        self._run("INSERT INTO rejected VALUES (?, 1) ON CONFLICT (reason) DO UPDATE SET n = rejected.n + 1",
                  (reason,))

    def rejected(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self._all("SELECT reason, n FROM rejected")}

    def counts(self) -> dict[str, int]:
        """Summaries stored per job."""
        return {str(k): int(v) for k, v in self._all("SELECT job, COUNT(*) FROM summaries GROUP BY job")}

    def stats(self, job: str) -> dict[str, int]:
        row = self._one("SELECT COUNT(*), COUNT(DISTINCT node), MAX(win) FROM summaries WHERE job = ?", (job,))
        n, nodes, last = row or (0, 0, None)
        return {"summaries": int(n), "nodes": int(nodes), "last_window": int(last) if last is not None else -1}

    def rows_since(self, job: str, after: int, upto: int | None = None) -> list[tuple[int, str, str]]:
        """(id, node, body) of the job's summaries stored after `after` (and up to `upto`), oldest first."""
        if upto is None:
            return self._all("SELECT id, node, body FROM summaries WHERE job = ? AND id > ? ORDER BY id",
                             (job, after))  # type: ignore[return-value]
        return self._all("SELECT id, node, body FROM summaries WHERE job = ? AND id > ? AND id <= ? ORDER BY id",
                         (job, after, upto))  # type: ignore[return-value]

    def last_id(self, job: str) -> int:
        row = self._one("SELECT MAX(id) FROM summaries WHERE job = ?", (job,))
        return int(row[0]) if row and row[0] is not None else 0

    def jobs_with_summaries(self) -> list[str]:
        return [str(r[0]) for r in self._all("SELECT DISTINCT job FROM summaries")]

    # -- retention --------------------------------------------------------------------------

    def prune(self, older_than_ns: int, max_rows_per_job: int = 0, batch: int = 10_000) -> tuple[int, list[str]]:
        """Delete summaries received before `older_than_ns` and, with a cap, each job's oldest rows
        beyond `max_rows_per_job`; then the state of jobs left with no summaries and no verdict
        newer than the cut. In batches, so posts are never held up for long. Returns the number of
        summaries deleted and the jobs forgotten."""
        gone = 0
        while True:
            n = self._run("DELETE FROM summaries WHERE id IN (SELECT id FROM summaries WHERE received_ns < ? "
                          "ORDER BY id LIMIT ?)", (older_than_ns, batch))
            gone += max(n, 0)
            if n < batch:
                break
        if max_rows_per_job > 0:
            for (job,) in self._all("SELECT job FROM summaries GROUP BY job HAVING COUNT(*) > ?", (max_rows_per_job,)):
                row = self._one("SELECT id FROM summaries WHERE job = ? ORDER BY id DESC LIMIT 1 OFFSET ?",
                                (job, max_rows_per_job - 1))
                if row is not None:  # the oldest id kept; older rows of this job go
                    gone += max(self._run("DELETE FROM summaries WHERE job = ? AND id < ?", (job, int(row[0]))), 0)
        stale = [str(r[0]) for r in self._all(
            "SELECT job FROM jobs WHERE updated_ns < ? AND job NOT IN (SELECT DISTINCT job FROM summaries) "
            "UNION SELECT job FROM nodes WHERE seen_ns < ? AND job NOT IN (SELECT DISTINCT job FROM summaries) "
            "AND job NOT IN (SELECT job FROM jobs WHERE updated_ns >= ?)", (older_than_ns, older_than_ns, older_than_ns))]
        for job in stale:
            with self._tx() as db:
                for table in ("jobs", "nodes", "groups", "fetches", "records", "failures"):
                    db.execute(self._q(f"DELETE FROM {table} WHERE job = ?"), (job,))
        return gone, stale

    # -- progressive fetching ---------------------------------------------------------------

    def set_fetch(self, job: str, plan: dict[str, dict[str, list[int]]], upto: int) -> int:
        """Ask the nodes in `plan` for their records; returns the request number."""
        with self._tx() as db:
            row = db.execute(self._q("SELECT request FROM fetches WHERE job = ?"), (job,)).fetchone()
            request = int(row[0]) + 1 if row else 1
            db.execute(self._q("DELETE FROM records WHERE job = ?"), (job,))
            db.execute(self._q("INSERT INTO fetches VALUES (?, ?, ?, ?, ?) ON CONFLICT (job) DO UPDATE SET "
                               "request = excluded.request, plan = excluded.plan, upto = excluded.upto, "
                               "created_ns = excluded.created_ns"),
                       (job, request, json.dumps(plan), upto, time.time_ns()))
        return request

    def fetch(self, job: str) -> Fetch | None:
        row = self._one("SELECT request, plan, upto, created_ns FROM fetches WHERE job = ? AND plan <> '{}'", (job,))
        return Fetch(int(row[0]), json.loads(row[1]), int(row[2]), int(row[3])) if row else None

    def clear_fetch(self, job: str) -> None:
        with self._tx() as db:
            db.execute(self._q("UPDATE fetches SET plan = '{}' WHERE job = ?"), (job,))
            db.execute(self._q("DELETE FROM records WHERE job = ?"), (job,))

    def add_records(self, job: str, request: int, node: str, body: str) -> bool:
        return self._run("INSERT INTO records VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                         (job, request, node, body)) == 1

    def records(self, job: str, request: int) -> dict[str, str]:
        rows = self._all("SELECT node, body FROM records WHERE job = ? AND request = ?", (job, request))
        return {str(n): str(b) for n, b in rows}

    def answered(self, job: str, request: int) -> set[str]:
        return {str(r[0]) for r in self._all("SELECT node FROM records WHERE job = ? AND request = ?", (job, request))}

    # -- verdicts ---------------------------------------------------------------------------

    def save_job(self, job: str, verdict: dict[str, Any], report: dict[str, Any], markdown: str) -> None:
        """The latest verdict and report; the HTML is rendered later, when first asked for."""
        with self._tx() as db:
            db.execute(self._q("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, '') ON CONFLICT (job) DO UPDATE SET "
                               "updated_ns = excluded.updated_ns, verdict = excluded.verdict, "
                               "report = excluded.report, markdown = excluded.markdown, html = ''"),
                       (job, time.time_ns(), json.dumps(verdict), json.dumps(report, default=str), markdown))
            db.execute(self._q("DELETE FROM failures WHERE job = ?"), (job,))

    def fail_job(self, job: str, reason: str) -> None:
        self._run("INSERT INTO failures VALUES (?, ?, ?) ON CONFLICT (job) DO UPDATE SET reason = excluded.reason, "
                  "at_ns = excluded.at_ns", (job, reason[:500], time.time_ns()))

    def failures(self) -> dict[str, str]:
        return {str(j): str(r) for j, r in self._all("SELECT job, reason FROM failures")}

    def save_html(self, job: str, updated_ns: int, html: str) -> None:
        """Cache the rendered page, unless a newer verdict arrived meanwhile."""
        self._run("UPDATE jobs SET html = ? WHERE job = ? AND updated_ns = ?", (html, job, updated_ns))

    def job(self, job: str) -> JobState | None:
        row = self._one("SELECT job, updated_ns, verdict, report FROM jobs WHERE job = ?", (job,))
        return JobState(row[0], int(row[1]), json.loads(row[2]), json.loads(row[3])) if row else None

    def jobs(self) -> list[JobState]:
        rows = self._all("SELECT job, updated_ns, verdict, report FROM jobs ORDER BY job")
        return [JobState(r[0], int(r[1]), json.loads(r[2]), json.loads(r[3])) for r in rows]

    def rendered(self, job: str, fmt: str) -> str | None:
        col = {"md": "markdown", "html": "html", "json": "report"}[fmt]
        row = self._one(f"SELECT {col} FROM jobs WHERE job = ?", (job,))
        return str(row[0]) if row else None

    def close(self) -> None:
        with self._lock:
            self._db.close()
