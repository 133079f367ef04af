"""The node summary: what each host reports of its ranks' compute."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from collector.trace.meta import JobMeta
from collector.trace.traceio import Trace
from localize.combine import localize_trace
from localize.commops import COLUMNS
from localize.ops.table import prepare_ops
from localize.summary import first_slow_hosts, localize_from_summary, summarize, write_summaries
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace

TRACE = Path(__file__).resolve().parents[2] / "traces" / "gpu-straggler"


def test_a_hosts_typical_compute_is_its_fast_ranks_own_not_lifted_by_a_slow_peer() -> None:
    """On hosts of two ranks, the host's row is the faster rank's compute: interpolated, a GPU
    slow from the first step lifted its peer by a quarter, and the stage looked misconfigured."""
    df = Trace.open(TRACE).commops(columns=COLUMNS)
    ops = prepare_ops(df.copy())
    own = pd.DataFrame({"pair": ops.rank // 2, "step": ops.step, "rank": ops.rank, "c": ops.gap})
    per_rank = own.groupby(["pair", "step", "rank"])["c"].sum()
    fastest = per_rank.groupby(["pair", "step"]).min()
    summary = summarize(df, host_of=lambda r: f"pair-{r // 2}")
    hosts = summary[(summary["group"] == "*") & (summary["rank"] < 0)]
    pair = hosts["host"].str.removeprefix("pair-").astype(int).to_numpy()
    want = fastest.loc[list(zip(pair, hosts["step"].to_numpy(), strict=True))].to_numpy()
    np.testing.assert_allclose(hosts["compute_s"].to_numpy(), want, rtol=1e-9)
    slowest = per_rank.groupby(["pair", "step"]).max()
    assert (slowest / fastest).max() > 1.5  # the trace's slow GPU shares a pair: the case is exercised


@pytest.mark.parametrize(("fault", "layout"), [
    ("nic:host=node-3,factor=2.5,steps=6:29", {"gpus": 64, "tp": 8, "pp": 2, "gpus_per_host": 4}),
    ("link:hosts=node-1+node-2,factor=3,steps=5:29", {"gpus": 64, "tp": 8, "pp": 2}),
])
def test_a_fault_over_most_steps_is_found_from_summaries_as_from_records(tmp_path: Path, fault: str,
                                                                          layout: dict[str, Any]) -> None:
    """The sidecars judge operators against the node's own normal steps: against all its steps, a
    fault on for over a quarter of them widened the history until its own operators were not
    abnormal, and the summary path read "healthy" where the full records named the device."""
    simulate_trace(SimConfig(steps=30, seed=77, faults=[FaultSpec.parse(fault)], job="j", **layout), tmp_path,
                   counterfactual=False)
    trace = Trace.open(tmp_path)
    full = localize_trace(trace, ("commops",))
    write_summaries(trace)
    summary, _ = localize_from_summary(trace)
    assert summary.status == "irregular" and summary.candidates, summary.status
    assert summary.candidates[0].device() == full.candidates[0].device()


def test_the_summary_path_reads_the_groups_from_one_step_when_meta_has_none(tmp_path: Path) -> None:
    """The fetch plan picks groups to read whole; with no groups in meta.json it fetched nothing
    and said "healthy" where the full records named the host."""
    simulate_trace(SimConfig(gpus=64, tp=4, pp=2, steps=24, seed=78, job="j",
                             faults=[FaultSpec.parse("host:host=node-3,factor=2,steps=10:23")]), tmp_path,
                   counterfactual=False)
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta.pop("groups"), meta.pop("parallelism")
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    trace = Trace.open(tmp_path)
    write_summaries(trace)
    summary, plan = localize_from_summary(trace)
    assert plan.ranks and summary.candidates and summary.candidates[0].device() == "host node-3", summary.status


def test_rows_without_step_numbers_are_numbered_per_node_and_fetched_as_numbered(tmp_path: Path) -> None:
    """A logger without step markers (step = -1 everywhere): each node numbers its own rows as the
    timeline numbers the job's, and the fetch numbers the hosts it reads the same way. Before, the
    summary held one step (-1), the fetch by step range read nothing, and the verdict was
    "healthy" where the full records named the host."""
    from localize.distributed import Serial, Source, localize_distributed

    simulate_trace(SimConfig(gpus=32, tp=4, pp=2, steps=24, seed=79, job="j", hide_steps=True,
                             faults=[FaultSpec.parse("host:host=node-2,factor=2,steps=12:23")]), tmp_path,
                   counterfactual=False)
    trace = Trace.open(tmp_path)
    assert (trace.commops(columns=["step"])["step"] < 0).all()
    full = localize_trace(trace, ("commops",))
    assert full.candidates and full.candidates[0].device() == "host node-2"
    write_summaries(trace)
    summary, plan = localize_from_summary(trace)
    assert plan.rows_fetched and summary.candidates, summary.status
    assert summary.candidates[0].device() == full.candidates[0].device()
    assert summary.onset_step == full.onset_step
    shutil.rmtree(tmp_path / "summary")
    distributed, _ = localize_distributed(Source.open(tmp_path), Serial())
    assert distributed.to_dict() == summary.to_dict()


@pytest.mark.parametrize("sample", [3.0, 0.4])
def test_sampled_steps_last_as_long_from_summaries_as_on_the_timeline(tmp_path: Path, sample: float) -> None:
    """A logger keeping every K-th step, or a random 40% never two in a row: each host's summary
    says when its steps started as well as ended, and a step logged without the one before it is
    measured as the timeline measures it (`durations_from_bounds`). From step ends alone, a step
    lasted until the previous *logged* step's end -- K steps' time -- and the irregular steps were
    wrong, the verdict "healthy" where the full records named the GPU."""
    from localize.summary import read_summary, step_table
    from timeline.build import build_timeline

    simulate_trace(SimConfig(gpus=32, tp=4, pp=2, steps=60, seed=81, job="j", sample_steps=sample,
                             faults=[FaultSpec.parse("gpu:rank=13,factor=2.5,steps=30:59")]), tmp_path,
                   counterfactual=False)
    trace = Trace.open(tmp_path)
    timeline = build_timeline(trace).steps.set_index("step")
    write_summaries(trace)
    table, _ = step_table(read_summary(trace))
    ours = table.set_index("step")
    assert list(ours.index) == list(timeline.index)
    np.testing.assert_allclose(ours["ratio"].to_numpy(), timeline["ratio"].to_numpy(), rtol=0.1)
    assert (ours["irregular"] == timeline["irregular"]).all() and ours["irregular"].sum() >= 5
    full = localize_trace(trace, ("commops",))
    summary, _ = localize_from_summary(trace)
    assert full.candidates and summary.candidates, summary.status
    assert summary.candidates[0].device() == full.candidates[0].device() == "gpu rank 13 (node-1 gpu 5)"


def _layout() -> JobMeta:
    """16 ranks on 8 hosts of 2: model replica k = ranks 4k..4k+3 (two stages of a TP pair), DP over replicas."""
    groups = {f"tp-{h}": [2 * h, 2 * h + 1] for h in range(8)}
    groups |= {f"dp-{j}": [j, 4 + j, 8 + j, 12 + j] for j in range(4)}
    groups |= {f"pp-{k}-{j}": [4 * k + j, 4 * k + 2 + j] for k in range(4) for j in range(2)}
    return JobMeta.from_dict({"job": "j", "world_size": 16, "groups": groups,
                              "ranks": {str(r): {"host": f"node-{r // 2}", "gpu": r % 2} for r in range(16)}})


def _host_rows(compute: pd.DataFrame, abnormal: dict[tuple[int, str], float] | None = None) -> pd.DataFrame:
    """A summary of host rows (hosts x steps of `compute`, seconds; 1 s steps) and abnormal group rows."""
    rows = [{"host": f"node-{h}", "rank": -1, "step": int(s), "group": "*", "abnormal": 0, "abnormal_s": 0.0,
             "compute_s": float(compute.loc[h, s]), "step_end_ns": int((s + 1) * 1e9), "step_start_ns": int(s * 1e9)}
            for h in compute.index for s in map(int, compute.columns)]
    rows += [{"host": "node-0", "rank": -1, "step": s, "group": g, "abnormal": 1, "abnormal_s": t, "compute_s": 0.0,
              "step_end_ns": 0, "step_start_ns": 0} for (s, g), t in (abnormal or {}).items()]
    return pd.DataFrame(rows)


def _steps(logged: list[int], irregular: list[int]) -> pd.DataFrame:
    irr = np.isin(logged, irregular)
    return pd.DataFrame({"step": logged, "duration_s": np.where(irr, 1.5, 1.0), "baseline_s": 1.0,
                         "ratio": np.where(irr, 1.5, 1.0), "irregular": irr, "pattern": ""})


def test_a_fault_that_moves_between_replicas_is_fetched_in_every_step_it_was_in() -> None:
    """Data: a different replica computes longer in each irregular step. Judged by its median over
    the irregular steps, no rank was slow, and nothing was fetched; the slowest of each step are."""
    from localize.summary import plan_fetch

    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    for s, replica in ((6, 0), (8, 1), (10, 2)):
        compute.loc[[2 * replica, 2 * replica + 1], s] = 1.6
    plan = plan_fetch(_host_rows(compute), _layout(), _steps(steps, [6, 8, 10]))
    assert {r // 4 for r in plan.ranks} >= {0, 1, 2}, plan


def test_a_rank_within_the_noise_of_normal_steps_does_not_narrow_the_fetch() -> None:
    """A network fault: abnormal transfers in one DP group, and a host 1.105x its peers in the slow
    steps -- less than one reached in a normal step -- and another, a last stage that computes
    1.12x every step, 1.15x then. Taken for slow ranks, they cut the budget to their own groups'
    and the abnormal group was never fetched."""
    from localize.summary import plan_fetch

    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    compute.loc[5, 3] = 1.12
    compute.loc[3, [6, 8]] = 1.105
    compute.loc[7] = 1.12
    compute.loc[7, [6, 8, 10]] = 1.15
    ab = {(s, "dp-1"): 0.3 for s in (6, 8, 10)}
    plan = plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8, 10]))
    assert plan.groups[0] == "dp-1" and plan.ranks == list(range(16)), plan


def test_a_network_fault_fetches_the_abnormal_groups_first_then_the_rest_within_the_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow NIC's own host sent late but never waited: only its victims' groups show abnormal
    time. Fetching those alone left the NIC's host out (a real throttled NIC, named as a GPU it
    fed at 0.01); every group is fetched while the budget lasts, the abnormal ones first, each
    with the rest of its members' hosts (their own groups tell a host from its NIC)."""
    import localize.summary as summary

    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    ab = {(s, "dp-1"): 0.3 for s in (6, 8, 10)}
    plan = summary.plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8, 10]))
    assert plan.groups[0] == "dp-1" and set(plan.groups) == set(_layout().groups) and plan.ranks == list(range(16))
    monkeypatch.setattr(summary, "MAX_RANKS_NET", 8)
    plan = summary.plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8, 10]))
    assert plan.groups[0] == "dp-1" and plan.ranks == [0, 1, 4, 5, 8, 9, 12, 13], plan


