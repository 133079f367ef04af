"""build_timeline end to end on hand-built traces: skew, hidden steps, step windows, model figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from collector.inputs.errors import TraceError, UserError
from collector.trace.traceio import Trace
from tests.timeline.timeline_factory import make_trace
from timeline.build import build_timeline, expected_step_seconds

DIMS = {"tp": 2, "pp": 2, "dp": 2}
STEPS = [1.0] * 6 + [2.0] + [1.0] * 4 + [1.6] * 5 + [1.0] * 2
SKEW = {0: 0, 1: 3_000_000_000, 2: -40_000_000, 3: 90_000_000}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    return make_trace(tmp_path_factory.mktemp("b"), DIMS, STEPS, offsets_ns=SKEW)


def test_irregular_steps_and_status(trace: Trace) -> None:
    tl = build_timeline(trace)
    assert tl.status == "irregular"
    assert tl.irregular_steps == [6, 11, 12, 13, 14, 15]
    assert tl.steps.set_index("step").loc[6, "pattern"] == "spike"
    assert set(tl.steps.set_index("step").loc[11:15, "pattern"]) == {"persistent"}
    assert tl.slowdown == pytest.approx(1.6, rel=0.02)
    np.testing.assert_allclose(tl.steps["duration_s"].to_numpy()[1:], STEPS[1:], rtol=0.01)
    assert set(tl.group_kind.values()) == {"tp", "pp", "dp"}
    assert any("clocks disagree" in n for n in tl.notes)


def test_json_round_trip(trace: Trace) -> None:
    d = json.loads(json.dumps(build_timeline(trace).to_dict()))
    assert d["status"] == "irregular" and d["since_step"] == 6
    assert [s["step"] for s in d["steps"]] == list(range(len(STEPS)))
    assert {s["pattern"] for s in d["steps"]} == {"", "spike", "persistent"}
    assert d["group_kinds_summary"] == {"dp": 4, "pp": 4, "tp": 4}


def test_healthy_has_no_irregular_steps(tmp_path: Path) -> None:
    tl = build_timeline(make_trace(tmp_path, DIMS, [1.0] * 10, offsets_ns=SKEW))
    assert tl.status == "healthy" and tl.irregular_steps == [] and tl.slowdown == 1.0


def test_hidden_steps_give_same_timeline(tmp_path: Path) -> None:
    tl = build_timeline(make_trace(tmp_path, DIMS, STEPS, offsets_ns=SKEW, hide_steps=True, names="opaque"))
    assert len(tl.steps) == len(STEPS)
    assert tl.irregular_steps == [6, 11, 12, 13, 14, 15]
    assert any("inferred 18 steps" in n for n in tl.notes)
    assert sorted(tl.kinds_summary()) == ["dp", "pp", "tp"]


def test_step_window(trace: Trace) -> None:
    tl = build_timeline(trace, steps=(4, 9))
    assert tl.steps["step"].tolist() == [4, 5, 6, 7, 8, 9]
    assert tl.irregular_steps == [6]
    # the last step of the window is closed by the next step's start, not estimated
    assert tl.steps["duration_s"].iloc[-1] == pytest.approx(1.0, rel=0.01)


def test_window_outside_trace_is_a_user_error(trace: Trace) -> None:
    with pytest.raises(UserError, match="no operator rows"):
        build_timeline(trace, steps=(500, 600))


def test_delta_must_exceed_one(trace: Trace) -> None:
    with pytest.raises(UserError, match="delta"):
        build_timeline(trace, delta=0.9)


def test_larger_delta_flags_fewer(trace: Trace) -> None:
    assert build_timeline(trace, delta=1.8).irregular_steps == [6]


def test_expected_step_time_from_meta(tmp_path: Path) -> None:
    extra = {"model": {"params": 7e9, "tokens_per_step": 4e6}, "hardware": {"peak_tflops": 989, "mfu": 0.4}}
    tl = build_timeline(make_trace(tmp_path, DIMS, [1.0] * 4, meta_extra=extra))
    want = 6 * 7e9 * 4e6 / (8 * 989e12 * 0.4)
    assert tl.expected_step_s == pytest.approx(want)
    assert expected_step_seconds(tl.meta) == pytest.approx(want)
    assert any("expected step time" in n for n in tl.notes)


def test_expected_step_time_absent_is_said(trace: Trace) -> None:
    tl = build_timeline(trace)
    assert tl.expected_step_s is None
    assert any("no expected step time" in n for n in tl.notes)


def test_trace_without_commops(tmp_path: Path) -> None:
    make_trace(tmp_path, DIMS, [1.0] * 2)
    (tmp_path / "commops.parquet").unlink()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node-0.log").write_text("hello\n")
    with pytest.raises(TraceError, match="needs commops"):
        build_timeline(Trace.open(tmp_path))


def test_jsonl_trace_reads_through_collector(tmp_path: Path) -> None:
    import pandas as pd

    from collector.trace.schema import COMMOPS_SCHEMA
    from collector.trace.traceio import write_table

    make_trace(tmp_path, DIMS, STEPS, offsets_ns=SKEW)
    df = pd.read_parquet(tmp_path / "commops.parquet")
    (tmp_path / "commops.parquet").unlink()
    write_table(df, tmp_path / "commops.jsonl", COMMOPS_SCHEMA)
    assert build_timeline(Trace.open(tmp_path)).irregular_steps == [6, 11, 12, 13, 14, 15]


def test_read_commops_decodes_strings_as_dictionaries_whatever_the_stored_schema(tmp_path: Path) -> None:
    """Shards written without Arrow's schema (plain Parquet strings) beside ones that store a
    dictionary read alike: group and op are scanned as dictionaries (never one string a row) and
    arrive as categoricals, the values intact."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from timeline.columns import _scan_parquet, read_commops

    src = Path(__file__).resolve().parents[2] / "traces" / "gpu-straggler"
    table = pq.read_table(src / "commops.parquet")
    (tmp_path / "commops").mkdir()
    shutil.copy(src / "meta.json", tmp_path / "meta.json")
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half).cast(table.schema), tmp_path / "commops" / "a.parquet", store_schema=False)
    pq.write_table(table.slice(half), tmp_path / "commops" / "b.parquet")
    scanned = _scan_parquet(tmp_path / "commops", ["group", "op", "rank"], None)
    assert pa.types.is_dictionary(scanned.column("group").type) and pa.types.is_dictionary(scanned.column("op").type)
    got = read_commops(Trace.open(tmp_path), ["group", "op", "rank"])
    assert str(got["group"].dtype) == "category" and str(got["op"].dtype) == "category"
    assert got["group"].astype(str).tolist() == [str(x) for x in table.column("group").to_pylist()]
    assert got["op"].astype(str).tolist() == [str(x) for x in table.column("op").to_pylist()]
