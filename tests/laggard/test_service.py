"""The service in-process: agents' posts, progressive fetching, refusals, isolation, metrics, restarts."""

from __future__ import annotations

import copy
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from laggard.service import app as service_app
from laggard.service.app import create_app
from localize.summary import MAX_NORMAL, MAX_STEPS
from tests.laggard.agents import agents, localize, sharded_job

ROOT = 21  # node-2 gpu 5


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sharded_job(tmp_path_factory.mktemp("svc"))


def _client(db: Path, **kw: Any) -> TestClient:
    """The service with every round's device published (these tests post a finished job at once;
    test_service_publish.py covers the rule that waits for agreeing rounds)."""
    kw.setdefault("confirm_rounds", 1)
    return TestClient(create_app(db, interval_s=0, **kw))


def _posts(trace: Path, tmp: Path) -> list[dict[str, Any]]:
    """What the agents would post (built, not sent)."""
    out = []
    for a in agents(trace, TestClient(create_app(tmp / "unused.db", interval_s=0)), tmp / "spool-built"):
        out += [json.loads(b) for _, b in a.summarize_new(final=True)]
    return out


def _metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_agents_post_the_service_fetches_and_names_the_slow_gpu(tmp_path: Path, trace: Path) -> None:
    with _client(tmp_path / "s.db") as c:
        nodes = agents(trace, c, tmp_path / "spool")
        for a in nodes:
            a.step(final=True)
            assert a.posted == 3 and a.refused == 0 and not a.spool.items()
        first = c.post("/v1/jobs/svc-job/localize")
        assert first.status_code == 202 and first.json()["status"] == "fetching"
        asked = first.json()["fetch"]
        assert str(ROOT) not in asked and ROOT in asked["node-2"]["ranks"]  # only some ranks, only some steps
        assert sum(len(v["ranks"]) for v in asked.values()) < 32 and len(asked["node-2"]["steps"]) <= 2 * MAX_STEPS + MAX_NORMAL
        verdict = localize(c, "svc-job", nodes)
        assert verdict["status"] == "irregular" and verdict["candidates"][0]["rank"] == ROOT
        assert min(verdict["irregular_steps"]) >= 12 and verdict["slowdown"] > 1.1
        assert sum(a.answered for a in nodes) == len(asked)
        m = c.get("/metrics").text
        assert _metric(m, "laggard_job_irregular", job_name="svc-job") == 1
        assert _metric(m, "laggard_summaries_received_total", job_name="svc-job") == 12
        score = _metric(m, "laggard_candidate_score", job_name="svc-job", position="1", kind="gpu", host="node-2",
                        gpu="5", rank=str(ROOT))
        assert score is not None and score > 0.3
        assert (_metric(m, "laggard_job_lost_gpu_seconds_total", job_name="svc-job") or 0) > 0
        assert (_metric(m, "laggard_job_onset_timestamp_seconds", job_name="svc-job") or 0) > 1e9
        assert _metric(m, "laggard_build_info") == 1 and "process_resident_memory_bytes" in m
        assert 'job="' not in m  # Prometheus' own label is left to Prometheus
        html = c.get("/v1/jobs/svc-job/report")
        assert html.status_code == 200 and f"gpu rank {ROOT}" in html.text
        assert c.get("/v1/jobs/svc-job/report", params={"format": "md"}).text.startswith("# laggard report: svc-job")
        assert c.get("/v1/jobs/svc-job/report", params={"format": "json"}).json()["root_cause"]["rank"] == ROOT
        assert c.get("/v1/jobs").json()[0]["status"] == "irregular"
        assert c.get("/healthz").json() == {"status": "ok"}


def test_retried_post_is_not_counted_twice(tmp_path: Path, trace: Path) -> None:
    posts = _posts(trace, tmp_path)
    with _client(tmp_path / "s.db") as c:
        for p in posts[:3]:
            assert c.post("/v1/summaries", json=p).json()["stored"] is True
        again = c.post("/v1/summaries", json=posts[0])
        assert again.status_code == 202 and again.json()["duplicate"] is True
        assert c.get("/v1/jobs/svc-job/stats").json()["summaries"] == 3


def _stuck(rank: int) -> dict[str, list[Any]]:
    return {"rank": [rank], "group": ["dp-0"], "op": ["all_reduce"], "seq": [3], "peer": [-1], "nbytes": [8],
            "start_ns": [10**18], "step": [4], "seen_ns": [10**18 + 5 * 10**9], "failed": [False]}


