"""Alerts posted to a local receiver: Slack-compatible webhooks and Alertmanager."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from collector.inputs.errors import UserError
from explain.report.alert import detect_format
from explain.report.build import report_from_verdict
from explain.report.model import Report
from laggard.notify import BACKOFF_S, notify
from localize.verdict import Candidate, Verdict
from tests.conftest import run_cli
from tests.explain.report_helpers import make_trace
from tests.laggard.receiver import Receiver


@pytest.fixture
def report() -> Report:
    v = Verdict("run7", "irregular", [40, 41, 42], 1.8,
                [Candidate("gpu", 0.93, ["last to arrive"], rank=12, host="node-1", gpu=4)])
    r = report_from_verdict(v, None, {"probes": [{"probe": "gpu_clocks", "host": "node-1", "argv": ["nvidia-smi", "-q", "-i", "4"]}]},
                            world_size=1024)
    r.lost_s = 36.0
    return r


def test_slack_webhook_gets_text_and_blocks(report: Report) -> None:
    with Receiver() as rx:
        assert notify(report, rx.url + "/services/T0/B0/xyz", link="file:///r.html") == 200
    [(path, body)] = rx.posts
    assert path == "/services/T0/B0/xyz"
    assert "run7" in body["text"] and "gpu rank 12 (node-1 gpu 4)" in body["text"]
    fields = " ".join(f["text"] for b in body["blocks"] if b["type"] == "section" for f in b.get("fields", []))
    assert "1.80×" in fields and "10.2" in fields and "high" in fields  # 36 s × 1024 GPUs = 10.24 GPU-h
    assert any("nvidia-smi" in b.get("text", {}).get("text", "") for b in body["blocks"])
    assert len(json.dumps(body)) < 3000  # compact


def test_alertmanager_detected_by_path(report: Report) -> None:
    with Receiver() as rx:
        notify(report, rx.url + "/api/v2/alerts")
    [(path, body)] = rx.posts
    assert path == "/api/v2/alerts" and isinstance(body, list) and len(body) == 1
    alert = body[0]
    assert alert["labels"]["alertname"] == "LaggardIrregularity" and alert["labels"]["job"] == "run7"
    assert alert["annotations"]["root_kind"] == "gpu" and "endsAt" not in alert
    assert alert["startsAt"].endswith("Z") and alert["annotations"]["slowdown"] == "1.800"


def test_format_flag_overrides_the_path(report: Report) -> None:
    with Receiver() as rx:
        notify(report, rx.url + "/hook", fmt="alertmanager")
    assert isinstance(rx.posts[0][1], list)
    assert detect_format("http://am:9093/api/v2/alerts/?x=1") == "alertmanager"
    assert detect_format("https://hooks.slack.com/services/a") == "slack"


def test_healthy_job_resolves_the_alert() -> None:
    r = report_from_verdict(Verdict("ok", "healthy"), None, None, world_size=8)
    with Receiver() as rx:
        notify(r, rx.url + "/api/v2/alerts")
    resolved = rx.posts[0][1]
    assert all(a["endsAt"] == a["startsAt"] for a in resolved)
    assert {a["labels"]["alertname"] for a in resolved} == {"LaggardIrregularity", "LaggardHang"}


def test_the_resolving_alert_has_the_firing_alerts_labels(report: Report) -> None:
    """Alertmanager matches a resolution to its alert by labels: whatever the diagnosis said."""
    healthy = report_from_verdict(Verdict("run7", "healthy"), None, None, world_size=8)
    with Receiver() as rx:
        notify(report, rx.url + "/api/v2/alerts")
        notify(healthy, rx.url + "/api/v2/alerts")
    firing, resolving = rx.posts[0][1], rx.posts[1][1]
    assert firing[0]["labels"] in [a["labels"] for a in resolving]


def test_transient_failures_are_retried_with_backoff_and_refusals_are_not(report: Report) -> None:
    waits: list[float] = []
    with Receiver(status=503) as rx:
        def recover(s: float) -> None:
            waits.append(s)
            if len(waits) == 2:
                rx.status = 200

        assert notify(report, rx.url + "/api/v2/alerts", sleep=recover) == 200
    assert len(rx.posts) == 3  # two failures, then delivered
    for i, w in enumerate(waits):  # each wait in its doubling window, jittered by 0.5-1.5x
        assert BACKOFF_S * 2**i * 0.5 <= w < BACKOFF_S * 2**i * 1.5
    with Receiver(status=400) as rx, pytest.raises(UserError, match="HTTP 400"):
        notify(report, rx.url + "/hook", sleep=waits.append)
    assert len(rx.posts) == 1  # a refusal is final


def test_alertmanager_starts_at_the_onset_and_links_the_service() -> None:
    from datetime import UTC, datetime

    v = Verdict("run8", "irregular", [40], 1.5, [Candidate("gpu", 0.9, [], rank=3, host="n", gpu=3)])
    onset = datetime(2026, 11, 25, 12, 0, 5, tzinfo=UTC)
    with Receiver() as rx:
        notify(report_from_verdict(v, None, None, world_size=8), rx.url + "/api/v2/alerts",
               link="http://laggard:8750/v1/jobs/run8/report", starts_at=onset)
    alert = rx.posts[0][1][0]
    assert alert["startsAt"] == "2026-11-25T12:00:05Z"
    assert alert["generatorURL"] == "http://laggard:8750/v1/jobs/run8/report"


def test_refused_or_unreachable_receiver_is_a_user_error(report: Report) -> None:
    with Receiver(status=500) as rx, pytest.raises(UserError, match="HTTP 500"):
        notify(report, rx.url + "/hook", sleep=lambda s: None)
    assert len(rx.posts) == 4
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UserError, match="could not post"):
        notify(report, f"http://127.0.0.1:{port}/hook", sleep=lambda s: None)
    with pytest.raises(UserError, match="not an http"):
        notify(report, "ftp://x/y")




@pytest.mark.slow
def test_cli_report_writes_and_notifies(tmp_path: Path) -> None:
    trace = make_trace(tmp_path / "toy")
    out = tmp_path / "r.md"
    with Receiver() as rx:
        proc = run_cli("report", trace, "--out", out, "--notify", rx.url + "/api/v2/alerts", "--fail-on-irregular")
    assert proc.returncode == 1, proc.stderr  # irregular, and --fail-on-irregular was given
    assert out.read_text().startswith("# laggard report: toy")
    assert rx.posts and rx.posts[0][1][0]["labels"]["job"] == "toy"


def test_cli_report_user_errors_exit_2(tmp_path: Path) -> None:
    proc = run_cli("report", tmp_path / "nope", "--out", tmp_path / "r.html")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    proc = run_cli("report", tmp_path, "--out", "-", "--format", "html")
    assert proc.returncode == 2 and "stdout" in proc.stderr


@pytest.mark.parametrize("extra, words", [(["--notify", "file:///etc/passwd"], "not an http(s) URL"),
                                          (["--out", "/nonexistent-dir/r.html"], "does not exist")])
def test_cli_report_refuses_its_flags_before_any_work(tmp_path: Path, extra: list[str], words: str) -> None:
    trace = Path(__file__).resolve().parents[2] / "traces" / "gpu-spike"
    proc = run_cli("report", trace, "--out", tmp_path / "r.html", *extra)
    assert proc.returncode == 2 and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "r.html").exists()
