"""Overlapped data-parallel sync (Megatron's overlap_grad_reduce / overlap_param_gather, DDP buckets)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collector.inputs.errors import UserError
from collector.trace.traceio import Trace
from collector.trace.validate import validate_trace
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace

# 32 GPUs, tp2 pp2 -> dp 8; stage 0 holds ranks 0-15, rank 0's DP group is 0,2,...,14
SLOW, PEER = 2, 0


def _trace(tmp_path: Path, name: str, fault: str | None = None, **kw: object) -> pd.DataFrame:
    cfg = SimConfig(gpus=32, tp=2, pp=2, steps=5, seed=4, clock_skew_ms=0,
                    faults=[FaultSpec.parse(fault)] if fault else [], **kw)  # type: ignore[arg-type]
    simulate_trace(cfg, tmp_path / name)
    assert validate_trace(tmp_path / name) == []
    df = Trace.open(tmp_path / name).commops()
    return df.assign(ms=(df["end_ns"] - df["start_ns"]) / 1e6)


def test_off_by_default_one_blocking_reduce_scatter_after_the_last_chunk(tmp_path: Path) -> None:
    df = _trace(tmp_path, "off")
    r0 = df[df["rank"] == PEER]
    rs = r0[r0["op"] == "reduce_scatter"]
    assert len(rs) == 5 and (rs["nbytes"] == 256 << 20).all()  # one per step, the whole gradient
    tp_end = r0[r0["group"].str.startswith("tp")].groupby("step")["end_ns"].max()
    assert (rs.set_index("step")["start_ns"] >= tp_end).all()  # it starts once the compute is over
    assert "grad_overlap" not in Trace.open(tmp_path / "off").truth()["config"]  # type: ignore[index]


def test_buckets_run_beside_the_backward_and_the_rank_waits_for_them_at_the_end(tmp_path: Path) -> None:
    df = _trace(tmp_path, "on", grad_overlap=True, grad_buckets=3)
    assert Trace.open(tmp_path / "on").truth()["config"]["grad_overlap"] is True  # type: ignore[index]
    rs = df[df["op"] == "reduce_scatter"]
    per = rs.groupby(["rank", "step"])
    assert (per.size() == 3).all()  # three buckets per rank per step
    assert (per["nbytes"].sum() >= (256 << 20) - 3).all()  # together they carry the gradient
    r0 = df[df["rank"] == PEER]
    first_bucket = r0[r0["op"] == "reduce_scatter"].groupby("step")["start_ns"].min()
    tp_end = r0[r0["group"].str.startswith("tp")].groupby("step")["end_ns"].max()
    assert (first_bucket < tp_end).all()  # launched while the backward still runs its TP collectives
    # overlapping records of one rank: a bucket spans TP operators that start after its launch
    b0 = r0[(r0["op"] == "reduce_scatter") & (r0["step"] == 2)].sort_values("start_ns").iloc[0]
    inside = r0[r0["group"].str.startswith("tp") & (r0["start_ns"] > b0["start_ns"]) & (r0["end_ns"] < b0["end_ns"])]
    assert len(inside) >= 1
    # on one communication stream: a rank's buckets end in launch order
    for _, g in r0[r0["op"] == "reduce_scatter"].groupby("step"):
        assert g.sort_values("seq")["end_ns"].is_monotonic_increasing
    # the iteration waits for the last bucket: the optimizer's all-gather starts after it ends
    ag = r0[r0["op"] == "all_gather"].set_index("step")["start_ns"]
    assert (ag >= r0[r0["op"] == "reduce_scatter"].groupby("step")["end_ns"].max()).all()


def _peer_view(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """PEER's own TP operator durations inside each step (the first one also waits for the partners'
    end-of-step waits), and its buckets' time from the first launch to the last end, per step."""
    r = df[df["rank"] == PEER]
    tp = r[r["group"].str.startswith("tp")].sort_values(["step", "seq"])
    tp_ms = tp[tp.duplicated("step")]["ms"].to_numpy()
    rs = r[r["op"] == "reduce_scatter"].groupby("step")
    return tp_ms, ((rs["end_ns"].max() - rs["start_ns"].min()) / 1e6).to_numpy()


def test_a_slow_gpu_delays_its_dp_peers_bucket_ends_not_their_compute(tmp_path: Path) -> None:
    clean = _trace(tmp_path, "clean", grad_overlap=True)
    slow = _trace(tmp_path, "slow", f"gpu:rank={SLOW},factor=3,steps=2:4", grad_overlap=True)
    tp0, span0 = _peer_view(clean)
    tp1, span1 = _peer_view(slow)
    np.testing.assert_allclose(tp1, tp0, atol=0.01)  # the peer's own compute and TP ops are untouched
    assert (span1[2:] > span0[2:] + 5).all()  # its buckets end when the slow replica's are launched
    np.testing.assert_allclose(span1[:2], span0[:2], atol=0.01)  # before the fault: the same
    # the slow rank launched late, so its own buckets are the short ones of its group
    rs = slow[(slow["op"] == "reduce_scatter") & (slow["step"] == 3) & (slow["rank"] % 2 == 0) & (slow["rank"] < 16)]
    last = rs.loc[rs.groupby("rank")["seq"].idxmax()].set_index("rank")["ms"]
    assert last.idxmin() == SLOW


def test_a_slow_nic_slows_the_buckets_of_its_groups(tmp_path: Path) -> None:
    clean = _trace(tmp_path, "clean", grad_overlap=True)
    nic = _trace(tmp_path, "nic", "nic:host=node-0,factor=4,steps=2:4", grad_overlap=True)
    _, span0 = _peer_view(clean)
    _, span1 = _peer_view(nic)
    assert (span1[2:] > 2 * span0[2:]).all()


def test_param_gather_overlap_is_waited_for_by_the_next_forward(tmp_path: Path) -> None:
    df = _trace(tmp_path, "pg", grad_overlap=True, param_gather_overlap=True, grad_buckets=2)
    r0 = df[df["rank"] == PEER]
    ag = r0[r0["op"] == "all_gather"]
    # launched after optimizer.step(): the next step's first operators (the first step's own launch them)
    assert sorted(ag["step"].unique()) == [0, 1, 2, 3, 4] and (ag.groupby("step").size() == 2).all()
    for step in range(5):
        gathers = ag[ag["step"] == step].sort_values("seq")
        tp = r0[(r0["step"] == step) & r0["group"].str.startswith("tp")].sort_values("seq")
        assert gathers["start_ns"].iloc[0] < tp["start_ns"].iloc[0]  # before the step's first compute
        assert gathers["end_ns"].iloc[-1] > tp["start_ns"].iloc[0]  # still running when the forward computes
        assert tp["start_ns"].iloc[0] > gathers["end_ns"].iloc[0]  # the first layer waited for its bucket


def test_bad_bucket_count_is_one_line(tmp_path: Path, cli) -> None:
    with pytest.raises(UserError, match="grad-buckets"):
        SimConfig(gpus=8, grad_buckets=0).resolved()
    bad = cli("simulate", "--gpus", "8", "--grad-overlap", "--grad-buckets", "1000", "--out", tmp_path / "x")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "grad-buckets" in bad.stderr
    ok = cli("simulate", "--gpus", "16", "--tp", "2", "--steps", "2", "--grad-overlap", "--param-gather-overlap",
             "--out", tmp_path / "ok")
    assert ok.returncode == 0, ok.stderr
    cfg = Trace.open(tmp_path / "ok").truth()["config"]  # type: ignore[index]
    assert cfg["grad_overlap"] and cfg["param_gather_overlap"] and cfg["grad_buckets"] == 3
