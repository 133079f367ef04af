"""localize.commops: the last arrivers' history is read at their rows only, with the same answers."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from collector.trace.traceio import Trace
from localize.commops import COLUMNS, _late_history
from localize.ops import history, table
from localize.ops.history import slot_history, step_scale
from localize.ops.table import Ops, prepare_ops, sorted_rows

GREW = np.ones(4)  # every rank of a 4-rank job computed longer in the slow steps (`computed_longer`)
TRACE = Path(__file__).resolve().parents[2] / "traces" / "gpu-straggler"


@pytest.fixture(scope="module")
def ops() -> Ops:
    return prepare_ops(sorted_rows(Trace.open(TRACE).commops(columns=COLUMNS)))


def _view(ops: Ops) -> SimpleNamespace:
    steps = np.unique(ops.step)  # a drifting step time, so the scale is not 1
    return SimpleNamespace(steps=pd.DataFrame({"step": steps, "baseline_s": 1.0 + 0.01 * np.arange(len(steps))}))


@pytest.mark.parametrize("ref", ["normal", "none seen"])
def test_late_history_is_slot_history_at_the_last_arrivers(ops: Ops, ref: str) -> None:
    """Bit for bit the per-row figures read at the late rows ("none seen": every slot falls back on
    its instance's minimum)."""
    steps = np.unique(ops.step)
    ref_steps = steps[2:-3] if ref == "normal" else np.array([int(steps.max()) + 100])
    view = _view(ops)
    scale = step_scale(ops, view.steps)
    med, q1, q3 = slot_history(ops, ref_steps, scale)
    late, s = ops.late_row, scale[ops.late_row]
    base, spread = _late_history(ops, view, ref_steps)  # type: ignore[arg-type]
    np.testing.assert_array_equal(base, med[late] * s)
    np.testing.assert_array_equal(spread, (q3[late] - q1[late]) * s)


def test_late_history_holds_no_per_row_quantiles(ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three per-row quantile arrays (24 bytes a row) made this stage the analysis's peak on a
    5 M-row job; it now holds the scale, the scaled times and the slots x steps history. (Small
    chunks: on this small trace the history's chunk scratch would hide the difference.)"""
    monkeypatch.setattr(table, "_CHUNK", 4096)
    monkeypatch.setattr(history, "_CHUNK", 4096)  # (its own binding of table's constant)
    view, ref = _view(ops), np.unique(ops.step)[2:-3]
    tracemalloc.start()
    try:
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        _late_history(ops, view, ref)  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    assert peak < 4 * 8 * len(ops.rank)  # was 5.3 row-sized float arrays, now 3.3


def test_an_irregular_step_with_no_rows_in_the_window_is_left_out_not_a_crash() -> None:
    """The service's fetch from a live job came back without one of the irregular steps it asked
    for: the per-step blame table had a column the step mask did not ("shape mismatch"), every
    round failed, and the job read irregular with no candidate (tests/deploy/test_slurm.py)."""
    from localize.commops import analyse_ops
    from localize.ops.steps import step_view, with_steps
    from tests.conftest import REPO
    from timeline.columns import read_commops

    trace = Trace.open(REPO / "traces" / "gpu-straggler")
    view = step_view(trace, None)
    df = sorted_rows(with_steps(read_commops(trace, COLUMNS, None)))
    verdict, _ = analyse_ops(df[df["step"] != view.irregular_steps[2]].reset_index(drop=True), trace.meta, view)
    assert [c.device() for c in verdict.candidates[:1]] == ["gpu rank 13 (node-1 gpu 5)"]


def test_replicas_late_only_where_a_slow_link_delivered_their_data_are_the_link() -> None:
    """With eager sends a slow pipeline link makes its receivers late, and which replicas that shows
    in moves step to step with its traffic: a "data" unit. Its blame is the link's where it sits
    on the ranks of the link's two hosts whose own transfers through it were slow; elsewhere, or
    a device, it stays."""
    from collector.trace.meta import JobMeta
    from localize.commops import network_shadow
    from localize.network.devices import NetCandidate
    from localize.waits.ranking import RankUnit

    meta = JobMeta.from_dict({"job": "j", "world_size": 8,
                              "ranks": {str(r): {"host": f"node-{r // 2}", "gpu": r % 2} for r in range(8)}})
    link = NetCandidate("link", ("node-1", "node-2"), 0.9, 2, 2, carried=["pp-a", "pp-b"])
    slow = {"pp-a": 0.1, "pp-b": 0.1}
    members = {"pp-a": [2, 4], "pp-b": [3, 5], "dp": [0, 2, 4, 6]}
    blame = np.array([0.0, 0.0, 0.3, 0.2, 0.3, 0.2, 0.0, 0.01])
    ends = RankUnit("data", [2, 3, 4, 5], 0.98, 1.0, "2 model replicas")
    kept, moved = network_shadow([ends], link, slow, members, blame, meta)
    assert kept == [] and moved == pytest.approx(1.0)
    elsewhere = RankUnit("data", [2, 6, 7], 0.9, 1.0, "2 model replicas")
    blame_elsewhere = np.array([0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.3, 0.2])
    assert network_shadow([elsewhere], link, slow, members, blame_elsewhere, meta) == ([elsewhere], 0.0)
    gpu = RankUnit("gpu", [2], 0.9, 1.0, "rank 2")
    assert network_shadow([gpu], link, slow, members, blame, meta) == ([gpu], 0.0)
    # the link's groups ran normally: nothing crossed it slow, nothing is its shadow
    assert network_shadow([ends], link, {}, members, blame, meta) == ([ends], 0.0)
    # a host stands for itself, not for a switch of its name
    host = NetCandidate("host", ("node-1",), 0.9, 2, 2, carried=["pp-a", "pp-b"])
    on_host = RankUnit("data", [2, 3], 0.9, 1.0, "2 model replicas")
    assert network_shadow([on_host], host, slow, members, blame, meta) == ([], pytest.approx(0.5))


def test_a_host_late_in_compute_and_slow_in_its_transfers_is_one_finding_over_its_nic() -> None:
    """A real host at 12% of its CPU under gloo: its transfers alone named its NIC (0.85) a hair
    over the host (0.83); its ranks' lateness, which no NIC causes, tips it to the host. A NIC
    fault leaves its host's ranks on time, and one GPU's blame does not pull a slow GPU's
    verdict to its host when the transfers hold little of the delay."""
    from collector.trace.meta import JobMeta
    from localize.commops import host_on_both
    from localize.network.devices import NetCandidate
    from localize.waits.ranking import RankUnit

    meta = JobMeta.from_dict({"job": "j", "world_size": 4,
                              "ranks": {str(r): {"host": f"node-{r // 2}", "gpu": r % 2} for r in range(4)}})
    net = [NetCandidate("nic", ("node-1",), 0.85, 2, 3), NetCandidate("host", ("node-1",), 0.83, 2, 4)]
    host = RankUnit("host", [2, 3], 0.99, 1.0, "node-1")
    found = host_on_both([host], net, meta, rank_frac=0.09, comm_frac=0.91, computed=GREW)
    assert found is not None and found[1] is net[1] and found[2] > 0.85 * 0.91
    assert host_on_both([], net, meta, rank_frac=0.0, comm_frac=1.0, computed=GREW) is None  # a NIC fault: no rank late
    gpu = RankUnit("gpu", [2], 0.98, 1.0, "rank 2")
    assert host_on_both([gpu], net, meta, rank_frac=0.11, comm_frac=0.89, computed=GREW) is not None
    assert host_on_both([gpu], net, meta, rank_frac=0.7, comm_frac=0.3, computed=GREW) is None  # the GPU's own delay
    other = RankUnit("host", [0, 1], 0.99, 1.0, "node-0")
    assert host_on_both([other], net, meta, rank_frac=0.09, comm_frac=0.91, computed=GREW) is None
    # no group inside node-1: the resolver lists its NIC for both, and the ranks decide
    nic_only = [NetCandidate("nic", ("node-1",), 0.85, 2, 3), NetCandidate("link", ("node-0", "node-1"), 0.6, 1, 2)]
    found = host_on_both([host], nic_only, meta, rank_frac=0.2, comm_frac=0.8, computed=GREW)
    assert found is not None and (found[1].kind, found[1].key) == ("host", ("node-1",)) and nic_only[0].kind == "nic"
    assert host_on_both([], nic_only, meta, rank_frac=0.0, comm_frac=1.0, computed=GREW) is None


HOSTS8 = np.arange(8) // 2  # (host index per rank: two ranks a host)


def test_a_host_holding_half_the_logged_ranks_is_measured_against_the_others() -> None:
    """A real DDP job on two hosts, node-1 under a CPU quota of 8.9% (bench.realjobs --cpu, seed 0,
    run 2): its ranks' compute grew 17-20 ms a step, the other host's shrank 50-55 ms. Against the
    median of all four ranks, between the hosts, neither host computed longer; against the ranks
    elsewhere, node-1's did."""
    from localize.commops import computed_longer

    grew = np.array([-54.6e-3, -50.0e-3, 19.5e-3, 17.2e-3])
    assert computed_longer(grew, np.ones(4, dtype=bool), np.array([0, 0, 1, 1])).tolist() == [0, 0, 1, 1]


def test_a_rank_computing_a_hair_longer_than_a_few_close_peers_did_not_compute_longer() -> None:
    """A real HSDP job, a rank per host, host-2's NIC throttled (`bench.realjobs --network --seed 13`,
    run 4): every rank computed 2-3 ms a step less in the slow steps, rank 2 0.5 ms less so. Four
    ranks' robust σ is a fraction of that, and the full records named host-2 for its NIC; a share of
    a normal step (270 ms there) bounds what counts as longer."""
    from localize.commops import computed_longer

    grew = np.array([-2.97e-3, -2.83e-3, -2.18e-3, -2.28e-3])
    every = np.ones(4, dtype=bool)
    assert computed_longer(grew, every, np.arange(4)).tolist() == [0, 0, 1, 0]  # (σ alone)
    assert computed_longer(grew, every, np.arange(4), floor=9e-3).tolist() == [0, 0, 0, 0]
    starved = grew + np.array([0.0, 0.0, 40e-3, 0.0])
    assert computed_longer(starved, every, np.arange(4), floor=9e-3).tolist() == [0, 0, 1, 0]


def test_a_host_whose_ranks_did_not_compute_longer_or_that_ends_a_slow_link_is_not_one_finding() -> None:
    """A 4x NIC under eager sends: its host's ranks waited on their unlogged TP peers, whose data
    came late through it, and read as the host (0.94). Its ranks computed no longer than anyone's:
    the NIC. A 4.6x link under batched p2p: the host at its one end explained the slow transfers
    at 0.64 against the link's 1.0, its ranks' lateness the link's."""
    from collector.trace.meta import JobMeta
    from localize.commops import computed_longer, host_on_both
    from localize.network.devices import NetCandidate
    from localize.waits.ranking import RankUnit

    meta = JobMeta.from_dict({"job": "j", "world_size": 8,
                              "ranks": {str(r): {"host": f"node-{r // 2}", "gpu": r % 2} for r in range(8)}})
    host = RankUnit("host", [2, 3], 0.6, 1.0, "node-1")
    nic = [NetCandidate("nic", ("node-1",), 0.98, 5, 5)]
    logged = np.array([True, False] * 4)  # one rank per TP group
    common = np.array([2.1e-3, 0.0, 2.0e-3, 0.0, 2.3e-3, 0.0, 1.9e-3, 0.0])
    assert np.isnan(computed_longer(common, logged, HOSTS8)[1::2]).all() and computed_longer(common, logged, HOSTS8)[2] == 0
    assert host_on_both([host], nic, meta, rank_frac=0.09, comm_frac=0.91, computed=computed_longer(common, logged, HOSTS8)) is None
    starved = common.copy()
    starved[2] = 30e-3
    assert computed_longer(starved, logged, HOSTS8)[2] == 1
    assert host_on_both([host], nic, meta, rank_frac=0.09, comm_frac=0.91, computed=computed_longer(starved, logged, HOSTS8)) is not None
    link = [NetCandidate("link", ("node-1", "node-3"), 1.0, 8, 8), NetCandidate("host", ("node-1",), 0.64, 8, 17)]
    every = np.ones(8)
    assert host_on_both([host], link, meta, rank_frac=0.35, comm_frac=0.65, computed=every) is None


def test_a_host_holding_a_sliver_of_the_rank_blame_does_not_tip_a_network_tie() -> None:
    """Every member of a slow DP ring late alike (its forward waiting on the ring's all-gather): the
    blame's first unit, one host of sixteen at 6%, named the host over the ring's tied links (a
    256-GPU link fault). A host that stands out in the blame still does."""
    from collector.trace.meta import JobMeta
    from localize.commops import host_on_both
    from localize.network.devices import NetCandidate
    from localize.waits.ranking import MIN_SHARE, RankUnit

    meta = JobMeta.from_dict({"job": "j", "world_size": 4,
                              "ranks": {str(r): {"host": f"node-{r // 2}", "gpu": r % 2} for r in range(4)}})
    ring = [NetCandidate("link", ("node-0", "node-1"), 0.52, 1, 1), NetCandidate("host", ("node-1",), 0.52, 1, 6)]
    sliver = RankUnit("host", [2, 3], MIN_SHARE * 0.8, 1.0, "node-1")
    assert host_on_both([sliver], ring, meta, rank_frac=0.8, comm_frac=0.2, computed=GREW) is None
    whole = RankUnit("host", [2, 3], 0.9, 1.0, "node-1")
    assert host_on_both([whole], ring, meta, rank_frac=0.8, comm_frac=0.2, computed=GREW) is not None


def _rings(slow_steps: set[int], steps: int = 10) -> tuple[Ops, object]:
    """Four 4-rank DP rings on four hosts each, one all-gather a step; ring dp-3's takes 3x in
    `slow_steps`."""
    from collector.trace.meta import JobMeta

    rng = np.random.default_rng(7)
    rows = []
    for s in range(steps):
        for g in range(4):
            took = 10e6 * (3.0 if g == 3 and s in slow_steps else 1.0) * (1 + 0.02 * rng.standard_normal())
            for m in range(4):
                start = s * 10**9 + int(rng.integers(0, 1000))
                rows.append({"rank": 4 * m + g, "group": f"dp-{g}", "op": "all_gather", "seq": s, "peer": -1,
                             "nbytes": 1 << 26, "start_ns": start, "end_ns": s * 10**9 + 1000 + int(took), "step": s})
    meta = JobMeta.from_dict({"job": "j", "world_size": 16,
                              "ranks": {str(r): {"host": f"node-{r // 4}", "gpu": r % 4} for r in range(16)},
                              "groups": {f"dp-{g}": [4 * m + g for m in range(4)] for g in range(4)}})
    return prepare_ops(sorted_rows(pd.DataFrame(rows))), meta


def test_a_ring_slow_in_half_its_normal_steps_is_slow_against_its_path_class() -> None:
    """A link under an overlapped DP ring, on in steps the step times left normal, is half of the
    ring's own history, so its own median and spread clear it; the other rings of its class (same
    operator, payload, members and hosts) ran normally and show it slow. A ring that was never
    fast (its path is longer) is not."""
    from localize.commops import _comm_excess

    ops, meta = _rings({2, 4, 6, 8, 9})
    view = SimpleNamespace(steps=pd.DataFrame({"step": np.arange(10), "baseline_s": np.ones(10)}))
    ref = np.arange(1, 9)
    excess, _ = _comm_excess(ops, meta, np.zeros(len(ops.rank), bool), view, ref)  # type: ignore[arg-type]
    slow = {(str(ops.groups[ops.inst_group[i]]), int(ops.inst_step[i])) for i in np.flatnonzero(excess > 0)}
    assert slow == {("dp-3", 9)}
    ops, meta = _rings(set(range(10)))
    excess, _ = _comm_excess(ops, meta, np.zeros(len(ops.rank), bool), view, ref)  # type: ignore[arg-type]
    assert not (excess > 0).any()


def test_a_network_tie_holding_the_nic_of_the_one_host_that_computed_longer_is_that_host() -> None:
    """A real DDP job, node-1 under a CPU quota: the ring's all-reduces ran on its CPUs and every
    copy ended together, so nobody was waited on and the tie of the ring's devices stood. Its two
    ranks alone computed longer: the host. Not where another host's rank did too, where its one
    logged rank alone did, or where its NIC is not in the tie."""
    from collector.trace.meta import JobMeta
    from localize.commops import host_breaks_tie
    from localize.network.devices import NetCandidate

    meta = JobMeta.from_dict({"job": "j", "world_size": 4,
                              "ranks": {str(r): {"host": f"node-{r // 2}", "gpu": r % 2} for r in range(4)}})
    tie = [NetCandidate("link", ("node-0", "node-1"), 1.0, 1, 1), NetCandidate("nic", ("node-0",), 1.0, 1, 1),
           NetCandidate("nic", ("node-1",), 1.0, 1, 1)]
    host, hosts = np.array([0, 0, 1, 1]), meta.hosts()
    got = host_breaks_tie(tie, host, hosts, np.array([0.0, 0.0, 1.0, 1.0]))
    assert got is not None and (got.kind, got.key) == ("host", ("node-1",))
    assert host_breaks_tie(tie, host, hosts, np.array([1.0, 0.0, 1.0, 1.0])) is None
    assert host_breaks_tie(tie, host, hosts, np.array([0.0, 0.0, 1.0, np.nan])) is None
    below = [tie[0], tie[1], NetCandidate("nic", ("node-1",), 0.8, 1, 1)]
    assert host_breaks_tie(below, host, hosts, np.array([0.0, 0.0, 1.0, 1.0])) is None


def test_a_host_inside_whose_ranks_computed_no_longer_is_collateral() -> None:
    """A host's inside named by in-host transfers that slowed with its network is dropped when none
    of its logged ranks computed longer (a throttled NIC's host under gloo); kept when one did (a
    starved host), when the host logged nothing, and for any other kind of device."""
    from localize.commops import collateral_inside
    from localize.network.devices import NetCandidate

    inside = NetCandidate("host", ("node-1",), 0.7, 3, 4, inside=["dp-1"])
    host, hosts = np.array([0, 0, 1, 1]), ["node-0", "node-1"]
    assert collateral_inside(inside, hosts, host, np.array([0.0, 0.0, 0.0, 0.0]))
    assert not collateral_inside(inside, hosts, host, np.array([0.0, 0.0, 1.0, 0.0]))
    assert not collateral_inside(inside, hosts, host, np.array([0.0, 0.0, np.nan, np.nan]))
    assert not collateral_inside(NetCandidate("host", ("node-1",), 0.7, 3, 4), hosts, host, np.zeros(4))
    assert not collateral_inside(NetCandidate("nic", ("node-1",), 0.7, 3, 4), hosts, host, np.zeros(4))
