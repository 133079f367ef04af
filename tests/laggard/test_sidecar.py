"""Node-local detection + progressive fetching on a simulated job laid out as the logger writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench.sidecar import shard_like_logger
from collector.trace.meta import JobMeta
from laggard.sidecar import central_localize, summarize_node
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace
from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # simulates a 32-GPU job and runs the CLI: seconds, not milliseconds


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sidecar")
    cfg = SimConfig(gpus=32, tp=4, pp=2, steps=30, seed=5,
                    faults=[FaultSpec(kind="gpu", factor=2.5, rank=13, steps=(12, 21))])
    simulate_trace(cfg, tmp / "sim")
    shard_like_logger(tmp / "sim", tmp / "trace")
    return tmp / "trace"


def test_summaries_then_fetch_names_the_slow_gpu(sharded: Path) -> None:
    meta = JobMeta.load(sharded / "meta.json")
    for h in meta.hosts():
        assert summarize_node(sharded, h, window=10)
    verdict, mv = central_localize(sharded)
    assert verdict.status == "irregular" and verdict.candidates[0].rank == 13
    assert set(range(12, 22)) & set(verdict.irregular_steps)
    d = mv.to_dict()
    assert 0 < d["moved_bytes"] < d["full_bytes"] and d["summary_bytes"] > 0
    total = sum(pq.ParquetFile(p).metadata.num_rows for p in (sharded / "commops").glob("*.parquet"))
    assert 0 < d["fetched_rows"] < total  # only what the summaries asked for


def test_windows_are_incremental(sharded: Path, tmp_path: Path) -> None:
    host = JobMeta.load(sharded / "meta.json").hosts()[0]
    out = sharded / "summary"
    before = sorted(p.name for p in out.glob(f"{host}-w*.parquet"))
    assert len(before) == 3  # 30 steps in windows of 10
    assert summarize_node(sharded, host, window=10) == []  # nothing new to summarize
    assert sorted(p.name for p in out.glob(f"{host}-w*.parquet")) == before
    assert json.loads((out / f".{host}.state.json").read_text())["next_step"] == 30


def test_cli_localize_prints_bytes_and_verdict(sharded: Path) -> None:
    proc = run_cli("sidecar", "localize", sharded, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["candidates"][0]["rank"] == 13 and out["data_movement"]["reduction"] > 0
    assert run_cli("localize", sharded, "--format", "json", check=True).returncode == 0  # same trace, full path


def test_follow_mode_finishes_when_shards_stop_changing(sharded: Path, tmp_path: Path) -> None:
    import shutil

    from laggard.sidecar import follow_node

    copy = tmp_path / "t"
    shutil.copytree(sharded, copy, ignore=shutil.ignore_patterns("summary"))
    host = JobMeta.load(copy / "meta.json").hosts()[1]
    assert follow_node(copy, host, window=10, poll_s=0.05, stop_after_idle_s=0.1) == 3
    assert len(list((copy / "summary").glob(f"{host}-w*.parquet"))) == 3


def test_cli_run_finds_this_node_as_the_logger_named_it(sharded: Path, tmp_path: Path) -> None:
    """Without --host, `sidecar run` reads the ranks of the host the logger wrote for this node
    (LAGGARD_HOST, SLURMD_NODENAME, NODE_NAME, else the hostname), not always the hostname."""
    import shutil

    copy = tmp_path / "t"
    shutil.copytree(sharded, copy, ignore=shutil.ignore_patterns("summary"))
    host = JobMeta.load(copy / "meta.json").hosts()[2]
    proc = run_cli("sidecar", "run", copy, env={"LAGGARD_HOST": "", "SLURMD_NODENAME": host})
    assert proc.returncode == 0 and proc.stdout.startswith(f"{host}: 2 window"), proc.stdout + proc.stderr
    assert {p.name.split("-w")[0] for p in (copy / "summary").glob("*.parquet")} == {host}


def test_cli_output_escapes_terminal_sequences_in_names(sharded: Path, tmp_path: Path) -> None:
    """A job name from meta.json that carries escape sequences (retitle, clear screen) is shown
    escaped by `sidecar run` and `sidecar localize`, never obeyed by the on-call engineer's terminal."""
    import shutil

    copy = tmp_path / "t"
    shutil.copytree(sharded, copy, ignore=shutil.ignore_patterns("summary"))
    meta = json.loads((copy / "meta.json").read_text())
    meta["job"] = "run7\x1b]0;pwned\x07\x1b[2J\u202e"
    (copy / "meta.json").write_text(json.dumps(meta))
    ran = run_cli("sidecar", "run", copy, "--all-hosts", check=True)
    proc = run_cli("sidecar", "localize", copy, check=True)
    out = ran.stdout + ran.stderr + proc.stdout + proc.stderr
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert proc.stdout.startswith("run7\\x1b]0;pwned\\x07\\x1b[2J\\u202e: irregular"), proc.stdout


