"""What a rank says about where it runs, from torchrun / Slurm / Kubernetes environments."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from collector.commops.launcher import (
    device_index,
    host_of,
    identity,
    job_of,
    node_rank,
    parse_parallelism,
)
from collector.commops.layout import merge_meta, rank_shards, read_rank_infos
from collector.inputs.errors import TraceError

TORCHRUN = {"LOCAL_RANK": "3", "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "none", "HOSTNAME": "gpu-a17"}
SLURM = {"SLURMD_NODENAME": "gpu-b03", "SLURM_JOB_NAME": "llama70b", "SLURM_JOB_ID": "881234",
         "SLURM_LOCALID": "5", "SLURM_NODEID": "12", "HOSTNAME": "gpu-b03.cluster"}
POD = {"NODE_NAME": "ip-10-0-3-7", "HOSTNAME": "trainer-worker-3", "TORCHELASTIC_RUN_ID": "trainer-7f3",
       "LOCAL_RANK": "0", "GROUP_RANK": "3"}


def test_host_precedence() -> None:
    assert host_of(TORCHRUN, "gpu-a17") == ("gpu-a17", "hostname")
    assert host_of(SLURM, "gpu-b03.cluster") == ("gpu-b03", "SLURMD_NODENAME")
    assert host_of(POD, "trainer-worker-3") == ("ip-10-0-3-7", "NODE_NAME")  # the machine, not the pod
    assert host_of({**POD, **SLURM, "LAGGARD_HOST": "node-9"}, "x") == ("node-9", "LAGGARD_HOST")
    assert host_of({"LAGGARD_HOST": "  ", "NODE_NAME": ""}, "box") == ("box", "hostname")


def test_job_name_precedence() -> None:
    assert job_of(SLURM, "run7") == "llama70b-881234"
    assert job_of({"SLURM_JOB_ID": "17"}) == "slurm-17"
    assert job_of(POD, "run7") == "trainer-7f3"
    assert job_of(TORCHRUN, "run7") == "run7"  # torchrun's placeholder id is no name
    assert job_of({**SLURM, "LAGGARD_JOB": "mine"}) == "mine"
    assert job_of({}) == "commops"


def test_device_and_node() -> None:
    assert (device_index(TORCHRUN), node_rank(TORCHRUN)) == (3, 1)
    assert (device_index(SLURM), node_rank(SLURM)) == (5, 12)
    assert (device_index({}), node_rank({})) == (0, -1)
    assert identity(POD, {"tp": 2}) == {"host": "ip-10-0-3-7", "host_from": "NODE_NAME", "gpu": 0,
                                        "node_rank": 3, "parallelism": {"tp": 2}}


def test_parallelism_from_text_or_mapping() -> None:
    want = {"dp": 2, "tp": 2, "pp": 2, "ep": 1, "cp": 1}
    assert parse_parallelism("tp=2, pp=2,dp=2") == want
    assert parse_parallelism({"TP": 2, "pp": 2, "dp": 2}) == want
    for bad, says in [("tp=2,zz=3", "unknown parallel dimension 'zz'"), ("tp", "not DIM=SIZE"),
                      ("tp=0", "positive integer"), ("tp=1.5", "positive integer"), ({"tp": True}, "positive integer")]:
        with pytest.raises(ValueError, match=says):
            parse_parallelism(bad)  # type: ignore[arg-type]


def _rank(root: Path, r: int, **kw: object) -> None:
    (root / "ranks").mkdir(parents=True, exist_ok=True)
    info = {"rank": r, "world_size": 4, "job": "j", "host": f"node-{r // 2}", "gpu": r % 2, **kw}
    (root / "ranks" / f"rank-{r:05d}.json").write_text(json.dumps(info))


def test_merge_keeps_hosts_parallelism_and_reports_conflicts(tmp_path: Path) -> None:
    par = {"dp": 2, "tp": 2, "pp": 1, "ep": 1, "cp": 1}
    for r in range(4):
        _rank(tmp_path, r, parallelism=par, groups={f"tp-{r // 2}": [r // 2 * 2, r // 2 * 2 + 1], "dp": [r % 2, r % 2 + 2]})
    meta = merge_meta(tmp_path)
    assert [meta.host_of(r) for r in range(4)] == ["node-0", "node-0", "node-1", "node-1"]
    assert meta.parallelism == par and meta.groups["tp-1"] == [2, 3]
    # two different groups both called "dp": kept first-come, and said
    assert meta.groups["dp"] == [0, 2] and "give each group its own name" in meta.extra["commops_warnings"][0]
    _rank(tmp_path, 3, parallelism={**par, "tp": 4})
    assert "different parallelism" in merge_meta(tmp_path).extra["commops_warnings"][-1]


@pytest.mark.timeout(30)
def test_a_rank_file_that_is_a_fifo_or_too_deep_is_passed_over_not_waited_on(tmp_path: Path) -> None:
    for r in range(3):
        _rank(tmp_path, r)
    os.mkfifo(tmp_path / "ranks" / "rank-00003.json")  # open() of it would block until a writer came
    (tmp_path / "ranks" / "rank-00002.json").write_text("[" * 100_000 + "]" * 100_000)
    assert sorted(read_rank_infos(tmp_path)) == [0, 1]
    assert merge_meta(tmp_path).host_of(1) == "node-0"


def test_a_shard_that_is_not_a_regular_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "commops").mkdir()
    (tmp_path / "commops" / "rank-00000-0000.parquet").write_bytes(b"")
    os.mkfifo(tmp_path / "commops" / "rank-00001-0000.parquet")
    assert [p.name for p in rank_shards(tmp_path, [0])] == ["rank-00000-0000.parquet"]
    with pytest.raises(TraceError, match=r"rank-00001-0000\.parquet: a FIFO, not a regular file"):
        rank_shards(tmp_path)
