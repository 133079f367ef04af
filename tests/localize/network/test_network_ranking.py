"""Network resolution (which device explains the slow units) and rank-blame units."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collector.trace.meta import JobMeta, RankInfo
from localize.network.devices import (
    beyond_common_mode,
    discount_collateral,
    resolve_network,
    slow_units,
    split_slow,
    tie_note,
    tied_best,
)
from localize.waits.ranking import explain_rank_blame


def meta16() -> JobMeta:
    """32 ranks, 4 per host (8 hosts), 2 hosts per switch; tp inside hosts, dp rings across."""
    ranks = {r: RankInfo(f"node-{r // 4}", r % 4) for r in range(32)}
    groups = {f"tp-{h}": list(range(4 * h, 4 * h + 4)) for h in range(8)}
    groups |= {f"dp-{i}": [i + 4 * h for h in range(4)] for i in range(4)}  # hosts 0..3
    groups |= {f"dp-{4 + i}": [16 + i + 4 * h for h in range(4)] for i in range(4)}  # hosts 4..7
    topo = {f"node-{h}": {"switch": f"tor-{h // 2}"} for h in range(8)}
    return JobMeta("t", 32, ranks, groups, {}, topo)


def units_of(meta: JobMeta) -> dict[str, list[int]]:
    units = dict(meta.groups)
    for r in range(16):  # pipeline p2p between host h and h+4
        units[f"pp:{r}->{r + 16}"] = [r, r + 16]
    return units


def test_nic_beats_the_links_it_shares() -> None:
    meta = meta16()
    units = units_of(meta)
    # NIC of node-1 slow: the dp rings of hosts 0..3 and node-1's pipeline transfers
    slow = {n: 1.0 for n, m in units.items() if n.startswith("dp") and m[0] < 16}
    slow |= {f"pp:{r}->{r + 16}": 1.0 for r in range(4, 8)}
    best = resolve_network(units, slow, meta)[0]
    assert (best.kind, best.key) == ("nic", ("node-1",))


def test_transfers_slowed_a_twentieth_as_much_per_byte_are_collateral_not_the_nics() -> None:
    """A real link throttled to 1 Gbit/s between two pipeline stages' hosts (bench.realjobs
    --network, seed 1): its transfers ran 16 ms/MiB longer, both ways, and one of its ends' transfers
    from the next stage 0.6 ms/MiB longer, in the same backlog, in most steps. As consistently
    slow, they made that end's NIC explain more than the link; a slow NIC would have slowed them
    by as much per byte as the link's."""
    meta = JobMeta("t", 8, {r: RankInfo(f"node-{r // 2}", r % 2) for r in range(8)}, {}, {},
                   {f"node-{h}": {"switch": "tor-0"} for h in range(4)})
    # two pipelines over hosts 0..3 (tp1 pp4 dp2, the DP rings inside the hosts); node-0 <-> node-1 throttled
    pairs = [(0, 2), (2, 4), (4, 6), (1, 3), (3, 5), (5, 7)]
    units = {f"pp:{a}->{b}": [a, b] for x, y in pairs for a, b in ((x, y), (y, x))}
    excess = {"pp:0->2": 0.71, "pp:2->0": 0.79, "pp:1->3": 0.72, "pp:3->1": 0.81, "pp:4->2": 0.57, "pp:5->3": 0.42,
              "pp:7->5": 0.12, "pp:6->4": 0.07}
    mib = 1 << 20
    per_byte = {n: 0.0 for n in units} | {n: 16e-3 / mib for n in ("pp:0->2", "pp:2->0", "pp:1->3", "pp:3->1")}
    per_byte |= {"pp:4->2": 0.6e-3 / mib, "pp:5->3": 0.7e-3 / mib, "pp:7->5": 0.9e-3 / mib, "pp:6->4": 0.75e-3 / mib}
    slow, partly = split_slow(excess)
    as_often = resolve_network(units, slow, meta, partly=partly, total=sum(excess.values()))
    assert (as_often[0].kind, as_often[0].key) == ("nic", ("node-1",)) and as_often[0].score > as_often[1].score
    weighed = discount_collateral(excess, per_byte)
    assert weighed["pp:0->2"] == excess["pp:0->2"] and weighed["pp:4->2"] < 0.3
    slow, partly = split_slow(weighed)
    best = tied_best(resolve_network(units, slow, meta, partly=partly, total=sum(weighed.values())))
    # (node-0's NIC carries nothing but that link here: a declared tie, which flows or a probe decide)
    assert sorted((c.kind, c.key) for c in best) == [("link", ("node-0", "node-1")), ("nic", ("node-0",))]


