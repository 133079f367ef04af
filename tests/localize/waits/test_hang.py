"""Hang attribution from Flight Recorder snapshots and from the logger's pending operators."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from collector.commops.layout import PENDING_SCHEMA, atomic_write_table
from collector.importers.flight_recorder import import_flight_recorder
from collector.trace.meta import JobMeta, RankInfo
from collector.trace.schema import COMMOPS_SCHEMA
from collector.trace.traceio import Trace, write_table
from localize.waits.hang import find_hang

FR = Path(__file__).parents[2] / "collector" / "data" / "fr-gloo-hang"


def test_real_gloo_dumps_name_the_rank_that_never_arrived(tmp_path: Path) -> None:
    import_flight_recorder(FR, tmp_path)
    v = find_hang(Trace.open(tmp_path))
    assert v is not None and v.status == "hang"
    assert [c.rank for c in v.candidates] == [1]
    assert "never entered all_reduce #9 of tp-0" in v.candidates[0].evidence[0]


def test_missing_dump_counts_as_not_arrived(tmp_path: Path) -> None:
    src = tmp_path / "dumps"
    src.mkdir()
    for f in FR.iterdir():
        if f.name != "rank_1":
            (src / f.name).write_bytes(f.read_bytes())
    import_flight_recorder(src, tmp_path / "t", world_size=4)
    v = find_hang(Trace.open(tmp_path / "t"))
    assert v is not None and v.candidates[0].rank == 1


def _trace(root: Path, done: list[tuple], pending: list[tuple]) -> Trace:
    """rows: (rank, group, op, seq, peer, step); pending adds (wait_s, failed)."""
    meta = JobMeta("j", 4, {r: RankInfo(f"node-{r // 2}", r % 2) for r in range(4)},
                   groups={"tp-0": [0, 1], "tp-1": [2, 3], "dp-0": [0, 1, 2, 3], "pp-0": [0, 2], "pp-1": [1, 3]})
    root.mkdir(parents=True, exist_ok=True)
    meta.save(root / "meta.json")
    cols: dict[str, list[Any]] = {f.name: [] for f in COMMOPS_SCHEMA}
    for r, g, op, seq, peer, step in done:
        for k, v in zip(("rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step"),
                        (r, g, op, seq, peer, 8, 1000 * seq, 1000 * seq + 10, step), strict=True):
            cols[k].append(v)
    write_table(pa.Table.from_pydict(cols, schema=COMMOPS_SCHEMA), root / "commops.parquet", COMMOPS_SCHEMA)
    if pending:
        p: dict[str, list[Any]] = {f.name: [] for f in PENDING_SCHEMA}
        for r, g, op, seq, peer, step, wait, failed in pending:
            for k, v in zip(("rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "step", "seen_ns", "failed"),
                            (r, g, op, seq, peer, 8, 10**9, step, 10**9 + int(wait * 1e9), failed), strict=True):
                p[k].append(v)
        atomic_write_table(root / "pending" / "rank-all.parquet", pa.Table.from_pydict(p, schema=PENDING_SCHEMA))
    return Trace.open(root)


def test_root_and_victim_through_pipeline(tmp_path: Path) -> None:
    # rank 1 stuck in compute before tp-0 all_reduce #2; rank 0 waits there; rank 3 waits for
    # rank 1's send; rank 2 waits for rank 0's send (rank 0 is a victim)
    done = [(r, "dp-0", "all_reduce", 1, -1, 0) for r in range(4)]
    done += [(0, "tp-0", "all_reduce", 1, -1, 0), (1, "tp-0", "all_reduce", 1, -1, 0),
             (0, "pp-0", "send", 1, 2, 0), (2, "pp-0", "recv", 1, 0, 0),
             (1, "pp-1", "send", 1, 3, 0), (3, "pp-1", "recv", 1, 1, 0)]
    pending = [(0, "tp-0", "all_reduce", 2, -1, 1, 30.0, True), (2, "pp-0", "recv", 2, 0, 1, 30.0, True),
               (3, "pp-1", "recv", 2, 1, 1, 30.0, True)]
    v = find_hang(_trace(tmp_path, done, pending))
    assert v is not None and [c.rank for c in v.candidates] == [1, 0]
    assert v.candidates[0].score > 0.5 > v.candidates[1].score
    assert "victim" in " ".join(v.candidates[1].evidence)
    assert v.irregular_steps == [1] and v.to_dict()["hang"]["not_arrived"] == [0, 1]


def test_short_waits_and_clean_runs_are_not_hangs(tmp_path: Path) -> None:
    done = [(r, "dp-0", "all_reduce", 1, -1, 0) for r in range(4)]
    assert find_hang(_trace(tmp_path / "a", done, [])) is None
    # a snapshot caught rank 0 mid-operator for 50 ms: not a hang
    assert find_hang(_trace(tmp_path / "b", done, [(0, "dp-0", "all_reduce", 2, -1, 1, 0.05, False)])) is None


def test_verdict_json_contract(tmp_path: Path) -> None:
    import_flight_recorder(FR, tmp_path)
    v = find_hang(Trace.open(tmp_path))
    assert v is not None
    d = json.loads(json.dumps(v.to_dict()))
    assert d["status"] == "hang" and d["candidates"][0]["kind"] == "host" and d["candidates"][0]["rank"] == 1


def _fr_entry(seq: int, state: str, pg: tuple[str, str], created: int, timing: bool) -> dict:
    """One NCCL Flight Recorder entry as torch 2.10-format dumps hold it (see fr-nccl-h100-json)."""
    return {"record_id": seq, "pg_id": int(pg[0]), "process_group": pg, "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": created,
            "duration_ms": None, "input_sizes": [[8192, 1, 5120]], "input_dtypes": ["BFloat16"],
            "output_sizes": [[8192, 1, 5120]], "output_dtypes": ["BFloat16"], "state": state,
            "time_discovered_started_ns": created + 40_000 if timing and state == "started" else None,
            "time_discovered_completed_ns": None, "retired": False, "timeout_ms": 600_000, "is_p2p": False,
            "thread_id": "140094222388096", "thread_name": "pt_main_thread"}


def write_hang_only_dumps(root: Path, entries: dict[int, list[tuple[int, str]]], timing: bool,
                          hosts: dict[int, str] | None = None) -> Path:
    """Pickled dumps of a hung 4-rank job written with only active entries (no completed row), as
    `_dump_nccl_trace(only_active=True)` or a dump on watchdog timeout with a small buffer writes them."""
    root.mkdir(parents=True, exist_ok=True)
    pg = ("38", "TENSOR_MODEL_PARALLEL_GROUP")
    for rank in range(4):
        mine = entries.get(rank, [])
        enq = max([s for s, _ in mine], default=6)
        dump = {"version": "2.10", "comm_lib_version": "2.27.3", "nccl_comm_state": {},
                "pg_config": {"38": {"name": "38", "desc": pg[1], "ranks": "[0, 1, 2, 3]"}},
                "pg_status": {"38": {"last_enqueued_collective": enq, "last_completed_collective": 6,
                                     "last_started_collective": (7 if any(s == "started" for _, s in mine) else 6) if timing else -1}},
                "entries": [_fr_entry(seq, st, pg, 1_790_000_000_000_000_000 + seq * 1_000_000 + rank, timing)
                            for seq, st in mine]}
        if hosts:
            dump["hostname"] = hosts[rank]
        (root / f"_dump_{rank}").write_bytes(pickle.dumps(dump))
    return root


def test_hang_only_dump_rank_that_never_entered_is_a_host(tmp_path: Path) -> None:
    """No timing (every entry 'scheduled'), rank 2 stopped issuing operators (a held GIL, say):
    its dump has no active entry while ranks 0, 1, 3 sit in all_reduce #7."""
    src = write_hang_only_dumps(tmp_path / "d", {r: [(7, "scheduled")] for r in (0, 1, 3)}, timing=False)
    meta = import_flight_recorder(src, tmp_path / "t")
    assert meta.extra["completed_ops"] == 0 and meta.extra["pending_ops"] == 3
    v = find_hang(Trace.open(tmp_path / "t"))
    assert v is not None and [c.rank for c in v.candidates] == [2]
    c = v.candidates[0]
    assert c.kind == "host"
    assert c.evidence[0] == "rank 2 never entered all_reduce #7 of TENSOR_MODEL_PARALLEL_GROUP-pg38; rank(s) 0, 1, 3 waiting"
    assert len(c.evidence) == len(set(c.evidence)) == 2 and "stopped issuing" in c.evidence[1]


