"""Units from rank blame: which stage a rank is in, and replicas taking turns."""

from __future__ import annotations

import numpy as np
import pytest

from collector.trace.meta import JobMeta, RankInfo
from localize.waits.ranking import explain_rank_blame, pipeline_stages, replica_turns


def test_a_pipeline_group_of_unknown_kind_takes_its_ranks_stage_from_their_tp_peers() -> None:
    """tp2 x pp2: the pipeline group of TP index 1 has no kind (none of it logged); ranks 1 and 3
    share TP groups with ranks 0 and 2, whose pipeline group says their stages."""
    meta = JobMeta(job="j", world_size=4, ranks={r: RankInfo("h0", r) for r in range(4)},
                   groups={"pp-a": [0, 2], "pp-b": [1, 3], "tp-0": [0, 1], "tp-1": [2, 3]})
    kinds = {"pp-a": "pp", "tp-0": "tp", "tp-1": "tp"}
    stage, known = pipeline_stages(meta, 4, kinds)
    assert stage.tolist() == [0, 0, 1, 1] and known.all()
    stage, known = pipeline_stages(meta, 4, {"pp-a": "pp"})
    assert known.tolist() == [True, False, True, False]
    assert pipeline_stages(meta, 4, {"tp-0": "tp"})[1].all()  # no pipeline: every rank is stage 0


def _turns(owners: list[int], n_rep: int = 2) -> np.ndarray:
    """Rank x step blame: two ranks per replica, each step's blame on the replica `owners` names."""
    replica = np.repeat(np.arange(n_rep), 2)
    by_step = np.zeros((len(replica), len(owners)))
    for col, k in enumerate(owners):
        by_step[replica == k, col] = 1.0
    return by_step


@pytest.mark.parametrize(("owners", "turns"), [
    ([0, 1, 0, 1], [0, 1]),
    ([1, 1, 0, 0, 0, 1, 1, 1], [0, 1]),  # over half, the other's three turns as strong: a random batch, dp 2
    ([1] * 11 + [0] * 3, [0, 1]),  # 11 to 3 (the independent generator's seed 3030, job 3)
    ([1] * 12 + [0] * 2, None),  # over TURNS_MOST
    ([1] * 13 + [0], None),  # one turn elsewhere is noise: the replica holds the fault
    ([1] * 10, None),  # a device
    ([1, 1, 0], None),  # one turn is no turn
    ([0, 1], [0, 1]),  # a two-step spike, each step another replica's batch
    ([1, 1], None),
])
def test_replicas_take_turns_when_none_held_over_half(owners: list[int], turns: list[int] | None) -> None:
    replica = np.repeat(np.arange(2), 2)
    found = replica_turns(_turns(owners), replica)
    assert (None if found is None else found[0].tolist()) == turns


def test_three_replicas_one_turn_each_take_turns() -> None:
    found = replica_turns(_turns([0, 1, 2], 3), np.repeat(np.arange(3), 2))
    assert found is not None and found[0].tolist() == [0, 1, 2]


def _tp2_pp2_dp4_on_two_hosts() -> tuple[JobMeta, dict[str, str]]:
    """16 ranks, 8 per host, tp-pp-dp order: replicas 0 and 1 on h0, 2 and 3 on h1."""
    groups: dict[str, list[int]] = {}
    for d in range(4):
        base = 4 * d
        groups |= {f"tp-{d}a": [base, base + 1], f"tp-{d}b": [base + 2, base + 3],
                   f"pp-{d}a": [base, base + 2], f"pp-{d}b": [base + 1, base + 3]}
    for i in range(4):
        groups[f"dp-{i}"] = [i + 4 * d for d in range(4)]
    meta = JobMeta(job="j", world_size=16, ranks={r: RankInfo(f"h{r // 8}", r % 8) for r in range(16)}, groups=groups)
    return meta, {g: g.split("-")[0] for g in groups}


