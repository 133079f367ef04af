"""localize.flows: the verdict from flows alone, on simulated faults with known roots."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import timeline.flows
from collector.trace.traceio import Trace
from localize.flows import judged_iterations, localize_flows, network_candidates, peer_median
from localize.verdict import Verdict
from tests.conftest import run_cli
from tests.flows_sims import SEMANTICS, sim_flows
from timeline.flows import build_flow_timeline


def _verdict(name: str, p2p: str = "rendezvous") -> tuple[Verdict, dict]:
    t = Trace.open(sim_flows(name, p2p=p2p))
    v = localize_flows(t)
    truth = t.truth()
    assert truth is not None
    return v, truth


@pytest.mark.parametrize("p2p", SEMANTICS)
def test_healthy_job_has_no_candidates(p2p: str) -> None:
    v, _ = _verdict("healthy", p2p)
    assert v.status == "healthy" and v.candidates == [] and v.irregular_steps == []


@pytest.mark.parametrize("name,kind,where", [
    ("link", "link", {"hosts": ["node-2", "node-3"]}),
    ("nic", "nic", {"host": "node-3"}),
    ("switch", "switch", {"switch": "tor-1"}),
    ("straggler", "host", {"host": "node-1"}),
    ("pcie", "gpu", {"rank": 21, "host": "node-2"}),
])
@pytest.mark.parametrize("p2p", SEMANTICS)
def test_fault_is_ranked_first(name: str, kind: str, where: dict, p2p: str) -> None:
    v, truth = _verdict(name, p2p)
    assert v.status == "irregular"
    assert set(v.irregular_steps) == set(truth["irregular_steps"])
    top = v.candidates[0]
    assert top.kind == kind and top.source == "flows"
    for key, value in where.items():
        assert getattr(top, key) == value
    assert v.slowdown > 1.05


@pytest.mark.parametrize("p2p", SEMANTICS)
def test_host_slow_from_the_first_step_is_named(p2p: str) -> None:
    """GPU rank 21 (node-2) computes 2x slower in every step: no iteration is normal, but node-2
    starts its ring's sync last in every iteration while its peers stall."""
    v, _ = _verdict("slow-from-start", p2p)
    assert v.status == "irregular" and v.onset_step == 0
    top = v.candidates[0]
    assert (top.kind, top.host, top.source) == ("host", "node-2", "flows") and top.score >= 0.9
    assert [c.host for c in v.candidates if c.kind == "host"] == ["node-2"]


@pytest.mark.parametrize("p2p", SEMANTICS)
def test_a_nic_slow_from_the_first_step_outranks_a_ring_member_a_little_late(p2p: str) -> None:
    """node-3's NIC runs 3x slower in every step: its flows are the slow ones, and node-11, last
    to start its ring's sync by 1.3 ms (about 1% of an iteration) in every iteration, explains far
    less than the time node-3's flows lose."""
    v, _ = _verdict("nic-from-start", p2p)
    assert v.status == "irregular"
    assert (v.candidates[0].kind, v.candidates[0].host) == ("nic", "node-3")
    assert all(c.score < v.candidates[0].score / 2 for c in v.candidates[1:])


def _ring(slow_ratio: dict[tuple[str, str], float]) -> pd.DataFrame:
    hosts = [f"node-{i}" for i in range(8)]
    pairs = list(zip(hosts, hosts[1:] + hosts[:1], strict=True))
    ratio = [slow_ratio.get(p, 1.0) for p in pairs]
    return pd.DataFrame({"sh": [a for a, _ in pairs], "dh": [b for _, b in pairs], "ratio": ratio,
                         "slow": [r > 1.5 for r in ratio]})


def test_a_ring_paced_by_one_slow_edge_is_a_tie_of_every_device_it_crosses() -> None:
    """Eight hosts under one switch on one ring, every edge 1.6x slow: the ring runs at its slowest
    edge's pace, so the switch, each NIC and each link are one tie, not the switch alone."""
    edges = _ring({p: 1.6 for p in zip(_ring({})["sh"], _ring({})["dh"], strict=True)})
    cands = network_candidates(edges, {f"node-{i}": "tor-0" for i in range(8)}, "flows")
    assert len(cands) == 17 and {c.tie for c in cands} == {17} and len({c.score for c in cands}) == 1
    assert {c.kind for c in cands} == {"switch", "nic", "link"}
    one = network_candidates(_ring({("node-5", "node-6"): 2.3, ("node-6", "node-7"): 2.3}),
                             {f"node-{i}": "tor-0" for i in range(8)}, "flows")
    assert [(c.kind, c.host, c.tie) for c in one] == [("nic", "node-6", None)]


