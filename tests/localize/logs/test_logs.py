"""localize.logs.analysis (L4): cross-job pool, spatial ranking, temporal DTW, stages, verdict."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from collector.logs import parse_logs
from collector.trace.traceio import Trace
from localize.logs.analysis import analyze_logs, localize_logs
from localize.logs.pool import POOL_ENV, SHIPPED_POOL, EventPool, user_pool_path
from localize.logs.temporal import STAGES, dtw, stage_of_shapes
from simulator.cluster import Layout
from simulator.config import SimConfig
from simulator.logs import emit_logs


def make(tmp_path: Path, name: str, seed: int, failure: str | None, hosts: int = 4) -> Trace:
    d = tmp_path / name
    d.mkdir()
    Layout.build(SimConfig(gpus=8 * hosts, tp=8, job=name).resolved()).meta().save(d / "meta.json")
    emit_logs(d, seed, failure)
    return Trace.open(d)


@pytest.fixture(scope="module")
def pool() -> EventPool:
    return EventPool.load(SHIPPED_POOL)


def test_shipped_pool_is_there_and_small() -> None:
    p = EventPool.load(SHIPPED_POOL)
    assert len(p) > 50 and len(p.jobs) >= 10
    assert SHIPPED_POOL.stat().st_size < 200_000


def test_gpu_failure_names_the_node_gpu_stage_and_iteration(tmp_path: Path, pool: EventPool) -> None:
    trace = make(tmp_path, "xid", 21, "gpu_xid")
    truth = (trace.truth() or {})["log_failures"][0]
    v = localize_logs(trace, top=3, pool=pool)
    assert v.status == "irregular"
    c = v.candidates[0]
    assert (c.kind, c.host, c.rank, c.gpu) == ("gpu", truth["host"], truth["rank"], truth["gpu"])
    assert c.source == "logs" and len(v.candidates) <= 3
    assert any("Xid" in e and e.startswith(f"logs/{truth['host']}.log:") for e in c.evidence)
    info = v.to_dict()["logs"]
    assert info["stage"] == truth["stage"] and info["iteration"] == truth["step"]
    # every cited line exists and says what the citation says
    ref, _, text = c.evidence[0].partition(": ")
    path, _, n = ref.rpartition(":")
    assert (trace.path / path).read_text().splitlines()[int(n) - 1].startswith(text[:50])


def test_failure_lines_match_the_injected_ones(tmp_path: Path, pool: EventPool) -> None:
    trace = make(tmp_path, "nic", 22, "nic_cqe", hosts=6)
    truth = (trace.truth() or {})["log_failures"][0]
    a = analyze_logs(trace, pool)
    pred, gold = set(a.failure_lines()), set(truth["lines"])
    assert len(pred & gold) / len(gold) > 0.95 and len(pred & gold) / len(pred) > 0.9
    assert a.kind == "nic" and a.category == "network" and a.nodes[0].host == truth["host"]


def test_config_failure_blames_no_node(tmp_path: Path, pool: EventPool) -> None:
    trace = make(tmp_path, "cfg", 23, "config_parallel")
    v = localize_logs(trace, pool=pool)
    assert [c.kind for c in v.candidates] == ["config"] and v.candidates[0].host is None
    assert v.extra["logs"]["stage"] == "init" and v.extra["logs"]["iteration"] is None


def test_framework_fault_is_told_apart_from_user_config(tmp_path: Path, pool: EventPool) -> None:
    a = analyze_logs(make(tmp_path, "fw", 24, "framework_bug"), pool)
    assert (a.kind, a.category) == ("config", "framework")


def test_healthy_job_is_healthy(tmp_path: Path, pool: EventPool) -> None:
    v = localize_logs(make(tmp_path, "ok", 25, None), pool=pool)
    assert v.status == "healthy" and v.candidates == [] and v.extra["logs"]["failure_lines"] == 0


def test_cross_job_pool_filters_what_successful_jobs_print(tmp_path: Path) -> None:
    failed = make(tmp_path, "oom", 26, "host_oom", hosts=3)
    empty = analyze_logs(failed, EventPool())
    learned = EventPool()
    for s in range(3):
        ok = make(tmp_path, f"ok{s}", 900 + s, None, hosts=3)
        learned.add(parse_logs(ok.log_files(), root=ok.path), f"ok{s}")
    with_pool = analyze_logs(failed, learned)
    gold = set((failed.truth() or {})["log_failures"][0]["lines"])
    assert with_pool.suspect.sum() < empty.suspect.sum()
    assert len(set(with_pool.failure_lines()) - gold) <= len(set(empty.failure_lines()) - gold)
    assert with_pool.kind == "host"


def test_pool_round_trip_and_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "p" / "pool.json"
    monkeypatch.setenv(POOL_ENV, str(target))
    assert user_pool_path() == target
    ok = make(tmp_path, "ok", 27, None, hosts=2)
    p = EventPool()
    assert p.add(parse_logs(ok.log_files(), root=ok.path), "ok") > 10
    p.save(target)
    back = EventPool.load(target)
    assert back.shapes == p.shapes and back.jobs == ["ok"]
    assert len(EventPool.default()) >= len(EventPool.load(SHIPPED_POOL))
    assert json.loads(target.read_text())["version"] == 1


def test_dtw_counts_edits_relative_to_length() -> None:
    assert dtw((1, 2, 3), (1, 2, 3)) == 0.0
    assert dtw((1, 1, 1, 2), (1, 2)) == 0.0  # warping absorbs repeats
    assert dtw((1, 2, 3), (1, 9, 3)) == pytest.approx(1 / 3)
    assert dtw((), (1,)) == 1.0


def test_stage_rules() -> None:
    shapes = ["[rank<NUM>]: > building train, validation, and test datasets ...",
              "[rank<NUM>]: saving checkpoint at iteration <NUM> to <PATH>",
              "node-<NUM>:<NUM>:<NUM> [<NUM>] NCCL INFO Bootstrap : Using eth<NUM>:<IP><<NUM>>",
              "[rank<NUM>]: [after training is done] datetime: <NUM>",
              "[rank<NUM>]: hello"]
    got = [STAGES[i] if i >= 0 else None for i in stage_of_shapes(shapes)]
    assert got == ["data loading", "checkpoint", "init", "teardown", None]


def test_temporal_flags_the_iteration_that_departs(tmp_path: Path) -> None:
    lines = []
    for i in range(30):
        lines += [f"[rank{r}]: step: {i} loss: 1.0" for r in range(4)]
        lines += [f"[rank{r}]: tokens seen {i * 100}" for r in range(4)]
        if i == 21:
            lines += ["[rank2]: RuntimeError: CUDA error: an illegal memory access was encountered"] * 3
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node-0.log").write_text("\n".join(lines) + "\n")
    from localize.logs.temporal import temporal

    logs = parse_logs([tmp_path / "logs" / "node-0.log"])
    t = temporal(logs, np.full(len(logs), STAGES.index("training"), dtype=np.int8), [0])
    assert t.flagged[0] == [21]
