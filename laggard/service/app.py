"""The HTTP service: sidecars post summaries, a loop localizes each job, people read metrics and reports.

Endpoints
  POST /v1/summaries             one `schema.Summary` (JSON); 202 once committed to SQLite
  GET  /v1/jobs                  every job's status, slowdown and root cause
  GET  /v1/jobs/{job}            the job's latest verdict (the verdict JSON of docs/verdict.md)
  GET  /v1/jobs/{job}/report     the latest report (?format=html|md|json)
  GET  /v1/jobs/{job}/stats      summaries stored, nodes, last window
  POST /v1/jobs/{job}/localize   localize now instead of waiting for the loop
  GET  /metrics                  Prometheus text exposition
  GET  /healthz
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from explain.report.build import report_from_verdict
from explain.report.html import render_html
from explain.report.markdown import render_markdown
from explain.report.model import Report, irregular_windows
from laggard.service.localizer import Batch, batch_from_summaries, localize_batch
from laggard.service.metrics import Metrics
from laggard.service.schema import Summary
from laggard.service.store import Store
from localize.verdict import Verdict

MAX_BODY = 4 << 20  # bytes: a node's abnormal operators for 10 s fit easily; more is a bug upstream
RECENT_WINDOWS = 30  # localize over the last 30 windows (5 minutes at 10 s)


class Service:
    """State shared by the endpoints and the localization loop."""

    def __init__(self, db: Path | str, max_body: int = MAX_BODY, windows: int = RECENT_WINDOWS,
                 isolate: bool = False) -> None:
        self.store = Store(db)
        # one worker process for localization and rendering; None = in a thread of this process
        self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) if isolate else None
        self.metrics = Metrics()
        self.max_body = max_body
        self.windows = windows
        self._dirty: set[str] = set(self.store.jobs_with_summaries())  # re-localize after a restart
        self._dirty_lock = threading.Lock()
        self._groups: dict[str, dict[str, list[int]]] = {}
        for job, n in self.store.counts().items():
            self.metrics.received[job] = n
        self.metrics.rejected.update(self.store.rejected())
        for state in self.store.jobs():
            self.metrics.set_verdict(state.job, state.verdict, state.report)

    def reject(self, status: int, reason: str, detail: str) -> HTTPException:
        self.metrics.rejected[reason] = self.metrics.rejected.get(reason, 0) + 1
        self.store.count_rejected(reason)
        return HTTPException(status, detail={"reason": reason, "detail": detail})

    def ingest(self, body: bytes) -> tuple[bool, Summary]:
        """Validate and commit one summary (about a millisecond: done inline, no thread hop)."""
        try:
            summary = Summary.model_validate_json(body)
        except ValidationError as exc:
            errors = exc.errors()
            err = errors[0]
            if err.get("type") == "json_invalid":
                raise self.reject(400, "not_json", f"body is not JSON: {err.get('msg')}") from exc
            where = ".".join(str(p) for p in err.get("loc", ()))
            got = err.get("input")
            shown = f" (got {got!r})" if isinstance(got, str | int | float) and len(repr(got)) < 80 else ""
            raise self.reject(422, "invalid", f"{where}: {err.get('msg')}{shown}" + (
                f" ({len(errors)} problems)" if len(errors) > 1 else "")) from exc
        if summary.groups:
            # every node of a DP group sends the same membership: store only what is new
            groups = summary.members()
            if summary.job not in self._groups:
                self._groups[summary.job] = self.store.groups(summary.job)
            known = self._groups[summary.job]
            fresh = {g: m for g, m in groups.items() if known.get(g) != sorted(m)}
            if fresh:
                self.store.add_groups(summary.job, fresh)
                known.update({g: sorted(m) for g, m in fresh.items()})
        stored = summary.model_dump_json(exclude={"groups"}) if summary.groups else body.decode()
        new = self.store.add_summary(summary.job, summary.node, summary.window, stored)
        if new:
            self.metrics.received[summary.job] = self.metrics.received.get(summary.job, 0) + 1
            with self._dirty_lock:
                self._dirty.add(summary.job)
        return new, summary

    def localize(self, job: str) -> dict[str, Any] | None:
        """Localize one job here, in this process (tests, and the first round before a pool exists)."""
        return self.save(localize_job(self.store.path, job, self.windows))

    async def localize_async(self, job: str) -> dict[str, Any] | None:
        """Localize in the worker process, so rendering figures never stalls ingest (the GIL)."""
        if self.pool is None:
            return await run_in_threadpool(self.localize, job)
        loop = asyncio.get_running_loop()
        return self.save(await loop.run_in_executor(self.pool, localize_job, self.store.path, job, self.windows))

    def save(self, result: Localized | None) -> dict[str, Any] | None:
        if result is None:
            return None
        self.store.save_job(result.job, result.verdict, result.report, result.markdown)
        self.metrics.set_verdict(result.job, result.verdict, result.report)
        self.metrics.localize_s[result.job] = result.seconds
        return result.verdict

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
        with self._dirty_lock:
            jobs, self._dirty = sorted(self._dirty), set()
        return jobs


@dataclass
class Localized:
    job: str
    verdict: dict[str, Any]
    report: dict[str, Any]
    markdown: str
    seconds: float


@dataclass
class _JobCache:
    """What a worker already parsed of one job: the last row read, and columns per window."""

    rowid: int = 0
    world: int = 0
    windows: dict[int, list[Batch]] = field(default_factory=dict)


_CACHE: dict[tuple[str, str], _JobCache] = {}


def localize_job(db: str, job: str, windows: int) -> Localized | None:
    """Verdict and report of one job from its recent summaries (runs in the worker process).

    Only summaries stored since the last round are parsed; older windows stay cached as
    columns, so a round costs the new posts plus vectorized work, not a re-read of everything."""
    cache = _CACHE.setdefault((db, job), _JobCache())
    store = Store(db)
    try:
        rows = store.rows_since(job, cache.rowid)
        groups = store.groups(job)
    finally:
        store.close()
    if rows:
        cache.rowid = rows[-1][0]
        parsed = [json.loads(body) for _, body in rows]
        cache.world = int(parsed[-1]["world_size"])
        for w in sorted({int(p["window"]) for p in parsed}):
            cache.windows.setdefault(w, []).append(batch_from_summaries([p for p in parsed if p["window"] == w]))
    if not cache.windows:
        return None
    newest = max(cache.windows)
    for w in [w for w in cache.windows if w <= newest - windows]:
        del cache.windows[w]
    t0 = time.perf_counter()
    batch = Batch.concat([b for w in sorted(cache.windows) for b in cache.windows[w]])
    verdict, steps = localize_batch(job, batch, groups)
    report = service_report(verdict.to_dict(), steps, cache.world)
    return Localized(job, verdict.to_dict(), report.to_dict(), render_markdown(report), time.perf_counter() - t0)


def service_report(verdict: dict[str, Any], steps: pd.DataFrame, world: int) -> Report:
    """The report the service serves: the verdict, the step times, and where they came from."""
    report = report_from_verdict(Verdict.from_dict(verdict), None, None, world_size=world)
    if not steps.empty:
        report.steps = steps
        report.windows = irregular_windows(steps)
        irr = steps[steps["irregular"].astype(bool)]
        report.lost_s = float((irr["duration_s"] - irr["baseline_s"]).clip(lower=0).sum())
    extra = verdict
    report.notes.append(f"from {extra.get('summaries')} sidecar summaries of {extra.get('nodes')} nodes "
                        f"(windows {extra['windows'][0]}..{extra['windows'][1]})")
    return report


def render_job_html(verdict: dict[str, Any], report: dict[str, Any]) -> str:
    """HTML of a stored report, rendered when someone asks for it (figures cost seconds)."""
    return render_html(service_report(verdict, pd.DataFrame(report.get("steps", [])), int(report["world_size"])))


def _warm() -> None:
    """Run in the worker once at startup so its imports are done before the first localization."""


def create_app(db: Path | str, interval_s: float = 10.0, max_body: int = MAX_BODY, isolate: bool = False) -> FastAPI:
    """The app; `isolate` localizes in a worker process (what `laggard serve` does)."""
    svc = Service(db, max_body=max_body, isolate=isolate)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                for job in svc.take_dirty():
                    await svc.localize_async(job)

        if svc.pool is not None:  # start the worker (imports take seconds) before taking load
            await asyncio.get_running_loop().run_in_executor(svc.pool, _warm)
        task = asyncio.create_task(loop()) if interval_s > 0 else None
        yield
        if task:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if svc.pool:
            svc.pool.shutdown(cancel_futures=True)
        svc.store.close()

    app = FastAPI(title="laggard", lifespan=lifespan)
    app.state.service = svc

    @app.post("/v1/summaries", status_code=202)
    async def post_summary(request: Request) -> dict[str, Any]:
        t0 = time.perf_counter()
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > svc.max_body:
            raise svc.reject(413, "too_large", f"body of {declared} bytes is over the {svc.max_body}-byte limit; "
                                               "post one node's window at a time")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > svc.max_body:
                raise svc.reject(413, "too_large", f"body is over the {svc.max_body}-byte limit")
        new, summary = svc.ingest(bytes(body))
        svc.metrics.observe_ingest(time.perf_counter() - t0)
        return {"stored": new, "duplicate": not new, "job": summary.job, "node": summary.node,
                "window": summary.window}

    @app.get("/v1/jobs")
    def jobs() -> list[dict[str, Any]]:
        return [{"job": s.job, "status": s.verdict["status"], "slowdown": s.verdict["slowdown"],
                 "root_cause": (s.report.get("root_cause") or {}).get("device"), "updated_ns": s.updated_ns}
                for s in svc.store.jobs()]

    @app.get("/v1/jobs/{job}")
    def job(job: str) -> dict[str, Any]:
        state = svc.store.job(job)
        if state is None:
            raise HTTPException(404, detail={"reason": "unknown_job", "detail": f"no verdict for job {job} yet"})
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
        verdict = await svc.localize_async(job)
        if verdict is None:
            raise HTTPException(404, detail={"reason": "unknown_job", "detail": f"no summaries for job {job}"})
        return verdict

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(svc.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
