"""One rank logged per TP group (Megatron's usual logging): a slow GPU that was not logged shows
only as its group's logged rank waiting inside operators no peer copy shows. Which member was
slow its records cannot say: the unlogged members are named as a tie, the logged rank is not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.trace.traceio import Trace
from localize.combine import localize_trace
from localize.summary import localize_from_summary, write_summaries
from localize.verdict import Candidate, Verdict
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace


def both_paths(cfg: SimConfig, out: Path) -> tuple[Verdict, Verdict]:
    """The simulated job's verdicts from the full records and from the node summaries."""
    simulate_trace(cfg, out, counterfactual=False)
    trace = Trace.open(out)
    full = localize_trace(trace, ("commops",), top=20)
    write_summaries(trace)
    return full, localize_from_summary(trace, top=20)[0]


def top_tie(v: Verdict) -> list[Candidate]:
    """The candidates at the top score, checked to be declared a tie of that many."""
    tie = [c for c in v.candidates if c.score == v.candidates[0].score]
    assert len(tie) == 1 or all(c.tie is not None and c.tie >= len(tie) for c in tie), [(c.device(), c.tie) for c in tie]
    return tie


@pytest.mark.parametrize(("p2p", "gpus", "tp", "pp", "rank"), [("rendezvous", 64, 8, 1, 22), ("batched", 128, 4, 2, 45)])
def test_a_slow_unlogged_gpu_is_named_in_a_tie_of_its_groups_unlogged_members(tmp_path: Path, p2p: str, gpus: int, tp: int, pp: int,
                                                                  rank: int) -> None:
    cfg = SimConfig(gpus=gpus, tp=tp, pp=pp, gpus_per_host=4 if tp == 8 else 8, steps=16, seed=4242, p2p=p2p,
                    logged_ranks="one-per-tp", faults=[FaultSpec.parse(f"gpu:rank={rank},factor=2.5,steps=5:15")], job="j")
    simulate_trace(cfg, tmp_path, counterfactual=False)
    v = localize_trace(Trace.open(tmp_path), ("commops",), top=20)
    assert v.status == "irregular" and v.onset_step is not None and abs(int(v.onset_step) - 5) <= 1, v.status
    tie = {c.rank for c in top_tie(v) if c.kind == "gpu"}
    assert rank in tie and rank - rank % tp not in tie, [c.device() for c in v.candidates]


@pytest.mark.parametrize(("p2p", "per_host"), [("batched", 8), ("rendezvous", 8), ("batched", 4)])
def test_an_unlogged_gpu_slow_from_the_first_step_is_named_on_both_paths(tmp_path: Path, p2p: str, per_host: int) -> None:
    """The real Megatron shape: tp4 pp4 dp4, TP rank 0 logged, sampled steps, no normal step; its
    TP peer computes 2.3x longer in every step, which shows only as the logged rank's lone TP operators.
    With 4 GPUs a host the TP group is the host, whose summary compute is its one logged rank's."""
    cfg = SimConfig(gpus=64, tp=4, pp=4, steps=40, seed=4243, p2p=p2p, mp_sync=True, sample_steps=3, gpus_per_host=per_host,
                    hosts_per_switch=16, logged_ranks="one-per-tp", faults=[FaultSpec.parse("gpu:rank=5,factor=2.3")],
                    job="j")
    for v in both_paths(cfg, tmp_path):
        assert v.status == "irregular" and v.candidates, v.status
        tie = top_tie(v)
        assert {c.rank for c in tie} == {5, 6, 7}, [c.device() for c in v.candidates]
        assert all(c.score < tie[0].score for c in v.candidates if c.kind in ("config", "data"))


