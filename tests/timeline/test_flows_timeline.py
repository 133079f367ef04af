"""timeline.flows: jobs, parallelism and iterations recognised from flows alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collector.trace.traceio import Trace
from simulator.flows import merge_fabric
from tests.flows_sims import SEMANTICS, sim_flows
from timeline.flows import TP_NOTE, _align, build_flow_timeline


def _truth(t: Trace) -> dict:
    """The simulator's ground truth, which every simulated trace has."""
    truth = t.truth()
    assert truth is not None
    return truth


def test_concurrent_jobs_are_separated_exactly(tmp_path: Path) -> None:
    truth = merge_fabric([sim_flows("small-a"), sim_flows("small-b"), sim_flows("link")], tmp_path / "fabric")
    t = Trace.open(tmp_path / "fabric")
    tl = build_flow_timeline(t.flows(), t.meta)
    assert sorted(sorted(j.endpoints) for j in tl.jobs) == sorted(truth.values())


@pytest.mark.parametrize("p2p", SEMANTICS)
def test_parallelism_rings_and_chains(p2p: str) -> None:
    t = Trace.open(sim_flows("healthy", p2p=p2p))  # 64 GPUs, tp 8, pp 2: dp 4 over hosts of each stage
    job = build_flow_timeline(t.flows(), t.meta).job(t.meta.job)
    assert job is not None and job.name == "healthy"
    rings = sorted(g.hosts for g in job.groups if g.kind == "dp")
    assert rings == [["node-0", "node-1", "node-2", "node-3"], ["node-4", "node-5", "node-6", "node-7"]]
    chains = sorted(g.hosts for g in job.groups if g.kind == "pp")
    assert chains == [[f"node-{h}", f"node-{h + 4}"] for h in range(4)]
    assert job.parallelism() == {"dp": 4, "pp": 2}
    assert TP_NOTE in job.notes


@pytest.mark.parametrize("p2p", SEMANTICS)
def test_two_host_rings_and_pipeline_pairs_are_told_apart(p2p: str) -> None:
    """With dp 2 every group is a two-way host pair: a ring of two syncs once or twice per iteration,
    a pipeline edge carries a transfer per microbatch each way (overlapping both ways unless eager)."""
    t = Trace.open(sim_flows("pairs", p2p=p2p))  # 32 GPUs, tp 8, pp 2, dp 2: node-0/1 stage 0, node-2/3 stage 1
    job = build_flow_timeline(t.flows(), t.meta).job(t.meta.job)
    assert job is not None
    assert [(g.kind, g.hosts) for g in job.groups] == [
        ("dp", ["node-0", "node-1"]), ("dp", ["node-2", "node-3"]), ("pp", ["node-0", "node-2"]), ("pp", ["node-1", "node-3"])]
    truth = np.asarray(_truth(t)["step_time_s"])
    got = job.iterations["duration_s"].to_numpy()
    assert len(got) == len(truth) and np.max(np.abs(got[1:] - truth[1:]) / truth[1:]) < 1e-3


@pytest.mark.parametrize("p2p", SEMANTICS)
def test_iterations_match_the_simulated_step_times(p2p: str) -> None:
    for name in ("healthy", "straggler", "link", "nic", "switch"):
        t = Trace.open(sim_flows(name, p2p=p2p))
        job = build_flow_timeline(t.flows(), t.meta).job(t.meta.job)
        assert job is not None
        it = job.iterations
        truth = np.asarray(_truth(t)["step_time_s"])
        assert len(it) == len(truth)
        got = it["duration_s"].to_numpy()[1:]
        assert np.max(np.abs(got - truth[1:]) / truth[1:]) < 1e-3, name
        assert not it["complete"].iloc[0] and it["complete"].iloc[1:].all()


@pytest.mark.parametrize("p2p", SEMANTICS)
def test_a_tp_ring_across_two_hosts_is_not_part_of_the_dp_rings(p2p: str) -> None:
    """tp 8 on 4-GPU hosts: each TP ring crosses the network twice (GPU 3 -> GPU 4, GPU 7 -> GPU 0)
    in every layer, and joins at host level the DP rings through the same hosts; its hops close no
    cycle of endpoints, so they are a TP group of their own and the DP rings' syncs cut the steps."""
    t = Trace.open(sim_flows("tp-across-hosts", p2p=p2p))  # 64 GPUs, dp 8, TP ring i over node-2i and node-2i+1
    job = build_flow_timeline(t.flows(), t.meta).job(t.meta.job)
    assert job is not None
    assert {tuple(g.hosts) for g in job.groups if g.kind == "tp"} == {(f"node-{2 * i}", f"node-{2 * i + 1}") for i in range(8)}
    rings = sorted(g.hosts for g in job.groups if g.kind == "dp")
    assert rings == [[f"node-{h}" for h in range(0, 16, 2)], [f"node-{h}" for h in range(1, 16, 2)]]
    truth = np.asarray(_truth(t)["step_time_s"])
    got = job.iterations["duration_s"].to_numpy()
    assert len(got) == len(truth) and np.max(np.abs(got[1:] - truth[1:]) / truth[1:]) < 1e-3


