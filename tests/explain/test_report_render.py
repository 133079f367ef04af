"""Report building and rendering on a hand-built trace whose straggler is known (rank 5)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from collector.trace.traceio import Trace
from explain.report.build import build_report, report_from_verdict
from explain.report.html import render_html
from explain.report.markdown import render_markdown
from explain.report.model import LogEvidence, Report, confidence_label, irregular_windows
from localize.verdict import Candidate, Verdict
from tests.explain.report_helpers import (
    SLOW_RANK,
    make_diagnosis,
    make_timeline,
    make_trace,
    make_verdict,
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Report:
    trace = make_trace(tmp_path_factory.mktemp("toy") / "t", with_logs=True)
    return build_report(Trace.open(trace), make_timeline(), make_verdict(), make_diagnosis())


def test_answers_come_from_the_inputs(report: Report) -> None:
    assert report.status == "irregular"
    assert report.since_step == 10 and report.since_utc and report.since_utc.endswith("UTC")
    assert report.windows == [(10, 14, "persistent")]
    assert report.lost_s == pytest.approx(5 * 0.2)
    assert report.gpu_hours_lost == pytest.approx(1.0 * 16 / 3600)
    assert report.root and report.root["rank"] == SLOW_RANK and report.confidence == "high"
    assert report.checks == ["gpu_clocks on node-0: `nvidia-smi -q -d PERFORMANCE -i 5` — SM clock 900 MHz of "
                             "1980 MHz: thermal slowdown active"]
    assert report.actions and report.actions[0].startswith("drain_slurm (host node-0): take the node out")
    assert "needs approval" in report.actions[0] and "`scontrol update NodeName=node-0 State=DRAIN`" in report.actions[0]
    assert report.explanation.startswith("Most likely cause: GPU thermal throttling (gpu), confidence 0.80, confirmed")
    assert "logs: node-0: GPU 5 clocks throttled (thermal)" in report.evidence


def test_wait_path_ends_at_the_straggler(report: Report) -> None:
    assert report.path[0].ranks == [SLOW_RANK]
    level1 = set(report.path[1].ranks)
    assert {4, 6, 7} <= level1  # its tp peers waited on it directly
    assert SLOW_RANK not in {r for hop in report.path[1:] for r in hop.ranks}
    waits = report.waits
    assert waits is not None
    per_rank = waits.total_by_rank()
    assert per_rank[SLOW_RANK] == per_rank.min()  # the straggler is the one that never waits


def test_gantt_compares_a_slow_and_a_normal_step(report: Report) -> None:
    assert report.gantt_steps is not None
    slow, normal = report.gantt_steps
    assert slow in range(10, 15) and normal not in range(10, 15)
    assert report.gantt_slow is not None and report.gantt_normal is not None
    assert report.gantt_slow["t1"].max() > report.gantt_normal["t1"].max() * 2


def test_html_is_self_contained_and_has_every_figure(report: Report) -> None:
    html = render_html(report)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched from a network
    assert "<script" not in html
    uris = re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', html)
    assert len(uris) == 5  # iteration time, heatmap, wait graph, gantt, logs (no flows in this trace)
    for uri in uris:
        assert base64.b64decode(uri).lstrip().startswith(b"<?xml")
    for answer in ("Irregular?", "Since when?", "Time lost", "Root cause", "What to check", "What to do"):
        assert answer in html
    assert "gpu rank 5 (node-0 gpu 5)" in html


def test_html_escapes_what_it_quotes() -> None:
    v = Verdict("<job>", "irregular", [3], 1.5, [])
    r = report_from_verdict(v, None, {"cause": {"title": "<script>alert(1)</script>"}}, world_size=8)
    html = render_html(r)
    assert "<script>" not in html and "&lt;script&gt;" in html and "&lt;job&gt;" in html


CONTROLS = "\x00\x07\x1b[2J\x1b]0;pwned\x07\r\x7f\x85\u202e"


def _controls(text: str) -> list[str]:
    """The characters a page or terminal would obey rather than show (tab and newline are text)."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f or c == "\u202e"]


