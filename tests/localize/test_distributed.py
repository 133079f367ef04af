"""The summary-first localizer split into map tasks gives the single-process verdict, byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import fsspec
import pandas as pd
import pytest

from collector.inputs.errors import TraceError
from collector.trace.schema import COMMOPS_SCHEMA
from collector.trace.traceio import Trace, list_pieces, open_filesystem, read_pieces
from localize.commops import COLUMNS
from localize.distributed import (
    Serial,
    Source,
    Stats,
    fetch_rows,
    fetch_tasks,
    host_tasks,
    localize_distributed,
)
from localize.summary import localize_from_summary, write_summaries

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.name for p in (REPO / "traces").iterdir() if (p / "meta.json").exists())


def reference(trace_dir: Path) -> str:
    """The single-process summary-first verdict: every host summarized, then the summary reduce."""
    write_summaries(Trace.open(trace_dir))
    v, _ = localize_from_summary(Trace.open(trace_dir))
    shutil.rmtree(trace_dir / "summary")
    return json.dumps(v.to_dict())


@pytest.mark.parametrize("name", SHIPPED)
def test_serial_tasks_match_single_process_on_shipped_traces(name: str, tmp_path: Path) -> None:
    d = tmp_path / name
    shutil.copytree(REPO / "traces" / name, d)
    v, _ = localize_distributed(Source.open(d), Serial())
    assert json.dumps(v.to_dict()) == reference(d)


def test_hosts_sharing_one_file_are_read_together_within_a_row_budget(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """One commops.parquet holds every host's rows: reading its row groups once per host made
    a 256-host job's summaries take 147 s. Hosts are read together, SUMMARY_ROWS at most a task,
    and each host's summary is the one it has alone."""
    import localize.distributed as dist

    d = tmp_path / "t"
    shutil.copytree(REPO / "traces" / "gpu-straggler", d)
    want = reference(d)
    hosts = len(Trace.open(d).meta.hosts())
    for budget, tasks in ((dist.SUMMARY_ROWS, 1), (1, hosts)):
        monkeypatch.setattr(dist, "SUMMARY_ROWS", budget)
        stats = Stats()
        v, _ = localize_distributed(Source.open(d), Serial(), stats=stats)
        assert json.dumps(v.to_dict()) == want
        assert (stats.map_tasks, stats.hosts) == (tasks, hosts)


def test_pieces_read_the_same_rows_as_the_trace(tmp_path: Path) -> None:
    src = Source.open(REPO / "traces" / "gpu-straggler")
    trace = Trace.open(REPO / "traces" / "gpu-straggler")
    ranks = [3, 13, 40, 41]
    want = trace.commops(columns=COLUMNS, ranks=ranks, steps=(5, 9))
    got = pd.concat([fetch_rows(*t) for t in fetch_tasks(src, ranks, (5, 9))], ignore_index=True)
    pd.testing.assert_frame_equal(got, want)
    # every host task sees exactly its ranks' rows
    tasks = host_tasks(src)
    assert sorted(r for _, _, rs, _, _ in tasks for r in rs) == sorted(trace.meta.ranks)


def test_rank_shards_are_skipped_by_their_statistics(tmp_path: Path) -> None:
    """Per-rank shards (the sidecar's layout): a host task opens only its ranks' files."""
    from bench.sidecar import shard_like_logger

    shard_like_logger(REPO / "traces" / "gpu-straggler", tmp_path / "t", steps_per_shard=5)
    src = Source.open(tmp_path / "t")
    n_files = len({p.path for p in src.pieces})
    assert n_files > 64
    for _, host, ranks, pieces, _ in host_tasks(src):
        assert {p.rank_lo for p in pieces} == set(ranks), host
    trace = Trace.open(tmp_path / "t")
    fs, _ = open_filesystem(str(tmp_path / "t"))
    whole = read_pieces(fs, src.pieces, COMMOPS_SCHEMA, COLUMNS).to_pandas()
    pd.testing.assert_frame_equal(whole, trace.commops(columns=COLUMNS))
    v, _ = localize_distributed(src, Serial())
    assert json.dumps(v.to_dict()) == reference(tmp_path / "t")


def test_object_store_url(tmp_path: Path) -> None:
    """A trace in an object store (fsspec's in-memory one here) is read where it lies."""
    fs = fsspec.filesystem("memory")
    src_dir = REPO / "traces" / "gpu-straggler"
    for f in ("meta.json", "commops.parquet"):
        fs.pipe(f"/laggard-test/run7/{f}", (src_dir / f).read_bytes())
    try:
        v, _ = localize_distributed(Source.open("memory://laggard-test/run7"), Serial())
        local = tmp_path / "t"
        shutil.copytree(src_dir, local)
        assert json.dumps(v.to_dict()) == reference(local)
        assert list_pieces(*open_filesystem("memory://laggard-test/run7"))[0].rows > 0
    finally:
        fs.rm("/laggard-test", recursive=True)


def test_bad_locations_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no meta"):
        Source.open(tmp_path)
    (tmp_path / "meta.json").write_text('{"job": "j", "world_size": 1, "ranks": {"0": {"host": "h"}}}')
    with pytest.raises(TraceError, match="no CommOps Parquet"):
        Source.open(tmp_path)
    (tmp_path / "commops.parquet").write_bytes(b"not parquet")
    with pytest.raises(TraceError, match="cannot be read"):
        Source.open(tmp_path)
    with pytest.raises(TraceError, match="no filesystem"):
        Source.open("nosuchscheme://bucket/run")


def test_without_cluster_no_engine_is_imported(tmp_path: Path) -> None:
    """Neither the full path nor the one-process summary-first path loads Dask (or fsspec)."""
    d = tmp_path / "t"
    shutil.copytree(REPO / "traces" / "gpu-straggler", d)
    code = ("import sys, contextlib, io, json\n"
            "from laggard.cli import main\n"
            "buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n"
            f"    assert main(['localize', {str(d)!r}, '--format', 'json']) == 0\n"
            f"    assert main(['localize', {str(d)!r}, '--summary-first', '--format', 'json']) == 0\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed', 'ray', 'fsspec'))\n"
            "print(json.dumps([bad, buf.getvalue()]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    bad, printed = json.loads(out.stdout.strip().splitlines()[-1])
    assert bad == []
    summary_first = json.loads(printed[printed.index("}\n{") + 2:])
    assert json.dumps(summary_first) == reference(d)