def test_the_edges_that_pace_a_ring_are_named_when_they_read_slower_than_the_rest() -> None:
    """A 4.75x link on a ring of eight hosts (matrix seed 4242, batched): its edge read 3.1x, the
    seven it paced 1.85-1.88x. The link is named alone; a NIC's two edges apart alike name the NIC."""
    ring = list(zip(_ring({})["sh"], _ring({})["dh"], strict=True))
    switch_of: dict[str, str | None] = {f"node-{i}": "tor-0" for i in range(8)}
    paced = {p: 1.85 + 0.005 * i for i, p in enumerate(ring)}
    link = network_candidates(_ring({**paced, ("node-1", "node-2"): 3.1}), switch_of, "flows")
    assert [(c.kind, c.hosts, c.tie) for c in link] == [("link", ["node-1", "node-2"], None)]
    assert "the ring's other 7 edges ran 1.9x slower" in link[0].evidence[-1]
    nic = network_candidates(_ring({**paced, ("node-5", "node-6"): 2.6, ("node-6", "node-7"): 2.7}), switch_of, "flows")
    assert [(c.kind, c.host) for c in nic] == [("nic", "node-6")]
    close = network_candidates(_ring({**paced, ("node-1", "node-2"): 2.1}), switch_of, "flows")
    assert len(close) == 17 and {c.tie for c in close} == {17}


def test_verdict_json_round_trips() -> None:
    v, _ = _verdict("link")
    d = v.to_dict()
    assert Verdict.from_dict(d).to_dict() == d
    assert d["flows"]["parallelism"] == {"dp": 8}


def test_steps_window_limits_the_analysis() -> None:
    t = Trace.open(sim_flows("link"))
    v = localize_flows(t, steps=(0, 4))
    assert v.status == "healthy" and v.candidates == []


