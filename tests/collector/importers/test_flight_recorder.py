"""Flight Recorder import: real gloo dumps, NCCL-shaped JSON dumps, and hostile or broken files."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pandas as pd
import pytest

from collector.importers.flight_recorder import import_flight_recorder, load_dump
from collector.inputs.errors import UserError
from tests.conftest import run_cli

DATA = Path(__file__).parents[1] / "data" / "fr-gloo-hang"


class _Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, ("touch /tmp/laggard-pwned",))


def test_real_gloo_dumps_import(tmp_path: Path) -> None:
    meta = import_flight_recorder(DATA, tmp_path / "t")
    assert meta.world_size == 4 and meta.extra["backends"] == ["gloo"]
    assert {"tp-0", "tp-1", "dp-0"} <= set(meta.groups)
    df = pd.read_parquet(tmp_path / "t" / "commops.parquet")
    last = df[df["group"] == "tp-0"].groupby("rank")["seq"].max().to_dict()
    assert last[0] == last[1] + 1  # rank 1 stopped before the tp-0 all_reduce rank 0 entered


def _nccl_entry(seq: int, state: str, pg: tuple[str, str] = ("1", "tp-0"), name: str = "nccl:all_reduce") -> dict:
    return {"profiling_name": name, "process_group": list(pg), "collective_seq_id": seq, "p2p_seq_id": 0,
            "time_created_ns": 1_000_000 * seq, "time_discovered_started_ns": 1_000_000 * seq + 10,
            "time_discovered_completed_ns": 1_000_000 * seq + 500 if state == "completed" else None,
            "state": state, "input_sizes": [[256, 4]], "input_dtypes": ["BFloat16"]}


def test_nccl_json_pending_and_sizes(tmp_path: Path) -> None:
    src = tmp_path / "dumps"
    src.mkdir()
    for rank, states in ((0, ["completed", "started"]), (1, ["completed"])):
        dump = {"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "tp-0", "ranks": "[0, 1]"}},
                "entries": [_nccl_entry(i + 1, s) for i, s in enumerate(states)]}
        (src / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(dump))
    import_flight_recorder(src, tmp_path / "t")
    rows = pd.read_parquet(tmp_path / "t" / "commops.parquet")
    pend = pd.read_parquet(tmp_path / "t" / "pending.parquet")
    assert len(rows) == 2 and (rows["nbytes"] == 256 * 4 * 2).all() and (rows["end_ns"] - rows["start_ns"] == 490).all()
    assert pend[["rank", "group", "seq"]].values.tolist() == [[0, "tp-0", 2]]


def test_groups_that_share_a_frameworks_description_stay_apart(tmp_path: Path) -> None:
    """Megatron describes every TP group 'TENSOR_MODEL_PARALLEL_GROUP': two TP groups of two ranks
    each, named by the description alone, were one group of four whose two all-reduce #1 were one."""
    src = tmp_path / "dumps"
    src.mkdir()
    desc = "TENSOR_MODEL_PARALLEL_GROUP"
    cfg = {"5": {"name": "5", "desc": desc, "ranks": "[0, 1]"}, "6": {"name": "6", "desc": desc, "ranks": "[2, 3]"}}
    for rank in range(4):
        pg = ("5", desc) if rank < 2 else ("6", desc)
        dump = {"version": "2.10", "pg_config": cfg, "entries": [_nccl_entry(1, "completed", pg)]}
        (src / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(dump))
    meta = import_flight_recorder(src, tmp_path / "t")
    tp = {g: m for g, m in meta.groups.items() if g.startswith(desc)}
    assert sorted(tp.values()) == [[0, 1], [2, 3]], meta.groups
    rows = pd.read_parquet(tmp_path / "t" / "commops.parquet")
    assert rows.groupby("group")["rank"].apply(sorted).tolist() == [[0, 1], [2, 3]]


def test_hostile_pickle_refused_without_running(tmp_path: Path) -> None:
    bad = tmp_path / "rank_0"
    bad.write_bytes(pickle.dumps({"entries": [_Evil()]}))
    with pytest.raises(UserError, match=r"refused: the pickle wants to build posix\.system|refused: .*system"):
        load_dump(bad)
    assert not Path("/tmp/laggard-pwned").exists()


@pytest.mark.parametrize("content,match", [
    (pickle.dumps({"entries": []})[:-5], "truncated or not a pickle"),
    (b'{"entries": [{"profiling_name": "gloo:all', "not valid JSON"),
    (json.dumps({"entries": [{"profiling_name": 5, "process_group": ["0", ""], "collective_seq_id": 1,
                              "time_created_ns": 1}]}).encode(), "field 'profiling_name' is a int"),
    (json.dumps({"entries": "nope"}).encode(), "no 'entries' list"),
    (json.dumps({"entries": [{"profiling_name": "gloo:all_reduce", "process_group": ["0", ""],
                              "collective_seq_id": "1", "time_created_ns": 1}]}).encode(), "collective_seq_id"),
    (pickle.dumps({"entries": [], "x": bytearray(b"a")}), "refused: the pickle wants to build builtins.bytearray"),
])
def test_malformed_dumps_refused(tmp_path: Path, content: bytes, match: str) -> None:
    f = tmp_path / "rank_0"
    f.write_bytes(content)
    with pytest.raises(UserError, match=match):
        import_flight_recorder(f, tmp_path / "out")