@pytest.mark.parametrize(("slow", "kind"), [
    ([4, 5, 6, 7], "data"),  # one replica, half of h0: no GPU slows its peers' compute, and h0's other four were not slow
    (list(range(8)), "host"),  # all of h0: the host
    ([5], "gpu"),
])
def test_one_replica_slow_within_one_host_is_its_batch(slow: list[int], kind: str) -> None:
    """Seed 8181 job 27 of the independent generator: a three-step spike of one replica's batch, one
    step logged; the replica's four GPUs were half a host and were named one by one, each at 0.25."""
    meta, kinds = _tp2_pp2_dp4_on_two_hosts()
    blame = np.full(16, 0.001)
    blame[slow] = 1.0
    units = explain_rank_blame(blame, meta, kinds, static=False)
    assert units[0].kind == kind and sorted(units[0].ranks) == sorted(slow), units[:2]


@pytest.mark.parametrize(("blame", "kind", "ranks"), [
    # seed 8686 job 26: h0 slowed; the last of its two replicas collected most of the waits
    ({**dict.fromkeys(range(4), 1.0), **dict.fromkeys(range(4, 8), 0.15)}, "host", list(range(8))),
    # the same shares on replicas of two hosts: their batches
    ({**dict.fromkeys(range(4), 1.0), **dict.fromkeys(range(8, 12), 0.15)}, "data", [*range(4), *range(8, 12)]),
])
def test_whole_replicas_of_one_host_are_the_host_and_of_several_their_data(blame: dict[int, float], kind: str,
                                                                           ranks: list[int]) -> None:
    meta, kinds = _tp2_pp2_dp4_on_two_hosts()
    b = np.full(16, 0.001)
    b[list(blame)] = list(blame.values())
    units = explain_rank_blame(b, meta, kinds, static=False)
    assert units[0].kind == kind and sorted(units[0].ranks) == ranks, units[:2]


def test_weak_turns_elsewhere_do_not_make_a_device_the_data() -> None:
    """Replica 1 holds five of eight slow steps; replica 0's three are a tenth as strong: a device's
    blame landing elsewhere now and then (a silent host's), not a batch."""
    by_step = _turns([1, 1, 0, 0, 0, 1, 1, 1])
    by_step[:, [2, 3, 4]] *= 0.1
    assert replica_turns(by_step, np.repeat(np.arange(2), 2)) is None


@pytest.mark.parametrize(("grew", "kind"), [
    (dict.fromkeys(range(8), 0.3), "host"),  # every GPU of h0 computed longer: the host
    ({2: 0.3}, "gpu"),  # only the blamed GPU did: it
])
def test_a_host_whose_gpus_all_computed_longer_is_the_host_however_the_blame_fell(grew: dict[int, float],
                                                                                 kind: str) -> None:
    """Seed 9191 job 23 of the independent generator: a host 2.5x on and off, four of its steps
    judged from summaries; each step's last arriver collected the waits, two GPUs held 64% of the
    blame, the host's coverage fell short and its GPUs were named one by one. Its GPUs' own compute
    grew alike in the slow steps."""
    meta, kinds = _tp2_pp2_dp4_on_two_hosts()
    blame = np.full(16, 0.001)
    blame[[2, 3, 5]] = [0.4, 0.26, 0.12]
    growth = np.zeros(16)
    growth[list(grew)] = list(grew.values())
    units = explain_rank_blame(blame, meta, kinds, static=False, grew=growth)
    assert units[0].kind == kind, units[:2]
    assert explain_rank_blame(blame, meta, kinds, static=False)[0].kind == "gpu"  # (blame alone)


