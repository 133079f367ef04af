"""Schema round-trips in every format, and the trace reader's one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from collector.inputs.errors import TraceError
from collector.trace.meta import JobMeta, RankInfo
from collector.trace.schema import COMMOPS_SCHEMA, FLOWS_SCHEMA
from collector.trace.traceio import FORMATS, Trace, read_table, write_table


def commops_frame(n_ranks: int = 4, steps: int = 3) -> pd.DataFrame:
    rows = []
    for step in range(steps):
        for r in range(n_ranks):
            start = 1_000_000 * step + 10 * r
            rows.append({"rank": r, "group": "dp-0", "op": "all_reduce", "seq": step, "peer": -1,
                         "nbytes": 1 << 20, "start_ns": start, "end_ns": start + 500 + r, "step": step})
    return pd.DataFrame(rows)


def flows_frame() -> pd.DataFrame:
    return pd.DataFrame([{"start_ns": 1, "end_ns": 9, "src_ip": "10.0.0.1", "dst_ip": "10.0.0.2", "src_port": 5000,
                          "dst_port": 4791, "proto": "roce", "qp": 17, "bytes": 4096, "packets": 4}])


def make_trace(path: Path, fmt: str = ".parquet", n_ranks: int = 4, frame: pd.DataFrame | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    meta = JobMeta("t", n_ranks, {r: RankInfo(f"node-{r // 2}", r % 2) for r in range(n_ranks)},
                   groups={"dp-0": list(range(n_ranks))})
    meta.save(path / "meta.json")
    write_table(commops_frame(n_ranks) if frame is None else frame, path / f"commops{fmt}", COMMOPS_SCHEMA)
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_commops_round_trip(tmp_path: Path, fmt: str) -> None:
    df = commops_frame()
    write_table(df, tmp_path / f"commops{fmt}", COMMOPS_SCHEMA)
    back = read_table(tmp_path / f"commops{fmt}", COMMOPS_SCHEMA)
    assert back.schema == COMMOPS_SCHEMA
    pd.testing.assert_frame_equal(back.to_pandas(), df.astype(back.to_pandas().dtypes.to_dict()))


@pytest.mark.parametrize("fmt", FORMATS)
def test_flows_round_trip(tmp_path: Path, fmt: str) -> None:
    df = flows_frame()
    write_table(df, tmp_path / f"flows{fmt}", FLOWS_SCHEMA)
    back = read_table(tmp_path / f"flows{fmt}", FLOWS_SCHEMA).to_pylist()
    assert back == df.to_dict("records")


def test_trace_open_filters_ranks_and_steps(tmp_path: Path) -> None:
    trace = Trace.open(make_trace(tmp_path / "t"))
    df = trace.commops(ranks=[1, 2], steps=(1, 2))
    assert sorted(df["rank"].unique()) == [1, 2]
    assert sorted(df["step"].unique()) == [1, 2]


def test_shard_directory_reads_as_one_table(tmp_path: Path) -> None:
    trace_dir = make_trace(tmp_path / "t")
    (trace_dir / "commops.parquet").unlink()
    shards = trace_dir / "commops"
    shards.mkdir()
    df = commops_frame()
    for r, part in df.groupby("rank"):
        write_table(part, shards / f"rank-{r:05d}.parquet", COMMOPS_SCHEMA)
    assert len(Trace.open(trace_dir).commops()) == len(df)


def test_missing_column_names_it(tmp_path: Path) -> None:
    df = commops_frame().drop(columns=["seq"])
    pq_path = tmp_path / "commops.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pandas(df), pq_path)
    with pytest.raises(TraceError, match=r"missing column.*seq"):
        read_table(pq_path, COMMOPS_SCHEMA)


def test_wrong_type_names_column(tmp_path: Path) -> None:
    df = commops_frame().astype({"start_ns": str})
    df.loc[0, "start_ns"] = "yesterday"
    df.to_csv(tmp_path / "commops.csv", index=False)
    with pytest.raises(TraceError, match="start_ns"):
        read_table(tmp_path / "commops.csv", COMMOPS_SCHEMA)


def test_truncated_parquet_is_a_trace_error(tmp_path: Path) -> None:
    write_table(commops_frame(), tmp_path / "commops.parquet", COMMOPS_SCHEMA)
    data = (tmp_path / "commops.parquet").read_bytes()
    (tmp_path / "commops.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="cannot be read"):
        read_table(tmp_path / "commops.parquet", COMMOPS_SCHEMA)


def test_open_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace"):
        Trace.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match=r"meta\.json not found"):
        Trace.open(tmp_path / "empty")
    (tmp_path / "empty" / "meta.json").write_text("{not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        Trace.open(tmp_path / "empty")
    (tmp_path / "empty" / "meta.json").write_text(json.dumps({"job": "x", "world_size": 1, "ranks": {"0": {"host": "a"}}}))
    with pytest.raises(TraceError, match="no evidence"):
        Trace.open(tmp_path / "empty")


def test_meta_round_trip_keeps_unknown_keys(tmp_path: Path) -> None:
    raw = {"job": "j", "world_size": 2, "ranks": {"0": {"host": "h", "gpu": 0}, "1": {"host": "h", "gpu": 1}},
           "model": {"params": 7e9}}
    meta = JobMeta.from_dict(raw)
    meta.save(tmp_path / "meta.json")
    assert JobMeta.load(tmp_path / "meta.json").extra == {"model": {"params": 7e9}}


@pytest.mark.parametrize("fmt", FORMATS)
def test_parquet_rows_come_from_the_footers_and_only_for_parquet(tmp_path: Path, fmt: str) -> None:
    trace = Trace.open(make_trace(tmp_path / "t", fmt))
    assert trace.parquet_rows("commops") == (len(commops_frame()) if fmt == ".parquet" else None)
    assert trace.parquet_rows("flows") is None
