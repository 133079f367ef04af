"""The CommOps logger in one process (gloo, world size 1): what it records and how it writes."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from collector import commops
from collector.commops.recorder import OP_CODE, Recorder, make_collective
from collector.commops.writer import ShardWriter
from collector.trace.meta import JobMeta
from collector.trace.traceio import Trace
from collector.trace.validate import validate_trace


@pytest.fixture(scope="module")
def world1() -> Iterator[None]:
    if not dist.is_initialized():
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(20000 + os.getpid() % 20000)
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_attach_records_collectives_steps_and_writes_a_valid_trace(world1: None, tmp_path: Path) -> None:
    original = dist.all_reduce
    assert commops.attach(tmp_path, flush_s=60)
    try:
        assert dist.all_reduce is not original and dist.distributed_c10d.all_reduce is dist.all_reduce
        g = dist.new_group([0], group_desc="tp-0")
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        t = torch.ones(8)
        for _ in range(3):
            dist.all_reduce(t)
            dist.all_reduce(t, group=g)
            dist.broadcast(t, 0, group=g)
            dist.all_reduce(t, async_op=True).wait()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
        dist.barrier()
        commops.flush()
        st = commops.stats()
    finally:
        commops.detach()
    assert dist.all_reduce is original and dist.distributed_c10d.all_reduce is original
    assert st["rows"] == 13 and st["dropped"] == 0 and st["errors"] == 0
    df = Trace.open(tmp_path).commops().sort_values(["group", "op", "seq"])
    world = df[df["group"] == "world"]
    assert world[world["op"] == "all_reduce"]["seq"].tolist() == [1, 2, 3, 4, 5, 6]  # sync + async share the seq
    assert df[df["group"] == "tp-0"]["seq"].tolist() == [1, 3, 5, 2, 4, 6]  # all_reduce then broadcast rows
    assert sorted(df[(df["group"] == "tp-0") & (df["op"] == "all_reduce")]["step"]) == [0, 1, 2]  # from optimizer.step()
    assert (df["nbytes"][df["op"] != "barrier"] == 32).all()
    assert (df["end_ns"] >= df["start_ns"]).all()
    meta = JobMeta.load(tmp_path / "meta.json")
    assert meta.groups == {"tp-0": [0], "world": [0]} and meta.world_size == 1
    assert validate_trace(tmp_path) == []
    assert list((tmp_path / "commops").glob("rank-00000-*.parquet"))


def test_manual_step_overrides_auto(world1: None, tmp_path: Path) -> None:
    commops.attach(tmp_path, flush_s=60)
    try:
        t = torch.ones(2)
        for s in range(3):
            commops.step(10 + s)
            dist.all_reduce(t)
    finally:
        commops.detach()
    assert Trace.open(tmp_path).commops()["step"].tolist() == [10, 11, 12]


def test_bookkeeping_errors_never_reach_the_caller(world1: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = Recorder(1 << 4)
    rec.rank = 0
    calls = []

    def fake(tensor: object, op: object = None, group: object = None, async_op: bool = False) -> None:
        calls.append(tensor)

    wrapped = make_collective(rec, fake, "all_reduce", 0, 2)
    wrapped(object())  # no numel(): the recorder fails, the op still runs
    wrapped(object())
    assert len(calls) == 2 and rec.errors == 2
    assert capsys.readouterr().err.count("recording error") == 1  # reported once


def test_ring_overflow_is_counted_and_memory_bounded(world1: None, tmp_path: Path) -> None:
    rec = Recorder(1 << 4)
    rec.rank = 0
    wrapped = make_collective(rec, lambda tensor, op=None, group=None, async_op=False: None, "all_reduce", 0, 2)
    t = torch.ones(1)
    for _ in range(100):
        wrapped(t)
    w = ShardWriter(rec, tmp_path, 0, 1, 60, "j")
    w.flush()
    assert rec.ring.maxlen == 16 and w.rows + w.dropped == 100 and w.rows <= 16
    df = pd.read_parquet(next((tmp_path / "commops").glob("*.parquet")))
    assert df["seq"].tolist() == list(range(100 - w.rows + 1, 101))  # the newest survive, in order


def test_failed_op_is_kept_as_pending(world1: None, tmp_path: Path) -> None:
    rec = Recorder(1 << 4)
    rec.rank = 0

    def boom(tensor: object, op: object = None, group: object = None, async_op: bool = False) -> None:
        raise RuntimeError("Timed out waiting 5000ms")

    wrapped = make_collective(rec, boom, "all_reduce", 0, 2)
    with pytest.raises(RuntimeError, match="Timed out"):
        wrapped(torch.ones(4))
    ShardWriter(rec, tmp_path, 0, 1, 60, "j").flush()
    pend = pd.read_parquet(tmp_path / "pending" / "rank-00000.parquet")
    assert pend[["group", "op", "seq", "failed"]].values.tolist() == [["world", "all_reduce", 1, True]]


def test_op_in_progress_is_pending_without_a_marker(world1: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path keeps no in-flight marker: an op a thread is inside of is read off its stack
    (and written to pending/ once it has been in flight for STUCK_NS)."""
    from collector.commops import writer

    rec = Recorder(1 << 4)
    rec.rank = 0
    seen: list[list[list[object]]] = []
    w = ShardWriter(rec, tmp_path, 0, 1, 60, "j")
    pending = tmp_path / "pending" / "rank-00000.parquet"

    def stuck(tensor: object, op: object = None, group: object = None, async_op: bool = False) -> None:
        w.flush()  # the writer looks while this op is still running
        seen.append(pd.read_parquet(pending)[["seq", "nbytes", "failed"]].values.tolist() if pending.exists() else [])

    wrapped = make_collective(rec, stuck, "all_reduce", 0, 2)
    t = torch.ones(4)
    wrapped(t)  # first op of the group: the slow path (registers it, marks `current`); just begun
    monkeypatch.setattr(writer, "STUCK_NS", 0)
    wrapped(t)  # the fast path, in flight "long enough" now
    assert seen == [[], [[2, 16, False]]]
    w.flush()
    assert not pending.exists() and w.rows == 2 and w.dropped == 0