def test_a_group_abnormal_beyond_its_peers_is_fetched_before_rings_that_all_waited(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow NIC makes every data-parallel ring wait evenly, and its own pipeline pair four
    times more than the other pairs: ranked by abnormal seconds, the rings took a budget too
    small for the job and the pair was never fetched (a 4,096-GPU job: a tie of 288 devices
    from the summaries, the NIC from the full records)."""
    import localize.summary as summary

    monkeypatch.setattr(summary, "MAX_RANKS_NET", 8)
    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    ab = {(s, g): t for s in (6, 8, 10) for g, t in
          [*((f"dp-{j}", 0.6) for j in range(4)), ("pp-1-0", 0.4), ("pp-0-0", 0.1), ("pp-2-0", 0.1), ("pp-3-0", 0.1)]}
    plan = summary.plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8, 10]))
    assert plan.groups[0] == "pp-1-0" and {4, 6} <= set(plan.ranks) and len(plan.ranks) <= 8, plan
    order = summary.abnormal_beyond_peers(pd.Series({"dp-0": 0.6, "dp-1": 0.5, "pp-1-0": 0.4, "pp-0-0": 0.1}), _layout())
    assert list(order.index) == ["pp-1-0", "dp-0", "dp-1", "pp-0-0"]


def test_the_most_abnormal_ring_is_fetched_though_small_groups_stand_further_above_their_peers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow link crossed only by data-parallel rings: every ring waited alike, and the pipeline
    pairs that waited on the slow ring stood far above the other pairs. Ranked by that alone the
    pairs filled the budget, no ring was fetched, no transfer judged, and an 8,192-GPU job's
    summaries named a host at 0.009; the most abnormal group of each size is fetched first."""
    import localize.summary as summary

    monkeypatch.setattr(summary, "MAX_RANKS_NET", 8)
    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    ab = {(s, g): t for s in (6, 8, 10) for g, t in
          [("dp-0", 0.6), ("dp-1", 0.5), ("dp-2", 0.5), ("dp-3", 0.5),
           ("pp-0-0", 0.4), ("pp-1-0", 0.4), ("pp-2-0", 0.4),
           *((f"pp-{k}-1", 0.02) for k in range(4)), ("pp-3-0", 0.02)]}
    plan = summary.plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8, 10]))
    assert "dp-0" in plan.groups and {0, 4, 8, 12} <= set(plan.ranks) and len(plan.ranks) <= 8, plan