def _tp2_pp4_dp2_on_four_hosts() -> tuple[JobMeta, dict[str, str]]:
    """16 ranks, 4 per host, tp-pp-dp order: each replica's eight GPUs on two hosts (h0 h1, h2 h3)."""
    groups: dict[str, list[int]] = {}
    for d in range(2):
        for s in range(4):
            base = 8 * d + 2 * s
            groups[f"tp-{d}-{s}"] = [base, base + 1]
        for t in range(2):
            groups[f"pp-{d}-{t}"] = [8 * d + 2 * s + t for s in range(4)]
    for i in range(8):
        groups[f"dp-{i}"] = [i, i + 8]
    meta = JobMeta(job="j", world_size=16, ranks={r: RankInfo(f"h{r // 4}", r % 4) for r in range(16)}, groups=groups)
    return meta, {g: g.split("-")[0] for g in groups}


@pytest.mark.parametrize(("grew", "kind"), [
    (range(8), "data"),  # the whole replica, on both its hosts: its batch
    (range(4, 8), "host"),  # only the host its blame fell on
])
def test_a_replica_whose_gpus_all_computed_longer_across_hosts_is_its_batch(grew: range, kind: str) -> None:
    """Seed 18181 job 24 of the independent generator: one replica's 2.05x batch in most slow steps
    (tp2 pp8, each replica on two hosts); the waits fell on its last stages' host, named at 0.67,
    though the GPUs of both its hosts computed longer."""
    meta, kinds = _tp2_pp4_dp2_on_four_hosts()
    blame = np.full(16, 0.001)
    blame[4:8] = [1.0, 0.9, 0.8, 0.7]
    growth = np.zeros(16)
    growth[list(grew)] = 0.3
    units = explain_rank_blame(blame, meta, kinds, static=False, grew=growth)
    assert units[0].kind == kind, units[:2]
    assert explain_rank_blame(blame, meta, kinds, static=False)[0].kind == "host"  # (blame alone)


@pytest.mark.parametrize(("computed", "kind"), [
    (0.0, "gpu"),  # the logged ranks only waited on their unlogged TP peers: one of those GPUs
    (1.0, "host"),  # they computed longer too: the host
])
def test_a_host_whose_logged_ranks_only_waited_on_unlogged_peers_is_not_the_host(computed: float, kind: str) -> None:
    """Seed 4242's 512-GPU tp4 pp2 ep2 job, one rank logged per TP group: a slow unlogged GPU kept
    its TP group's logged rank waiting, and through the expert all-to-all the host's other TP group
    too; both logged ranks' waits read as the host."""
    meta, kinds = _tp2_pp2_dp4_on_two_hosts()
    logged = np.zeros(16, dtype=bool)
    logged[::2] = True
    blame = np.zeros(16)
    blame[[2, 0, 4]] = [1.0, 0.4, 0.4]
    done = np.where(logged, computed, np.nan)
    units = explain_rank_blame(blame, meta, kinds, logged=logged, static=False, unseen=blame.copy(),
                               peers={r: [r + 1] for r in range(0, 16, 2)}, grew=np.zeros(16), computed=done)
    assert units[0].kind == kind, units[:2]
    if kind == "gpu":
        assert units[0].ranks == [3] and units[0].via == 2


def test_an_unlogged_tp_group_across_hosts_ties_its_rings_links() -> None:
    """The independent generator with ranks placed round-robin over hosts (seed 43100 job 17, tp8 on
    8 hosts, TP rank 0 logged): a link between two of the unlogged members' hosts slowed the TP
    ring, and the tie of the logged rank's unlogged peers named only the links from its own host."""
    meta = JobMeta(job="j", world_size=8, ranks={r: RankInfo(f"h{r}", 0) for r in range(8)},
                   groups={"tp-0": list(range(8))})
    logged = np.zeros(8, dtype=bool)
    logged[0] = True
    blame = np.zeros(8)
    blame[0] = 1.0
    units = explain_rank_blame(blame, meta, {"tp-0": "tp"}, logged=logged, static=False, unseen=blame.copy(),
                               peers={0: list(range(1, 8))})
    links = {a.label for a in units[0].also if a.kind == "link"}
    assert {"h5<->h6", "h0<->h7", "h0<->h3"} <= links, links
    assert units[0].via == 0 and len([a for a in units[0].also if a.kind == "gpu"]) == 6