def _bad_posts(p: dict[str, Any]) -> list[tuple[str, dict[str, Any] | bytes, int, str, str]]:
    """(what, body, status, reason, words in the detail) for posts that must be refused."""
    def w(**kv: Any) -> dict[str, Any]:
        q = copy.deepcopy(p)
        q.update(kv)
        return q

    rows = p["rows"]
    def r(**kv: Any) -> dict[str, Any]:
        return w(rows={**rows, **kv})

    n = len(rows["rank"])
    return [
        ("not json", b"{not json", 400, "not_json", "not JSON"),
        ("window 2**64", w(window=2**64), 422, "invalid", "window"),
        ("window 2**63", w(window=2**63), 422, "invalid", "window"),
        ("a huge step end", r(step_end_us=[2**63] * n), 422, "invalid", "step_end_us"),
        ("negative time", r(compute_us=[-1] * n), 422, "invalid", "compute_us"),
        ("a group of a million", w(groups={"dp-x": "0:1000000:1"}), 422, "invalid", "dp-x"),
        ("a group that is not a range", w(groups={"dp-y": "0:abc"}), 422, "invalid", "start:stop:step"),
        ("a range past any world", w(groups={"dp-x": "0:" + "9" * 30 + ":1"}), 422, "invalid", "dp-x"),
        ("a range of a huge step", w(groups={"dp-x": "0:4:-" + "9" * 30}), 422, "invalid", "dp-x"),
        ("an empty range", w(groups={"dp-z": "5:5:1"}), 422, "invalid", "empty"),
        ("columns of different lengths", r(step=rows["step"][:-1]), 422, "invalid", "different lengths"),
        ("step starts of another length", r(step_start_us=rows["step_start_us"][:-1]), 422, "invalid",
         "different lengths"),
        ("rows of another node's rank", r(rank=[31] * n), 422, "invalid", "not on node"),
        ("world_size 2**40", w(world_size=2**40), 422, "invalid", "world_size"),
        ("rank beyond world", w(world_size=2), 422, "invalid", "world_size"),
        ("an unknown field", w(extra=1), 422, "invalid", "extra"),
        ("a missing field", {k: v for k, v in p.items() if k != "node"}, 422, "invalid", "node"),
        ("a name with a newline", w(job="a\nb"), 422, "invalid", "job"),
        ("rows outside the steps", r(step=[10**6] * n), 422, "invalid", "outside steps"),
        ("stuck operators of another node's rank", w(pending=_stuck(31)), 422, "invalid", "not on node"),
        ("a stuck operator seen before it began", w(pending={**_stuck(int(min(p["ranks"]))),
                                                             "seen_ns": [1]}), 422, "invalid", "seen_ns < start_ns"),
        ("too large", w(pad="x" * 300_000), 413, "too_large", "limit"),
    ]


def test_every_bad_post_gets_a_4xx_with_one_reason_and_stores_nothing(tmp_path: Path, trace: Path) -> None:
    p = _posts(trace, tmp_path)[4]  # node-1's first post
    with _client(tmp_path / "s.db", max_body=200_000) as c:
        for what, body, status, reason, words in _bad_posts(p):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            t0 = time.perf_counter()
            r = c.post("/v1/summaries", content=data, headers={"content-type": "application/json"})
            assert r.status_code == status, (what, r.text)
            detail = r.json()["detail"]
            assert detail["reason"] == reason and words in detail["detail"], (what, detail)
            assert time.perf_counter() - t0 < 1.0, what
        assert c.get("/v1/jobs/svc-job/stats").json()["summaries"] == 0
        assert c.post("/v1/summaries", json=p).status_code == 202  # the good one still goes in
        m = c.get("/metrics").text
        assert _metric(m, "laggard_posts_rejected_total", reason="invalid") == 20
        assert _metric(m, "laggard_posts_rejected_total", reason="too_large") == 1
    with sqlite3.connect(tmp_path / "s.db") as db:
        assert db.execute("SELECT COUNT(*) FROM groups WHERE grp IN ('dp-x', 'dp-y', 'dp-z')").fetchone()[0] == 0


def test_an_agent_that_posts_no_step_starts_is_heard(tmp_path: Path, trace: Path) -> None:
    """Step starts came later than the rest of the summary: an older agent's posts go in, and its
    steps read as unknown starts (0), measured end to end."""
    from laggard.service.localizing import parse_post, summary_frame

    p = _posts(trace, tmp_path)[4]
    assert p["rows"].pop("step_start_us")
    with _client(tmp_path / "s.db") as c:
        assert c.post("/v1/summaries", json=p).status_code == 202
    df = summary_frame([parse_post(1, p["node"], json.dumps(p))])
    assert len(df) == len(p["rows"]["rank"]) and (df["step_start_ns"] == 0).all()