def test_report_shows_control_characters_from_inputs_escaped() -> None:
    v = Verdict(f"run7{CONTROLS}", "irregular", [3], 1.5,
                [Candidate("gpu", 0.9, rank=1, host=f"node{CONTROLS}", gpu=1, evidence=[f"seen{CONTROLS}"])])
    r = report_from_verdict(v, None, None, world_size=8)
    r.logs = LogEvidence([f"node{CONTROLS}"], [1], [(f"node{CONTROLS}", f"NCCL WARN\tline{CONTROLS}")])
    for page in (render_html(r), render_markdown(r)):
        assert _controls(page) == []
        assert "run7\\x00\\x07\\x1b[2J\\x1b]0;pwned\\x07\\x0d\\x7f\\x85\\u202e" in page
        assert "NCCL WARN\tline\\x00" in page  # a tab is kept as it is


def test_markdown_reads_in_a_terminal(report: Report) -> None:
    md = render_markdown(report)
    assert md.startswith("# laggard report: toy")
    assert max(len(line) for line in md.splitlines()) <= 160
    assert "^^^^^" in md  # the irregular steps marked under the sparkline
    assert "| 1 | gpu rank 5 (node-0 gpu 5) | gpu | 0.910 | commops |" in md
    assert "GPU 5 clocks throttled" in md  # the log line from the suspect host


def test_json_is_plain_data(report: Report) -> None:
    d = json.loads(json.dumps(report.to_dict(), default=str))
    assert d["root_cause"]["rank"] == SLOW_RANK
    assert d["wait_path"][0]["ranks"] == [SLOW_RANK]
    assert len(d["steps"]) == 20 and d["steps"][10]["irregular"] is True


def test_healthy_report_says_so_without_figures_of_faults() -> None:
    r = report_from_verdict(Verdict("ok", "healthy"), None, None, world_size=8)
    assert r.headline() == "ok: healthy — no irregular iteration found"
    assert r.confidence == "none" and r.root is None
    html = render_html(r)
    assert "HEALTHY" in html and "<figure>" not in html
    assert "Nothing to do" in html


def test_hang_is_stated_first() -> None:
    r = report_from_verdict(Verdict("j", "hang", candidates=[]), None, None, world_size=8)
    assert "STUCK" in r.headline() and "STUCK" in render_markdown(r)


def test_irregular_windows_split_runs_and_pick_a_pattern() -> None:
    steps = pd.DataFrame({"step": range(10), "irregular": [0, 1, 1, 0, 0, 1, 0, 0, 1, 1],
                          "pattern": ["", "spike", "spike", "", "", "fluctuation", "", "", "persistent", ""]})
    assert irregular_windows(steps) == [(1, 2, "spike"), (5, 5, "fluctuation"), (8, 9, "persistent")]


def test_confidence_needs_a_margin() -> None:
    assert confidence_label([{"score": 0.9}, {"score": 0.3}]) == "high"
    assert confidence_label([{"score": 0.9}, {"score": 0.85}]) == "low"
    assert confidence_label([{"score": 0.5}]) == "medium"
    assert confidence_label([]) == "none"


def test_flow_evidence_flags_the_slow_host(tmp_path: Path) -> None:
    from explain.report.evidence import flow_evidence

    trace = Trace.open(make_trace(tmp_path / "t"))
    rows = []
    for _r, info in trace.meta.ranks.items():
        gbps = 50.0 if info.host == "node-1" else 400.0
        for i in range(5):
            rows.append({"start_ns": i * 10**9, "end_ns": i * 10**9 + 10**6, "src_ip": info.ip,
                         "bytes": int(gbps * 1e9 / 8 * 1e-3)})
    ev = flow_evidence(pd.DataFrame(rows), trace.meta, ["node-0"])
    assert ev is not None and ev.flagged == ["node-1"] and ev.hosts[0] == "node-1"
    assert ev.gbps[0] == pytest.approx(50.0, rel=0.01)


def test_slow_from_the_start_is_worded_as_such(tmp_path: Path) -> None:
    """No irregular step and no normal one: no '0 irregular steps', no '0.0 s extra', no slow-vs-normal pair."""
    trace = Trace.open(make_trace(tmp_path / "t"))
    v = Verdict("toy", "irregular", [], 1.4, make_verdict().candidates[:1], {"persistent": True},
                onset_step=0)
    r = build_report(trace, make_timeline(), v, None)
    assert r.from_start and r.since_step == 0 and r.irregular_steps == [] and r.gantt_steps is None
    assert "slow from the first step" in r.headline() and "since step" not in r.headline()
    html, md = render_html(r), render_markdown(r)
    assert "Slow from the start" in html and "0 irregular step" not in html and "0.0 s extra" not in html
    assert "Slow iteration beside a normal one" not in html  # no gantt pair
    assert "slow from the first step" in md and "0.0 s extra" not in md
    assert r.story.startswith("toy: SLOW from the first step (step 0)")


