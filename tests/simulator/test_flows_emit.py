"""simulator.flows: flow bursts consistent with the simulated CommOps, and a readable RoCEv2 pcap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collector.inputs.errors import UserError
from collector.network.flows import pcap_to_flows
from collector.trace.traceio import Trace
from simulator.config import FaultSpec, SimConfig
from simulator.flows import emit_flows, sim_bursts, write_roce_pcap
from simulator.writer import simulate_trace
from tests.flows_sims import sim_flows


def test_only_inter_host_traffic_reaches_the_network() -> None:
    t = Trace.open(sim_flows("small-b"))
    f = t.flows()
    host = {i.ip: i.host for i in t.meta.ranks.values()}
    assert len(f) and (f["src_ip"].map(host) != f["dst_ip"].map(host)).all()
    assert set(f["proto"]) == {"roce"} and (f["dst_port"] == 4791).all() and (f["qp"] > 0).all()
    # one QP per connection: a (src, dst, qp) triple never changes its source port
    assert f.groupby(["src_ip", "dst_ip", "qp"])["src_port"].nunique().max() == 1


def test_bursts_are_in_true_time_and_carry_the_ring_volume() -> None:
    t = Trace.open(sim_flows("small-a"))
    truth = t.truth()
    assert truth is not None
    f = t.flows()
    ops = t.commops()
    off = {h: o for h, o in truth["clock_offsets_ns"].items()}
    true_end = (ops["end_ns"] - ops["rank"].map(lambda r: off[t.meta.ranks[r].host])).max()
    assert abs(int(f["end_ns"].max()) - int(true_end)) < 1_000_000  # within a millisecond of the last op
    dp = ops[ops["group"].str.startswith("dp")]
    k = 4  # 32 GPUs, tp 8: a ring of four hosts per dp group
    per_rank = dp.groupby(["group", "seq"])["nbytes"].first().sum() * (k - 1) / k / (dp["group"].nunique())
    per_edge = f.groupby(["src_ip", "dst_ip"])["bytes"].sum()
    assert np.allclose(per_edge.to_numpy(), per_rank, rtol=0.01)


def test_pcap_reads_back_into_the_same_bursts() -> None:
    """The capture covers the whole job: every burst of flows.parquet, from first to last."""
    d = sim_flows("small-a", pcap=True)
    f = Trace.open(d).flows()
    got = pcap_to_flows(d / "capture.pcap").table.to_pandas()
    assert set(got["proto"]) == {"roce"} and len(got) == len(f)
    assert got["start_ns"].min() == f["start_ns"].min() and got["end_ns"].max() == f["end_ns"].max()
    key = ["src_ip", "dst_ip", "qp", "start_ns"]
    merged = got.merge(f, on=key, suffixes=("", "_sim"))
    assert len(merged) == len(f)
    assert (merged["bytes"] == merged["bytes_sim"]).all() and (merged["end_ns"] == merged["end_ns_sim"]).all()
    truth = Trace.open(d).truth()
    assert truth is not None
    assert truth["flows"]["pcap_packets"] > 0


def test_a_capture_too_large_for_a_file_is_refused(tmp_path: Path) -> None:
    d = sim_flows("small-a")
    bursts = sim_bursts(d)
    with pytest.raises(UserError, match=r"need .* packets .* use --flows"):
        write_roce_pcap(bursts, tmp_path / "c.pcap", max_packets=100)
    assert not (tmp_path / "c.pcap").exists()


def test_a_capture_sees_the_whole_job_whatever_its_logger_kept(tmp_path: Path) -> None:
    """One rank logged per TP group and sampled steps: the fabric still carries every rank's
    traffic in every step, so the flows are those of the job logged whole."""
    job: dict[str, Any] = {"gpus": 32, "tp": 4, "pp": 2, "steps": 10, "seed": 5, "job": "j",
                           "faults": [FaultSpec.parse("link:hosts=node-2+node-3,factor=3,steps=4:9")]}
    loggers: list[tuple[str, dict[str, Any]]] = [("whole", {}), ("part", {"logged_ranks": "one-per-tp", "sample_steps": 3.0})]
    for name, logger in loggers:
        simulate_trace(SimConfig(**job, **logger), tmp_path / name)
        emit_flows(tmp_path / name, pcap=False)
    part, whole = Trace.open(tmp_path / "part"), Trace.open(tmp_path / "whole")
    assert part.commops()["step"].nunique() < 10 and part.commops()["rank"].nunique() == 8
    key = ["src_ip", "dst_ip", "qp", "start_ns", "end_ns", "bytes"]
    got = part.flows().sort_values(key).reset_index(drop=True)[key]
    want = whole.flows().sort_values(key).reset_index(drop=True)[key]
    assert len(got) == len(want) and got.equals(want)