def test_one_ranks_noise_in_one_of_the_slow_steps_does_not_narrow_the_fetch() -> None:
    """A link fault slows steps 6, 8 and 10; rank 3 computes 1.6x in step 8 alone. Taken for a
    straggler, it cut the fetch to its own groups, and the summary path named a GPU where the
    full records named the link."""
    from localize.summary import plan_fetch

    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    compute.loc[3, 8] = 1.6
    ab = {(s, "dp-1"): 0.3 for s in (6, 8, 10)}
    plan = plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8, 10]))
    assert plan.groups[0] == "dp-1" and plan.ranks == list(range(16)), plan
    compute.loc[3, [6, 10]] = 1.6  # slow in every slow step: a straggler, its groups fetched
    plan = plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8, 10]))
    assert 3 in plan.ranks and "dp-1" not in plan.groups, plan


def test_lone_ranks_over_the_bar_on_other_hosts_in_other_steps_are_noise_not_stragglers() -> None:
    """A switch's spike slows steps 6, 8 and 10; host 3 computes 1.15x in step 6 and host 5 in
    step 8, each just over the normal steps' noise (1.1x, the floor). Taken for stragglers they
    narrowed the fetch to their groups, the switch's rings were not fetched, and the summaries
    said "data" where the full records name the switch. The same host slow in two steps is a
    straggler."""
    from localize.summary import plan_fetch

    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    compute.loc[3, 6] = compute.loc[5, 8] = 1.15
    ab = {(s, "dp-1"): 0.3 for s in (6, 8, 10)}
    plan = plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8, 10]))
    assert plan.groups[0] == "dp-1" and plan.ranks == list(range(16)), plan
    compute.loc[5, 8], compute.loc[3, 8] = 1.0, 1.15
    plan = plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8, 10]))
    assert {6, 7} <= set(plan.ranks) and "dp-1" not in plan.groups, plan


