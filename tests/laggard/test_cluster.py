"""`--cluster`: the summary-first localizer's tasks on a real local Dask cluster (worker processes)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.sidecar import shard_like_logger
from collector.inputs.errors import UserError
from collector.trace.meta import JobMeta
from laggard.cliutil import print_json
from laggard.cluster import DaskRun, open_cluster
from laggard.sidecar import central_localize, summarize_node
from localize.distributed import Source, Stats, fetcher, localize_distributed
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace
from tests.conftest import run_cli
from tests.localize.test_distributed import reference

pytestmark = pytest.mark.slow  # starts worker processes: seconds each

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[DaskRun]:
    with open_cluster("local", workers=2, memory="1GiB") as run:
        yield run


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 64-GPU job with a slow GPU, laid out as the sidecar logger writes it (per-rank shards)."""
    tmp = tmp_path_factory.mktemp("cluster")
    cfg = SimConfig(gpus=64, tp=4, pp=2, steps=24, seed=11, faults=[FaultSpec(kind="gpu", factor=2.0, rank=37, steps=(12, 23))])
    simulate_trace(cfg, tmp / "sim")
    shard_like_logger(tmp / "sim", tmp / "trace", steps_per_shard=8)
    return tmp / "trace"


def test_two_worker_processes_give_the_single_process_verdict(cluster: DaskRun, simulated: Path, tmp_path: Path) -> None:
    workers = cluster.worker_stats()
    assert len(workers) == 2
    shipped = tmp_path / "nic"
    shutil.copytree(REPO / "traces" / "nic-degraded", shipped)
    for d in (shipped, simulated):
        stats = Stats()
        v, _ = localize_distributed(Source.open(d), cluster, stats=stats)
        assert json.dumps(v.to_dict()) == reference(d)
        assert stats.hosts == len(JobMeta.load(d / "meta.json").hosts()) and stats.fetch_tasks >= 1
    assert v.candidates[0].rank == 37
    # both workers ran tasks: each sent results
    assert all(w["sent_bytes"] > 0 for w in cluster.worker_stats().values())


def test_sidecar_localize_fetches_on_the_cluster(cluster: DaskRun, simulated: Path) -> None:
    for h in JobMeta.load(simulated / "meta.json").hosts():
        summarize_node(simulated, h, window=12)
    try:
        one, _ = central_localize(simulated)
        many, _ = central_localize(simulated, fetch=fetcher(Source.open(simulated), cluster))
        assert json.dumps(many.to_dict()) == json.dumps(one.to_dict())
        assert many.candidates[0].rank == 37
    finally:
        shutil.rmtree(simulated / "summary")


def test_cli_cluster_local_prints_the_same_json(tmp_path: Path) -> None:
    d = tmp_path / "t"
    shutil.copytree(REPO / "traces" / "gpu-straggler", d)
    p = run_cli("localize", d, "--cluster", "local", "--workers", "2", "--worker-memory", "1GiB", "--format", "json")
    assert p.returncode == 0, p.stderr
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_json(json.loads(reference(d)))
    assert p.stdout == buf.getvalue()
    assert "2 worker(s)" in p.stderr and "summary task(s) for 8 host(s)" in p.stderr


def test_cli_cluster_mistakes_are_one_line(tmp_path: Path) -> None:
    p = run_cli("localize", REPO / "traces" / "gpu-straggler", "--cluster", "tcp://127.0.0.1:9", "--format", "json")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "no Dask scheduler" in p.stderr
    p = run_cli("localize", REPO / "traces" / "gpu-straggler", "--cluster", "local", "--steps", "1:3")
    assert p.returncode == 2 and "--steps" in p.stderr and "Traceback" not in p.stderr
    with pytest.raises(UserError, match="not a size"), open_cluster("local", 1, "lots"):
        pass


def test_report_summary_first(tmp_path: Path) -> None:
    """`report --summary-first` localizes one host at a time and writes the page without the full timeline."""
    d = tmp_path / "t"
    shutil.copytree(REPO / "traces" / "gpu-straggler", d)
    p = run_cli("report", d, "--out", tmp_path / "r.md", "--summary-first")
    assert p.returncode == 0, p.stderr
    assert "gpu rank 13" in p.stderr and "gpu rank 13" in (tmp_path / "r.md").read_text()
