"""The HTTP service: node agents post summaries, a loop localizes each job, people read metrics and reports.

Endpoints
  POST /v1/summaries             one `schema.SummaryPost`; 202 once committed (the reply carries any
                                 fetch request for the posting node)
  GET  /v1/jobs/{job}/fetch      ?node=N: the records the localizer wants from that node (204: none)
  POST /v1/records               a node's answer to a fetch request (`schema.RecordsPost`)
  GET  /v1/jobs                  every job's status, slowdown and root cause
  GET  /v1/jobs/{job}            the job's latest verdict (the verdict JSON of docs/verdict.md)
  GET  /v1/jobs/{job}/report     the latest report (?format=html|md|json)
  GET  /v1/jobs/{job}/stats      summaries stored, nodes, last window
  POST /v1/jobs/{job}/localize   localize now instead of waiting for the loop
  GET  /metrics                  Prometheus exposition (prometheus_client)
  GET  /healthz                  ok, or degraded with the jobs whose localization failed

Each job's round runs on its own in a worker process with a time limit: a job whose data makes
localization fail or stall is marked failed (in /healthz and `laggard_job_localization_failed`)
and the other jobs go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sys
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from laggard.cliutil import emit
from laggard.notify import notify_with_retry
from laggard.service.localizing import (
    Localized,
    Round,
    localize_round,
    render_job_html,
    rerender,
    service_report,
)
from laggard.service.metrics import Metrics
from laggard.service.publish import NEEDED, Agreement, device_key, publish
from laggard.service.schema import RecordsPost, SummaryPost
from laggard.service.store import Store
from laggard.service.workers import Workers

MAX_BODY = 4 << 20  # bytes: a node's summary of a few hundred steps fits easily; more is a bug upstream
MAX_RECORDS_BODY = 64 << 20  # a fetch answer: a node's planned ranks for a few steps
M = TypeVar("M", bound=BaseModel)
JOB_TIMEOUT_S = 120.0  # one job's round; longer is a stall: the worker is replaced, the job marked failed
RETENTION_S = 7 * 86400.0  # summaries older than this are deleted (and jobs with nothing newer forgotten)
PRUNE_EVERY_S = 300.0
WORKERS = 2  # jobs localized at once, each worker a process of its own
SETTLE_S = 30.0  # agents quiet this long after a withheld round: its device is published (no more evidence comes)
QUARANTINE_S = 600.0  # a job whose round stalled is left out of the rounds this long, so it cannot stall them all


class Service:
    """State shared by the endpoints and the localization loop."""

    def __init__(self, db: Path | str, max_body: int = MAX_BODY, isolate: bool = False,
                 notify_url: str | None = None, external_url: str = "", ttl_s: float = 3600.0,
                 job_timeout_s: float = JOB_TIMEOUT_S, confirm_rounds: int = NEEDED,
                 settle_s: float = SETTLE_S, retention_s: float = RETENTION_S, max_rows_per_job: int = 0,
                 workers: int = WORKERS) -> None:
        self.store = Store(db)
        self.confirm_rounds = confirm_rounds
        self.agreement: dict[str, Agreement] = {}  # per job: the rounds that named the same device
        self.unconfirmed: dict[str, Localized] = {}  # per job: the last round, while its device is withheld
        self.settle_s = settle_s
        self.retention_s = retention_s
        self.max_rows_per_job = max_rows_per_job
        self.next_prune = 0.0  # monotonic time of the next pruning pass
        self.isolate = isolate
        self.workers = Workers(max(1, workers), processes=isolate)
        self.running: dict[str, asyncio.Task[Any]] = {}  # jobs whose round the loop started and that have not ended
        self.metrics = Metrics(ttl_s)
        self.max_body = max_body
        self.notify_url = notify_url
        self.external_url = external_url.rstrip("/")
        self.job_timeout_s = job_timeout_s
        self.wake = asyncio.Event()
        self.closed = False  # set by close(): no round starts after it
        self._dirty: set[str] = set(self.store.jobs_with_summaries())  # re-localize after a restart
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, str], str] = {}  # what each node last said about its ranks
        self.ended: dict[str, set[str]] = {}  # per job: the nodes whose ranks have all exited
        self._groups: dict[str, dict[str, str]] = {}
        self.fetches: dict[str, tuple[int, dict[str, dict[str, list[int]]]]] = {}
        self.failed: dict[str, str] = self.store.failures()
        self.quarantine: dict[str, float] = {}  # job -> monotonic time until which its rounds are skipped
        for job, n in self.store.counts().items():
            self.metrics.received(job, n)
        for reason, n in self.store.rejected().items():
            self.metrics.rejected.labels(reason).inc(n)
        for state in self.store.jobs():
            self.metrics.set_verdict(state.job, state.verdict)
            key = device_key(state.verdict)
            if key is not None:  # a device published before a restart stays published while rounds agree
                self.agreement[state.job] = Agreement(key, -1, confirm_rounds)
        for job, reason in self.failed.items():
            self.metrics.set_failed(job, reason)
        for job in self._dirty:
            f = self.store.fetch(job)
            if f is not None:
                self.fetches[job] = (f.request, f.plan)

    def reject(self, status: int, reason: str, detail: str) -> HTTPException:
        self.metrics.rejected.labels(reason).inc()
        self.store.count_rejected(reason)
        return HTTPException(status, detail={"reason": reason, "detail": detail})

    def validate(self, model: type[M], body: bytes) -> M:
        try:
            return model.model_validate_json(body)
        except ValidationError as exc:
            errors = exc.errors()
            err = errors[0]
            if err.get("type") == "json_invalid":
                raise self.reject(400, "not_json", f"body is not JSON: {err.get('msg')}") from exc
            where = ".".join(str(p) for p in err.get("loc", ()))
            got = err.get("input")
            shown = f" (got {got!r})" if isinstance(got, str | int | float) and len(repr(got)) < 80 else ""
            raise self.reject(422, "invalid", f"{where or 'body'}: {err.get('msg')}{shown}" + (
                f" ({len(errors)} problems)" if len(errors) > 1 else "")) from exc

    def ingest(self, body: bytes) -> tuple[bool, SummaryPost]:
        """Validate and commit one summary (about a millisecond: done inline, no thread hop)."""
        s = self.validate(SummaryPost, body)
        ranks = {r: v.model_dump() for r, v in sorted(s.ranks.items())}
        said = json.dumps([s.world_size, ranks], sort_keys=True)
        if self._nodes.get((s.job, s.node)) != said:
            self.store.set_node(s.job, s.node, s.world_size, ranks)
            self._nodes[(s.job, s.node)] = said
        if s.groups:
            # every node of a DP group sends the same membership: store only what is new
            known = self._groups.setdefault(s.job, {})
            if not known:
                known.update(self.store.groups(s.job))
            specs = {g: m if isinstance(m, str) else json.dumps(sorted(m)) for g, m in s.groups.items()}
            fresh = {g: m for g, m in specs.items() if known.get(g) != m}
            if fresh:
                self.store.add_groups(s.job, fresh)
                known.update(fresh)
        new = self.store.add_summary(s.job, s.node, s.window, body.decode())
        ended = self.ended.setdefault(s.job, set())
        if s.ended:
            ended.add(s.node)
        elif new:  # the node posts steps again (a restarted job under the same name)
            ended.discard(s.node)
        if new:
            self.metrics.received(s.job)
            with self._lock:
                self._dirty.add(s.job)
        return new, s

    def ingest_records(self, body: bytes) -> RecordsPost:
        """A node's answer to a fetch request: only what was asked, only for a request still open."""
        p = self.validate(RecordsPost, body)
        request, plan = self.fetches.get(p.job, (None, {}))
        if request != p.request or p.node not in plan:
            raise self.reject(409, "no_request", f"job {p.job} has no open fetch request {p.request} for node "
                                                 f"{p.node} (it was answered, replaced or timed out)")
        asked = plan[p.node]
        extra_r = set(p.rows.rank) - set(asked["ranks"])
        extra_s = set(p.rows.step) - set(asked["steps"])
        if extra_r or extra_s:
            raise self.reject(422, "invalid", f"records of ranks {sorted(extra_r)[:5]} / steps {sorted(extra_s)[:5]} "
                                              "that were not asked for")
        self.store.add_records(p.job, p.request, p.node, body.decode())
        if set(plan) <= self.store.answered(p.job, p.request):
            with self._lock:
                self._dirty.add(p.job)
            self.wake.set()
        return p

    def fetch_for(self, job: str, node: str) -> dict[str, Any] | None:
        request, plan = self.fetches.get(job, (None, {}))
        if request is None or node not in plan:
            return None
        return {"request": request, "ranks": plan[node]["ranks"], "steps": plan[node]["steps"]}

    async def round(self, job: str) -> Round | None:
        """One job's round, isolated: a failure or a stall marks this job failed, nothing else."""
        t0 = time.perf_counter()
        try:
            out = await self.workers.run(job, self.job_timeout_s, localize_round, self.store.url, job)
        except TimeoutError:
            self.quarantine[job] = time.monotonic() + QUARANTINE_S
            self.mark_failed(job, f"localization took over {self.job_timeout_s:.0f} s; the worker was restarted "
                                  f"and the job is left out for {QUARANTINE_S:.0f} s")
            return None
        except Exception as exc:  # the job's data broke its localization: keep serving the others
            self.mark_failed(job, f"{type(exc).__name__}: {str(exc)[:300]}")
            return None
        if out.stale:
            with self._lock:
                self._dirty.add(job)
        if out.fetch is not None:
            self.fetches[job] = (out.request, out.fetch)
        elif out.done_request is not None or out.localized is not None:
            self.fetches.pop(job, None)
        if out.localized is not None:
            await self.publish(out.localized)
            self.metrics.localize.observe(time.perf_counter() - t0)
        return out

    async def publish(self, loc: Localized, needed: int | None = None) -> None:
        """Store and export a round's verdict; its device only once consecutive rounds agree on it."""
        job = loc.job
        prev = self.agreement.get(job, Agreement())
        self.agreement[job], shown = publish(prev, loc.verdict, loc.evidence, needed or self.confirm_rounds)
        if shown is loc.verdict:
            self.unconfirmed.pop(job, None)
        else:
            self.unconfirmed[job] = loc
        report, markdown = loc.report, loc.markdown
        if shown is not loc.verdict:
            report, markdown = await run_in_threadpool(rerender, shown, loc.report)
        before = self.store.job(job)
        self.store.save_job(job, shown, report, markdown)
        self.metrics.set_verdict(job, shown, loc.onset_unix_s, loc.lost_s, loc.world_size)
        self.failed.pop(job, None)
        # people are told when the status or the named device changes, never about a device still unconfirmed
        was = (before.verdict["status"], device_key(before.verdict)) if before else ("healthy", None)
        if self.notify_url and not shown.get("localizing") and (shown["status"], device_key(shown)) != was:
            asyncio.get_running_loop().run_in_executor(None, self._notify, shown, report, loc.onset_unix_s)

    async def settle(self) -> None:
        """A withheld device is published once no more evidence is coming, so the last round is the
        best answer: every node said its ranks exited and that round saw it, or the job's agents have
        been quiet for `settle_s` (an agent that cannot see its ranks, or one that died)."""
        cut = time.time() - self.settle_s
        for job, loc in list(self.unconfirmed.items()):
            if job in self.fetches or job in self.running:
                continue
            ended = self.ended.get(job, set())
            seen_end = (bool(ended) and set(self.store.nodes(job)) <= ended
                        and loc.upto >= self.store.last_id(job))  # that round read the nodes' last posts
            if seen_end or self.metrics.job(job).last_post < cut:
                await self.publish(loc, needed=1)

    def prune(self) -> int:
        """Apply the retention and the per-job cap; forget jobs the store forgot. Summaries deleted."""
        gone, jobs = self.store.prune(time.time_ns() - int(self.retention_s * 1e9), self.max_rows_per_job)
        self.metrics.pruned.inc(gone)
        with self._lock:
            for job in jobs:
                self.agreement.pop(job, None)
                self.unconfirmed.pop(job, None)
                self.ended.pop(job, None)
                self.failed.pop(job, None)
                self._groups.pop(job, None)
                self.fetches.pop(job, None)
                self.workers.forget(job)
                self._nodes = {k: v for k, v in self._nodes.items() if k[0] != job}
        return gone

    async def maintain(self) -> None:
        """The loop's housekeeping: publish settled devices; prune every PRUNE_EVERY_S (or sooner for a short retention)."""
        await self.settle()
        if time.monotonic() >= self.next_prune:
            self.next_prune = time.monotonic() + min(PRUNE_EVERY_S, self.retention_s / 10)
            await run_in_threadpool(self.prune)

    def mark_failed(self, job: str, reason: str) -> None:
        self.failed[job] = reason
        self.store.fail_job(job, reason)
        self.metrics.set_failed(job, reason)
        emit(f"laggard serve: job {job}: localization failed: {reason}", file=sys.stderr)

    def _notify(self, verdict: dict[str, Any], report: dict[str, Any], onset: float | None) -> None:
        """Alertmanager/Slack alert: startsAt = the onset, generatorURL = this service's report page."""
        assert self.notify_url is not None
        rep = service_report(verdict, pd.DataFrame(report.get("steps", [])), int(report["world_size"]))
        link = f"{self.external_url}/v1/jobs/{rep.job}/report" if self.external_url else None
        start = datetime.fromtimestamp(onset, UTC) if onset else None
        if not notify_with_retry(rep, self.notify_url, link=link, starts_at=start):
            self.metrics.notify_failed.inc()

    async def html(self, job: str) -> str | None:
        """The job's HTML report: cached, or rendered now (in the worker when there is one)."""
        cached = self.store.rendered(job, "html")
        if cached:
            return cached
        state = self.store.job(job)
        if state is None:
            return None
        text = await self.workers.run(job, self.job_timeout_s, render_job_html, state.verdict, state.report)
        self.store.save_html(job, state.updated_ns, text)
        return text

    def take_dirty(self) -> list[str]:
        """Jobs due a round; quarantined jobs and jobs whose round is still running keep their place."""
        now = time.monotonic()
        with self._lock:
            jobs = sorted(self._dirty | set(self.fetches))
            held = {j for j in jobs if self.quarantine.get(j, 0.0) > now or j in self.running}
            self._dirty = held
        return [j for j in jobs if j not in held]

    def start_rounds(self) -> None:
        """Start a round for every job due one, each on its own: a slow job does not hold up the others."""
        if self.closed:
            return
        for job in self.take_dirty():
            task = asyncio.create_task(self._round_guarded(job))
            self.running[job] = task
            task.add_done_callback(functools.partial(self._ended, job))

    def _ended(self, job: str, _task: asyncio.Task[Any]) -> None:
        self.running.pop(job, None)
        self.wake.set()  # posts that came meanwhile left the job dirty: go round again now

    async def _round_guarded(self, job: str) -> None:
        try:
            await self.round(job)
        except Exception as exc:  # a bug in publishing one job must not end the other jobs' rounds
            self.mark_failed(job, f"{type(exc).__name__}: {str(exc)[:300]}")

    def close(self) -> None:
        # (first: a cancelled round's end wakes the loop, and a loop whose cancellation was lost
        # would start rounds on the closed store and executor as fast as they fail)
        self.closed = True
        for task in self.running.values():
            task.cancel()
        self.workers.close()
        self.store.close()