def test_records_only_for_an_open_request_and_only_what_was_asked(tmp_path: Path, trace: Path) -> None:
    with _client(tmp_path / "s.db") as c:
        nodes = agents(trace, c, tmp_path / "spool")
        for a in nodes:
            a.step(final=True)
        asked = c.post("/v1/jobs/svc-job/localize").json()
        node, req = "node-2", asked["request"]
        ok = nodes[2].records(asked["fetch"][node]["ranks"], asked["fetch"][node]["steps"])
        body = {"job": "svc-job", "node": node, "request": req, "rows": ok}
        assert c.post("/v1/records", json={**body, "request": req + 7}).json()["detail"]["reason"] == "no_request"
        more = nodes[2].records(list(range(16, 24)), list(range(0, 30)))
        r = c.post("/v1/records", json={**body, "rows": more})
        assert r.status_code == 422 and "not asked for" in r.json()["detail"]["detail"]
        huge = {**ok, "seq": [2**64] * len(ok["seq"])}
        r = c.post("/v1/records", json={**body, "rows": huge})
        assert r.status_code == 422 and "seq" in r.json()["detail"]["detail"]
        backwards = {**ok, "end_ns": [0] * len(ok["end_ns"])}
        assert "ends before it starts" in c.post("/v1/records", json={**body, "rows": backwards}).text
        assert c.post("/v1/records", json=body).status_code == 202