def test_a_log_without_step_numbers_is_numbered_on_each_node(tmp_path: Path) -> None:
    """A logger without step markers writes step = -1: the sidecar read no row of it and wrote no
    summary ("no node summaries"). Each node now numbers its own rows, and the central localizer
    names the device the full records name."""
    from collector.trace.traceio import Trace
    from localize.combine import localize_trace

    cfg = SimConfig(gpus=32, tp=4, pp=2, steps=30, seed=5, hide_steps=True,
                    faults=[FaultSpec(kind="gpu", factor=2.5, rank=13, steps=(12, 21))])
    simulate_trace(cfg, tmp_path / "sim")
    shard_like_logger(tmp_path / "sim", tmp_path / "trace")
    root = tmp_path / "trace"
    for h in JobMeta.load(root / "meta.json").hosts():
        assert summarize_node(root, h, window=10)
    verdict, _ = central_localize(root)
    full = localize_trace(Trace.open(root), ("commops",))
    assert verdict.candidates and verdict.candidates[0].device() == full.candidates[0].device()
    assert verdict.candidates[0].rank == 13 and verdict.onset_step == full.onset_step == 12


def test_cli_run_refuses_a_shard_that_is_a_fifo_in_one_line(sharded: Path, tmp_path: Path) -> None:
    import os
    import shutil

    copy = tmp_path / "t"
    shutil.copytree(sharded, copy, ignore=shutil.ignore_patterns("summary"))
    host = JobMeta.load(copy / "meta.json").host_of(0)
    os.mkfifo(copy / "commops" / "rank-00000-9999.parquet")
    proc = run_cli("sidecar", "run", copy, "--host", host, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "a FIFO, not a regular file" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(60)
def test_a_state_file_that_is_a_fifo_is_refused_not_waited_on(sharded: Path, tmp_path: Path) -> None:
    import os
    import shutil

    from collector.inputs.errors import TraceError

    copy = tmp_path / "t"
    shutil.copytree(sharded, copy, ignore=shutil.ignore_patterns("summary"))
    host = JobMeta.load(copy / "meta.json").host_of(0)
    (copy / "summary").mkdir()
    os.mkfifo(copy / "summary" / f".{host}.state.json")
    with pytest.raises(TraceError, match="not a regular file"):
        summarize_node(copy, host)


def test_a_trace_in_one_file_is_summarized_and_agrees_with_localize(tmp_path: Path) -> None:
    """An imported or simulated trace keeps every rank in one commops.parquet: `sidecar run` used
    to write no summary from it, and `sidecar localize` then asked for the run just done."""
    import shutil

    from tests.conftest import REPO

    trace = tmp_path / "gpu-straggler"
    shutil.copytree(REPO / "traces" / "gpu-straggler", trace)
    out = run_cli("sidecar", "run", trace, "--all-hosts", check=True).stdout
    assert "node-1: 1 window summary(ies)" in out, out
    side = json.loads(run_cli("sidecar", "localize", trace, "--format", "json", check=True).stdout)
    full = json.loads(run_cli("localize", trace, "--format", "json", check=True).stdout)
    assert side["candidates"][0]["rank"] == full["candidates"][0]["rank"] == 13
    assert side["data_movement"]["full_bytes"] == (trace / "commops.parquet").stat().st_size
