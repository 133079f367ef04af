"""The service in-process: ingest, refusals, continuous localization, metrics, reports, restarts."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from collector.traceio import Trace
from laggard.service.app import create_app
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace
from tests.laggard.sidecar_summaries import trace_summaries

ROOT = 21


@pytest.fixture(scope="module")
def summaries(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("sim") / "t"
    cfg = SimConfig(gpus=32, tp=8, pp=2, steps=24, seed=5, job="svc-job",
                    faults=[FaultSpec("gpu", 2.0, rank=ROOT, steps=(10, 23))])
    simulate_trace(cfg, out)
    return trace_summaries(Trace.open(out))


def _client(db: Path, **kw: Any) -> TestClient:
    return TestClient(create_app(db, interval_s=0, **kw))


def _post_all(client: TestClient, summaries: list[dict[str, Any]]) -> None:
    for s in summaries:
        r = client.post("/v1/summaries", json=s)
        assert r.status_code == 202, r.text
        assert r.json()["stored"] is True


def test_ingest_localize_metrics_and_report(tmp_path: Path, summaries: list[dict[str, Any]]) -> None:
    with _client(tmp_path / "s.db") as c:
        _post_all(c, summaries)
        assert c.get("/v1/jobs/svc-job/stats").json()["summaries"] == len(summaries)
        verdict = c.post("/v1/jobs/svc-job/localize").json()
        assert verdict["status"] == "irregular" and verdict["candidates"][0]["rank"] == ROOT
        assert min(verdict["irregular_steps"]) >= 10 and verdict["slowdown"] > 1.1
        metrics = c.get("/metrics").text
        assert 'laggard_job_irregular{job="svc-job"} 1' in metrics
        assert f'laggard_summaries_received_total{{job="svc-job"}} {len(summaries)}' in metrics
        line = next(ln for ln in metrics.splitlines() if ln.startswith("laggard_candidate_score") and 'rank_order="1"' in ln)
        assert f"gpu rank {ROOT} " in line and float(line.rsplit(" ", 1)[1]) > 0.3
        assert "# TYPE laggard_ingest_seconds histogram" in metrics
        html = c.get("/v1/jobs/svc-job/report")
        assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
        assert f"gpu rank {ROOT}" in html.text and "data:image/svg+xml;base64," in html.text
        md = c.get("/v1/jobs/svc-job/report", params={"format": "md"}).text
        assert md.startswith("# laggard report: svc-job")
        assert c.get("/v1/jobs/svc-job/report", params={"format": "json"}).json()["root_cause"]["rank"] == ROOT
        assert c.get("/v1/jobs").json()[0]["status"] == "irregular"


def test_retried_post_is_not_counted_twice(tmp_path: Path, summaries: list[dict[str, Any]]) -> None:
    with _client(tmp_path / "s.db") as c:
        _post_all(c, summaries[:3])
        again = c.post("/v1/summaries", json=summaries[0])
        assert again.status_code == 202 and again.json()["duplicate"] is True
        assert c.get("/v1/jobs/svc-job/stats").json()["summaries"] == 3


def test_bad_posts_get_4xx_with_a_reason_and_lose_nothing(tmp_path: Path, summaries: list[dict[str, Any]]) -> None:
    with _client(tmp_path / "s.db", max_body=200_000) as c:
        _post_all(c, summaries[:4])
        bad_op = copy.deepcopy(summaries[1])
        bad_op["window"] = 999
        bad_op["ops"] = [{**summaries[1]["ops"][0], "op": "teleport"}] if summaries[1]["ops"] else [
            {"rank": bad_op["ranks"][0], "group": "tp-0", "op": "teleport", "seq": 1, "elapsed": 1, "step": 1, "score": 1}]
        stray = copy.deepcopy(summaries[1])
        stray["window"] = 998
        elsewhere = next(r for r in range(stray["world_size"]) if r not in stray["ranks"])
        stray["ops"] = [{"rank": elsewhere, "group": "tp-0", "op": "all_reduce", "seq": 1, "elapsed": 1.0, "step": 1, "score": 0.9}]
        missing = {k: v for k, v in summaries[1].items() if k != "node"}
        cases = [
            (b"{not json", 400, "not_json"),
            (json.dumps(bad_op).encode(), 422, "invalid"),
            (json.dumps(stray).encode(), 422, "invalid"),
            (json.dumps(missing).encode(), 422, "invalid"),
            (json.dumps({**summaries[1], "window": 997, "pad": "x" * 300_000}).encode(), 413, "too_large"),
        ]
        for body, status, reason in cases:
            r = c.post("/v1/summaries", content=body, headers={"content-type": "application/json"})
            assert r.status_code == status, r.text
            assert r.json()["detail"]["reason"] == reason and r.json()["detail"]["detail"]
        assert "teleport" in c.post("/v1/summaries", json=bad_op).json()["detail"]["detail"]
        assert "not on node" in c.post("/v1/summaries", json=stray).json()["detail"]["detail"]
        assert c.get("/v1/jobs/svc-job/stats").json()["summaries"] == 4
        metrics = c.get("/metrics").text
        assert 'laggard_summaries_rejected_total{reason="invalid"} 5' in metrics
        assert 'laggard_summaries_rejected_total{reason="too_large"} 1' in metrics


def test_state_survives_a_restart(tmp_path: Path, summaries: list[dict[str, Any]]) -> None:
    db = tmp_path / "s.db"
    with _client(db) as c:
        _post_all(c, summaries)
        before = c.post("/v1/jobs/svc-job/localize").json()
        c.post("/v1/summaries", content=b"[", headers={"content-type": "application/json"})
    with _client(db) as c:
        assert c.get("/v1/jobs/svc-job").json() == before
        assert c.get("/v1/jobs/svc-job/stats").json()["summaries"] == len(summaries)
        metrics = c.get("/metrics").text
        assert f'laggard_summaries_received_total{{job="svc-job"}} {len(summaries)}' in metrics
        assert 'laggard_summaries_rejected_total{reason="not_json"} 1' in metrics
        assert 'laggard_job_irregular{job="svc-job"} 1' in metrics
        assert f"gpu rank {ROOT}" in c.get("/v1/jobs/svc-job/report").text


def test_unknown_job_and_format(tmp_path: Path) -> None:
    with _client(tmp_path / "s.db") as c:
        assert c.get("/v1/jobs/nope").status_code == 404
        assert c.get("/v1/jobs/nope/report").json()["detail"]["reason"] == "unknown_job"
        assert c.get("/v1/jobs/nope/report", params={"format": "pdf"}).status_code == 400
        assert c.post("/v1/jobs/nope/localize").status_code == 404


@pytest.mark.slow
def test_laggard_serve_runs_uvicorn_on_loopback(tmp_path: Path, summaries: list[dict[str, Any]]) -> None:
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    from tests.conftest import REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "laggard", "serve", "--port", str(port), "--db", str(tmp_path / "s.db"),
                             "--interval", "0.5"], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        for s in summaries:
            assert httpx.post(base + "/v1/summaries", json=s, timeout=10).status_code == 202
        for _ in range(100):  # the background loop localizes on its own, once everything is in
            r = httpx.get(base + "/v1/jobs/svc-job", timeout=5)
            if r.status_code == 200 and r.json()["summaries"] == len(summaries):
                break
            time.sleep(0.2)
        assert r.json()["candidates"][0]["rank"] == ROOT
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_groups_may_be_ranges(tmp_path: Path, summaries: list[dict[str, Any]]) -> None:
    s = copy.deepcopy(summaries[0])
    s["groups"] = {"dp-x": "0:32:8", "tp-x": list(range(8))}
    with _client(tmp_path / "s.db") as c:
        assert c.post("/v1/summaries", json=s).status_code == 202
        svc = c.app.state.service  # type: ignore[attr-defined]
        assert svc.store.groups(s["job"])["dp-x"] == [0, 8, 16, 24]
        bad = {**s, "window": 77, "groups": {"dp-y": "0:abc"}}
        r = c.post("/v1/summaries", json=bad)
        assert r.status_code == 422 and "start:stop:step" in r.json()["detail"]["detail"]
        assert c.post("/v1/summaries", json={**s, "window": 78, "groups": {"dp-z": "0:99999:8"}}).status_code == 422