def test_a_poisoned_job_is_marked_failed_and_the_others_go_on(tmp_path: Path, trace: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    real = service_app.localize_round

    def poisoned(db: str, job: str) -> Any:
        if job == "poison":
            raise OverflowError("Python int too large to convert to C long")
        return real(db, job)

    monkeypatch.setattr(service_app, "localize_round", poisoned)
    p = _posts(trace, tmp_path)[0]
    with _client(tmp_path / "s.db") as c:
        assert c.post("/v1/summaries", json={**p, "job": "poison"}).status_code == 202
        nodes = agents(trace, c, tmp_path / "spool")
        for a in nodes:
            a.step(final=True)
        r = c.post("/v1/jobs/poison/localize")
        assert r.status_code == 500 and "OverflowError" in r.json()["detail"]["detail"]
        assert localize(c, "svc-job", nodes)["candidates"][0]["rank"] == ROOT
        health = c.get("/healthz").json()
        assert health["status"] == "degraded" and "OverflowError" in health["failed_jobs"]["poison"]
        m = c.get("/metrics").text
        assert _metric(m, "laggard_job_localization_failed", job_name="poison") == 1
        assert _metric(m, "laggard_job_localization_failed", job_name="svc-job") == 0


def test_state_survives_a_restart(tmp_path: Path, trace: Path) -> None:
    db = tmp_path / "s.db"
    with _client(db) as c:
        nodes = agents(trace, c, tmp_path / "spool")
        for a in nodes:
            a.step(final=True)
        before = localize(c, "svc-job", nodes)
        c.post("/v1/summaries", content=b"[", headers={"content-type": "application/json"})
    with _client(db) as c:
        assert c.get("/v1/jobs/svc-job").json() == before
        assert c.get("/v1/jobs/svc-job/stats").json()["summaries"] == 12
        m = c.get("/metrics").text
        assert _metric(m, "laggard_summaries_received_total", job_name="svc-job") == 12
        assert _metric(m, "laggard_posts_rejected_total", reason="not_json") == 1
        assert _metric(m, "laggard_job_irregular", job_name="svc-job") == 1
        assert f"gpu rank {ROOT}" in c.get("/v1/jobs/svc-job/report").text


def test_idle_jobs_leave_the_metrics(tmp_path: Path, trace: Path) -> None:
    p = _posts(trace, tmp_path)[0]
    with _client(tmp_path / "s.db", ttl_s=0.2) as c:
        c.post("/v1/summaries", json=p)
        assert _metric(c.get("/metrics").text, "laggard_summaries_received_total", job_name="svc-job") == 1
        time.sleep(0.3)
        assert "svc-job" not in c.get("/metrics").text


def test_unknown_job_and_format(tmp_path: Path) -> None:
    with _client(tmp_path / "s.db") as c:
        assert c.get("/v1/jobs/nope").status_code == 404
        assert c.get("/v1/jobs/nope/report").json()["detail"]["reason"] == "unknown_job"
        assert c.get("/v1/jobs/nope/report", params={"format": "pdf"}).status_code == 400
        assert c.post("/v1/jobs/nope/localize").status_code == 404
        assert c.get("/v1/jobs/nope/fetch", params={"node": "n"}).status_code == 204


def _delay_rounds(monkeypatch: pytest.MonkeyPatch, job: str, seconds: float) -> None:
    """Make every localization round of `job` take `seconds` longer."""
    real = service_app.localize_round

    def delayed(db: str, name: str) -> Any:
        if name == job:
            time.sleep(seconds)
        return real(db, name)

    monkeypatch.setattr(service_app, "localize_round", delayed)


def test_a_stalled_job_times_out_and_is_left_out_of_the_rounds(tmp_path: Path, trace: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _delay_rounds(monkeypatch, "stall", 3.0)
    p = _posts(trace, tmp_path)[0]
    with _client(tmp_path / "s.db", job_timeout_s=0.5) as c:
        assert c.post("/v1/summaries", json={**p, "job": "stall"}).status_code == 202
        assert c.post("/v1/summaries", json=p).status_code == 202
        r = c.post("/v1/jobs/stall/localize")
        assert r.status_code == 500 and "took over 0 s" in r.json()["detail"]["detail"]
        svc = c.app.state.service  # type: ignore[attr-defined]
        assert svc.take_dirty() == ["svc-job"]  # the stalled job waits out its quarantine
        assert "stall" in c.get("/healthz").json()["failed_jobs"]


def test_posts_that_arrive_during_a_fetch_are_localized_next(tmp_path: Path, trace: Path) -> None:
    """A verdict planned on some nodes' posts is redone once the later posts are in, even when
    no post arrives after it (the loop took those posts while the fetch was open)."""
    with _client(tmp_path / "s.db") as c:
        svc = c.app.state.service  # type: ignore[attr-defined]
        nodes = agents(trace, c, tmp_path / "spool")
        for a in nodes[:2]:
            a.step(final=True)
        asked = c.post("/v1/jobs/svc-job/localize")
        assert asked.status_code == 202, asked.text
        for a in nodes[2:]:
            a.step(final=True)
        svc.take_dirty()  # the loop's round for those posts: it waits for the open fetch
        for a in nodes:
            a.poll_fetch()
        svc.take_dirty()  # the loop's round for the answers, which this request runs
        first = c.post("/v1/jobs/svc-job/localize").json()
        assert first["nodes"] == 2  # planned on the first two nodes' posts
        assert svc.take_dirty() == ["svc-job"]  # ...so the job goes round again
        final = localize(c, "svc-job", nodes)
        assert final["nodes"] == 4 and final["candidates"][0]["rank"] == ROOT


def test_a_slow_job_does_not_hold_up_the_others(tmp_path: Path, trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds run side by side, one job per worker: another job's verdict comes while one job's
    round is still running (one after another, it would wait the whole 4 s)."""
    _delay_rounds(monkeypatch, "slow", 4.0)
    p = _posts(trace, tmp_path)[0]
    with TestClient(create_app(tmp_path / "s.db", interval_s=0.1, workers=2)) as c:
        svc = c.app.state.service  # type: ignore[attr-defined]
        assert c.post("/v1/summaries", json={**p, "job": "slow"}).status_code == 202  # "slow" sorts first
        assert c.post("/v1/summaries", json=p).status_code == 202
        t0 = time.monotonic()
        while c.get("/v1/jobs/svc-job").status_code != 200 and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert c.get("/v1/jobs/svc-job").status_code == 200
        assert "slow" in svc.running and c.get("/v1/jobs/slow").status_code == 404, time.monotonic() - t0
        assert svc.workers.slot("slow") != svc.workers.slot("svc-job")


def test_no_round_starts_once_the_service_is_closed(tmp_path: Path, trace: Path) -> None:
    """A round cancelled at shutdown wakes the loop as it ends; a loop whose cancellation was lost
    then started rounds on the closed store and executor as fast as they failed (a 5 GB log, and
    SIGTERM not done in 15 s). Closed, a job due a round starts none."""
    p = _posts(trace, tmp_path)[0]
    with TestClient(create_app(tmp_path / "s.db", interval_s=0)) as c:
        svc = c.app.state.service  # type: ignore[attr-defined]
        assert c.post("/v1/summaries", json=p).status_code == 202
    assert svc.closed and "svc-job" in svc._dirty  # the job is still due a round ...
    svc.start_rounds()  # ... and none starts
    assert not svc.running
