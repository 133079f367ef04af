"""Every validation error, and the `laggard validate` CLI: one line per problem, exit 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from collector.trace.validate import validate_trace
from tests.collector.trace.test_traceio import commops_frame, make_trace


def problems(path: Path) -> list[str]:
    return [p.line() for p in validate_trace(path)]


def test_valid_trace_has_no_problems(tmp_path: Path) -> None:
    assert problems(make_trace(tmp_path / "t")) == []


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (lambda df: df.assign(rank=df["rank"].where(df["rank"] != 3, 9)), "not in meta.json"),
        (lambda df: df.assign(end_ns=df["start_ns"] - 1), "end_ns < start_ns"),
        (lambda df: pd.concat([df, df.iloc[[0]]]), "duplicate row"),
        (lambda df: df.iloc[0:0], "empty"),
        (lambda df: df.assign(op="allreduce"), "unknown op"),
        (lambda df: df.assign(nbytes=-1), "negative nbytes"),
    ],
)
def test_each_commops_problem(tmp_path: Path, mutate, expect: str) -> None:
    trace = make_trace(tmp_path / "t", frame=mutate(commops_frame()))
    lines = problems(trace)
    assert any(expect in line for line in lines), lines


def test_missing_meta_and_missing_evidence(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    assert "meta.json not found" in problems(tmp_path / "a")[0]
    (tmp_path / "a" / "meta.json").write_text(json.dumps({"job": "x", "world_size": 1, "ranks": {"0": {"host": "h"}}}))
    assert "no evidence file" in problems(tmp_path / "a")[0]


def test_meta_group_with_unknown_rank(tmp_path: Path) -> None:
    t = make_trace(tmp_path / "t")
    meta = json.loads((t / "meta.json").read_text())
    meta["groups"]["tp-0"] = [0, 42]
    (t / "meta.json").write_text(json.dumps(meta))
    assert any("unknown rank" in line or "member is 42, outside" in line for line in problems(t))


def test_cli_validate_reports_and_exits_2(tmp_path: Path, cli) -> None:
    trace = make_trace(tmp_path / "t", frame=commops_frame().assign(end_ns=0))
    proc = cli("validate", trace)
    assert proc.returncode == 2
    assert "end_ns < start_ns" in proc.stderr
    assert "Traceback" not in proc.stderr
    ok = cli("validate", make_trace(tmp_path / "ok"))
    assert ok.returncode == 0 and "valid" in ok.stdout


def test_cli_validate_missing_dir(tmp_path: Path, cli) -> None:
    proc = cli("validate", tmp_path / "missing")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_flow_address_that_is_not_an_ip_is_one_problem_and_refused_by_every_reader(tmp_path: Path, cli) -> None:
    """validate and the analysis share the check: the flows file's rows, with a host name in src_ip."""
    from collector.inputs.errors import TraceError
    from collector.trace.schema import FLOWS_SCHEMA
    from collector.trace.traceio import Trace, write_table
    from tests.collector.trace.test_traceio import flows_frame

    trace = make_trace(tmp_path / "t")
    write_table(flows_frame().assign(src_ip="node-0"), trace / "flows.parquet", FLOWS_SCHEMA)
    assert [line for line in problems(trace) if "not an IP" in line] == [
        f"{trace / 'flows.parquet'}: src_ip 'node-0' is not an IP address (1 distinct such value(s)) — "
        "give each flow's addresses as IPv4 (10.0.0.1) or IPv6 (fd00::1)"]
    with pytest.raises(TraceError, match="src_ip 'node-0' is not an IP address"):
        Trace.open(trace).flows()
    proc = cli("localize", trace, "--flows")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not an IP address" in proc.stderr
