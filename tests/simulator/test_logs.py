"""simulator.logs: realistic multi-host logs with injected failures recorded in truth.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.inputs.errors import UserError
from simulator.cluster import Layout
from simulator.config import SimConfig
from simulator.logs import CATEGORIES, FAILURES, emit_logs


def job(tmp_path: Path, hosts: int = 3, name: str = "t") -> Path:
    d = tmp_path / name
    d.mkdir()
    Layout.build(SimConfig(gpus=8 * hosts, tp=8, job=name).resolved()).meta().save(d / "meta.json")
    return d


def lines_at(d: Path, ref: str) -> str:
    path, _, n = ref.rpartition(":")
    return (d / path).read_text().splitlines()[int(n) - 1]


def test_standalone_trace_gets_one_log_per_host_and_truth(tmp_path: Path) -> None:
    d = job(tmp_path)
    emit_logs(d, 3, "gpu_xid")
    assert sorted(p.name for p in (d / "logs").iterdir()) == ["node-0.log", "node-1.log", "node-2.log"]
    truth = json.loads((d / "truth.json").read_text())
    (f,) = truth["log_failures"]
    assert f["failure"] == "gpu_xid" and f["kind"] == "gpu" and f["category"] == "hardware"
    assert f["host"] == f"node-{f['rank'] // 8}" and f["gpu"] == f["rank"] % 8
    texts = [lines_at(d, ref) for ref in f["lines"]]
    assert any("Xid" in t and f["host"] in t for t in texts)  # the root line is on the faulty host
    assert any("Watchdog caught collective operation timeout" in t for t in texts)  # the cascade on peers


def test_existing_truth_keys_are_kept(tmp_path: Path) -> None:
    d = job(tmp_path)
    (d / "truth.json").write_text(json.dumps({"job": "t", "faults": [{"kind": "gpu"}], "step_time_s": [1.0] * 25}))
    emit_logs(d, 1, "config_path")
    truth = json.loads((d / "truth.json").read_text())
    assert truth["faults"] == [{"kind": "gpu"}] and truth["log_failures"][0]["stage"] == "data loading"


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a, b = job(tmp_path, name="a"), job(tmp_path, name="b")
    for d in (a, b):
        emit_logs(d, 7, "nic_cqe")
    assert (a / "logs" / "node-1.log").read_bytes() == (b / "logs" / "node-1.log").read_bytes()


def test_healthy_run_has_no_failure(tmp_path: Path) -> None:
    d = job(tmp_path)
    emit_logs(d, 5, None)
    assert json.loads((d / "truth.json").read_text())["log_failures"] == []
    text = "".join(p.read_text() for p in (d / "logs").iterdir())
    assert "Watchdog" not in text and "Traceback" not in text and "worker group successfully finished" in text


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_every_failure_is_recorded_with_its_lines(tmp_path: Path, name: str) -> None:
    d = job(tmp_path, hosts=2)
    emit_logs(d, 11, name)
    (f,) = json.loads((d / "truth.json").read_text())["log_failures"]
    category, kind, stages = FAILURES[name]
    assert (f["category"], f["kind"]) == (category, kind) and f["stage"] in stages
    assert f["lines"] and all(lines_at(d, ref).strip() for ref in f["lines"])
    assert (f["step"] >= 0) == (f["stage"] in ("training", "checkpoint"))


def test_categories_pick_a_failure_of_that_category(tmp_path: Path) -> None:
    for i, cat in enumerate(CATEGORIES):
        d = job(tmp_path, hosts=2, name=cat)
        emit_logs(d, i, cat)
        assert json.loads((d / "truth.json").read_text())["log_failures"][0]["category"] == cat


def test_unknown_failure_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown log failure"):
        emit_logs(job(tmp_path), 1, "cosmic_ray")