def test_cli_localize_flows(tmp_path: Path) -> None:
    d = tmp_path / "t"
    shutil.copytree(sim_flows("link"), d)
    (d / "commops.parquet").unlink()  # flows only: the black-box path
    proc = run_cli("localize", d, "--flows", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    import json

    out = json.loads(proc.stdout)
    assert out["candidates"][0]["kind"] == "link" and out["candidates"][0]["hosts"] == ["node-2", "node-3"]


def test_most_edges_slow_at_once_are_still_flagged() -> None:
    """A switch under half a ring's hosts slows most of its edges: each edge is judged against
    its own normal iterations, not against the job's (now slow) median edge."""
    import numpy as np
    import pandas as pd

    from localize.flows import network_candidates, slow_edges

    rng = np.random.default_rng(0)
    hosts = [f"node-{h}" for h in range(8)]
    rows = []
    for step in range(10):
        for h in range(8):
            a, b = hosts[h], hosts[(h + 1) % 8]
            slow = step >= 6 and (h >= 3)  # every edge touching node-4..7 (tor-1)
            rows.append((a, b, step, 1e9 * rng.uniform(0.97, 1.03) / (3.0 if slow else 1.0)))
    rates = pd.DataFrame(rows, columns=["sh", "dh", "step", "rate"])
    edges = slow_edges(rates, {6, 7, 8, 9})
    assert sorted(edges.loc[edges["slow"], "sh"]) == ["node-3", "node-4", "node-5", "node-6", "node-7"]
    cands = network_candidates(edges, {h: f"tor-{i // 4}" for i, h in enumerate(hosts)}, "flows")
    assert (cands[0].kind, cands[0].switch) == ("switch", "tor-1")


def test_a_capture_too_short_gives_no_verdict(tmp_path: Path) -> None:
    """A pcap of the first 0.3 s of a faulty job (about two iterations): said too short, no verdict;
    beside the job's CommOps the verdict goes on from those and says what it could not judge."""
    import json

    from collector.network.flows import Bursts
    from simulator.flows import sim_bursts, write_roce_pcap

    src = sim_flows("link")
    b = sim_bursts(src)
    early = b.cols["start_ns"] < b.cols["start_ns"].min() + 300_000_000
    write_roce_pcap(Bursts({k: v[early] for k, v in b.cols.items()}), tmp_path / "short.pcap")
    cap = run_cli("capture", "--read", tmp_path / "short.pcap", "--meta", src / "meta.json", "--out", tmp_path / "t")
    assert cap.returncode == 0 and "capture too short" in cap.stdout and "no verdict" in cap.stdout, cap.stdout
    loc = run_cli("localize", tmp_path / "t", "--flows")
    assert loc.returncode == 2 and "capture too short" in loc.stderr and len(loc.stderr.strip().splitlines()) == 1
    both = tmp_path / "both"
    shutil.copytree(src, both)
    shutil.copy(tmp_path / "t" / "flows.parquet", both / "flows.parquet")
    v = json.loads(run_cli("localize", both, "--format", "json", check=True).stdout)
    assert v["status"] == "irregular" and any("capture too short" in u for u in v["unjudged"])


def test_a_slow_link_to_a_host_with_no_other_peer_ties_with_that_hosts_nic() -> None:
    """The last stage of a pipeline whose stages fill hosts talks to one host only: its NIC and
    the link to that host carry the same flows, so flows list both at one score, a declared tie,
    and not the NIC of the other end, whose flows to its other neighbour ran normally."""
    import pandas as pd

    from localize.flows import network_candidates

    chain = [("node-0", "node-1"), ("node-1", "node-2"), ("node-2", "node-3")]
    rows = [(a, b, 3.0 if b == "node-3" or a == "node-3" else 1.0) for x, y in chain for a, b in ((x, y), (y, x))]
    edges = pd.DataFrame(rows, columns=["sh", "dh", "ratio"]).assign(slow=lambda d: d["ratio"] > 1.5)
    cands = network_candidates(edges, {}, "flows")
    assert sorted((c.kind, c.host or "+".join(c.hosts or [])) for c in cands) == [
        ("link", "node-2+node-3"), ("nic", "node-3")]
    assert {c.tie for c in cands} == {2} and len({c.score for c in cands}) == 1


def test_iterations_of_pauses_that_alternate_a_little_are_cut_whole() -> None:
    """GPU rank 13 (node-1) 2x slower in every step of an eager tp4 pp2 job: one ring's pauses
    between iterations alternate 69 and 70 ms, and cutting only the longer ones was as even, two
    iterations at a time. The iterations came out as 16 ms pieces and 200 ms pairs."""
    t = Trace.open(sim_flows("slow-from-start-cut", p2p="eager"))
    it = build_flow_timeline(t.flows(), t.meta).jobs[0].iterations
    done = it.loc[it["complete"], "duration_s"]
    assert done.between(0.9 * done.median(), 1.1 * done.median()).all()
    v = localize_flows(t)
    assert (v.candidates[0].kind, v.candidates[0].host) == ("host", "node-1") and v.onset_step == 0


def test_host_slow_from_the_first_step_is_named_over_iterations_cut_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same job cut as it was before (any break between pause lengths taken): a piece of an
    iteration holds no sync of its own, and counted, it left node-1 last in only 79% of the
    iterations ("no candidate")."""
    t = Trace.open(sim_flows("slow-from-start-cut", p2p="eager"))
    monkeypatch.setattr(timeline.flows, "MIN_BREAK", 1.0)
    tl = build_flow_timeline(t.flows(), t.meta)
    done = tl.jobs[0].iterations.loc[lambda x: x["complete"], "duration_s"]
    assert (done < done.median() / 2).sum() >= 2  # (the cut this test is about)
    v = localize_flows(t, timeline=tl)
    assert (v.candidates[0].kind, v.candidates[0].host) == ("host", "node-1")


def test_a_ring_member_is_compared_with_the_median_of_its_peers_alone() -> None:
    values = np.array([1.0, 5.0, 3.0, 10.0, 20.0, np.nan, 7.0])
    group = np.array([0, 0, 0, 1, 1, 1, 2])
    got = peer_median(values, group)
    np.testing.assert_array_equal(got[:5], [4.0, 2.0, 3.0, 20.0, 10.0])  # (a ring of two: the other one)
    assert np.isnan(got[5]) and np.isnan(got[6])  # no value; no peer
    np.testing.assert_array_equal(peer_median(np.array([4.0, 1.0, 3.0, 2.0]), np.zeros(4)), [2.0, 3.0, 2.0, 3.0])


@pytest.mark.parametrize("p2p", SEMANTICS)
def test_host_slow_from_the_first_step_is_named_in_rings_of_two_hosts(p2p: str) -> None:
    """GPU rank 9 (node-1) 1.5x slower in every step of a tp8 pp4 dp2 job: each ring is two hosts
    of the same stage. Against a median it is part of, node-1 read 0.7 ms late, under the bar;
    against its one peer, 1.4 ms ("healthy" before)."""
    v = localize_flows(Trace.open(sim_flows("slow-from-start-pairs", p2p=p2p)))
    assert v.candidates and (v.candidates[0].kind, v.candidates[0].host) == ("host", "node-1")
    assert v.onset_step == 0


def test_iterations_are_judged_as_steps_are_warm_up_left_out() -> None:
    """Flow iterations go through the one step judgment of every path: a real gloo ring's first
    iterations ran 1.13x and 1.08x (warm-up) before a link slowed it from step 11; the old k-sigma
    rule called them irregular and the onset "step 1"."""
    d = [0.161, 0.155, 0.148, 0.136, 0.144, 0.139, 0.140, 0.135, 0.137, 0.134, 0.144,
         0.177, 0.187, 0.193, 0.187, 0.187, 0.188, 0.187, 0.189, 0.188, 0.187]
    it = pd.DataFrame({"step": range(len(d)), "duration_s": d, "complete": True})
    it.loc[0, "complete"] = False  # (the capture's partial first iteration is never judged)
    judged, base, warm, onset = judged_iterations(it)
    assert onset == 11 and warm == [1]
    assert sorted(judged.loc[judged["irregular"], "step"]) == list(range(11, len(d)))
    assert 0.134 <= base <= 0.148
