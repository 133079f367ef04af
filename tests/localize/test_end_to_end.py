"""The CommOps localizer end to end on small simulated traces, the CLI, summaries, the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collector.inputs.errors import UserError
from collector.trace.traceio import Trace
from localize.combine import localize_trace, merge
from localize.detect.model_store import HASH_NAME, MODEL_DIR, MODEL_NAME, load_model, save_model
from localize.summary import localize_from_summary, write_summaries
from localize.verdict import Candidate, Verdict
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace

pytestmark = pytest.mark.slow


def sim(root: Path, name: str, faults: list[str], **kw: Any) -> Trace:
    cfg = SimConfig(gpus=kw.pop("gpus", 32), tp=kw.pop("tp", 4), pp=kw.pop("pp", 2), steps=kw.pop("steps", 10),
                    seed=kw.pop("seed", 7), faults=[FaultSpec.parse(f) for f in faults], job=name, **kw)
    simulate_trace(cfg, root / name, counterfactual=False)
    return Trace.open(root / name)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trace]:
    root = tmp_path_factory.mktemp("loc")
    return {
        "gpu": sim(root, "gpu", ["gpu:rank=13,factor=2.5,steps=4:9"]),
        "nic": sim(root, "nic", ["nic:host=node-2,factor=4,steps=4:9"]),
        "host": sim(root, "host", ["host:host=node-1,factor=2,steps=4:9"]),
        "healthy": sim(root, "healthy", [], drift=0.1),
        "stage": sim(root, "stage", ["stage:stage=1,factor=1.6"]),
        "skewed": sim(root, "skewed", ["gpu:rank=6,factor=2,steps=4:9"], tp=1, pp=4, clock_skew_ms=500.0),
    }


def top(v: Verdict) -> Candidate:
    assert v.status == "irregular" and v.candidates, v.to_dict()
    return v.candidates[0]


def test_gpu_straggler(traces: dict[str, Trace]) -> None:
    c = top(localize_trace(traces["gpu"]))
    assert (c.kind, c.rank, c.host, c.gpu) == ("gpu", 13, "node-1", 5)
    assert c.evidence and 0 < c.score <= 1


def test_nic_host_stage_and_healthy(traces: dict[str, Trace]) -> None:
    assert (top(localize_trace(traces["nic"])).kind, top(localize_trace(traces["nic"])).host) == ("nic", "node-2")
    c = top(localize_trace(traces["host"]))
    assert (c.kind, c.host) == ("host", "node-1")
    c = top(localize_trace(traces["stage"]))
    assert (c.kind, c.stage) == ("config", 1)
    v = localize_trace(traces["healthy"])
    assert v.status == "healthy" and v.candidates == []


def test_clock_skew_does_not_matter(traces: dict[str, Trace]) -> None:
    # 500 ms offsets between hosts: far larger than any operator; only durations are compared
    assert top(localize_trace(traces["skewed"])).rank == 6


def test_steps_window(traces: dict[str, Trace]) -> None:
    v = localize_trace(traces["gpu"], steps=(0, 3))
    assert v.status == "healthy"


def test_summary_path_fetches_only_part(traces: dict[str, Trace]) -> None:
    t = traces["gpu"]
    write_summaries(t)
    v, plan = localize_from_summary(Trace.open(t.path))
    assert top(v).rank == 13
    assert 0 < plan.rows_fetched < len(t.commops(columns=["rank"]))


def test_a_trace_over_the_full_paths_rows_is_localized_from_summaries(traces: dict[str, Trace], cli,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Past LAGGARD_MAX_FULL_ROWS CommOps rows, localize works host by host as the sidecars do
    (its memory follows a host's rows, not the trace's) and says so; under it, or for a window
    of steps, it reads the full records. Same device either way."""
    t = traces["gpu"]
    rows = t.parquet_rows("commops")
    assert rows is not None and rows > 1000
    full = localize_trace(t)
    assert "from" not in full.extra and "summary_first" not in full.extra
    monkeypatch.setenv("LAGGARD_MAX_FULL_ROWS", "1000")
    v = localize_trace(Trace.open(t.path))
    assert v.extra.get("from") == "summary" and f"{rows:,} CommOps rows" in str(v.extra["summary_first"])
    assert top(v).rank == top(full).rank == 13 and v.onset_step == full.onset_step
    assert "from" not in localize_trace(Trace.open(t.path), steps=(0, 9)).extra
    p = cli("localize", t.path, env={"LAGGARD_MAX_FULL_ROWS": "1000"})
    assert p.returncode == 0 and "rank 13" in p.stdout and "LAGGARD_MAX_FULL_ROWS" in p.stdout, p.stdout + p.stderr


