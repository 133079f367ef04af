"""Hang attribution from Flight Recorder snapshots and from the logger's pending operators."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from collector.commops.layout import PENDING_SCHEMA, atomic_write_table
from collector.flight_recorder import import_flight_recorder
from collector.meta import JobMeta, RankInfo
from collector.schema import COMMOPS_SCHEMA
from collector.traceio import Trace, write_table
from localize.hang import find_hang

FR = Path(__file__).parents[1] / "collector" / "data" / "fr-gloo-hang"


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
    cols = {f.name: [] for f in COMMOPS_SCHEMA}
    for r, g, op, seq, peer, step in done:
        for k, v in zip(("rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step"),
                        (r, g, op, seq, peer, 8, 1000 * seq, 1000 * seq + 10, step), strict=True):
            cols[k].append(v)
    write_table(pa.Table.from_pydict(cols, schema=COMMOPS_SCHEMA), root / "commops.parquet", COMMOPS_SCHEMA)
    if pending:
        p = {f.name: [] for f in PENDING_SCHEMA}
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
    assert d["status"] == "hang" and d["candidates"][0]["kind"] == "gpu" and d["candidates"][0]["rank"] == 1
