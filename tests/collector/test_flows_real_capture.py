"""Real traffic: a 4-rank gloo DDP job in network namespaces, captured by tcpdump on the bridge.

One run (about a minute) covers three phases, each checked from the capture alone:
steps 0-9 healthy, 10-19 rank 1's link rate-limited by tc tbf, 20-29 healthy, 30-39 rank 2 a
straggler (0.4 s of extra compute, over three times the 0.12 s pause between iterations: its
peers' stall after their first chunks is far longer than that pause, and must not be read as
the iteration's end). The namespaces are removed in the fixture's finally block,
whatever happens.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collector.trace.traceio import Trace
from localize.flows import localize_flows
from tests.collector.netns_job import NetnsLab, ensure_tools, iteration_errors
from tests.conftest import run_cli
from timeline.flows import build_flow_timeline

pytestmark = [pytest.mark.slow, pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]

LAB = NetnsLab(tag="lgft")


def captured(lab: NetnsLab, out: Path, **run: Any) -> tuple[Path, list[list[dict]]]:
    """`lab.run(out, **run)` between the lab's set-up and tear-down, its capture ingested into a
    trace by `laggard capture`: the trace's path and the ranks' step logs."""
    ensure_tools()
    try:
        lab.up()
        logs = lab.run(out, **run)
    finally:
        lab.down()
    (out / "meta.json").write_text(json.dumps(lab.meta("ddp-gloo")))
    proc = run_cli("capture", "--read", out / "capture.pcap", "--meta", out / "meta.json", "--out", out / "trace")
    assert proc.returncode == 0, proc.stderr
    return out / "trace", logs


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[dict]]]:
    return captured(LAB, tmp_path_factory.mktemp("real"), steps=40, slow_rank=2, slow_from=30, slow_s=0.4,
                    at_step=[(10, lambda: LAB.throttle(1)), (20, lambda: LAB.unthrottle(1))])


def test_namespaces_are_gone(capture: tuple[Path, list]) -> None:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in names for ns in [*LAB.rank_ns, LAB.br_ns])


def test_job_and_ring_are_recognised(capture: tuple[Path, list]) -> None:
    t = Trace.open(capture[0])
    tl = build_flow_timeline(t.flows(), t.meta)
    assert len(tl.jobs) == 1
    job = tl.jobs[0]
    assert job.name == "ddp-gloo" and job.hosts == [f"host-{i}" for i in range(4)]
    rings = [g for g in job.groups if g.kind == "dp"]
    assert len(rings) == 1 and sorted(rings[0].hosts) == job.hosts and len(rings[0].edges) == 4
    assert job.parallelism() == {"dp": 4}


def test_iterations_match_the_ranks_step_times(capture: tuple[Path, list]) -> None:
    t = Trace.open(capture[0])
    it = build_flow_timeline(t.flows(), t.meta).jobs[0].iterations
    assert abs(len(it) - 40) <= 1
    err = iteration_errors(it["end_ns"].to_numpy(), capture[1])
    assert len(err) >= 35
    # the ranks share this (busy) machine's CPUs: a sanity bound here, the figure is in bench.flows
    assert float(np.median(err)) < 0.03


def first_slow_step(logs: list[list[dict]], after: int) -> int:
    """The first step from `after` on that the ranks' own logs show slow: the job's step (its
    slowest rank's) over 1.2x the median of steps 3-9 (past the warm-up, before any fault)."""
    steps = np.array([[r["synced_ns"] - r["start_ns"] for r in rank] for rank in logs]).max(axis=0)
    normal = float(np.median(steps[3:10]))
    return after + int(np.argmax(steps[after:] > 1.2 * normal))


def test_slow_link_is_localized(capture: tuple[Path, list]) -> None:
    v = localize_flows(Trace.open(capture[0]), steps=(0, 19))
    assert v.status == "irregular" and v.candidates
    top = v.candidates[0]
    assert top.kind in ("link", "nic")
    assert "host-1" in ([top.host] if top.host else top.hosts or [])
    assert len(set(range(11, 20)) & set(v.irregular_steps)) >= 7
    # the warm-up's slow first steps are not the fault's: the onset is where the ranks saw it
    assert v.onset_step is not None and abs(v.onset_step - first_slow_step(capture[1], 10)) <= 1


def test_straggler_is_localized(capture: tuple[Path, list]) -> None:
    v = localize_flows(Trace.open(capture[0]), steps=(20, 39))
    assert v.status == "irregular" and v.candidates
    top = v.candidates[0]
    assert (top.kind, top.host) == ("host", "host-2")
    assert len(set(range(30, 40)) & set(v.irregular_steps)) >= 8
    assert v.onset_step is not None and abs(v.onset_step - first_slow_step(capture[1], 25)) <= 1


RING_LAB = NetnsLab(tag="lgrl")


@pytest.fixture(scope="module")
def ring_link(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[dict]]]:
    """The same job, 25 steps, with only the path between host-1 and host-2 (two neighbours of
    the ring) rate-limited both ways from step 10: one slow link, the others unlimited."""
    return captured(RING_LAB, tmp_path_factory.mktemp("ring-link"), steps=25,
                    at_step=[(10, lambda: RING_LAB.throttle_path(1, 2, "400mbit"))])


def test_one_slow_link_of_a_ring_is_named_alone(ring_link: tuple[Path, list[list[dict]]]) -> None:
    """Every edge of a ring waits for its slowest, yet on the wire only the slow one is busy the
    whole time: the others move each chunk at full rate and pause. So the link, not the ring's
    other links nor either end's NIC (whose other edge ran at full rate), is named."""
    proc = run_cli("localize", ring_link[0], "--flows", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    v = json.loads(proc.stdout)
    assert v["status"] == "irregular" and v["candidates"]
    top = v["candidates"][0]
    assert top["kind"] == "link" and sorted(top["hosts"]) == ["host-1", "host-2"], top
    assert all(c["score"] < top["score"] for c in v["candidates"][1:])
    assert len(set(range(12, 25)) & set(v["irregular_steps"])) >= 10
    assert abs(v["onset_step"] - first_slow_step(ring_link[1], 10)) <= 1, v["onset_step"]
