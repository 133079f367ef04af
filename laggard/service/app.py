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
import json
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
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
from laggard.service.localizing import Round, localize_round, render_job_html, service_report
from laggard.service.metrics import Metrics
from laggard.service.schema import RecordsPost, SummaryPost
from laggard.service.store import Store
from laggard.service.worker import die_with_parent, warm

MAX_BODY = 4 << 20  # bytes: a node's summary of a few hundred steps fits easily; more is a bug upstream
MAX_RECORDS_BODY = 64 << 20  # a fetch answer: a node's planned ranks for a few steps
M = TypeVar("M", bound=BaseModel)
JOB_TIMEOUT_S = 120.0  # one job's round; longer is a stall: the worker is replaced, the job marked failed
QUARANTINE_S = 600.0  # a job whose round stalled is left out of the rounds this long, so it cannot stall them all


class Service:
    """State shared by the endpoints and the localization loop."""

    def __init__(self, db: Path | str, max_body: int = MAX_BODY, isolate: bool = False,
                 notify_url: str | None = None, external_url: str = "", ttl_s: float = 3600.0,
                 job_timeout_s: float = JOB_TIMEOUT_S) -> None:
        self.store = Store(db)
        self.isolate = isolate
        self.pool = _pool() if isolate else None
        self.metrics = Metrics(ttl_s)
        self.max_body = max_body
        self.notify_url = notify_url
        self.external_url = external_url.rstrip("/")
        self.job_timeout_s = job_timeout_s
        self.wake = asyncio.Event()
        self._dirty: set[str] = set(self.store.jobs_with_summaries())  # re-localize after a restart
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, str], str] = {}  # what each node last said about its ranks
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
            if self.pool is None:
                out = await asyncio.wait_for(run_in_threadpool(localize_round, self.store.url, job),
                                             self.job_timeout_s)
            else:
                loop = asyncio.get_running_loop()
                out = await asyncio.wait_for(loop.run_in_executor(self.pool, localize_round, self.store.url, job),
                                             self.job_timeout_s)
        except TimeoutError:
            self._replace_pool()
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
            loc = out.localized
            self.metrics.localize.observe(time.perf_counter() - t0)
            before = self.store.job(job)
            self.store.save_job(job, loc.verdict, loc.report, loc.markdown)
            self.metrics.set_verdict(job, loc.verdict, loc.onset_unix_s, loc.lost_s, loc.world_size)
            self.failed.pop(job, None)
            was = before.verdict["status"] if before else "healthy"
            if self.notify_url and loc.verdict["status"] != was:
                asyncio.get_running_loop().run_in_executor(None, self._notify, loc.verdict, loc.report,
                                                           loc.onset_unix_s)
        return out

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

    def _replace_pool(self) -> None:
        if self.pool is not None:
            _kill_pool(self.pool)
            self.pool = _pool()

    async def html(self, job: str) -> str | None:
        """The job's HTML report: cached, or rendered now (in the worker when there is one)."""
        cached = self.store.rendered(job, "html")
        if cached:
            return cached
        state = self.store.job(job)
        if state is None:
            return None
        if self.pool is None:
            text = await run_in_threadpool(render_job_html, state.verdict, state.report)
        else:
            loop = asyncio.get_running_loop()
            text = await loop.run_in_executor(self.pool, render_job_html, state.verdict, state.report)
        self.store.save_html(job, state.updated_ns, text)
        return text

    def take_dirty(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            jobs = sorted(self._dirty | set(self.fetches))
            held = {j for j in jobs if self.quarantine.get(j, 0.0) > now}
            self._dirty = held  # a quarantined job keeps its place for when it is let out
        return [j for j in jobs if j not in held]

    def close(self) -> None:
        if self.pool is not None:
            _kill_pool(self.pool)
        self.store.close()


def _pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent,
                               initargs=(os.getpid(),))


def _kill_pool(pool: ProcessPoolExecutor) -> None:
    """Stop the worker now: a round in progress is abandoned (its job is localized again later)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout=2)


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
               job_timeout_s: float = JOB_TIMEOUT_S) -> FastAPI:
    """The app; `isolate` localizes in a worker process (what `laggard serve` does)."""
    svc = Service(db, max_body=max_body, isolate=isolate, notify_url=notify_url, external_url=external_url,
                  ttl_s=ttl_s, job_timeout_s=job_timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(svc.wake.wait(), interval_s)
                svc.wake.clear()
                for job in svc.take_dirty():
                    await svc.round(job)

        if svc.pool is not None:  # start the worker now: its imports take seconds, done while posts arrive
            svc.pool.submit(warm)
        task = asyncio.create_task(loop()) if interval_s > 0 else None
        yield
        if task:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        svc.close()

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
                 "root_cause": (s.report.get("root_cause") or {}).get("device"), "updated_ns": s.updated_ns,
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
        if out is None or out.localized is None:
            state = svc.store.job(job)
            if state is None:
                raise HTTPException(404, detail={"reason": "unknown_job", "detail": f"no summaries for job {job}"})
            return state.verdict
        return out.localized.verdict

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(svc.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        if svc.failed:
            return {"status": "degraded", "failed_jobs": dict(svc.failed)}
        return {"status": "ok"}

    return app