def test_one_lone_rank_over_the_bar_in_one_of_two_slow_steps_is_noise_not_a_straggler() -> None:
    """A switch's spike slows steps 6 and 8; host 3 computes 1.15x in step 6 alone, just over the
    normal steps' noise, and nothing explains step 8. Taken for a straggler, it narrowed the fetch
    to its groups and the summaries named one of its GPUs at 0.89 from one prolonged operator (the
    independent generator's seed 10606, job 47, once its spill step was no longer irregular), where
    the full records name the switch. Far over the bar, or in both steps, it is a straggler."""
    from localize.summary import plan_fetch

    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    compute.loc[3, 6] = 1.15
    ab = {(s, "dp-1"): 0.3 for s in (6, 8)}
    plan = plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8]))
    assert plan.groups[0] == "dp-1" and plan.ranks == list(range(16)), plan
    for step, level in ((8, 1.15), (6, 3.0)):
        compute.loc[3, step] = level
        plan = plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8]))
        assert {6, 7} <= set(plan.ranks) and "dp-1" not in plan.groups, (step, level, plan)
        compute.loc[3, 8] = 1.0


def test_slow_ranks_on_several_hosts_in_a_step_do_not_narrow_the_fetch_to_their_groups() -> None:
    """Two hosts' ranks computing longer in the same steps are no one device's: a NIC's one-step
    spike on a 4,096-GPU job made 44 ranks on 44 hosts compute 3x, and fetched around them alone,
    the NIC's host was not fetched (a GPU named, where the full records name the NIC). Their groups
    come first, then the abnormal ones, then the rest, within the wide budget."""
    from localize.summary import plan_fetch

    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    compute.loc[[1, 6], [6, 8, 10]] = 1.6
    ab = {(s, "pp-1-0"): 0.3 for s in (6, 8, 10)}
    plan = plan_fetch(_host_rows(compute, ab), _layout(), _steps(steps, [6, 8, 10]))
    assert "pp-1-0" in plan.groups and set(plan.groups) == set(_layout().groups), plan
    assert plan.groups.index("pp-1-0") > plan.groups.index("tp-1"), plan

def test_a_sampled_irregular_step_is_fetched_with_the_step_logged_before_it() -> None:
    """Every third step logged: the step before an irregular one is not in the trace, so the one
    logged before it stands in (the operators' streams across the boundary); before, none did."""
    from localize.summary import plan_fetch

    steps = list(range(0, 36, 3))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    compute.loc[3, [12, 27]] = 2.0
    plan = plan_fetch(_host_rows(compute), _layout(), _steps(steps, [12, 27]))
    assert {9, 12, 24, 27} <= set(plan.fetch_steps), plan.fetch_steps


def test_each_irregular_step_gets_its_own_budget_of_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A different host slow in each irregular step, with a budget of one replica's ranks: spent on
    the first step's slow host, the other steps' hosts were never fetched."""
    import localize.summary as summary

    monkeypatch.setattr(summary, "MAX_RANKS", 4)
    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    for s, host in ((6, 0), (8, 2), (10, 4)):
        compute.loc[host, s] = 1.6
    plan = summary.plan_fetch(_host_rows(compute), _layout(), _steps(steps, [6, 8, 10]))
    assert {r // 4 for r in plan.ranks} >= {0, 1, 2} and len(plan.ranks) <= 12, plan


def test_a_replica_slow_across_hosts_is_fetched_with_all_its_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Data: one whole replica, two hosts, computes longer in each slow step. Within a budget of a
    few ranks the fetch held the replica and some of its data-parallel peers, and the analysis named
    one of its hosts (the one upstream) where the full records saw the whole replica and said data."""
    import localize.summary as summary

    monkeypatch.setattr(summary, "MAX_RANKS", 4)
    steps = list(range(12))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    for s, replica in ((6, 0), (8, 1), (10, 2)):
        compute.loc[[2 * replica, 2 * replica + 1], s] = 1.6
    plan = summary.plan_fetch(_host_rows(compute), _layout(), _steps(steps, [6, 8, 10]))
    assert plan.ranks == list(range(16)), plan


def test_a_slow_step_seen_by_one_stages_hosts_is_a_slow_step_of_the_job() -> None:
    """A pipeline of two stages on two hosts each, no sync at a step's end: the last stage's hosts
    cut their steps one step later, so a NIC's slow steps (10-13, 17, 19-22 at 1.18x) show on the
    first stage's hosts at those steps and on the last stage's one step later. The median over
    hosts averaged the two and missed steps 10, 14, 17-19 and 23 (onset read 11)."""
    from localize.summary import step_table

    n, base = 30, 200_000_000
    slow = np.isin(np.arange(n), [10, 11, 12, 13, 17, 19, 20, 21, 22])
    first = np.where(slow, 1.18, 1.0) * base * (1 + 0.003 * np.sin(np.arange(n)))
    rows = []
    for host, dur in (("a0", first), ("a1", first), ("b0", np.r_[first[:1], first[:-1]]),
                      ("b1", np.r_[first[:1], first[:-1]])):
        ends = np.cumsum(dur).astype(np.int64) + 10**12 * (host[0] == "b")  # (own clocks)
        rows += [{"host": host, "rank": -1, "step": k, "group": "*", "abnormal": 0, "abnormal_s": 0.0,
                  "compute_s": 0.1, "step_end_ns": int(e), "step_start_ns": int(e - d)}
                 for k, (e, d) in enumerate(zip(ends, dur, strict=True))]
    table, onset = step_table(pd.DataFrame(rows))
    assert onset == 10
    assert {10, 11, 12, 13, 17, 19, 20, 21, 22} <= set(table.loc[table["irregular"].astype(bool), "step"])