def test_hang_only_dump_rank_whose_gpu_never_started_is_a_gpu(tmp_path: Path) -> None:
    """With TORCH_NCCL_ENABLE_TIMING=1: ranks 0, 1, 3 started all_reduce #7 on their GPUs; rank 2's
    CPU queued #7 and #8 but its GPU never started #7. Hosts come from the dumps."""
    entries = {r: [(7, "started")] for r in (0, 1, 3)}
    entries[2] = [(7, "scheduled"), (8, "scheduled")]
    hosts = {0: "gpu-a01", 1: "gpu-a01", 2: "gpu-a02", 3: "gpu-a02"}
    src = write_hang_only_dumps(tmp_path / "d", entries, timing=True, hosts=hosts)
    meta = import_flight_recorder(src, tmp_path / "t")
    assert {r: i.host for r, i in meta.ranks.items()} == hosts
    v = find_hang(Trace.open(tmp_path / "t"))
    assert v is not None and [c.rank for c in v.candidates] == [2]
    c = v.candidates[0]
    assert (c.kind, c.host) == ("gpu", "gpu-a02")
    assert c.evidence[0].startswith("rank 2 queued all_reduce #7 of TENSOR_MODEL_PARALLEL_GROUP-pg38 but its GPU never started it")
    assert len(c.evidence) == len(set(c.evidence))


