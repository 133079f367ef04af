"""Slow steps whose delay no logged operator shows are said to be irregular, with why no device
is named -- never "healthy". A job of the second generator (`bench.altgen`) logging TP rank 0
only, whose slow link carries only the data-parallel ring of ranks that logged nothing: every
logged rank just waits longer at the end-of-step barrier."""

from __future__ import annotations

from pathlib import Path

from bench.altgen import Fault, Layout
from localize.combine import localize_trace
from tests.localize.altgen_jobs import altgen_job, written

SLOW = [10, 11, 12]


def test_slow_steps_no_logged_operator_explains_are_irregular_and_say_why(tmp_path: Path) -> None:
    # tp-dp-pp over 4-GPU hosts: TP ranks 4-7 of replica 0 / stage 0 sit on node-1, of replica 1 on node-3
    lay = Layout(tp=8, pp=2, dp=2, gpus_per_host=4, hosts_per_switch=2, order="tp-dp-pp")
    fault = Fault("link", 3.0, "persistent", SLOW, hosts=(1, 3))
    spec = altgen_job("unlogged-ring", lay, fault, steps=20, seed=5, logging="tp0", step_sync="barrier")
    trace = written(spec, tmp_path)
    v = localize_trace(trace, ("commops",))
    assert v.status == "irregular" and v.irregular_steps == SLOW, (v.status, v.irregular_steps, v.extra)
    assert v.onset_step == SLOW[0]
    assert v.candidates == [], [c.device() for c in v.candidates]
    assert "the 28 ranks that logged nothing" in str(v.extra["note"])
