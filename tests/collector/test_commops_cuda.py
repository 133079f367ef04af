"""CUDA-event timing of NCCL operators.

Unit tests (any machine): the anchor arithmetic, the finished/unfinished split, the per-call
choice of timing path. GPU tests (skipped without CUDA; run on a GPU machine): a real one-rank
NCCL job under torchrun whose GPU is delayed before each op, its profiler trace and its Flight
Recorder dump, through the importers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pandas as pd
import pytest

from collector.commops.cudatime import (
    drain_finished,
    has_cuda_tensor,
    run_cuda,
    run_cuda_batch,
    wall_ns,
)
from collector.commops.recorder import Recorder
from collector.trace.traceio import Trace
from tests.conftest import REPO, run_cli


class FakeEvent:
    """An event that fired at `t_ms` on the GPU's own timeline (test double for torch.cuda.Event)."""

    def __init__(self, t_ms: float, fired: bool = True) -> None:
        self.t_ms, self.fired = t_ms, fired

    def elapsed_time(self, other: FakeEvent) -> float:
        return other.t_ms - self.t_ms

    def query(self) -> bool:
        return self.fired


def test_events_map_onto_the_wall_clock_through_the_anchor() -> None:
    anchor = (FakeEvent(1000.0), 5_000_000_000)
    assert wall_ns(anchor, FakeEvent(1002.5)) == 5_002_500_000


def test_finished_ops_get_gpu_start_and_end_unfinished_ones_stay_pending() -> None:
    rec = Recorder(capacity=8)
    anchor = (FakeEvent(0.0), 10_000_000_000)
    done_row = (0, 1, 1, -1, 64, 123, 4)  # host call time 123 ns: replaced by the GPU's arrival
    stuck_row = (0, 1, 2, -1, 64, 456, 4)
    rec.in_flight = {id(done_row): done_row, id(stuck_row): stuck_row}
    done, waiting = drain_finished(rec, [(done_row, anchor, FakeEvent(50.0), FakeEvent(51.0)),
                                         (stuck_row, anchor, FakeEvent(60.0), FakeEvent(0.0, fired=False))])
    assert done == [((0, 1, 1, -1, 64, 10_050_000_000, 4), 10_051_000_000)]
    assert [w[0] for w in waiting] == [stuck_row]
    assert list(rec.in_flight.values()) == [stuck_row]  # a hung NCCL op is still reported pending


class Recorded:
    """A torch.cuda.Event double that notes when it was recorded, among the test's other steps."""

    log: ClassVar[list[str]] = []

    def __init__(self, enable_timing: bool = True) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        Recorded.log.append("event")


class CoalescedWork:
    """What NCCL's batch_isend_irecv returns: one work for the whole batch."""

    def wait(self) -> bool:
        Recorded.log.append("wait")
        return True


def _batch_recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    import torch

    monkeypatch.setattr(torch.cuda, "Event", Recorded)
    Recorded.log = []
    rec = Recorder(capacity=8)
    rec.gpu_clock = SimpleNamespace(anchor=(FakeEvent(0.0), 0))
    return rec


def test_a_cuda_batch_ends_once_its_caller_has_waited_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL's coalesced batch completes its future at enqueue (on an H200 its rows ended ~16 ms
    before they started): the end events must follow the caller's wait, which makes its stream wait."""
    rec = _batch_recorder(monkeypatch)
    send, recv = (0, 4, 1, 4, 64, 0, 3), (0, 5, 1, 4, 64, 0, 3)
    works = run_cuda_batch(rec, lambda ops: [CoalescedWork()], ["send", "recv"], [send, recv])
    assert Recorded.log == ["event"] and rec.cuda_rows == []  # the start only
    assert set(rec.in_flight) == {id(send), id(recv)}  # pending until waited for: a hang shows
    assert len(works) == 1
    works[0].wait()
    works[0].wait()  # a second wait records nothing more
    assert Recorded.log == ["event", "wait", "event", "event", "wait"]
    assert [r[0] for r in rec.cuda_rows] == [send, recv]
    assert len({id(r[2]) for r in rec.cuda_rows}) == 1  # one start: the batch's arrival


def test_a_cuda_batch_whose_timing_fails_still_runs_and_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidecar never breaks training: an event that cannot be made or recorded is a counted
    error; the batch runs, and its wait() returns."""
    import torch

    rec = _batch_recorder(monkeypatch)
    row = (0, 4, 1, 4, 64, 0, 3)
    works = run_cuda_batch(rec, lambda ops: [CoalescedWork()], ["send"], [row])

    class Broken:
        def __init__(self, enable_timing: bool = True) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "Event", Broken)
    assert works[0].wait() is True and rec.errors == 1  # the end event failed inside the caller's wait
    ran: list[str] = []

    def batch(ops: list[Any]) -> list[str]:
        ran.append("batch")
        return ["w"]

    assert run_cuda_batch(rec, batch, ["send"], [row]) == ["w"]
    assert ran == ["batch"] and rec.errors == 2  # the start event failed: the batch ran untimed


def test_a_cuda_op_whose_timing_fails_still_runs_untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A single NCCL op likewise: its start event failing runs it untimed; its end event failing
    drops its record, which is not left pending (that would read as a hang)."""
    import torch

    rec = _batch_recorder(monkeypatch)
    row = (0, 4, 1, -1, 64, 0, 3)
    ended = {"fail": False}

    class Flaky:
        def __init__(self, enable_timing: bool = True) -> None:
            if ended["fail"]:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

        def record(self, stream: Any = None) -> None:
            ended["fail"] = True  # the start was recorded: the next event (the end) fails

    monkeypatch.setattr(torch.cuda, "Event", Flaky)
    assert run_cuda(rec, lambda: None, row, (), {}) is None
    assert rec.errors == 1 and not rec.in_flight and not rec.cuda_rows
    assert run_cuda(rec, lambda: 7, row, (), {}) == 7  # now the start fails too: the op runs untimed
    assert rec.errors == 2