def test_cli_json_contract_and_exit_codes(traces: dict[str, Trace], cli) -> None:
    p = cli("localize", traces["gpu"].path, "--format", "json", "--top", "2")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert {"job", "status", "irregular_steps", "slowdown", "candidates"} <= set(out)
    c = out["candidates"][0]
    assert {"kind", "rank", "host", "gpu", "score", "evidence"} <= set(c) and len(out["candidates"]) <= 2
    p = cli("localize", traces["gpu"].path, "--fail-on-irregular")
    assert p.returncode == 1 and "IRREGULAR" in p.stdout and "rank 13" in p.stdout
    p = cli("localize", traces["healthy"].path, "--fail-on-irregular")
    assert p.returncode == 0 and "healthy" in p.stdout
    p = cli("localize", traces["gpu"].path, "--flows")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    p = cli("localize", "/nonexistent/trace")
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_merge_gains_when_sources_agree() -> None:
    a = Verdict("j", "irregular", [3], 1.5, [Candidate("nic", 0.6, ["x"], host="node-1", source="commops")], {"source": "commops"})
    b = Verdict("j", "irregular", [3], 1.4, [Candidate("nic", 0.5, ["y"], host="node-1", source="flows"),
                                            Candidate("switch", 0.3, ["z"], switch="tor-0", source="flows")], {"source": "flows"})
    m = merge("j", [a, b])
    assert m.candidates[0].host == "node-1" and m.candidates[0].score > 0.6
    assert m.candidates[0].source == "commops+flows" and m.candidates[0].evidence == ["x", "y"]


def test_model_is_shipped_and_hash_checked(tmp_path: Path) -> None:
    forest = load_model()
    assert forest is not None and forest.feature.shape[0] >= 4
    x = np.random.default_rng(0).normal(size=(50, forest.feature.max() + 1)).astype(np.float32)
    p = forest.predict_proba(x)
    assert p.shape == (50,) and ((p >= 0) & (p <= 1)).all()
    save_model(forest, {"note": "copy"}, tmp_path)
    assert (tmp_path / MODEL_NAME).read_bytes() == (MODEL_DIR / MODEL_NAME).read_bytes()  # byte-reproducible
    (tmp_path / HASH_NAME).write_text("0" * 64 + "\n")
    with pytest.raises(UserError):
        load_model(tmp_path)


def test_node_summaries_equal_whole_job_summary(traces: dict[str, Trace]) -> None:
    # every summary row is per host, so a sidecar summarizing its own node agrees with the whole
    import pandas as pd

    from localize.commops import COLUMNS
    from localize.summary import summarize

    t = traces["nic"]
    df = t.commops(columns=COLUMNS)
    key = ["host", "rank", "step", "group"]
    whole = summarize(df, t.meta.host_of).sort_values(key).reset_index(drop=True)
    hosts = df["rank"].map(lambda r: t.meta.host_of(int(r)))
    parts = pd.concat([summarize(g, t.meta.host_of) for _, g in df.groupby(hosts)]).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(whole, parts, check_dtype=False)
    assert (whole["host"].nunique(), (whole["rank"] < 0).mean() > 0.5) == (len(t.meta.hosts()), True)


def test_registry_skips_missing_localizers(traces: dict[str, Trace]) -> None:
    from localize import combine

    assert "commops" in combine.available(traces["gpu"])
    assert combine._function(("localize.no_such_module", "f")) is None


def test_metadata_without_group_members(traces: dict[str, Trace], tmp_path: Path) -> None:
    """A producer that names groups in its rows but lists no members in meta.json: the members
    are who logged each group, and the verdicts do not change."""
    import shutil

    for name in ("gpu", "nic"):
        dst = tmp_path / name
        shutil.copytree(traces[name].path, dst)
        meta = json.loads((dst / "meta.json").read_text())
        assert meta.pop("groups")
        (dst / "meta.json").write_text(json.dumps(meta))
        want, got = top(localize_trace(traces[name])), top(localize_trace(Trace.open(dst)))
        assert (got.kind, got.rank, got.host) == (want.kind, want.rank, want.host)


def test_late_sender_is_not_a_slow_transfer(tmp_path: Path) -> None:
    """A slow host in a pipeline: its sends start late, so receivers that used to find the
    data waiting now wait for it. That is the sender's lateness, not a slow path: no NIC or
    link may be named beside the host."""
    v = localize_trace(sim(tmp_path, "pp-host", ["host:host=node-6,factor=2,steps=6:11"], gpus=64, tp=1, pp=4,
                           steps=12, seed=1))
    assert (top(v).kind, top(v).host) == ("host", "node-6")
    assert not [c for c in v.candidates if c.kind in ("nic", "link", "switch")], v.to_dict()