#: every name a job may call -> the contract op recorded (the deprecated aliases call the others)
ALIASES = {
    "all_reduce": "all_reduce", "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_single": "all_gather", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter", "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
}


def _call(name: str, t: torch.Tensor, o: torch.Tensor, async_op: bool) -> None:
    fn = getattr(dist, name)
    if name in ("all_reduce",):
        w = fn(t, async_op=async_op)
    elif name in ("broadcast", "reduce"):
        w = fn(t, 0, async_op=async_op)
    elif name == "barrier":
        w = fn(async_op=async_op)
    elif name == "all_gather":
        w = fn([o], t, async_op=async_op)
    elif name == "reduce_scatter":
        w = fn(o, [t], async_op=async_op)
    elif name == "all_to_all":
        w = fn([o], [t], async_op=async_op)
    else:  # (output, input) tensor forms
        w = fn(o, t, async_op=async_op)
    if async_op:
        w.wait()


def _runs(name: str) -> bool:
    """Whether this torch has the operator and its gloo runs it (torch 2.11's gloo has no all-to-all)."""
    if not hasattr(dist, name):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            _call(name, torch.ones(4), torch.zeros(4), async_op=False)
    except RuntimeError:
        return False
    return True


def test_every_alias_is_recorded_once(world1: None, tmp_path: Path) -> None:
    """torch's deprecated names call the new ones (all_gather_into_tensor -> all_gather_single):
    each call is one operator, recorded once, sync or async, whichever name the job used. The
    names differ between torch releases (2.11 has no all_gather_single, nor an all-to-all on
    gloo): those this one has and runs."""
    names = {n: op for n, op in ALIASES.items() if _runs(n)}
    assert len(names) >= 10  # every release keeps the public names and most of the aliases
    assert commops.attach(tmp_path, flush_s=60)
    try:
        t, o = torch.ones(4), torch.zeros(4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            for i, name in enumerate(names):
                for async_op in (False, True):
                    commops.step(i)
                    _call(name, t, o, async_op)
        commops.flush()
        st = commops.stats()
    finally:
        commops.detach()
    df = Trace.open(tmp_path).commops()
    got = df.groupby("step")["op"].agg(list).to_dict()
    assert got == {i: [op, op] for i, op in enumerate(names.values())}
    assert st["rows"] == 2 * len(names) and st["dropped"] == 0 and st["errors"] == 0
    assert (df["seq"].sort_values().to_numpy() == range(1, 2 * len(names) + 1)).all()


def test_the_guard_is_per_thread(world1: None) -> None:
    """An operator another thread runs while this one is inside a wrapped operator is recorded."""
    import threading

    rec = Recorder(1 << 4)
    rec.rank = 0
    inner = make_collective(rec, lambda tensor, op=None, group=None, async_op=False: None, "all_reduce", 0, 2)

    def outer_body(tensor: object, op: object = None, group: object = None, async_op: bool = False) -> None:
        inner(tensor)  # the same thread: an alias calling another name, not a second operator
        th = threading.Thread(target=inner, args=(tensor,))
        th.start()
        th.join()

    outer = make_collective(rec, outer_body, "broadcast", 0, 2)
    outer(torch.ones(2))
    outer(torch.ones(2))  # the fast path too
    assert sorted(r[1] for r in rec.ring) == sorted([OP_CODE["broadcast"], OP_CODE["all_reduce"]] * 2)


def test_name_group_names_a_group_before_its_first_op(world1: None, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert not commops.name_group(None, "x")  # logger off: nothing to name
    commops.attach(tmp_path, flush_s=60, job="j7", parallelism={"tp": 1, "dp": 1})
    try:
        g = dist.new_group([0])
        assert commops.name_group(g, "tp-0")
        dist.all_reduce(torch.ones(2), group=g)
        assert commops.name_group(g, "tp-0")  # the same name again is fine
        assert not commops.name_group(g, "dp-0")  # rows already carry tp-0
        h = dist.new_group([0])
        dist.all_reduce(torch.ones(2), group=h)
    finally:
        commops.detach()
    assert "call name_group before its first operator" in capsys.readouterr().err
    meta = JobMeta.load(tmp_path / "meta.json")
    assert "tp-0" in meta.groups and any(n.startswith("pg-") for n in meta.groups)
    assert meta.job == "j7" and meta.parallelism == {"dp": 1, "tp": 1, "pp": 1, "ep": 1, "cp": 1}


def test_a_bad_parallelism_variable_is_reported_and_ignored(world1: None, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LAGGARD_PARALLELISM", "tp=2,pq=2")
    monkeypatch.setenv("LAGGARD_HOST", "node-5")
    assert commops.attach(tmp_path, flush_s=60)  # the job runs on
    try:
        dist.all_reduce(torch.ones(2))
    finally:
        commops.detach()
    assert "LAGGARD_PARALLELISM ignored: unknown parallel dimension 'pq'" in capsys.readouterr().err
    meta = JobMeta.load(tmp_path / "meta.json")
    assert meta.parallelism == {} and meta.host_of(0) == "node-5" and meta.job == tmp_path.name
    with pytest.raises(ValueError, match="positive integer"):
        commops.attach(tmp_path, parallelism={"tp": 0})


def test_groups_that_share_a_frameworks_description_are_named_apart(world1: None, tmp_path: Path) -> None:
    """Megatron creates every TP group with group_desc='TENSOR_MODEL_PARALLEL_GROUP' (DeviceMesh
    every group of a dimension with 'mesh_<dim>'): each group keeps its own name and sequence."""
    assert commops.attach(tmp_path, flush_s=60)
    try:
        a = dist.new_group([0], group_desc="TENSOR_MODEL_PARALLEL_GROUP")
        b = dist.new_group([0], group_desc="TENSOR_MODEL_PARALLEL_GROUP")
        t = torch.ones(8)
        for g in (a, b, a):
            dist.all_reduce(t, group=g)
        commops.flush()
    finally:
        commops.detach()
    df = Trace.open(tmp_path).commops()
    named = df[df["group"].astype(str).str.startswith("TENSOR_MODEL_PARALLEL_GROUP")]
    assert named.groupby("group", observed=True)["seq"].apply(sorted).tolist() == [[1, 2], [1]]
    meta = JobMeta.load(tmp_path / "meta.json")
    assert len([g for g in meta.groups if g.startswith("TENSOR_MODEL_PARALLEL_GROUP")]) == 2