def test_report_status_is_the_verdicts_not_the_timelines(tmp_path: Path) -> None:
    """The timeline of this trace has irregular steps; a healthy verdict is still reported healthy."""
    trace = Trace.open(make_trace(tmp_path / "t"))
    r = build_report(trace, make_timeline(), Verdict("toy", "healthy"), None)
    assert r.status == "healthy" and r.irregular_steps == [] and r.since_step is None and r.windows == []
    assert "HEALTHY" in render_html(r)  # and the figures render with no irregular step (no empty legend crash)


def test_commands_never_wrap_inside_a_flag() -> None:
    cmd = "nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader -i 5"
    r = report_from_verdict(Verdict("j", "irregular", [3], 1.5, []), None, None, world_size=8)
    r.checks = [f"gpu_clocks on a-very-long-host-name-0001: `{cmd}` — SM clock 900 MHz of 1980 MHz, more words"]
    md = render_markdown(r)
    assert f"`{cmd}`" in md  # whole, on one line
    html = render_html(r)
    assert '<span class="w">--query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu</span>' in html
    assert "code.cmd .w{white-space:nowrap}" in html


def test_waits_read_a_few_steps_at_a_time_are_the_waits_of_the_whole_trace(
        tmp_path: Path, report: Report, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report reads CommOps a chunk of whole steps at a time (its memory follows the chunk,
    not the trace); chunks of ~3 steps give the figures one read of every step gives."""
    import explain.report.build as build

    trace = make_trace(tmp_path / "t", with_logs=True)
    n = len(Trace.open(trace).commops(columns=["step"]))
    monkeypatch.setattr(build, "WAIT_CHUNK_ROWS", n // 7)
    assert len(build.step_chunks(Trace.open(trace), n // 7)) >= 6
    chunked = build_report(Trace.open(trace), make_timeline(), make_verdict(), make_diagnosis())
    assert report.waits is not None and chunked.waits is not None
    assert (chunked.waits.ranks == report.waits.ranks).all() and (chunked.waits.steps == report.waits.steps).all()
    assert chunked.waits.seconds == pytest.approx(report.waits.seconds, abs=1e-12)
    assert [h.to_dict() for h in chunked.path] == [h.to_dict() for h in report.path]
    assert chunked.gantt_steps == report.gantt_steps and chunked.since_utc == report.since_utc
    assert chunked.gantt_slow is not None and report.gantt_slow is not None
    assert chunked.gantt_normal is not None and report.gantt_normal is not None
    pd.testing.assert_frame_equal(chunked.gantt_slow, report.gantt_slow)
    pd.testing.assert_frame_equal(chunked.gantt_normal, report.gantt_normal)


def test_step_chunks_cover_every_step_once(tmp_path: Path) -> None:
    from explain.report.build import step_chunks

    trace = Trace.open(make_trace(tmp_path / "t"))
    steps = sorted(trace.commops(columns=["step"])["step"].unique())
    for rows in (1, 50, 10**9):
        chunks = step_chunks(trace, rows)
        covered = [s for lo, hi in chunks for s in steps if lo <= s <= hi]
        assert covered == steps and all(lo <= hi for lo, hi in chunks)
    assert len(step_chunks(trace, 1)) == len(steps) and len(step_chunks(trace, 10**9)) == 1


def test_waits_pair_sends_and_recvs_numbered_apart_as_the_timeline_does() -> None:
    """A producer that numbers each end of a pair on its own (sends 0, 1; recvs 5, 6): the copies
    are paired in order, as `timeline.instances` pairs them, so the late receiver is the blocker."""
    from explain.report.waits import annotate_waits

    ms = 1_000_000
    rows = pd.DataFrame({
        "rank": [0, 0, 1, 1], "group": ["pp-0"] * 4, "op": ["send", "send", "recv", "recv"],
        "seq": [0, 1, 5, 6], "peer": [1, 1, 0, 0],
        "start_ns": [0, 21 * ms, 8 * ms, 20 * ms], "end_ns": [10 * ms, 22 * ms, 10 * ms, 22 * ms], "step": [0] * 4})
    out = annotate_waits(rows)
    assert out["blocker"].tolist() == [1, 0, 1, 0]  # the first transfer waited on the receiver, the second on the sender
    assert out["wait_s"].tolist() == pytest.approx([0.008, 0.0, 0.0, 0.001])