def test_batch_isend_irecv_on_a_cuda_group_takes_the_event_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper sends a CUDA group's batch (CUDA tensors) to `run_cuda_batch`, a CPU one to the host path."""
    import collector.commops.recorder as recorder

    rec = Recorder(capacity=8)
    taken: list[str] = []

    def events_path(rec: Recorder, orig: Any, ops: list[Any], rows: list[tuple[int, ...]]) -> list[str]:
        taken.append("events")
        return ["w"]

    monkeypatch.setattr(recorder, "run_cuda_batch", events_path)
    monkeypatch.setattr(rec, "group_id", lambda pg: pg)  # groups 0 (CPU) and 1 (CUDA), registered
    rec.send_seq += [{}, {}]
    rec.recv_seq += [{}, {}]
    rec.cuda_groups.add(1)

    def isend() -> None: ...

    def batch(ops: list[Any]) -> list[Any]:
        taken.append("host")
        return []

    wrapped = recorder.make_batch_p2p(rec, batch, (isend,))
    op = SimpleNamespace(group=1, op=isend, peer=3, tensor=SimpleNamespace(nbytes=64, is_cuda=True))
    assert wrapped([op]) == ["w"] and taken == ["events"]
    wrapped([SimpleNamespace(group=0, op=isend, peer=3, tensor=SimpleNamespace(nbytes=64, is_cuda=False))])
    assert taken == ["events", "host"]


def test_a_cuda_batch_that_raises_is_failed_not_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _batch_recorder(monkeypatch)
    row = (0, 4, 1, 4, 64, 0, 3)

    def broken(ops: list[str]) -> list[Any]:
        raise RuntimeError("NCCL error: remote process exited")

    with pytest.raises(RuntimeError):
        run_cuda_batch(rec, broken, ["send"], [row])
    assert rec.failed == [row] and not rec.in_flight and not rec.cuda_rows


class _Tensor:
    def __init__(self, is_cuda: bool) -> None:
        self.is_cuda = is_cuda


def test_mixed_groups_choose_the_timing_path_by_the_tensors() -> None:
    assert has_cuda_tensor((_Tensor(True),), {})
    assert has_cuda_tensor(([_Tensor(True)], _Tensor(False)), {})  # all_gather's output list
    assert has_cuda_tensor((), {"tensor": _Tensor(True)})
    assert not has_cuda_tensor((_Tensor(False), None, 3), {"async_op": True})


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.slow
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (run on a GPU machine)")
def test_real_nccl_job_is_timed_on_the_gpu(tmp_path: Path) -> None:
    out, calls, prof, fr = tmp_path / "run", tmp_path / "calls.json", tmp_path / "prof", tmp_path / "fr"
    prof.mkdir()
    fr.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), LAGGARD_COMMOPS_DIR=str(out), LAGGARD_COMMOPS_FLUSH_S="0.5",
               TORCH_FR_BUFFER_SIZE="200")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           str(REPO / "tests" / "collector" / "jobs" / "nccl_events.py"), "--out", str(calls),
           "--profile", str(prof), "--fr-dump", str(fr / "rank_0")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    job = json.loads(calls.read_text())
    df = Trace.open(out).commops().sort_values("seq").reset_index(drop=True)
    steps = len(job["calls"]) // 2
    rows = df[df["step"].between(1, steps)]
    assert len(rows) == 3 * steps, rows
    for step in range(1, steps + 1):
        sync_call, cpu_call = (c for c in job["calls"] if c["step"] == step)
        delay_ns = min(sync_call["delay_ns"], cpu_call["delay_ns"])  # what the GPU really spent
        assert delay_ns > 10e6, job  # the delays dwarf launch and clock jitter
        sync_op, async_op, cpu_op = (r for _, r in rows[rows["step"] == step].iterrows())
        # the GPU reached the all-reduce only after the delay queued before it
        assert sync_op["start_ns"] - sync_call["host_call_ns"] > 0.6 * delay_ns, (step, sync_op)
        assert sync_op["end_ns"] - sync_op["start_ns"] < 0.3 * delay_ns
        # the async op ends when its own work is done, not when the caller's wait() returns
        assert async_op["end_ns"] - async_op["start_ns"] < 0.3 * delay_ns, (step, async_op)
        assert async_op["start_ns"] >= sync_op["end_ns"] - 1_000_000
        # a CPU tensor on the mixed group is timed on the host
        assert 0 <= cpu_op["start_ns"] - cpu_call["host_call_ns"] < 0.3 * delay_ns
    kineto = tmp_path / "kineto"
    run_cli("import", "kineto", prof, "--out", kineto, check=True)
    k = Trace.open(kineto).commops()
    assert (k["op"] == "all_reduce").sum() >= 3, k
    for dump in (fr / "rank_0", fr / "rank_0.json"):
        dump_dir = tmp_path / f"fr-{dump.suffix or 'pickle'}"
        dump_dir.mkdir()
        (dump_dir / "rank_0").write_bytes(dump.read_bytes())
        imported = tmp_path / f"imported-{dump.suffix or 'pickle'}"
        run_cli("import", "flight-recorder", dump_dir, "--out", imported, check=True)
        f = pd.read_parquet(imported / "commops.parquet")
        assert (f["op"] == "all_reduce").sum() >= 2 * steps, f
