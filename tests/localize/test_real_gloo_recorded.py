"""Real gloo jobs recorded on this machine (`data/real-gloo/README.md`), localized again by both
paths: runs a CI machine answered wrong, or that a path answered wrong in some runs, replayed so
that every machine checks them the same way. The live runs are `test_real_jobs.py`'s and
`tests/collector/test_commops_e2e.py`'s."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.stalls import stall_machine
from tests.localize.test_real_jobs import brief, verdicts

DATA = Path(__file__).parent / "data" / "real-gloo"


def answers(name: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    trace = tmp_path / name
    shutil.copytree(DATA / name, trace)  # (the sidecar path writes its summaries beside the records)
    return verdicts(trace)


@pytest.mark.slow
@pytest.mark.parametrize("stalled", [[], [1, 2, 3, 4, 5, 7, 21, 22, 23, 24, 25]], ids=["as-run", "busy-machine"])
def test_a_recorded_straggler_is_named_on_both_paths(tmp_path: Path, stalled: list[int]) -> None:
    """Eleven 60 ms stalls (3-4x a step) outnumber the straggler's ten 15x steps. The summary path
    fetched the most typical irregular steps by the steps' median, a stall's, and named no rank in
    CI's run (here: the host, 0.78). The time the steps lost puts rank 1's steps first."""
    trace = tmp_path / "trace"
    shutil.copytree(DATA / "straggler", trace)
    stall_machine(trace, stalled, 0.06)
    for path, v in verdicts(trace).items():
        assert v["status"] == "irregular" and v["candidates"][0].get("rank") == 1, f"{path}: {brief(v)}"
        assert set(range(10, 20)) <= set(v["irregular_steps"]), f"{path}: {brief(v)}"


@pytest.mark.slow
def test_a_recorded_throttled_link_is_the_link_on_both_paths(tmp_path: Path) -> None:
    """The path between host-0 and host-2 rate-limited from step 20. From six normal steps of
    history, stage 0's DP ring (host-0 to host-1, which the link does not carry) read slow in 5 of
    the 12 copies of the summary path's judged steps, and host-0's NIC was named (0.84) where the
    full records, 2 of 40, name the link; twelve steps of history read it as they do."""
    for path, v in answers("link", tmp_path).items():
        top = v["candidates"][0] if v["candidates"] else {}
        assert top.get("kind") == "link" and sorted(top.get("hosts") or []) == ["host-0", "host-2"], f"{path}: {brief(v)}"
        assert all(c["score"] < top["score"] for c in v["candidates"][1:]), f"{path}: {brief(v)}"
        assert v["onset_step"] == 20, f"{path}: {brief(v)}"


@pytest.mark.slow
def test_a_recorded_throttled_switch_uplink_is_the_switch_on_both_paths(tmp_path: Path) -> None:
    """tor-0's uplink rate-limited from step 20 (node-0 and node-1 under tor-0, meta.json's topology)."""
    for path, v in answers("switch", tmp_path).items():
        top = v["candidates"][0] if v["candidates"] else {}
        assert top.get("kind") == "switch" and top.get("switch") == "tor-0", f"{path}: {brief(v)}"
        assert all(c["score"] < top["score"] for c in v["candidates"][1:]), f"{path}: {brief(v)}"
        assert v["onset_step"] == 20, f"{path}: {brief(v)}"
