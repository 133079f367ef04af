"""Point-to-point semantics: eager, rendezvous and batched transfers between pipeline stages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collector.inputs.errors import UserError
from collector.trace.traceio import Trace
from collector.trace.validate import validate_trace
from simulator.config import P2P_MODES, FaultSpec, SimConfig
from simulator.writer import simulate_trace

SLOW = 9  # a rank of stage 2 of a 16-GPU tp2 pp4 job (stage size 4): stage 1's rank 5 sends to it


def _p2p_ms(tmp_path: Path, mode: str, fault: str | None) -> tuple[float, float]:
    """Median send 5->9 and recv 9<-5 duration (ms) in the faulty steps."""
    faults = [FaultSpec.parse(fault)] if fault else []
    out = tmp_path / f"{mode}-{bool(fault)}"
    simulate_trace(SimConfig(gpus=16, tp=2, pp=4, steps=6, seed=1, p2p=mode, faults=faults), out)
    df = Trace.open(out).commops()
    df = df[df["step"] >= 3].assign(ms=(df["end_ns"] - df["start_ns"]) / 1e6)
    send = df[(df["op"] == "send") & (df["rank"] == 5) & (df["peer"] == SLOW)]["ms"].median()
    recv = df[(df["op"] == "recv") & (df["rank"] == SLOW) & (df["peer"] == 5)]["ms"].median()
    return float(send), float(recv)


def test_rendezvous_late_receiver_makes_the_send_long_and_the_recv_short(tmp_path: Path) -> None:
    fault = f"gpu:rank={SLOW},factor=3,steps=3:5"
    send, recv = _p2p_ms(tmp_path, "rendezvous", fault)
    send0, _ = _p2p_ms(tmp_path, "rendezvous", None)
    transfer_ms = 32 * (1 << 20) / 25e9 * 1e3  # 32 MiB activation over a 25 GB/s link: ~1.3 ms
    assert send > 5 * send0  # the sender waited for its late receiver
    assert recv < 1.5 * transfer_ms  # the late receiver found its sender waiting: only the transfer


def test_eager_late_receiver_leaves_the_send_alone(tmp_path: Path) -> None:
    fault = f"gpu:rank={SLOW},factor=3,steps=3:5"
    send, recv = _p2p_ms(tmp_path, "eager", fault)
    send0, _ = _p2p_ms(tmp_path, "eager", None)
    assert send < 1.3 * send0  # the send finished after its transfer, whatever the receiver did
    assert recv < 0.5  # the data was already there when the late receiver posted


def test_rendezvous_transfer_starts_at_the_later_post_and_both_sides_end_together(tmp_path: Path) -> None:
    simulate_trace(SimConfig(gpus=16, tp=2, pp=4, steps=3, seed=2, clock_skew_ms=0,
                             faults=[FaultSpec.parse("gpu:rank=6,factor=2")]), tmp_path / "t")
    df = Trace.open(tmp_path / "t").commops()
    sends = df[df["op"] == "send"].rename(columns={"rank": "src", "peer": "dst"})
    recvs = df[df["op"] == "recv"].rename(columns={"rank": "dst", "peer": "src"})
    pairs = sends.merge(recvs, on=["group", "src", "dst", "seq"], suffixes=("_s", "_r"))
    assert len(pairs) == len(sends) == len(recvs)
    later = np.maximum(pairs["start_ns_s"], pairs["start_ns_r"])
    wire_ms = (np.minimum(pairs["end_ns_s"], pairs["end_ns_r"]) - later) / 1e6
    assert wire_ms.min() > 0  # nothing completes before both sides are there
    assert wire_ms.max() < 2.5  # ... and then only the transfer (at most ~1.3 ms + noise), never a wait
    assert ((pairs["end_ns_s"] - pairs["end_ns_r"]).abs() / 1e6).max() < 0.05  # both complete together


def _batches(tmp_path: Path, mode: str) -> tuple[int, int, int]:
    """(recv rows, send+recv pairs of one rank posted at the same instant, those that also ended together)."""
    simulate_trace(SimConfig(gpus=16, tp=2, pp=4, steps=2, seed=3, p2p=mode), tmp_path / mode)
    df = Trace.open(tmp_path / mode).commops()
    p2p = df[df["op"].isin(["send", "recv"])]
    by = p2p.groupby(["rank", "start_ns"])
    pair = by["op"].agg(lambda ops: set(ops) == {"send", "recv"})
    together = pair & (by["end_ns"].nunique() == 1)
    return int((p2p["op"] == "recv").sum()), int(pair.sum()), int(together.sum())


def test_batched_send_and_recv_share_a_start_and_an_end(tmp_path: Path) -> None:
    recvs, pairs, together = _batches(tmp_path, "batched")
    # every boundary with both a send and a recv is one batch (all but each stage's first and last)
    assert pairs > 0.8 * recvs and together == pairs  # posted together, waited together
    # rendezvous posts the recv and then the blocking send at the same instant, but each completes on its own
    recvs, pairs, together = _batches(tmp_path, "rendezvous")
    assert pairs > 0.8 * recvs and together < 0.05 * pairs
    assert _batches(tmp_path, "eager")[1] == 0  # eager posts the recv only once its send is done


@pytest.mark.parametrize("mode", P2P_MODES)
def test_no_deadlock_for_any_pipeline_depth_or_interleaving(tmp_path: Path, mode: str) -> None:
    for pp in range(2, 9):
        for vstages in (1, 2, 3):
            micro = 2 * pp if vstages > 1 else max(4, 2 * pp)
            cfg = SimConfig(gpus=2 * pp, pp=pp, steps=1, seed=pp, p2p=mode, virtual_stages=vstages,
                            microbatches=micro, gpus_per_host=2, hosts_per_switch=2)
            out = tmp_path / f"{pp}-{vstages}"
            simulate_trace(cfg, out)
            df = Trace.open(out).commops(columns=["op"])
            # every stage but the ends sends each chunk's output once each way
            expected = 2 * 2 * micro * (vstages * pp - 1)
            assert (df["op"] == "send").sum() == (df["op"] == "recv").sum() == expected, (pp, vstages)


def test_network_faults_slow_transfers_and_compute_faults_do_not(tmp_path: Path) -> None:
    """Under rendezvous, time on the wire (from the later post) grows with a NIC fault only."""
    def wire(fault: str) -> pd.Series:
        out = tmp_path / fault.split(":")[0]
        simulate_trace(SimConfig(gpus=16, tp=2, pp=4, steps=4, seed=4, clock_skew_ms=0, gpus_per_host=4,
                                 faults=[FaultSpec.parse(fault)]), out)
        df = Trace.open(out).commops()
        sends = df[df["op"] == "send"].rename(columns={"rank": "src", "peer": "dst"})
        recvs = df[df["op"] == "recv"].rename(columns={"rank": "dst", "peer": "src"})
        p = sends.merge(recvs, on=["group", "src", "dst", "seq"], suffixes=("_s", "_r"))
        p = p[p["src"] // 4 != p["dst"] // 4]  # inter-host only
        ms = (p["end_ns_r"] - np.maximum(p["start_ns_s"], p["start_ns_r"])) / 1e6
        return ms.groupby([(p["src"] // 4 == 1) | (p["dst"] // 4 == 1)]).median()

    nic, gpu = wire("nic:host=node-1,factor=4"), wire("gpu:rank=5,factor=4")
    assert nic[True] > 3 * nic[False]
    assert gpu[True] < 1.3 * gpu[False]


def test_bad_p2p_mode_is_a_user_error(tmp_path: Path, cli) -> None:
    with pytest.raises(UserError, match="p2p"):
        SimConfig(gpus=8, p2p="telepathy").resolved()
    bad = cli("simulate", "--gpus", "8", "--p2p", "telepathy", "--out", tmp_path / "x")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


@pytest.mark.parametrize("mode", P2P_MODES)
def test_every_mode_writes_a_valid_trace_with_its_setting(tmp_path: Path, mode: str, cli) -> None:
    ok = cli("simulate", "--gpus", "32", "--tp", "4", "--pp", "4", "--virtual-stages", "2", "--steps", "3",
             "--p2p", mode, "--out", tmp_path / mode)
    assert ok.returncode == 0, ok.stderr
    assert validate_trace(tmp_path / mode) == []
    assert Trace.open(tmp_path / mode).truth()["config"]["p2p"] == mode  # type: ignore[index]


@pytest.mark.parametrize("mp_sync", [False, True])
def test_iteration_end_model_parallel_sync_on_or_off(tmp_path: Path, mp_sync: bool) -> None:
    cfg = SimConfig(gpus=32, tp=2, pp=4, steps=3, seed=6, clock_skew_ms=0, mp_sync=mp_sync)
    simulate_trace(cfg, tmp_path / "t")
    assert validate_trace(tmp_path / "t") == []
    trace = Trace.open(tmp_path / "t")
    mp_groups = {g: m for g, m in trace.meta.groups.items() if g.startswith("mp-")}
    df = trace.commops()
    mp = df[df["group"].str.startswith("mp-")]
    if not mp_sync:
        assert not mp_groups and mp.empty and "group_kinds" not in trace.meta.extra
        return
    # one group per replica (dp = 4), each holding that replica's tp x pp = 8 ranks across all stages
    assert len(mp_groups) == 4 and all(len(m) == 8 for m in mp_groups.values())
    assert sorted(mp_groups["mp-0"]) == [0, 1, 8, 9, 16, 17, 24, 25]
    assert "mp" in trace.meta.extra["group_kinds"]
    assert (mp["op"] == "all_reduce").all() and len(mp) == 32 * 3  # once per rank per step
    assert (mp.groupby(["group", "step"])["seq"].nunique() == 1).all()
    # a collective: every member leaves together (within jitter), however late it arrived
    spread_ms = mp.groupby(["group", "step"])["end_ns"].agg(np.ptp) / 1e6
    assert spread_ms.max() < 0.05
    assert (mp.groupby("step")["start_ns"].agg(np.ptp) / 1e6).min() > 1  # stages arrive at different times
