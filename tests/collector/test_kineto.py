"""Kineto (torch.profiler Chrome trace) import: NCCL kernel names old and new, record_param_comms, gloo."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from collector.errors import UserError
from collector.kineto import import_kineto

DATA = Path(__file__).parent / "data" / "kineto-gloo"


def _kernel(name: str, ts: float, dur: float, **args: object) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": args}


def test_nccl_kernels_both_naming_schemes(tmp_path: Path) -> None:
    events = [
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 10.0, 5.0,
                **{"Process Group Name": "3", "Process Group Description": "dp-0", "In msg nelems": 100,
                   "dtype": "Float"}),
        _kernel("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", 20.0, 2.5),
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 30.0, 1.0,
                **{"Process Group Name": "3", "Process Group Description": "dp-0"}),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 1.0},
    ]
    trace = {"traceEvents": events, "baseTimeNanoseconds": 1_000_000_000, "distributedInfo": {"rank": 2, "world_size": 4}}
    (tmp_path / "t.json").write_text(json.dumps(trace))
    meta = import_kineto(tmp_path / "t.json", tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out" / "commops.parquet")
    assert meta.world_size == 4 and set(df["rank"]) == {2}
    assert df["op"].tolist() == ["all_reduce", "all_gather", "all_reduce"]
    assert df[df["group"] == "dp-0"]["seq"].tolist() == [1, 2]
    assert df.iloc[0]["start_ns"] == 1_000_000_000 + 10_000 and df.iloc[0]["end_ns"] - df.iloc[0]["start_ns"] == 5_000
    assert df.iloc[0]["nbytes"] == 400


def test_record_param_comms(tmp_path: Path) -> None:
    ev = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 5.0, "dur": 3.0,
          "args": {"Collective name": "allreduce", "Process Group Name": "0", "Process Group Description": "default_pg",
                   "In msg nelems": 8, "dtype": "BFloat16"}}
    (tmp_path / "trace_rank1.json").write_text(json.dumps({"traceEvents": [ev]}))
    import_kineto(tmp_path, tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out" / "commops.parquet")
    assert df[["rank", "group", "op", "nbytes"]].values.tolist() == [[1, "world", "all_reduce", 16]]


def test_real_gloo_profile(tmp_path: Path) -> None:
    meta = import_kineto(DATA, tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out" / "commops.parquet")
    assert meta.world_size == 2 and set(df["op"]) >= {"all_reduce", "broadcast"}
    assert (df["end_ns"] >= df["start_ns"]).all()


def test_real_nccl_profile_from_an_h100(tmp_path: Path) -> None:
    """torch 2.11 + NCCL 2.28, one rank: NCCL launches no kernel for a one-rank all-reduce, so the
    rows come from record_param_comms (tests/collector/jobs/nccl_events.py --profile)."""
    meta = import_kineto(DATA.parent / "kineto-nccl-h100", tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out" / "commops.parquet")
    assert meta.world_size == 1 and df["op"].tolist() == ["all_reduce"] * 3
    assert (df["nbytes"] == 4 << 20).all() and df["seq"].tolist() == [1, 2, 3]


@pytest.mark.parametrize("text,match", [("{\"traceEvents\": [", "not valid JSON"), ("{\"x\": 1}", "no traceEvents"),
                                        ("{\"traceEvents\": []}", "no communication events")])
def test_bad_traces(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "r0.json").write_text(text)
    with pytest.raises(UserError, match=match):
        import_kineto(tmp_path / "r0.json", tmp_path / "out")