@pytest.mark.parametrize("fault", [None, "gpu:rank=37,factor=2.0"])
def test_a_meta_without_groups_lays_out_stages_and_replicas_from_the_records(tmp_path: Path, fault: str | None) -> None:
    """The contract lets meta.json leave groups and parallelism out. With one rank logged per TP
    group, stages and model replicas must still come from the groups the records show: with none,
    every rank was its own replica and a healthy job's TP waits read as replicas taking turns."""
    cfg = SimConfig(gpus=128, tp=8, pp=4, steps=26, seed=4244, p2p="batched", logged_ranks="one-per-tp",
                    faults=[FaultSpec.parse(fault)] if fault else [], job="j")
    simulate_trace(cfg, tmp_path, counterfactual=False)
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta.pop("groups"), meta.pop("parallelism")
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    v = localize_trace(Trace.open(tmp_path), ("commops",), top=20)
    if fault is None:
        assert v.status == "healthy", [c.device() for c in v.candidates]
    else:
        assert v.candidates and 37 in {c.rank for c in top_tie(v)}, [c.device() for c in v.candidates]


def test_one_replica_logged_one_rank_per_tp_group_names_the_unlogged_members_since_the_fault(tmp_path: Path) -> None:
    """tp4 pp2 dp1 (the shape of a real gloo run that read "config"): each stage has one logged
    worker and no peer; stage 0 slowing from step 10 is no split of layers. Both paths name rank
    0's unlogged TP members, as a tie, with the onset."""
    cfg = SimConfig(gpus=8, tp=4, pp=2, steps=30, seed=4245, p2p="batched", gpus_per_host=4, logged_ranks="one-per-tp",
                    faults=[FaultSpec.parse("gpu:rank=2,factor=2.0,steps=10:29")], job="j")
    for v in both_paths(cfg, tmp_path):
        assert v.status == "irregular" and v.candidates, v.status
        assert {c.rank for c in top_tie(v)} == {1, 2, 3}, [c.device() for c in v.candidates]
        assert v.onset_step is not None and abs(int(v.onset_step) - 10) <= 1, v.onset_step


def test_without_groups_in_meta_the_summary_path_still_sees_lone_copies(tmp_path: Path) -> None:
    """meta.json without groups, one rank logged per TP group, an unlogged GPU slow from step 8: the
    summary path reads the groups from one step of every rank, where a TP group shows one logged
    member. Listed as a whole group of one, its operators were not lone copies, the logged rank's
    wait was nobody's, and the verdict "healthy" where the full records named the slow GPU in a tie."""
    cfg = SimConfig(gpus=64, tp=4, pp=2, steps=24, seed=4245, p2p="rendezvous", logged_ranks="one-per-tp",
                    faults=[FaultSpec.parse("gpu:rank=22,factor=2.0,steps=8:23")], job="j")
    simulate_trace(cfg, tmp_path, counterfactual=False)
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta.pop("groups"), meta.pop("parallelism")
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    trace = Trace.open(tmp_path)
    full = localize_trace(trace, ("commops",))
    write_summaries(trace)
    summary, _ = localize_from_summary(trace)
    for v in (full, summary):
        assert v.status == "irregular" and v.candidates, v.status
        assert 22 in {c.rank for c in top_tie(v)}, [c.device() for c in v.candidates]
    assert [c.device() for c in top_tie(summary)] == [c.device() for c in top_tie(full)]


@pytest.mark.parametrize("p2p", ["batched", "rendezvous", "eager"])
def test_a_stage_waiting_on_an_unlogged_gpu_through_expert_all_to_alls_is_not_its_layers(tmp_path: Path, p2p: str) -> None:
    """tp8 pp2 ep4, TP rank 0 logged: GPU 9, slow from the first step, holds up its expert group's
    all-to-alls, so every replica's stage-0 TP groups wait on it and every logged stage-0 rank spends
    longer in its lone TP operators than stage 1's. That is waiting, not the split of layers: the
    full records said "config" over the tie of GPU 9's TP peers (0.78 to 0.22), the summaries the tie."""
    cfg = SimConfig(gpus=64, tp=8, pp=2, ep=4, steps=28, seed=4244, p2p=p2p, logged_ranks="one-per-tp", sample_steps=0.4,
                    gpus_per_host=8, hosts_per_switch=8, faults=[FaultSpec.parse("gpu:rank=9,factor=1.8")], job="j")
    for v in both_paths(cfg, tmp_path):
        assert v.status == "irregular" and v.candidates, v.status
        tie = top_tie(v)
        assert {c.rank for c in tie} == set(range(9, 16)), [c.device() for c in v.candidates]
        assert all(c.score < tie[0].score for c in v.candidates if c.kind in ("config", "data"))
