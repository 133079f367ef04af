"""The service names a device only once consecutive rounds on new summaries agree on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from laggard.service.app import create_app
from laggard.service.publish import Agreement, device_key, publish
from tests.laggard.agents import agents, localize, sharded_job

ROOT = 21


def _v(status: str = "irregular", *ranks: int, tie: int | None = None) -> dict[str, Any]:
    cands = [{"kind": "gpu", "rank": r, "host": "n", "gpu": r % 8, "score": 0.9 - 0.1 * i,
              **({"tie": tie} if tie and i < tie else {})} for i, r in enumerate(ranks)]
    return {"job": "j", "status": status, "irregular_steps": [5], "slowdown": 1.5, "candidates": cands}


def test_a_device_is_shown_only_after_two_rounds_on_new_summaries_name_it() -> None:
    a, shown = publish(Agreement(), _v("irregular", 3, 1), upto=10)
    assert shown["candidates"] == [] and shown["status"] == "irregular"
    assert shown["localizing"]["rounds_agreeing"] == 1 and shown["localizing"]["rounds_needed"] == 2
    b, again = publish(a, _v("irregular", 3, 1), upto=10)  # the same summaries: no new evidence
    assert again["candidates"] == [] and b.rounds == 1
    c, ok = publish(b, _v("irregular", 3, 2), upto=14)  # the runner-up may change; the top device did not
    assert [x["rank"] for x in ok["candidates"]] == [3, 2] and "localizing" not in ok and c.rounds == 2
    d, moved = publish(c, _v("irregular", 1, 3), upto=20)  # another device: withheld until it is confirmed
    assert moved["candidates"] == [] and d.rounds == 1 and d.device == device_key(_v("irregular", 1))
    e, healthy = publish(d, _v("healthy"), upto=25)
    assert healthy == _v("healthy") and e.rounds == 0
    _, one = publish(Agreement(), _v("irregular", 7), upto=1, needed=1)
    assert one["candidates"][0]["rank"] == 7


def test_a_tie_is_one_device_whatever_its_order() -> None:
    assert device_key(_v("irregular", 4, 5, 9, tie=2)) == device_key(_v("irregular", 5, 4, 1, tie=2))
    assert device_key(_v("irregular", 4, 5, tie=2)) != device_key(_v("irregular", 4, 5))
    assert device_key(_v("healthy")) is None


def _metric(text: str, name: str, job: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'job_name="{job}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sharded_job(tmp_path_factory.mktemp("publish"))


def _first_round(c: TestClient, trace: Path, spool: Path) -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
    """Steps 0..19 of every node posted (the fault began at step 12) and localized."""
    nodes = agents(trace, c, spool)
    posts = {a.host: a.summarize_new(final=True) for a in nodes}
    for batch in posts.values():
        for _, body in batch[:2]:
            assert c.post("/v1/summaries", content=body).status_code == 202
    return nodes, posts, localize(c, "svc-job", nodes)


@pytest.mark.slow
def test_service_withholds_the_first_rounds_device_and_publishes_it_when_the_next_round_agrees(
        tmp_path: Path, trace: Path) -> None:
    with TestClient(create_app(tmp_path / "s.db", interval_s=0)) as c:
        nodes, posts, first = _first_round(c, trace, tmp_path / "spool")
        assert first["status"] == "irregular" and first["candidates"] == [], first
        assert first["localizing"]["rounds_agreeing"] == 1
        m = c.get("/metrics").text
        assert _metric(m, "laggard_job_irregular", "svc-job") == 1
        assert _metric(m, "laggard_job_localizing", "svc-job") == 1
        assert _metric(m, "laggard_candidate_score", "svc-job") is None  # no device on any surface yet
        assert c.get("/v1/jobs").json()[0]["localizing"] is True
        assert "root cause is named once 2 consecutive" in c.get("/v1/jobs/svc-job/report",
                                                                 params={"format": "md"}).text
        for batch in posts.values():  # steps 20..29
            for _, body in batch[2:]:
                assert c.post("/v1/summaries", content=body).status_code == 202
        second = localize(c, "svc-job", nodes)
        assert second["candidates"][0]["rank"] == ROOT and "localizing" not in second, second
        m = c.get("/metrics").text
        assert _metric(m, "laggard_job_localizing", "svc-job") == 0
        assert (_metric(m, "laggard_candidate_score", "svc-job") or 0) > 0.3
        assert json.loads(c.get("/v1/jobs/svc-job/report", params={"format": "json"}).text)["root_cause"][
            "rank"] == ROOT
    with TestClient(create_app(tmp_path / "s.db", interval_s=0)) as c:  # a restart does not withdraw it
        again = localize(c, "svc-job", agents(trace, c, tmp_path / "spool2"))
        assert again["candidates"][0]["rank"] == ROOT and "localizing" not in again, again


@pytest.mark.slow
def test_a_withheld_device_is_published_once_the_agents_go_quiet(tmp_path: Path, trace: Path) -> None:
    """The job ended after one round: no round will agree, so the last one's device is published."""
    with TestClient(create_app(tmp_path / "s.db", interval_s=0, settle_s=3600)) as c:
        svc = c.app.state.service  # type: ignore[attr-defined]
        _, _, first = _first_round(c, trace, tmp_path / "spool")
        assert first["candidates"] == []
        assert c.portal is not None
        c.portal.call(svc.settle)  # quiet for less than --settle: still withheld
        assert c.get("/v1/jobs/svc-job").json()["candidates"] == []
        svc.settle_s = 0.0
        c.portal.call(svc.settle)
        settled = c.get("/v1/jobs/svc-job").json()
        assert settled["candidates"][0]["rank"] == ROOT and "localizing" not in settled, settled


