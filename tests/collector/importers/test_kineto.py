"""Kineto (torch.profiler Chrome trace) import: NCCL kernel names old and new, record_param_comms, gloo."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from collector.importers.kineto import import_kineto
from collector.inputs.errors import UserError
from collector.trace.meta import coverage_note

DATA = Path(__file__).parents[1] / "data" / "kineto-gloo"


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


STEPS = DATA.parent / "kineto-gloo-steps"


def test_real_gzip_traces_steps_from_profiler_markers(tmp_path: Path) -> None:
    """A real 4-rank gloo DDP job profiled with tensorboard_trace_handler(use_gzip=True), rank 2
    computing 60 ms longer from step 15 (tests/collector/jobs/profiled_train.py --steps 24
    --compute-ms 10 --slow-rank 2 --slow-from 15 --slow-ms 60, trimmed by jobs/trim_kineto.py)."""
    meta = import_kineto(STEPS, tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out" / "commops.parquet")
    assert meta.world_size == 4 and meta.extra["ranks_present"] == [0, 1, 2, 3] and meta.extra["ranks_missing"] == []
    assert meta.groups == {"world": [0, 1, 2, 3]} and meta.extra["steps_from"] == "ProfilerStep markers"
    # the schedule was wait=1, warmup=1, active=22: the profiler's own steps 2..23, one DDP all-reduce each
    for rank in range(4):
        assert df[df["rank"] == rank]["step"].tolist() == list(range(2, 24))
    assert (df["op"] == "all_reduce").all() and (df["group"] == "world").all()
    # from step 15 rank 2 arrives last at every all-reduce: its copy is the shortest, its peers waited
    dur = df.assign(d=df["end_ns"] - df["start_ns"]).pivot_table(index="step", columns="rank", values="d")
    assert (dur.loc[15:22].idxmin(axis=1) == 2).all()


def test_a_partial_rank_set_is_named(tmp_path: Path) -> None:
    """Ranks 0 and 2 of the 4-rank job: the world size and groups of distributedInfo say who is missing."""
    src = tmp_path / "prof"
    src.mkdir()
    for f in STEPS.iterdir():
        if f.name.startswith(("vm_19926.", "vm_19928.")):
            (src / f.name).write_bytes(f.read_bytes())
    meta = import_kineto(src, tmp_path / "out")
    assert meta.world_size == 4 and meta.extra["ranks_present"] == [0, 2] and meta.extra["ranks_missing"] == [1, 3]
    assert "no trace from rank(s) 1, 3" in str(coverage_note(meta))


def _gz(path: Path, trace: dict) -> None:
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)


def _nccl_rank_trace(rank: int) -> dict:
    """A torch.profiler trace of two steps on an NCCL rank, as torch writes it: ProfilerStep#N on the
    CPU thread, record_param_comms and its cudaLaunchKernel (External id, correlation), and the
    kernel on the GPU stream, which runs after the CPU has moved on to the next step."""
    ev: list[dict] = []
    for i, step in enumerate((7, 8)):
        t0 = 1000.0 * i
        ext, corr = 100 + i, 500 + i
        ev += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": t0, "dur": 1000.0,
             "pid": 1, "tid": 1, "args": {"External id": 1 + i}},
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": t0 + 900.0, "dur": 20.0, "pid": 1, "tid": 1,
             "args": {"External id": ext, "Collective name": "allreduce", "Process Group Name": "3",
                      "Process Group Description": "dp-0", "In msg nelems": 1024, "dtype": "BFloat16"}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 905.0, "dur": 5.0, "pid": 1,
             "tid": 1, "args": {"External id": ext, "correlation": corr}},
            # runs 150 us later on the GPU: past the end of its step's marker
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, "
             "unsigned long, ncclWork*)", "ts": t0 + 1050.0, "dur": 30.0 + 100 * rank, "pid": 0, "tid": 7,
             "args": {"External id": ext, "correlation": corr, "stream": 7}},
        ]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]},
                          {"pg_name": "3", "pg_desc": "dp-0", "ranks": [0, 1]}]},
            "host_name": f"gpu-{rank:02d}", "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": ev}


def test_nccl_kernels_take_collective_args_and_steps_from_their_launch(tmp_path: Path) -> None:
    src = tmp_path / "prof"
    src.mkdir()
    for rank in (0, 1):
        _gz(src / f"gpu-{rank:02d}_4242.1700000000{rank}.pt.trace.json.gz", _nccl_rank_trace(rank))
    meta = import_kineto(src, tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out" / "commops.parquet").sort_values(["rank", "start_ns"])
    assert meta.extra["kineto_sources"] == ["nccl-kernel"] and meta.extra["ranks_missing"] == []
    assert {r: i.host for r, i in meta.ranks.items()} == {0: "gpu-00", 1: "gpu-01"}
    assert df[["rank", "group", "op", "seq", "step", "nbytes"]].values.tolist() == [
        [0, "dp-0", "all_reduce", 1, 7, 2048], [0, "dp-0", "all_reduce", 2, 8, 2048],
        [1, "dp-0", "all_reduce", 1, 7, 2048], [1, "dp-0", "all_reduce", 2, 8, 2048]]
    assert (df["end_ns"] - df["start_ns"]).tolist() == [30_000, 30_000, 130_000, 130_000]


def test_cli_names_the_ranks_a_trace_lacks(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    src = tmp_path / "prof"
    src.mkdir()
    _gz(src / "gpu-01_4242.17.pt.trace.json.gz", _nccl_rank_trace(1))
    proc = run_cli("import", "kineto", src, "--out", tmp_path / "t", check=True)
    assert "1 of 2 rank(s)" in proc.stdout and "no trace from rank(s) 0" in proc.stdout
    v = json.loads(run_cli("localize", tmp_path / "t", "--format", "json", check=True).stdout)
    assert v["coverage"]["ranks_missing"] == [0] and v["coverage"]["ranks_present"] == [1]


def test_truncated_gzip_is_refused_with_one_line(tmp_path: Path) -> None:
    f = tmp_path / "r0.pt.trace.json.gz"
    _gz(f, _nccl_rank_trace(0))
    f.write_bytes(f.read_bytes()[:-40])
    with pytest.raises(UserError, match="not a complete gzip file"):
        import_kineto(f, tmp_path / "out")


@pytest.mark.slow
def test_real_profiled_gloo_job_under_torchrun(tmp_path: Path) -> None:
    """A real 4-rank gloo DDP job profiled as users do (schedule + tensorboard_trace_handler, gzip);
    rank 2 computes 60 ms longer from step 10. Steps are the profiler's; from step 10 on rank 2 is
    the last to arrive at the all-reduces, so its copy is the shortest (its peers waited for it)."""
    import subprocess
    import sys

    job = Path(__file__).parents[1] / "jobs" / "profiled_train.py"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                           str(job), "--out", str(tmp_path / "prof"), "--steps", "14", "--compute-ms", "5",
                           "--slow-rank", "2", "--slow-from", "10", "--slow-ms", "60"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = sorted((tmp_path / "prof").glob("*.pt.trace.json.gz"))
    assert len(files) == 4
    meta = import_kineto(tmp_path / "prof", tmp_path / "t")
    df = pd.read_parquet(tmp_path / "t" / "commops.parquet")
    assert meta.extra["ranks_present"] == [0, 1, 2, 3] and meta.extra["steps_from"] == "ProfilerStep markers"
    assert sorted(df["step"].unique().tolist()) == list(range(2, 14))
    dur = df.assign(d=df["end_ns"] - df["start_ns"]).pivot_table(index="step", columns="rank", values="d")
    # (one step may be disturbed by the machine's other load or the profiler's own export)
    assert (dur.loc[10:].idxmin(axis=1) == 2).sum() >= len(dur.loc[10:]) - 1


def test_the_same_window_twice_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "prof"
    src.mkdir()
    _gz(src / "gpu-00_1.1.pt.trace.json.gz", _nccl_rank_trace(0))
    (src / "gpu-00_1.1.pt.trace.json").write_text(json.dumps(_nccl_rank_trace(0)))
    with pytest.raises(UserError, match="two traces of rank 0 cover the same time"):
        import_kineto(src, tmp_path / "out")


def test_a_gzip_bomb_is_refused(tmp_path: Path) -> None:
    from collector.importers.kineto import gunzip

    raw = gzip.compress(b" " * (8 << 20))
    with pytest.raises(UserError, match="expands past 1 MiB"):
        gunzip(raw, tmp_path / "bomb.json.gz", cap=1 << 20)
    assert gunzip(raw, tmp_path / "ok.json.gz", cap=16 << 20) == b" " * (8 << 20)


def test_a_trace_that_is_not_a_regular_file_is_refused_with_one_line(tmp_path: Path) -> None:
    """A FIFO named like a trace, given alone or in a directory, is named and refused (exit 2): it would
    block the reader, and skipped, its rank would pass for one that was not profiled."""
    from tests.conftest import run_cli

    src = tmp_path / "prof"
    src.mkdir()
    _gz(src / "gpu-01_4242.17.pt.trace.json.gz", _nccl_rank_trace(1))
    os.mkfifo(src / "gpu-00_4241.17.pt.trace.json")
    with pytest.raises(UserError, match=r"gpu-00_4241\.17\.pt\.trace\.json: a FIFO, not a regular file"):
        import_kineto(src, tmp_path / "out")
    proc = run_cli("import", "kineto", src / "gpu-00_4241.17.pt.trace.json", "--out", tmp_path / "t", timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "a FIFO, not a regular file" in proc.stderr


def test_a_negative_rank_in_a_trace_name_is_refused(tmp_path: Path) -> None:
    """With no distributedInfo the rank comes from the name: `trace_rank_-1.json` is not rank 1."""
    trace = _nccl_rank_trace(1)
    del trace["distributedInfo"]
    (tmp_path / "trace_rank_-1.json").write_text(json.dumps(trace))
    with pytest.raises(UserError, match=r"rank in the file name is -1, outside 0\.\."):
        import_kineto(tmp_path / "trace_rank_-1.json", tmp_path / "out")