def test_a_fault_on_and_off_whose_spill_makes_every_step_slow_somewhere_is_found() -> None:
    """No sync at a step's end, a log that begins mid-job: the first stage's hosts run slow in
    every other logged step (a NIC at 1.6x), the later stages' hosts one step later. Every step is
    slow on some host, so the 0.9 quantile over hosts found no step irregular and the job read
    healthy from the summaries (the independent generator's seed 10808 job 42). The hosts slow
    first hold the fault's steps (where the log shows the spill of an unlogged step first, the spill's
    steps are taken: a fault on and off looks the same from either side)."""
    from localize.summary import step_table

    n, base = 40, 210_000_000
    k = np.arange(n)
    wobble = 1 + 0.003 * np.sin(k)
    first = np.where(k % 2 == 0, 1.6, 1.0) * base * wobble
    later = np.where(k % 2 == 1, 1.6, 1.0) * base * wobble[::-1]
    rows = []
    for host, dur in [("a0", first), ("a1", first)] + [(f"b{i}", later) for i in range(6)]:
        ends = np.cumsum(dur).astype(np.int64) + 10**9 + 10**12 * (host[0] == "b")  # (own clocks)
        rows += [{"host": host, "rank": -1, "step": j, "group": "*", "abnormal": 0, "abnormal_s": 0.0,
                  "compute_s": 0.1, "step_end_ns": int(e), "step_start_ns": int(e - d)}
                 for j, (e, d) in enumerate(zip(ends, dur, strict=True))]
    table, onset = step_table(pd.DataFrame(rows))
    assert onset == 0
    assert set(table.loc[table["irregular"].astype(bool), "step"]) == set(range(0, n, 2))


