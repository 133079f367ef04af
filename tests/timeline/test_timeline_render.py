"""Text rendering: what a person reads first, and compact tables for long runs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta, RankInfo
from timeline.model import Timeline
from timeline.render import bar, fmt_seconds, render_plain, sparkline, step_rows
from timeline.steps import judge_steps, slowdown


def _timeline(durations: list[float]) -> Timeline:
    meta = JobMeta(job="j", world_size=2, ranks={0: RankInfo("node-0", 0), 1: RankInfo("node-1", 0)})
    steps = judge_steps(pd.Series(durations, index=pd.RangeIndex(len(durations), name="step")))
    irr = steps.loc[steps["irregular"], "step"].tolist()
    return Timeline(job="j", meta=meta, group_kind={"dp-0": "dp"}, steps=steps, irregular_steps=irr,
                    slowdown=slowdown(steps), status="irregular" if irr else "healthy", notes=["a note"])


def test_units_bars_and_sparkline() -> None:
    assert fmt_seconds(0.0813) == "81.3 ms" and fmt_seconds(2.5) == "2.50 s" and fmt_seconds(None) == "-"
    assert bar(1.0, 1.0, width=4) == "████" and bar(0.5, 1.0, width=4) == "██"
    line = sparkline(np.array([1.0, 1.0, 3.0, 1.0]))
    assert len(line) == 4 and line[2] == "█" and line[0] == "▁"
    assert len(sparkline(np.ones(500), width=80)) == 80


def test_irregular_summary_comes_first() -> None:
    text = render_plain(_timeline([1.0] * 8 + [2.0] + [1.0] * 5))
    lines = text.splitlines()
    assert lines[0] == "job j: 2 GPUs on 2 host(s), 14 step(s); groups: 1 dp"
    assert lines[1].startswith("status: IRREGULAR since step 8 — 1 of 14 steps irregular (spike x1)")
    assert lines[2].startswith("time lost: 1.00 s of 15.00 s (6.7%)") and lines[2].endswith("irregular steps: 8")
    assert "8!" in text and text.endswith("note: a note")


def test_healthy_summary() -> None:
    text = render_plain(_timeline([1.0] * 5))
    assert "status: healthy" in text.splitlines()[1]


def test_long_runs_are_compacted() -> None:
    d = [1.0] * 100
    d[20] = 3.0
    d[60:100] = [1.5] * 40
    rows = step_rows(_timeline(d))
    shown = [r[0] for r in rows]
    assert shown[:3] == ["0", "1", "2"] and "20!" in shown
    assert shown[shown.index("60!"):shown.index("60!") + 3] == ["60!", "61!", "62!"]
    assert shown[-2:] == ["98!", "99!"] and "80!" not in shown
    assert len(rows) < 20


def test_a_healthy_job_with_a_step_over_delta_does_not_say_none_ran_that_slow() -> None:
    """A 1.25x step the timeline left out (its noise, or too brief to cost time) is said, not denied:
    the status read "no step ran 1.10x its baseline" over it (independent generator, seed 8686 job 14)."""
    tl = _timeline([1.0] * 8 + [1.25] + [1.0] * 5)
    tl.steps.loc[tl.steps["step"] == 8, ["irregular", "pattern"]] = (False, "noise")
    tl.irregular_steps, tl.status = [], "healthy"
    line = render_plain(tl).splitlines()[1]
    assert "no step ran" not in line and "the slowest step (8) ran 1.25x its baseline" in line, line
    assert "no step ran 1.10x" in render_plain(_timeline([1.0] * 5)).splitlines()[1]


def test_a_job_slow_beside_its_peers_from_a_later_step_says_since_when() -> None:
    """Workers slow beside their peers from step 19, on steps too noisy to show it: the status and
    note say since when, and the job's own slowdown (it read "SLOW from the first step (~1.74x)",
    the device's excess, on the independent generator's seed 8282 job 37)."""
    tl = _timeline([1.0] * 30)
    tl.mark_slow_from_start(19, 1.11, "gpu rank 336")
    text = render_plain(tl)
    assert text.splitlines()[1].startswith("status: SLOW since step 19 (~1.11x)")
    assert "note: slow since step 19: gpu rank 336" in text
    tl = _timeline([1.0] * 30)
    tl.mark_slow_from_start(0, 1.3, "gpu rank 5")
    assert render_plain(tl).splitlines()[1].startswith("status: SLOW from the first step (~1.30x)")