def _tcp_flows(rows: list[tuple[int, int, str, str, int, int]]) -> pd.DataFrame:
    """A flow table of hand-made (start_ns, end_ns, src_ip, dst_ip, bytes, packets) bursts over TCP."""
    f = pd.DataFrame(rows, columns=["start_ns", "end_ns", "src_ip", "dst_ip", "bytes", "packets"])
    return f.assign(src_port=5000, dst_port=6000, proto="tcp", qp=-1)


def test_acks_and_one_off_transfers_do_not_make_groups() -> None:
    ring = [("10.9.0.1", "10.9.0.2"), ("10.9.0.2", "10.9.0.3"), ("10.9.0.3", "10.9.0.1")]
    rows = []
    for step in range(6):
        t0 = step * 100_000_000
        for s, d in ring:
            rows.append((t0, t0 + 5_000_000, s, d, 10_000_000, 2_000))
            rows.append((t0, t0 + 5_000_000, d, s, 60 * 300, 300))  # acknowledgements
    rows.append((1, 2, "10.9.0.1", "10.9.0.3", 50_000, 40))  # a one-off setup transfer
    f = _tcp_flows(rows)
    job = build_flow_timeline(f).jobs[0]
    assert [(g.kind, g.hosts) for g in job.groups] == [("dp", ["10.9.0.1", "10.9.0.2", "10.9.0.3"])]
    assert np.allclose(job.iterations["duration_s"].iloc[1:], 0.1)


def test_a_sync_in_two_phases_is_one_iteration_whatever_the_pause_between_them() -> None:
    """Each iteration syncs in two equal phases (reduce-scatter, all-gather) 10 ms apart, 40 ms
    once a slow link holds the ring; either cut is even, and the iteration is the coarser one."""
    ring = [("10.9.0.1", "10.9.0.2"), ("10.9.0.2", "10.9.0.3"), ("10.9.0.3", "10.9.0.1")]
    rows, t, ends = [], 0, []
    for step in range(12):
        t += 130_000_000  # forward and backward: no traffic
        between = 10_000_000 if step < 4 else 40_000_000
        for phase in range(2):
            for _ in range(2):  # a phase is bursts 0.1 ms apart, under the burst gap
                for s, d in ring:
                    rows.append((t, t + 5_000_000, s, d, 50_000_000, 12_500))
                t += 5_100_000
            t += between if phase == 0 else 0
        ends.append(t - 100_000)
    f = _tcp_flows(rows)
    it = build_flow_timeline(f).jobs[0].iterations
    assert len(it) == 12
    assert np.allclose(it["end_ns"], ends)


def test_a_straggler_stall_after_the_first_chunks_is_not_the_iteration_end() -> None:
    """From step 6 a straggler holds its ring 400 ms after the peers' first chunks (a tenth of
    the sync), over three times the 120 ms compute pause: the iteration still ends at that pause."""
    ring = [("10.9.0.1", "10.9.0.2"), ("10.9.0.2", "10.9.0.3"), ("10.9.0.3", "10.9.0.1")]
    rows, t, ends = [], 0, []
    for step in range(16):
        t += 120_000_000  # forward and backward: no traffic
        for chunk in range(10):
            if chunk == 1 and step >= 6:
                t += 400_000_000  # the peers' first chunks went out; they wait for the straggler
            for s, d in ring:
                rows.append((t, t + 1_000_000, s, d, 1_000_000, 700))
            t += 1_100_000
        ends.append(t - 100_000)
    f = _tcp_flows(rows)
    it = build_flow_timeline(f).jobs[0].iterations
    assert len(it) == 16
    assert np.allclose(it["end_ns"], ends)


def test_rings_that_end_a_hair_apart_either_way_are_aligned_to_the_same_iteration() -> None:
    """Two DP rings of a 256-GPU job (matrix seed 4646) closed each iteration within 0.8 ms of each
    other, the second a hair before the first in half of them: read as the next anchor after each,
    the rings seemed 154 ms apart (half a period), each iteration was matched to the next one, and
    a steady 0.31 s iteration came out as 0.04 s and 0.58 s."""
    ref = np.array([0, 269933056, 539196416, 831100160, 1147753984, 1469194752, 1785651456, 2103060992,
                    2416201472, 2728176128, 3041162240, 3358081792, 3666650368, 3977315840, 4285954048, 4594339584])
    other = np.array([585728, 270765568, 539197184, 831561984, 1147001600, 1468530176, 1785392384, 2103042816,
                      2416095488, 2727891200, 3041358336, 3357522688, 3666807552, 3977486080, 4285791232, 4593581056])
    period = float(np.median(np.diff(ref)))
    assert np.array_equal(_align(ref, other, period), other)
    late = ref + 40_000_000  # a ring that ends later by a steady offset is matched too
    assert np.array_equal(_align(ref, late, period), late)