def test_transfers_slowed_a_twentieth_as_much_per_byte_clear_the_devices_they_cross() -> None:
    """A real rack uplink throttled (bench.realjobs --moe --network, seed 0, run 1: tp1 pp4 dp2, a
    host per stage, host-0 and host-1 under tor-0, host-2 under tor-1, host-3 under tor-2): the stage
    pair across it slowed 15-27 ns/B; the next pairs' transfers, 1-2 ns/B in most of their copies.
    Counted as partly slow they made the far side's NIC and switch explain most (0.67, the truth
    0.61); the devices that carry them would have slowed them as much, so they clear those."""
    hosts = {0: "host-0", 1: "host-0", 2: "host-1", 3: "host-1", 4: "host-2", 5: "host-2", 6: "host-3", 7: "host-3"}
    meta = JobMeta("t", 8, {r: RankInfo(h, r % 2) for r, h in hosts.items()}, {}, {},
                   {"host-0": {"switch": "tor-0"}, "host-1": {"switch": "tor-0"}, "host-2": {"switch": "tor-1"},
                    "host-3": {"switch": "tor-2"}})
    pairs = [(0, 2), (2, 4), (4, 6), (1, 3), (3, 5), (5, 7)]
    units = {f"pp:{a}->{b}": [a, b] for x, y in pairs for a, b in ((x, y), (y, x))}
    excess = {"pp:2->4": 0.81, "pp:4->2": 0.88, "pp:3->5": 0.8, "pp:5->3": 0.69, "pp:0->2": 0.24, "pp:2->0": 0.12,
              "pp:1->3": 0.41, "pp:3->1": 0.09, "pp:4->6": 0.36, "pp:6->4": 0.37, "pp:5->7": 0.33, "pp:7->5": 0.45}
    per_byte = {"pp:2->4": 2.7e-8, "pp:4->2": 1.6e-8, "pp:3->5": 2.4e-8, "pp:5->3": 1.5e-8, "pp:0->2": 2.0e-9,
                "pp:2->0": 1.5e-9, "pp:1->3": 2.3e-9, "pp:3->1": 0.8e-9, "pp:4->6": 1.4e-9, "pp:6->4": 1.5e-9,
                "pp:5->7": 2.2e-9, "pp:7->5": 1.3e-9}
    weighed = discount_collateral(excess, per_byte)
    assert weighed["pp:2->4"] == excess["pp:2->4"] and weighed["pp:1->3"] == weighed["pp:4->6"] == 0.0
    slow, partly = split_slow(weighed)
    best = tied_best(resolve_network(units, slow, meta, partly=partly, total=sum(weighed.values())))
    # (tor-0's uplink carries nothing but that stage pair's transfers: a declared tie, which flows decide)
    assert sorted((c.kind, c.key) for c in best) == [("link", ("host-1", "host-2")), ("switch", ("tor-0",))]


