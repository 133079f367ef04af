"""The HTTP service: sidecars post summaries, a loop localizes each job, people read metrics and reports.

Endpoints
  POST /v1/summaries             one `schema.Summary` (JSON); 202 once committed to SQLite
  GET  /v1/jobs                  every job's status, slowdown and root cause
  GET  /v1/jobs/{job}            the job's latest verdict (the DESIGN.md verdict JSON)
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
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from explain.report.build import report_from_verdict
from explain.report.html import render_html
from explain.report.markdown import render_markdown
from explain.report.model import irregular_windows
from laggard.service.localizer import localize_summaries
from laggard.service.metrics import Metrics
from laggard.service.schema import Summary
from laggard.service.store import Store

MAX_BODY = 4 << 20  # bytes: a node's abnormal operators for 10 s fit easily; more is a bug upstream
RECENT_WINDOWS = 30  # localize over the last 30 windows (5 minutes at 10 s)


class Service:
    """State shared by the endpoints and the localization loop."""

    def __init__(self, db: Path | str, max_body: int = MAX_BODY, windows: int = RECENT_WINDOWS) -> None:
        self.store = Store(db)
        self.metrics = Metrics()
        self.max_body = max_body
        self.windows = windows
        self._dirty: set[str] = set(self.store.jobs_with_summaries())  # re-localize after a restart
        self._dirty_lock = threading.Lock()
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
        try:
            raw = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise self.reject(400, "not_json", f"body is not JSON: {exc}") from exc
        try:
            summary = Summary.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ()))
            raise self.reject(422, "invalid", f"{where}: {err.get('msg')}" + (
                f" ({len(exc.errors())} problems)" if len(exc.errors()) > 1 else "")) from exc
        if summary.groups:
            self.store.add_groups(summary.job, summary.groups)
        new = self.store.add_summary(summary.job, summary.node, summary.window, summary.model_dump_json())
        if new:
            self.metrics.received[summary.job] = self.metrics.received.get(summary.job, 0) + 1
            with self._dirty_lock:
                self._dirty.add(summary.job)
        return new, summary

    def localize(self, job: str) -> dict[str, Any] | None:
        """Localize one job from its recent summaries and store the verdict and the report."""
        summaries = self.store.recent(job, self.windows)
        if not summaries:
            return None
        t0 = time.perf_counter()
        verdict, steps = localize_summaries(summaries, self.store.groups(job))
        world = max(int(s["world_size"]) for s in summaries)
        report = report_from_verdict(verdict, None, None, world_size=world)
        if not steps.empty:
            report.steps = steps
            report.windows = irregular_windows(steps)
            irr = steps[steps["irregular"]]
            report.lost_s = float((irr["duration_s"] - irr["baseline_s"]).clip(lower=0).sum())
        report.notes.append(f"from {len(summaries)} sidecar summaries of {verdict.extra['nodes']} nodes "
                            f"(windows {verdict.extra['windows'][0]}..{verdict.extra['windows'][1]})")
        vd, rd = verdict.to_dict(), report.to_dict()
        self.store.save_job(job, vd, rd, render_markdown(report), render_html(report))
        self.metrics.set_verdict(job, vd, rd)
        self.metrics.localize_s[job] = time.perf_counter() - t0
        return vd

    def localize_dirty(self) -> list[str]:
        with self._dirty_lock:
            jobs, self._dirty = sorted(self._dirty), set()
        for job in jobs:
            self.localize(job)
        return jobs


def create_app(db: Path | str, interval_s: float = 10.0, max_body: int = MAX_BODY) -> FastAPI:
    svc = Service(db, max_body=max_body)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                await run_in_threadpool(svc.localize_dirty)

        task = asyncio.create_task(loop()) if interval_s > 0 else None
        yield
        if task:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
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
        new, summary = await run_in_threadpool(svc.ingest, bytes(body))
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
    def report(job: str, format: str = "html") -> Response:
        if format not in ("html", "md", "json"):
            raise HTTPException(400, detail={"reason": "bad_format", "detail": "format is html, md or json"})
        text = svc.store.rendered(job, format)
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
    def localize_now(job: str) -> dict[str, Any]:
        verdict = svc.localize(job)
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