@pytest.mark.parametrize("content,says", [
    (pickle.dumps({"entries": [_Evil()]}), "refused: the pickle wants to build"),
    (b'{"version": "2.10", "entries": [{"profiling_name": "nccl:all_re', "not valid JSON"),
    (json.dumps({"entries": [{"profiling_name": "gloo:barrier", "process_group": 7, "collective_seq_id": 1,
                              "time_created_ns": 1}]}).encode(), "field 'process_group' is a int"),
])
def test_cli_refuses_bad_dumps_with_one_line(tmp_path: Path, content: bytes, says: str) -> None:
    bad = tmp_path / "rank_3"
    bad.write_bytes(content)
    proc = run_cli("import", "flight-recorder", bad, "--out", tmp_path / "t")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "t").exists()


NCCL_H100 = Path(__file__).parents[1] / "data"


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_real_nccl_dumps_from_an_h100_import(form: str, tmp_path: Path) -> None:
    """Dumped by tests/collector/jobs/nccl_events.py (torch 2.11 + NCCL 2.28 on an H100; one rank)."""
    meta = import_flight_recorder(NCCL_H100 / f"fr-nccl-h100-{form}", tmp_path / "t")
    assert meta.world_size == 1 and meta.extra["backends"] == ["nccl"]
    df = pd.read_parquet(tmp_path / "t" / "commops.parquet")
    assert (df["op"] == "all_reduce").all() and list(df["seq"]) == list(range(1, len(df) + 1))
    assert (df["end_ns"] >= df["start_ns"]).all()


def test_gpu_measured_durations_set_op_lengths_when_timing_was_on(tmp_path: Path) -> None:
    """Without TORCH_NCCL_ENABLE_TIMING an op ends when the watchdog discovers it (~100 ms late);
    with it, the dump's duration_ms (microseconds here: one-rank all-reduces) is the op's length."""
    import_flight_recorder(NCCL_H100 / "fr-nccl-h100-timed", tmp_path / "timed")
    import_flight_recorder(NCCL_H100 / "fr-nccl-h100-pickle", tmp_path / "untimed")
    timed = pd.read_parquet(tmp_path / "timed" / "commops.parquet")
    untimed = pd.read_parquet(tmp_path / "untimed" / "commops.parquet")
    assert ((timed["end_ns"] - timed["start_ns"]) < 1_000_000).all()
    assert (untimed["end_ns"] - untimed["start_ns"]).median() > 10_000_000


def test_a_dump_that_is_not_a_regular_file_is_refused_with_one_line(tmp_path: Path) -> None:
    """A FIFO named like a dump would block the reader; skipped, its rank would pass for one that
    wrote no dump (the rank a hang is blamed on). Either way the import says so, once, and stops."""
    src = tmp_path / "dumps"
    src.mkdir()
    dump = {"version": "2.10", "entries": [_nccl_entry(1, "completed")]}
    (src / "nccl_trace_rank_0.json").write_text(json.dumps(dump))
    os.mkfifo(src / "nccl_trace_rank_1")
    with pytest.raises(UserError, match=r"nccl_trace_rank_1: a FIFO, not a regular file"):
        import_flight_recorder(src, tmp_path / "t")
    proc = run_cli("import", "flight-recorder", src / "nccl_trace_rank_1", "--out", tmp_path / "t", timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "a FIFO, not a regular file" in proc.stderr
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("name", ["nccl_trace_rank_-1", "rank--2.json", "-1.pkl"])
def test_a_negative_rank_in_a_dump_name_is_refused_with_one_line(tmp_path: Path, name: str) -> None:
    """`rank_-1` was read as rank 1: its entries were passed off as another rank's."""
    src = tmp_path / "dumps"
    src.mkdir()
    dump = {"version": "2.10", "entries": [_nccl_entry(1, "completed")]}
    (src / "nccl_trace_rank_0.json").write_text(json.dumps(dump))
    (src / name).write_text(json.dumps(dump))
    with pytest.raises(UserError, match=r"rank -[12] in the file name is negative"):
        import_flight_recorder(src, tmp_path / "t")
    proc = run_cli("import", "flight-recorder", src, "--out", tmp_path / "t")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is negative" in proc.stderr
    assert not (tmp_path / "t").exists()


def test_a_dash_after_a_word_separates_the_rank(tmp_path: Path) -> None:
    """`fr-dump-3` is rank 3 (the dash follows a letter): only a dash after a separator is a sign."""
    dump = {"version": "2.10", "entries": [_nccl_entry(1, "completed")]}
    (tmp_path / "fr-dump-3").write_text(json.dumps(dump))
    assert import_flight_recorder(tmp_path / "fr-dump-3", tmp_path / "t").extra["dumped_ranks"] == [3]