def test_a_hosts_only_gpu_is_no_device_apart_from_its_nic() -> None:
    """HSDP on a 2 x 2 mesh, a rank per host (a real run, host-0's NIC throttled): its shard and
    replica groups both slowed, and rank 0's own path to the network carried exactly what host-0's
    NIC did: a tie of the two, though no evidence could ever part them. The NIC stands for both;
    a host whose other GPUs logged nothing keeps the tie (their transfers were not seen)."""
    units = {"shard-0": [0, 1], "shard-1": [2, 3], "replica-0": [0, 2], "replica-1": [1, 3]}
    slow = {"shard-0": 0.68, "replica-0": 0.5}
    one_each = JobMeta("t", 4, {r: RankInfo(f"node-{r}", 0) for r in range(4)}, {}, {},
                       {f"node-{h}": {"switch": "tor-0"} for h in range(4)})
    best = tied_best(resolve_network(units, slow, one_each))
    assert [(c.kind, c.key) for c in best] == [("nic", ("node-0",))]
    # the same four ranks, each on a host with a second GPU that logged nothing
    two_each = JobMeta("t", 8, {r: RankInfo(f"node-{r % 4}", r // 4) for r in range(8)}, {}, {},
                       {f"node-{h}": {"switch": "tor-0"} for h in range(4)})
    best = tied_best(resolve_network(units, slow, two_each))
    assert sorted((c.kind, c.key) for c in best) == [("gpu", 0), ("nic", ("node-0",))]


def test_a_host_whose_own_groups_slowed_with_its_nic_traffic_is_the_host() -> None:
    """A starved host (its CPUs throttled) slows every transfer it takes part in, the TP ring
    among its own GPUs too, which its NIC does not carry: the host's inside, not its NIC."""
    meta = meta16()
    units = units_of(meta)
    slow = {n: 1.0 for n, m in units.items() if n.startswith("dp") and m[0] < 16}
    slow |= {f"pp:{r}->{r + 16}": 1.0 for r in range(4, 8)} | {"tp-1": 1.0}
    best = resolve_network(units, slow, meta)
    assert (best[0].kind, best[0].key) == ("host", ("node-1",)) and best[0].inside == ["tp-1"]
    assert best[0].score > best[1].score and (best[1].kind, best[1].key) == ("nic", ("node-1",))


def test_a_host_seen_only_through_its_nic_is_left_to_the_nic() -> None:
    """Hosts of one GPU each: every transfer leaves the host, so its inside and its NIC carry
    the same groups; the NIC stands for both and the host is no candidate."""
    ranks = {r: RankInfo(f"host-{r}", 0) for r in range(4)}
    units = {"dp-0": [0, 1, 2, 3], "pp-0": [0, 2], "pp-1": [1, 3]}
    meta = JobMeta("t", 4, ranks, units, {}, {})
    cands = resolve_network(units, {"dp-0": 1.0, "pp-1": 1.0}, meta, top=100)
    assert "host" not in {c.kind for c in cands} and ("nic", ("host-1",)) in {(c.kind, c.key) for c in tied_best(cands)}


def test_every_hosts_inside_slowing_together_is_no_evidence_against_one() -> None:
    """Every TP group (each inside its host) slowed alike -- the machine's load, or rings waiting
    on late peers: that common part is taken off, so node-1's TP group is no reason to prefer its
    inside to its NIC; one host's TP group slowing beyond the others' still is."""
    meta = meta16()
    units = units_of(meta)
    kind = {n: n.split("-")[0].split(":")[0] for n in units}
    nic1 = {n: 1.0 for n, m in units.items() if n.startswith("dp") and m[0] < 16}
    nic1 |= {f"pp:{r}->{r + 16}": 1.0 for r in range(4, 8)}
    together = beyond_common_mode(nic1 | {f"tp-{h}": 0.35 for h in range(8)}, units, meta, kind)
    assert not any(n.startswith("tp") for n in together) and together.items() >= nic1.items()
    slow, partly = split_slow(together)
    best = resolve_network(units, slow, meta, partly=partly, total=sum(nic1.values()) + 8 * 0.35)[0]
    assert (best.kind, best.key) == ("nic", ("node-1",))
    alone = beyond_common_mode(nic1 | {"tp-1": 0.9} | {f"tp-{h}": 0.05 for h in range(8) if h != 1}, units, meta, kind)
    assert alone["tp-1"] == pytest.approx(0.85)
    slow, partly = split_slow(alone)
    best = resolve_network(units, slow, meta, partly=partly)[0]
    assert (best.kind, best.key) == ("host", ("node-1",))


def test_a_gpu_path_is_judged_with_and_without_its_transfers_inside_the_host() -> None:
    """A downgraded PCIe link slows a GPU's transfers to its NIC and, where there is no NVLink,
    to its host's other GPUs too: its own path is named either way, its normal TP ring (NVLink)
    no evidence against it, its slow one (PCIe) none for its host."""
    meta = meta16()
    units = units_of(meta)
    out_only = resolve_network(units, {"dp-1": 1.0, "pp:5->21": 1.0}, meta)[0]
    assert (out_only.kind, out_only.key) == ("gpu", 5) and out_only.carried_units == 2
    both = resolve_network(units, {"dp-1": 1.0, "pp:5->21": 1.0, "tp-1": 1.0}, meta)
    assert (both[0].kind, both[0].key) == ("gpu", 5) and both[0].score > both[1].score


def test_a_single_gpu_path_beats_its_host() -> None:
    meta = meta16()
    units = units_of(meta)
    slow = {"dp-1": 1.0, "pp:5->21": 1.0}  # rank 5's transfers only
    best = resolve_network(units, slow, meta)[0]
    assert (best.kind, best.key) == ("gpu", 5)


def test_switch_when_every_host_under_it_is_slow() -> None:
    meta = meta16()
    units = units_of(meta)
    slow = {n: 1.0 for n, m in units.items() if n.startswith("dp") and m[0] < 16}
    slow |= {f"pp:{r}->{r + 16}": 1.0 for r in range(0, 8)}  # hosts 0,1 = tor-0
    best = resolve_network(units, slow, meta)[0]
    assert (best.kind, best.key) == ("switch", ("tor-0",))


def test_a_group_slow_in_some_of_its_copies_is_weak_evidence_not_a_clearing() -> None:
    """The real throttled-NIC job (4 hosts, one GPU each): host-1's NIC slows the DP ring and
    host-1's pipeline pair; its 8 KiB TP all-reduce was late in only a fifth more of its copies.
    Counted as healthy, that group clears host-1 as much as host-3's healthy one clears host-3,
    and the two hosts tie; weighed by how far it slowed, host-1 comes first."""
    ranks = {r: RankInfo(f"host-{r}", 0) for r in range(4)}
    units = {"tp-0": [0, 1], "tp-1": [2, 3], "dp-0": [0, 1, 2, 3], "pp-0": [0, 2], "pp-1": [1, 3]}
    meta = JobMeta("t", 4, ranks, units, {}, {})
    slow, partly = split_slow({"dp-0": 1.0, "pp-1": 0.78, "tp-0": 0.22, "tp-1": 0.0})
    assert set(slow) == {"dp-0", "pp-1"} and set(partly) == {"tp-0"}

    def hosts(cands: list) -> set:  # a NIC or the one GPU of a host: the host
        return {c.key if c.kind == "nic" else (f"host-{c.key}",) for c in tied_best(cands)}

    assert hosts(resolve_network(units, slow, meta, top=100)) == {("host-1",), ("host-3",)}
    assert hosts(resolve_network(units, slow, meta, top=100, partly=partly)) == {("host-1",)}


def test_slow_units_need_a_consistent_share() -> None:
    unit = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    comm = np.array([1, 1, 1, 0, 1, 0, 0, 0], dtype=bool)
    got = slow_units(unit, ["a", "b"], comm, np.ones(8, dtype=bool))
    assert got == {"a": 0.75}


def test_slow_units_count_only_what_changed_from_normal_steps() -> None:
    # "a" measures slow in half its normal instances too (a noisy stream): not evidence
    unit = np.array([0, 0, 0, 0, 1, 1, 1, 1] * 2)
    comm = np.array([1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0], dtype=bool)
    irregular = np.r_[np.ones(8, dtype=bool), np.zeros(8, dtype=bool)]
    got = slow_units(unit, ["a", "b"], comm, irregular, normal=~irregular)
    assert got == {"b": 1.0}


KINDS = {**{f"tp-{h}": "tp" for h in range(8)}, **{f"dp-{i}": "dp" for i in range(8)}}


def test_units_gpu_host_and_occam() -> None:
    meta = meta16()
    b = np.zeros(32)
    b[6] = 5.0
    b[[1, 20]] = 0.2
    units = explain_rank_blame(b, meta, KINDS)
    assert (units[0].kind, units[0].ranks) == ("gpu", [6])
    b = np.zeros(32)
    b[12:16] = [1.0, 0.9, 1.1, 1.0]  # all of node-3
    assert explain_rank_blame(b, meta, KINDS)[0].label == "node-3"


def test_stage_and_replicas() -> None:
    ranks = {r: RankInfo(f"node-{r // 4}", r % 4) for r in range(16)}
    groups = {f"pp-{i}": [i, i + 8] for i in range(8)}  # 2 stages: ranks 0-7, 8-15
    groups |= {f"tp-{k}": list(range(2 * k, 2 * k + 2)) for k in range(8)}
    meta = JobMeta("t", 16, ranks, groups)
    kinds = {g: g.split("-")[0] for g in groups}
    b = np.zeros(16)
    b[8:16] = 1.0  # stage 1 on nodes 2 and 3
    u = explain_rank_blame(b, meta, kinds)[0]
    assert u.kind == "config" and u.detail["stage"] == 1
    b = np.zeros(16)
    b[[0, 1, 8, 9]] = 1.0  # replica of ranks 0,1 (+ their stage-1 peers)
    b[[4, 5, 12, 13]] = 0.8  # another replica, another time
    assert explain_rank_blame(b, meta, kinds)[0].kind == "data"


def replicas_tp2_pp4() -> tuple[JobMeta, dict[str, str]]:
    """4 replicas of tp2 x pp4, each over 4 hosts of 2 GPUs, and the kinds of their groups."""
    ranks = {r: RankInfo(f"node-{r // 2}", r % 2) for r in range(32)}
    groups = {f"tp-{k}": [2 * k, 2 * k + 1] for k in range(16)}
    groups |= {f"pp-{d}-{t}": [8 * d + 2 * s + t for s in range(4)] for d in range(4) for t in range(2)}
    return JobMeta("t", 32, ranks, groups), {g: g.split("-")[0] for g in groups}


def test_replicas_that_take_turns_unevenly_are_data() -> None:
    # 4 replicas of tp2 x pp4 over 4 hosts each (the matrix's tp8 pp8 job in small): replica 0
    # got the longest sequences in most slow steps, the others in one or two each
    meta, kinds = replicas_tp2_pp4()
    b = np.repeat([1.0, 0.25, 0.12, 0.2], 8)
    u = explain_rank_blame(b, meta, kinds, static=False)[0]
    assert u.kind == "data" and u.detail["replicas"] == 4
    # one host of replica 0 slow, the rest noise: a host, not the data
    b = np.full(32, 0.01)
    b[[2, 3]] = 1.0
    assert explain_rank_blame(b, meta, kinds, static=False)[0].kind == "host"


def test_blame_on_every_replica_in_every_step_is_no_data() -> None:
    """A link slowed a 1,024-GPU job: judged over four steps, a little blame fell on every rank in
    every step, and "64 model replicas" outscored the link. Data slows replicas in turns, a few a
    step; all of them at once, every step, is nobody's batch."""
    meta, kinds = replicas_tp2_pp4()
    rng = np.random.default_rng(3)
    everyone = rng.uniform(0.8, 1.2, (32, 4))
    units = explain_rank_blame(everyone.sum(axis=1), meta, kinds, static=False, by_step=everyone)
    assert all(u.kind != "data" for u in units), [(u.kind, u.label) for u in units]
    turns = np.zeros((32, 4))
    for step, rep in enumerate([0, 2, 1, 3]):
        turns[8 * rep:8 * rep + 8, step] = rng.uniform(0.8, 1.2, 8)
    u = explain_rank_blame(turns.sum(axis=1), meta, kinds, static=False, by_step=turns)[0]
    assert u.kind == "data" and u.detail["replicas"] == 4, (u.kind, u.label)


def test_one_whole_replica_across_hosts_is_its_data_not_a_host() -> None:
    # tp2 x pp4 replicas over 4 hosts each: every GPU of replica 1 computed longer in the slow
    # steps (both of a spike's steps drew it); no one device slows four hosts it does not share
    meta, kinds = replicas_tp2_pp4()
    b = np.full(32, 0.005)
    b[8:16] = np.linspace(0.9, 1.1, 8)
    u = explain_rank_blame(b, meta, kinds, static=False)[0]
    assert u.kind == "data" and u.detail["replicas"] == 1 and u.ranks == list(range(8, 16))
    # half that replica's hosts: not the whole replica, so its hosts are named
    b[12:16] = 0.005
    assert explain_rank_blame(b, meta, kinds, static=False)[0].kind == "host"


def ring_meta(hosts: int = 8, gph: int = 4, hps: int = 4) -> JobMeta:
    """No pipeline: tp inside each host, one dp ring per GPU index over every host in order."""
    n = hosts * gph
    ranks = {r: RankInfo(f"node-{r // gph}", r % gph) for r in range(n)}
    groups = {f"tp-{h}": list(range(gph * h, gph * h + gph)) for h in range(hosts)}
    groups |= {f"dp-{i}": [i + gph * h for h in range(hosts)] for i in range(gph)}
    topo = {f"node-{h}": {"switch": f"tor-{h // hps}"} for h in range(hosts)}
    return JobMeta("t", n, ranks, groups, {}, topo)


def test_one_ring_over_every_host_is_a_tie_listed_scarcest_kind_first() -> None:
    meta = ring_meta()
    slow = {f"dp-{i}": 1.0 for i in range(4)}  # any NIC, link or switch of the ring would do this
    net = resolve_network(dict(meta.groups), slow, meta, top=1000)
    tie = tied_best(net)
    assert {c.kind for c in tie} == {"nic", "link", "switch"}
    assert len(tie) == 8 + 8 + 2  # every NIC, every ring link, both switches
    assert [c.kind for c in tie[:2]] == ["switch", "switch"]  # 2 switches before 8 NICs / 8 links
    note = tie_note(tie)
    assert "18 devices" in note and "2 switches (tor-0, tor-1)" in note and "node-0<->node-1" in note


def test_a_link_on_a_ring_ties_with_the_rings_other_links_only() -> None:
    meta = meta16()
    units = units_of(meta)  # pipeline transfers cross the NICs and switches, not the ring links
    slow = {n: 1.0 for n, m in units.items() if n.startswith("dp") and m[0] < 16}  # ring of hosts 0..3
    tie = tied_best(resolve_network(units, slow, meta, top=1000))
    assert {c.kind for c in tie} == {"link"}
    assert sorted(c.key for c in tie) == [("node-0", "node-1"), ("node-0", "node-3"), ("node-1", "node-2"), ("node-2", "node-3")]


def test_all_to_all_crosses_every_pair_of_its_hosts() -> None:
    meta = meta16()
    units = units_of(meta) | {"ep-0": [0, 4, 8, 12]}  # hosts 0..3, every pair exchanges data
    slow = {"ep-0": 1.0}  # link node-0<->node-2 is on no ring: only the all-to-all crosses it
    keys = {c.key for c in tied_best(resolve_network(units, slow, meta, top=1000, mesh={"ep-0"}))}
    assert ("node-0", "node-2") in keys and ("node-1", "node-3") in keys
    as_ring = {c.key for c in resolve_network(units, slow, meta, top=1000)}
    assert ("node-0", "node-2") not in as_ring


def test_flows_break_a_commops_tie_even_at_full_score() -> None:
    from localize.combine import merge
    from localize.verdict import Candidate, Verdict

    tie = [Candidate("switch", 1.0, ["tie"], switch="tor-0", source="commops"),
           Candidate("nic", 1.0, ["tie"], host="node-5", source="commops"),
           Candidate("link", 1.0, ["tie"], hosts=["node-2", "node-3"], source="commops")]
    a = Verdict("j", "irregular", [6], 1.5, tie, {"source": "commops", "network_tie": 3})
    b = Verdict("j", "irregular", [6], 1.5, [Candidate("nic", 0.6, ["flows"], host="node-5", source="flows")],
                {"source": "flows"})
    m = merge("j", [a, b])
    assert (m.candidates[0].kind, m.candidates[0].host) == ("nic", "node-5")
    assert m.candidates[0].source == "commops+flows"


def test_flows_that_name_every_device_of_a_commops_tie_rank_them_by_their_strength() -> None:
    """CommOps is sure (1.0) it is one of four ring links; flows name all four, one far more
    strongly: the merged scores must show that order, not four devices at 1.0."""
    from localize.combine import merge
    from localize.verdict import Candidate, Verdict

    links = [["node-0", "node-1"], ["node-1", "node-2"], ["node-2", "node-3"], ["node-0", "node-3"]]
    tie = [Candidate("link", 1.0, ["tie"], hosts=h, source="commops", tie=4) for h in links]
    flows = [Candidate("link", s, ["flows"], hosts=h, source="flows") for h, s in zip(links, (0.35, 0.34, 0.66, 0.35), strict=True)]
    m = merge("j", [Verdict("j", "irregular", [6], 1.5, tie, {"source": "commops"}),
                    Verdict("j", "irregular", [6], 1.5, flows, {"source": "flows"})])
    first, rest = m.candidates[0], m.candidates[1:4]
    assert first.hosts == ["node-2", "node-3"] and first.tie is None
    assert all(c.score < first.score - 0.1 for c in rest), [(c.hosts, c.score) for c in m.candidates]
    assert [c.hosts for c in rest][-1] == ["node-1", "node-2"]  # flows' weakest stays last


def test_a_slow_uplink_is_its_switch_though_traffic_inside_the_switch_ran_normally() -> None:
    """tor-2's uplink (hosts 4, 5) is slow: every unit leaving tor-2 is slow, while transfers
    between its two hosts ran normally; judged as a whole switch, those would clear it."""
    meta = meta16()
    units = units_of(meta)
    units |= {f"x:{a}->{b}": [a, b] for a in range(16, 20) for b in range(20, 24)}  # node-4 <-> node-5, inside tor-2
    slow = {n: 1.0 for n, m in units.items() if n.startswith("dp") and m[0] >= 16}
    slow |= {f"pp:{r}->{r + 16}": 1.0 for r in range(0, 8)}  # hosts 0, 1 -> 4, 5
    best = resolve_network(units, slow, meta)[0]
    assert (best.kind, best.key) == ("switch", ("tor-2",)), [(c.kind, c.key, round(c.score, 2)) for c in resolve_network(units, slow, meta)]


def test_a_hosts_one_logged_rank_ties_its_gpu_with_the_host() -> None:
    """One rank logged per TP group: node-1's logged rank 4 computing long is that GPU or the
    whole host (its unlogged peers would wait unseen either way): a tie of both, never a guess."""
    meta = meta16()
    logged = np.zeros(32, dtype=bool)
    logged[::4] = True  # TP rank 0 of every host's group
    b = np.zeros(32)
    b[4] = 5.0
    u = explain_rank_blame(b, meta, KINDS, logged=logged)[0]
    assert [(x.kind, x.label) for x in [u, *u.also]] == [("gpu", "rank 4"), ("host", "node-1")]
    logged[5] = True  # a second logged rank there, on time: the host is cleared
    u = explain_rank_blame(b, meta, KINDS, logged=logged)[0]
    assert (u.kind, u.ranks, u.also) == ("gpu", [4], [])


def _node1_logs_rank_4_only(wait_change: float) -> tuple[JobMeta, np.ndarray, np.ndarray, np.ndarray]:
    """Every fourth rank logged (node-1's rank 4 alone there), all the blame on rank 4, and its
    waits on its unlogged peers in the slow steps over before (`peer_wait`)."""
    logged = np.zeros(32, dtype=bool)
    logged[::4] = True
    b = np.zeros(32)
    b[4] = 5.0
    wait = np.full(32, np.nan)
    wait[4] = wait_change
    return meta16(), logged, b, wait


@pytest.mark.parametrize(("change", "named"), [(0.2, ("gpu", "rank 4")), (2.5, ("host", "node-1")), (1.0, None)])
def test_whether_its_unlogged_peers_kept_it_waiting_tells_the_gpu_from_the_host(change: float,
                                                                                named: tuple[str, str] | None) -> None:
    """The slowest member of a collective waits least: node-1's one logged rank waiting far less
    than before in its TP collectives arrived last (its GPU); far more, its peers were slow too
    (the host); about as long, its records cannot tell (the tie)."""
    meta, logged, b, wait = _node1_logs_rank_4_only(change)
    u = explain_rank_blame(b, meta, KINDS, logged=logged, peer_wait=wait)[0]
    if named is None:
        assert [(x.kind, x.label) for x in [u, *u.also]] == [("gpu", "rank 4"), ("host", "node-1")]
    else:
        assert ((u.kind, u.label), u.also, u.detail["peer_wait"]) == (named, [], change)


def test_waiting_on_unlogged_members_ties_them_and_the_hosts_none_of_whose_gpus_logged() -> None:
    """Rank 8's blame is time in TP collectives whose other members logged nothing: one of them
    was slow. Its group spans node-2 (its own host, which would have slowed it too) and node-3
    (no GPU logged there: the host, its NIC or the link between could be it)."""
    meta = meta16()
    spanning = JobMeta("t", 32, meta.ranks, {**{k: v for k, v in meta.groups.items() if not k.startswith("tp")},
                                             **{f"tp-{h}": list(range(8 * h, 8 * h + 8)) for h in range(4)}},
                       {}, meta.topology)
    logged = np.zeros(32, dtype=bool)
    logged[::8] = True
    b = np.eye(32)[8] * 5.0
    peers = {8: list(range(9, 16))}
    u = explain_rank_blame(b, spanning, KINDS, logged=logged, unseen=b * 0.9, peers=peers)[0]
    tie = [(x.kind, x.label) for x in [u, *u.also]]
    assert tie == [("gpu", f"rank {p}") for p in range(9, 16)] + [("host", "node-3"), ("nic", "node-3"),
                                                                  ("link", "node-2<->node-3")]
    assert all(x.via == 8 for x in [u, *u.also])
    own = explain_rank_blame(b, spanning, KINDS, logged=logged, unseen=b * 0.2, peers=peers)[0]
    assert (own.kind, own.ranks, [a.label for a in own.also]) == ("gpu", [8], ["node-2"])


def test_replicas_that_take_turns_holding_each_slow_steps_blame_are_the_data() -> None:
    """Each slow step's blame lands on one stage of whichever replica got the longest sequences:
    no replica looks whole in the sum, but turn by turn the blame moves between replicas."""
    meta = meta16()
    kinds = KINDS | {f"pp-{i}": "pp" for i in range(16)}
    meta.groups |= {f"pp-{i}": [i, i + 16] for i in range(16)}  # replicas: tp x pp, hosts h and h+4
    by_step = np.zeros((32, 6))
    for s, r in enumerate([0, 4, 8, 12, 1 + 4, 16 + 8]):
        by_step[r, s] = 1.0
    u = explain_rank_blame(by_step.sum(axis=1), meta, kinds, static=False, by_step=by_step)[0]
    assert u.kind == "data", (u.kind, u.label)
    one = np.zeros((32, 6))
    one[4, :] = 1.0  # the same GPU every step: a device
    assert explain_rank_blame(one.sum(axis=1), meta, kinds, static=False, by_step=one)[0].kind == "gpu"


def test_a_host_whose_logged_ranks_all_wait_on_their_unlogged_peers_is_the_host() -> None:
    """Two TP pairs on node-1, one rank of each logged: both logged ranks' blame is waiting on their
    unlogged partner. One slow partner would hold up one pair; both at once is the host."""
    meta = meta16()
    logged = np.zeros(32, dtype=bool)
    logged[::2] = True
    b = np.zeros(32)
    b[[4, 6]] = 5.0
    peers = {4: [5], 6: [7]}
    u = explain_rank_blame(b, meta, KINDS, logged=logged, unseen=b * 0.9, peers=peers)[0]
    assert (u.kind, u.label) == ("host", "node-1")
    b[6] = 0.0
    u = explain_rank_blame(b, meta, KINDS, logged=logged, unseen=b * 0.9, peers=peers)[0]
    assert (u.kind, u.ranks, u.via, u.also) == ("gpu", [5], 4, [])


def test_a_host_slowed_whole_grows_its_one_logged_ranks_compute_as_much_as_its_waits() -> None:
    """Rank 4 is node-1's only logged rank. Its growth half waiting on its unlogged TP peers, half
    its own compute, and its waits far longer than before: the whole host slowed, not one peer."""
    meta, logged, b, wait = _node1_logs_rank_4_only(4.7)
    peers = {4: [5, 6, 7]}
    u = explain_rank_blame(b, meta, KINDS, logged=logged, unseen=b * 0.55, peers=peers, peer_wait=wait)[0]
    assert (u.kind, u.label) == ("host", "node-1")
    u = explain_rank_blame(b, meta, KINDS, logged=logged, unseen=b * 0.9, peers=peers, peer_wait=wait)[0]
    assert (u.kind, u.via) == ("gpu", 4)  # nearly all waiting: one of its unlogged peers


@pytest.mark.slow
def test_an_eager_nic_spike_is_the_nic_on_both_paths(tmp_path: Path) -> None:
    """The independent generator's seed 9797, job 17, with eager p2p (NCCL's semantics up to 8 MiB,
    measured on an H200): node-6's NIC 2.9x for three steps. The pipeline's batched receives were
    timed to their sends' ends, which came before the data landed: every one read 0.02 ms, normal,
    and cleared the NIC; a tie of the DP ring's 8 links was named instead."""
    from bench.altgen import random_spec
    from tests.localize.altgen_jobs import both_paths, written

    spec = random_spec(17, "nic", 9797, force={"p2p": "eager"})
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert v.candidates[0].device() == "nic node-6", [c.device() for c in v.candidates[:3]]


def test_a_host_whose_gpus_all_computed_longer_is_the_host_though_one_gpu_collected_every_wait() -> None:
    """node-1's four GPUs all computed longer; in each collective the last of them to arrive
    collects the wait, and over a few steps that may be rank 5 every time. Rank 5 alone explains
    all the blame, yet it is the host; a GPU whose host-mates did not compute longer is the GPU."""
    meta = meta16()
    b = np.zeros(32)
    b[5] = 3.0
    grew = np.zeros(32)
    grew[4:8] = [0.09, 0.10, 0.08, 0.09]
    u = explain_rank_blame(b, meta, KINDS, grew=grew)[0]
    assert (u.kind, u.label) == ("host", "node-1")
    grew[[4, 6, 7]] = 0.0
    u = explain_rank_blame(b, meta, KINDS, grew=grew)[0]
    assert (u.kind, u.ranks) == ("gpu", [5])