def test_a_slow_step_is_not_read_again_in_the_later_stages_step_after_it() -> None:
    """No sync at a step's end: the first stage's hosts end steps 10-12 and 20 late (1.5x), the later
    stage's hosts end each of them on time and wait at the start of the step after, so on their own
    clocks the step after is the slow one. The 0.9 quantile of the hosts' own steps called steps 13
    and 21 irregular too (the independent generator's twelve-step switch spike read healthy that way,
    its spill swelling the noise). The hosts' ends, each moved to its typical place, run late together
    from the slow step on: only the slow steps are irregular."""
    from localize.summary import step_table

    n, period = 30, 1_000_000_000
    k = np.arange(n)
    wobble = (0.004 * period * np.sin(3 * k)).astype(np.int64)
    slow = np.isin(k, [10, 11, 12, 20])
    delay = np.cumsum(np.where(slow, period // 2, 0))  # the job's lateness after each step
    rows = []
    for i, host in enumerate(["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]):
        late = delay if host[0] == "a" else np.concatenate([[0], delay[:-1]])  # the later stage a step behind
        ends = (k + 1) * period + late + wobble + 37_000_000 * (i - 4) + 250_000_000 * (host[0] == "b")
        starts = np.concatenate([[ends[0] - period], ends[:-1]]) + 5_000_000
        rows += [{"host": host, "rank": -1, "step": int(j), "group": "*", "abnormal": 0, "abnormal_s": 0.0,
                  "compute_s": 0.1, "step_end_ns": int(e), "step_start_ns": int(b)}
                 for j, (e, b) in enumerate(zip(ends, starts, strict=True))]
    table, onset = step_table(pd.DataFrame(rows))
    assert onset == 10
    assert set(table.loc[table["irregular"].astype(bool), "step"]) == {10, 11, 12, 20}


def test_the_fetched_steps_follow_a_fault_that_moves_between_hosts() -> None:
    """A data fault on a different replica's hosts each step: the three most typical irregular
    steps had two of their slowest ranks on one host, and the fetched records read "host". Steps
    with another slowest host come first; a fault that stays on one host keeps the most typical."""
    from localize.summary import typical_steps

    irr = pd.DataFrame({"step": [9, 10, 11, 12, 13], "ratio": [2.0, 2.01, 1.98, 2.06, 2.4]})
    moving = {9: {"node-4"}, 10: {"node-4"}, 11: {"node-6"}, 12: {"node-4"}, 13: {"node-5"}}
    assert typical_steps(irr, {s: frozenset(h) for s, h in moving.items()}) == [10, 11, 13]
    assert typical_steps(irr, dict.fromkeys(moving, frozenset({"node-4"}))) == [9, 10, 11]
    assert typical_steps(irr, {}) == [9, 10, 11]
    # a replica over two hosts: a step whose slow hosts share one with a step taken is the same replica
    replicas = {9: {"a", "b"}, 10: {"a", "b"}, 11: {"c", "d"}, 12: {"b", "e"}, 13: {"e", "f"}}
    assert typical_steps(irr, {s: frozenset(h) for s, h in replicas.items()}) == [10, 11, 13]


def test_the_fetched_steps_stay_on_the_fault_when_a_busy_machine_slowed_the_steps_before_it() -> None:
    """A real run (one logged rank per TP group) whose machine was busy in steps 14-19, just before
    a GPU slowed from 20: those steps were irregular too, with no slow host. Taken as "another place
    the fault moved to", two of the three fetched steps were theirs, no rank computed longer in most
    of them, nothing was fetched, and the job read healthy. Where most irregular steps had slow
    hosts, a step with none comes after them; where most had none (a network fault), the most typical."""
    from localize.summary import typical_steps

    irr = pd.DataFrame({"step": [14, 15, 16, 19, 20, 21, 22, 23],
                        "ratio": [1.17, 1.18, 1.16, 1.19, 1.27, 1.2, 1.22, 1.28]})
    gpu = dict.fromkeys([20, 21, 22, 23], frozenset({"node-0"}))
    assert typical_steps(irr, gpu) == [20, 21, 22]
    # the most typical of the time lost: 1.2x (1.195x was the plain median of the steps)
    assert typical_steps(irr, dict.fromkeys([20, 21], frozenset({"node-0"}))) == [19, 21, 22]
    assert typical_steps(irr, {}) == [19, 21, 22]


def test_a_straggler_among_more_numerous_hiccups_of_a_busy_machine_is_what_is_fetched() -> None:
    """CI's real torchrun job: rank 1 slept 300 ms in steps 10-19 (15x its 20 ms steps) on a
    machine busy enough that seven other steps ran 1.6-2x. The plain median of the steps' ratios
    was a hiccup's; three hiccups, each led by another rank, were fetched and the sidecar path
    named the host. The time the steps lost puts the straggler's steps at the middle."""
    from localize.summary import typical_steps

    hiccups = {1: 1.8, 2: 1.7, 3: 1.9, 4: 1.6, 5: 1.75, 7: 2.0, 21: 1.65, 22: 1.7, 23: 1.8, 24: 1.9, 25: 1.6}
    straggler = {s: 14.5 + 0.1 * (s % 3) for s in range(10, 20)}
    irr = pd.DataFrame({"step": [*hiccups, *straggler], "ratio": [*hiccups.values(), *straggler.values()]})
    leaders = {s: frozenset({s % 4}) for s in hiccups} | dict.fromkeys(straggler, frozenset({1}))
    for led in (leaders, {}):
        picked = typical_steps(irr, led)
        assert set(picked) <= set(straggler), picked
    # ... but a mild fault's many steps stay typical among a few checkpoints' 10x stalls
    mild = {s: 1.2 + 0.01 * (s % 3) for s in range(10, 30)}
    irr = pd.DataFrame({"step": [*mild, 40, 50], "ratio": [*mild.values(), 10.0, 11.0]})
    assert not {40, 50} & set(typical_steps(irr, {})), typical_steps(irr, {})


@pytest.mark.slow
def test_a_data_fault_every_other_step_without_a_step_end_sync_is_the_data_on_both_paths(tmp_path: Path) -> None:
    """The independent generator's seed 10, job 27: 256 GPUs, pp8, no sync at a step's end, a data
    spike every other step on another replica each time. From the summaries, each spike's next step
    read slow too (hosts that finished the spike early wait in it for the last one), and two of the
    three fetched spikes fell to one replica: the summary path named a GPU at 0.07. It now judges
    the spikes it chose, on distinct replicas, with the steps fetched before them as context only."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(27, "data", 10)
    full, summary = both_paths(written(spec, tmp_path / spec.name))
    assert full.candidates[0].kind == "data"
    assert summary.candidates[0].kind == "data"


@pytest.mark.slow
def test_one_replica_slow_in_one_logged_step_on_half_a_host_is_the_data_on_both_paths(tmp_path: Path) -> None:
    """The independent generator's seed 8181, job 27: tp2 x pp2 x dp16 on 8-GPU hosts, one replica's
    batch 2.1x for three steps of which one was logged. Its four GPUs were half a host, so the rule
    that a replica across hosts is its batch did not apply: both paths named them one by one."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(27, "data", 8181)
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert v.candidates[0].kind == "data", [c.device() for c in v.candidates[:3]]


@pytest.mark.slow
def test_a_host_spike_over_the_two_replicas_it_holds_is_the_host_on_both_paths(tmp_path: Path) -> None:
    """The independent generator's seed 8686, job 26: tp2 x pp2 on 8-GPU hosts, so node-2 holds
    two whole replicas; it ran 2.3x for four steps. The last of its replicas collected most of
    the waits, both read as whole, and both paths said data taking turns at 0.95."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(26, "host", 8686)
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert v.candidates[0].device() == "host node-2", [c.device() for c in v.candidates[:3]]


@pytest.mark.slow
def test_a_compute_hiccup_in_one_of_two_slow_steps_is_not_fetched_as_the_straggler(tmp_path: Path) -> None:
    """The independent generator's seed 8282, job 26: one rank per TP group logged, the unlogged
    GPU 63 2.2x for two steps. Its TP peer's waits are operator time, not compute; rank 36's 1.15x
    compute hiccup in one of the two steps passed the bar, its groups alone were fetched, and the
    summary path named GPU 36 at 1.00 where the full records name 63. A straggler now has to
    explain a good part of what its step lost."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(26, "gpu", 8282)
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert (v.candidates[0].kind, v.candidates[0].rank) == ("gpu", 63), [c.device() for c in v.candidates[:3]]

@pytest.mark.slow
def test_a_warm_up_step_and_a_sampled_step_before_a_spike_do_not_spoil_the_summary_plan(tmp_path: Path) -> None:
    """The independent generator's seed 9292, job 10: every third of 12 steps logged (1000, 1003,
    1006, 1009), the data 1.9x in 1006. The summaries' step table read the warm-up step 1000
    irregular too: the plan judged it, and 1003 -- three steps before the spike, with none logged
    between -- was kept out of the history as a step that could hold its start. With one normal
    step to learn from, the summary path named GPU 20 at 0.06 where the full records say data."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(10, "data", 9292, {"steps": "12"})
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert v.candidates[0].kind == "data", [c.device() for c in v.candidates[:3]]
        assert v.onset_step == 1006


@pytest.mark.slow
def test_a_gpu_on_and_off_in_sampled_steps_is_timed_from_its_first_slow_step_on_both_paths(tmp_path: Path) -> None:
    """The independent generator's seed 8282, job 37: GPU 336 1.75x every other step from 17, 40%
    of steps logged, no step irregular. Its compute beside its peers' shifted level at step 32 (a
    normal step), which the verdict called "in every step since step 32"; its first logged slow
    step is 19."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(37, "gpu", 8282)
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert (v.candidates[0].kind, v.candidates[0].rank) == ("gpu", 336)
        assert v.onset_step == 19, v.onset_step


@pytest.mark.slow
def test_a_host_on_and_off_judged_in_four_steps_is_the_host_on_both_paths(tmp_path: Path) -> None:
    """The independent generator's seed 9191, job 23: node-1 2.5x every other step, 40% of steps
    logged without step numbers. The summary path judged four slow steps; the waits' blame fell on
    two of the host's GPUs (64%), and its GPUs were named one by one where the full records name
    the host. All eight computed longer in those steps: the host."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(23, "host", 9191, {"step_ids": "false"})
    full, summary = both_paths(written(spec, tmp_path / spec.name))
    for v in (full, summary):
        assert v.candidates[0].device() == "host node-1", [c.device() for c in v.candidates[:3]]
    assert "8 of the 8 logged GPUs of node-1 computed longer" in summary.candidates[0].evidence[0]


@pytest.mark.slow
def test_a_log_of_three_steps_without_abnormal_groups_still_fetches_the_network(tmp_path: Path) -> None:
    """The independent generator's seed 9292, job 52: 40% of 12 steps logged (2, 6 and 7), a NIC
    1.7x from step 6. The sidecars had no history to judge operators by, so the summaries held no
    abnormal group and no rank computed longer: the plan fetched nothing and said healthy. It now
    fetches every group within the network budget, and names the NIC as the full records do."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(52, "nic", 9292, {"steps": "12"})
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert v.candidates and v.candidates[0].device() == "nic node-28", [c.device() for c in v.candidates[:3]]


@pytest.mark.slow
@pytest.mark.parametrize(("job", "seed", "force"), [
    (34, 8787, {"gph": "4"}),  # tp8 pp8 dp2, the random batch 8 to 5 over 13 slow steps
    (3, 3030, {"logging": "tp0-random40"}),  # dp2, 11 to 3, one rank per TP group, 40% of steps logged
])
def test_data_taking_turns_with_two_replicas_is_the_data_on_both_paths(tmp_path: Path, job: int, seed: int,
                                                                       force: dict[str, str]) -> None:
    """With two replicas a random batch often falls to one of them in most slow steps: "none held
    over half" read both jobs as a host (0.07) or a GPU. The other replica's turns are as strong
    as a typical step's: the data."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(job, "data", seed, force)
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert v.candidates[0].kind == "data", [c.device() for c in v.candidates[:3]]



@pytest.mark.slow
def test_a_network_fault_after_one_normal_step_is_judged_against_it_on_both_paths(tmp_path: Path) -> None:
    """The independent generator's seed 10, job 24: a slow link from step 9, every third step
    logged, so one step (6) ran normally after warm-up. Each node judged its operators against all
    of its steps when it had under three normal ones: the slow DP rings were their own history,
    no node called them abnormal, none was fetched, and the summary path named GPUs at 0.12 where
    the full records give the rings' tie of links. One normal step is history enough."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(24, "link", 10)
    full, summary = both_paths(written(spec, tmp_path / spec.name), top=10)

    def first(v: Any) -> set[str]:
        return {c.device() for c in v.candidates if c.score >= v.candidates[0].score - 1e-9}

    assert "link node-2<->node-3" in first(full), first(full)
    assert first(summary) == first(full), (first(summary), first(full))


@pytest.mark.slow
def test_a_stage_given_more_work_is_the_configuration_on_both_paths_with_one_rank_per_tp_group(tmp_path: Path) -> None:
    """The independent generator's seed 78, job 13: pipeline stage 7 of 8 computes 1.55x from the
    first step, one rank per TP group logged. The pipeline groups of the unlogged TP indices had
    no kind (no record, a name the kinds did not know), so their ranks, which read their host's
    summary, counted as stage 0: the summary path named stage 7's two hosts, the full path the stage."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(13, "stage", 78)
    assert spec.logging == "tp0" and spec.fault is not None
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert (v.candidates[0].kind, v.candidates[0].stage) == ("config", spec.fault.stage), v.candidates[:2]
        assert v.slowdown > 1.3


@pytest.mark.slow
def test_the_step_before_a_slow_run_is_not_the_operators_history_on_the_summary_path(tmp_path: Path) -> None:
    """The independent generator's seed 2026, job 45: a link slow from step 1004, three normal
    steps after the warm-up, no sync at a step's end. Two hosts of 32 ran 1004 slow, so the
    hosts' step ends (their 0.9 quantile) showed the fault from 1005, and 1004 was fetched as
    history: the slow rings were a third of their own history, and the summary path named GPUs
    at 0.13 where the full records name the link."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(45, "link", 2026)
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert v.candidates[0].device() == "link node-12<->node-14", [c.device() for c in v.candidates[:3]]


def test_a_step_as_slow_as_the_faults_under_delta_is_not_the_operators_history() -> None:
    """An on-and-off fault: its turns at 1.15x are irregular, two milder ones at 1.12x are not. Taken
    as normal steps they were two of five history steps, the rings' usual range widened to hold
    them, and no slow transfer was seen (the independent generator's seed 10101, job 36)."""
    from localize.summary import plan_fetch

    steps = list(range(3, 26))
    compute = pd.DataFrame(1.0, index=range(8), columns=steps)
    table = _steps(steps, [7, 9, 11, 13, 17, 19, 21, 25])
    table.loc[table["irregular"], "ratio"] = 1.15
    table.loc[table["step"].isin([15, 23]), "ratio"] = 1.12
    plan = plan_fetch(_host_rows(compute), _layout(), table)
    assert plan.history and not {15, 23} & set(plan.history), plan.history


def test_an_on_and_off_link_under_its_milder_turns_is_the_same_answer_on_both_paths(tmp_path: Path) -> None:
    """The job of the test above, rebuilt: the summaries named a host at 0.26 where the full
    records name the tie of the devices every DP ring crosses (the link among them)."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(36, "link", 10101)
    full, summary = both_paths(written(spec, tmp_path / spec.name), top=40)
    for v in (full, summary):
        tied = {c.device() for c in v.candidates if c.tie == v.candidates[0].tie}
        assert v.candidates[0].tie == len(tied) == 36 and "link node-2<->node-3" in tied, [c.device() for c in v.candidates[:3]]


def test_a_fault_in_two_places_is_fetched_twice_in_each() -> None:
    """Two replicas taking turns (ranks 0-3 and 4-7), 11 steps to 3: three fetched steps fall 2 to 1
    and read as one replica's device; a second step of each shows the turns."""
    from localize.summary import typical_steps

    steps = list(range(10, 24))
    irr = pd.DataFrame({"step": steps, "ratio": np.linspace(1.3, 1.5, len(steps))})
    a, b = frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7})
    leaders = {s: (b if s in (13, 17, 20) else a) for s in steps}
    picked = typical_steps(irr, leaders)
    assert len(picked) == 4 and sum(leaders[s] == b for s in picked) == 2, picked
    assert len(typical_steps(irr, dict.fromkeys(steps, a))) == 3  # one place: the three most typical



@pytest.mark.slow
def test_a_healthy_job_with_a_silent_middle_stage_is_healthy_on_both_paths(tmp_path: Path) -> None:
    """The independent generator's seed 5050, job 22: a quarter of the hosts logged nothing and
    meta.json lists no groups. The pipeline groups were the ranks that logged in them, so a
    replica whose third stage was silent put its last stage (loss: 16% more compute) third, beside
    the third stage's workers, and a healthy job read "slow from the first step": a GPU."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(22, "healthy", 5050, {"logging": "hosts75"})
    assert not spec.meta_groups
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert v.status == "healthy", [c.device() for c in v.candidates[:3]]


@pytest.mark.slow
def test_a_stage_given_more_work_on_hosts_that_hold_both_stages_is_the_configuration(tmp_path: Path) -> None:
    """The independent generator's seed 6060, job 16: tp4 x pp2 on 8-GPU hosts, so each host holds
    both stages of one replica; stage 0 computes 1.44x. A host's summary median mixed its two
    stages, the stages read equal, and an outlier rank of stage 0 read as a slow GPU; the last
    steps of every rank's records judge stage against stage."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(16, "stage", 6060, {"step_ids": "false"})
    assert spec.fault is not None
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert (v.candidates[0].kind, v.candidates[0].stage) == ("config", spec.fault.stage), v.candidates[:2]


def test_half_the_hosts_slow_together_from_one_step_hold_the_faults_steps() -> None:
    """The independent generator's seed 49100 job 42 (pp2, 40% of steps logged, a switch 1.35x in
    random steps): the first stage's four hosts showed the fault's steps cleanly, the last stage's four
    ended each step after an unlogged slow one late too, and their noise hid it ("healthy" from the
    summaries). Half the hosts agreeing on the first slow step hold its steps; one host alone does not."""
    rng = np.random.default_rng(3)
    steps = np.arange(1000, 1024)
    per_host = 285e6 * (1 + 0.015 * rng.standard_normal((8, len(steps))))
    fault = np.isin(steps, [1008, 1011, 1012, 1015, 1018, 1019, 1022])
    per_host[:4, fault] *= 1.35
    per_host[4:] *= 1 + 0.1 * rng.random((4, len(steps)))  # (a spill of the unlogged steps before)
    per_host[4:, fault] *= 1.08
    found = first_slow_hosts(per_host, steps)
    assert found is not None and found[1] == 1008
    assert set(found[0]["step"][found[0]["irregular"]]) == set(steps[fault].tolist())
    lone = 285e6 * (1 + 0.015 * rng.standard_normal((8, len(steps))))
    lone[0, fault] *= 1.35
    assert first_slow_hosts(lone, steps) is None