def test_hosts_from_per_host_directories(tmp_path: Path) -> None:
    """Collectors gather dumps as HOST/PREFIX<rank>: the directory names the host."""
    flat = write_hang_only_dumps(tmp_path / "flat", {r: [(7, "scheduled")] for r in (0, 1, 3)}, timing=False)
    for r in range(4):
        d = tmp_path / "byhost" / f"node-{r // 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"_dump_{r}").write_bytes((flat / f"_dump_{r}").read_bytes())
    meta = import_flight_recorder(tmp_path / "byhost", tmp_path / "t")
    assert [meta.ranks[r].host for r in range(4)] == ["node-0", "node-0", "node-1", "node-1"]
    v = find_hang(Trace.open(tmp_path / "t"))
    assert v is not None and v.candidates[0].host == "node-1"


@pytest.mark.slow
def test_every_verb_takes_a_hang_only_import(tmp_path: Path) -> None:
    """validate, timeline, localize, explain and report on an import with no completed operator."""
    from tests.conftest import run_cli

    src = write_hang_only_dumps(tmp_path / "d", {r: [(7, "scheduled")] for r in (0, 1, 3)}, timing=False)
    run_cli("import", "flight-recorder", src, "--out", tmp_path / "t", check=True)
    assert "valid" in run_cli("validate", tmp_path / "t", check=True).stdout
    tl = json.loads(run_cli("timeline", tmp_path / "t", "--format", "json", check=True).stdout)
    assert tl["status"] == "hang" and tl["steps"] == []
    v = json.loads(run_cli("localize", tmp_path / "t", "--format", "json", check=True).stdout)
    assert v["status"] == "hang" and v["candidates"][0]["rank"] == 2 and v["candidates"][0]["kind"] == "host"
    assert "rank 2" in run_cli("explain", tmp_path / "t", check=True).stdout
    run_cli("report", tmp_path / "t", "--out", tmp_path / "r.md", "--format", "md", check=True)
    assert "rank 2 never entered all_reduce #7" in (tmp_path / "r.md").read_text()