async def _read(request: Request, svc: Service, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise svc.reject(413, "too_large", f"body of {declared} bytes is over the {limit}-byte limit; "
                                           "post one node's steps at a time")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise svc.reject(413, "too_large", f"body is over the {limit}-byte limit")
    return bytes(body)


def create_app(db: Path | str, interval_s: float = 10.0, max_body: int = MAX_BODY, isolate: bool = False,
               notify_url: str | None = None, external_url: str = "", ttl_s: float = 3600.0,
               job_timeout_s: float = JOB_TIMEOUT_S, confirm_rounds: int = NEEDED,
               settle_s: float = SETTLE_S, retention_s: float = RETENTION_S,
               max_rows_per_job: int = 0, workers: int = WORKERS) -> FastAPI:
    """The app; `isolate` localizes in a worker process (what `laggard serve` does)."""
    svc = Service(db, max_body=max_body, isolate=isolate, notify_url=notify_url, external_url=external_url,
                  ttl_s=ttl_s, job_timeout_s=job_timeout_s, confirm_rounds=confirm_rounds,
                  settle_s=settle_s, retention_s=retention_s, max_rows_per_job=max_rows_per_job,
                  workers=workers)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def loop() -> None:
            while not svc.closed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(svc.wake.wait(), interval_s)
                svc.wake.clear()
                svc.start_rounds()
                try:
                    await svc.maintain()
                except Exception as exc:  # the store refused (disk full, database gone): say so, go on
                    emit(f"laggard serve: housekeeping failed: {type(exc).__name__}: {str(exc)[:300]}",
                         file=sys.stderr)

        svc.workers.warm()
        task = asyncio.create_task(loop()) if interval_s > 0 else None
        yield
        # the workers go first: whatever the loop awaits (a round, housekeeping) cannot hold the stop
        if task:
            task.cancel()
        svc.close()
        if task:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 2)

    app = FastAPI(title="laggard", lifespan=lifespan)
    app.state.service = svc

    @app.post("/v1/summaries", status_code=202)
    async def post_summary(request: Request) -> dict[str, Any]:
        t0 = time.perf_counter()
        new, s = svc.ingest(await _read(request, svc, svc.max_body))
        svc.metrics.ingest.labels("summary").observe(time.perf_counter() - t0)
        out: dict[str, Any] = {"stored": new, "duplicate": not new, "job": s.job, "node": s.node, "window": s.window}
        fetch = svc.fetch_for(s.job, s.node)
        if fetch is not None:
            out["fetch"] = fetch
        return out

    @app.post("/v1/records", status_code=202)
    async def post_records(request: Request) -> dict[str, Any]:
        t0 = time.perf_counter()
        p = svc.ingest_records(await _read(request, svc, MAX_RECORDS_BODY))
        svc.metrics.ingest.labels("records").observe(time.perf_counter() - t0)
        return {"stored": len(p.rows.rank), "job": p.job, "node": p.node, "request": p.request}

    @app.get("/v1/jobs/{job}/fetch", response_model=None)
    def fetch(job: str, node: str) -> dict[str, Any] | Response:
        f = svc.fetch_for(job, node)
        return Response(status_code=204) if f is None else f

    @app.get("/v1/jobs")
    def jobs() -> list[dict[str, Any]]:
        return [{"job": s.job, "status": s.verdict["status"], "slowdown": s.verdict["slowdown"],
                 "root_cause": (s.report.get("root_cause") or {}).get("device"),
                 "localizing": bool(s.verdict.get("localizing")), "updated_ns": s.updated_ns,
                 "failed": svc.failed.get(s.job)}
                for s in svc.store.jobs()]

    @app.get("/v1/jobs/{job}")
    def job(job: str) -> dict[str, Any]:
        state = svc.store.job(job)
        if state is None:
            why = svc.failed.get(job)
            raise HTTPException(404, detail={"reason": "localization_failed" if why else "unknown_job",
                                             "detail": why or f"no verdict for job {job} yet"})
        return state.verdict

    @app.get("/v1/jobs/{job}/report")
    async def report(job: str, format: str = "html") -> Response:
        if format not in ("html", "md", "json"):
            raise HTTPException(400, detail={"reason": "bad_format", "detail": "format is html, md or json"})
        text = await svc.html(job) if format == "html" else svc.store.rendered(job, format)
        if text is None:
            raise HTTPException(404, detail={"reason": "unknown_job", "detail": f"no report for job {job} yet"})
        if format == "html":
            return HTMLResponse(text)
        if format == "json":
            return JSONResponse(json.loads(text))
        return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")

    @app.get("/v1/jobs/{job}/stats")
    def stats(job: str) -> dict[str, int]:
        return svc.store.stats(job)

    @app.post("/v1/jobs/{job}/localize")
    async def localize_now(job: str) -> dict[str, Any]:
        """Run rounds until a verdict (answering fetches needs the agents: 202 while they are asked)."""
        out = await svc.round(job)
        if job in svc.failed and (out is None or out.localized is None):
            raise HTTPException(500, detail={"reason": "localization_failed", "detail": svc.failed[job]})
        if out is not None and out.localized is None and job in svc.fetches:
            request, plan = svc.fetches[job]
            return JSONResponse({"status": "fetching", "fetch": plan, "request": request},
                                status_code=202)  # type: ignore[return-value]
        state = svc.store.job(job)  # what is published (a device only once rounds agree), not the raw round
        if state is None:
            raise HTTPException(404, detail={"reason": "unknown_job", "detail": f"no summaries for job {job}"})
        return state.verdict

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(svc.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        if svc.failed:
            return {"status": "degraded", "failed_jobs": dict(svc.failed)}
        return {"status": "ok"}

    return app