@pytest.mark.slow
def test_a_withheld_device_is_published_once_every_node_said_its_ranks_exited(tmp_path: Path, trace: Path) -> None:
    """No wait for quiet when the agents say the job ended: the round that read their last posts is
    the answer (rounds could never agree here: ten are needed)."""
    with TestClient(create_app(tmp_path / "s.db", interval_s=0, settle_s=3600, confirm_rounds=10)) as c:
        svc = c.app.state.service  # type: ignore[attr-defined]
        assert c.portal is not None
        nodes, _, first = _first_round(c, trace, tmp_path / "spool")
        assert first["candidates"] == []
        *running, last = nodes
        for a in running:
            a.step(final=True, ended=True)
        localize(c, "svc-job", nodes)
        c.portal.call(svc.settle)  # one node's ranks still run
        assert c.get("/v1/jobs/svc-job").json()["candidates"] == []
        last.step(final=True, ended=True)
        c.portal.call(svc.settle)  # every node ended, but no round has read the last one's post yet
        assert c.get("/v1/jobs/svc-job").json()["candidates"] == []
        localize(c, "svc-job", nodes)
        c.portal.call(svc.settle)
        settled = c.get("/v1/jobs/svc-job").json()
        assert settled["candidates"][0]["rank"] == ROOT and "localizing" not in settled, settled


@pytest.mark.slow
def test_posts_that_carry_no_steps_do_not_confirm_a_device(tmp_path: Path, trace: Path) -> None:
    """A round after posts that only say the ranks exited read nothing new of the job: it does not
    count as the second round that agrees (the device was confirmed on no new evidence)."""
    with TestClient(create_app(tmp_path / "s.db", interval_s=0, settle_s=3600)) as c:
        nodes, posts, first = _first_round(c, trace, tmp_path / "spool")
        assert first["candidates"] == [] and first["localizing"]["rounds_agreeing"] == 1
        for a in nodes:
            a.step(final=True, ended=True)
        again = localize(c, "svc-job", nodes)
        assert again["candidates"] == [] and again["localizing"]["rounds_agreeing"] == 1, again
        for batch in posts.values():  # steps 20..29: new evidence
            for _, body in batch[2:]:
                assert c.post("/v1/summaries", content=body).status_code == 202
        third = localize(c, "svc-job", nodes)
        assert third["candidates"][0]["rank"] == ROOT and "localizing" not in third, third
