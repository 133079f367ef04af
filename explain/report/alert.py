"""Compact alert payloads for a report: Slack-compatible webhooks and Alertmanager.

Both carry the headline answers only (status, since when, time lost, root cause and
confidence) plus where the full report lives; receivers should not need the page to act.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from explain.report.model import Report

FORMATS = ("slack", "alertmanager")


def summary(report: Report, link: str | None = None) -> dict[str, Any]:
    """The few facts every alert carries."""
    root = report.root
    return {
        "job": report.job,
        "status": report.status,
        "headline": report.headline(),
        "since_step": report.since_step,
        "slowdown": round(float(report.slowdown), 3),
        "gpu_hours_lost": round(report.gpu_hours_lost, 3),
        "root_cause": root["device"] if root else None,
        "root_kind": root.get("kind") if root else None,
        "score": round(float(root["score"]), 3) if root else None,
        "confidence": report.confidence,
        "first_check": report.checks[0] if report.checks else None,
        "report": link,
    }


def slack_payload(report: Report, link: str | None = None) -> dict[str, Any]:
    """Slack incoming-webhook JSON: `text` for notifications, `blocks` for the message body."""
    s = summary(report, link)
    icon = {"irregular": ":warning:", "hang": ":rotating_light:"}.get(report.status, ":white_check_mark:")
    fields = [
        f"*Status*\n{s['status']}",
        f"*Since*\n{'step ' + str(s['since_step']) if s['since_step'] is not None else '—'}",
        f"*Slowdown*\n{s['slowdown']:.2f}×",
        f"*GPU-hours lost*\n{report.gpu_hours_text()}",
        f"*Root cause*\n{s['root_cause'] or '—'}",
        f"*Confidence*\n{s['confidence']}" + (f" ({s['score']:.2f})" if s["score"] is not None else ""),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"laggard: {report.job} {report.status}"[:150]}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
    ]
    if s["first_check"]:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"*Check first:* {s['first_check']}"}})
    if link:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"Full report: {link}"}]})
    return {"text": f"{icon} {s['headline']}", "blocks": blocks}


#: alertname -> severity. An alert's labels are its identity in Alertmanager: they stay fixed for
#: the life of the problem, so the resolving post matches the firing one (status, root cause and
#: figures change as the diagnosis goes on and travel as annotations)
ALERTS = {"LaggardIrregularity": "warning", "LaggardHang": "critical"}


def alertmanager_payload(report: Report, link: str | None = None, now: datetime | None = None) -> list[dict[str, Any]]:
    """Alertmanager `/api/v2/alerts` body: the job's firing alert, or (healthy) both of its
    alerts resolved."""
    s = summary(report, link)
    now = now or datetime.now(UTC)
    stamp = now.isoformat().replace("+00:00", "Z")
    annotations = {"summary": s["headline"], "status": report.status, "slowdown": f"{s['slowdown']:.3f}",
                   "gpu_hours_lost": f"{s['gpu_hours_lost']:.3f}", "confidence": s["confidence"]}
    if s["root_cause"]:
        annotations["root_kind"] = str(s["root_kind"])
        annotations["root_cause"] = str(s["root_cause"])
    if s["first_check"]:
        annotations["first_check"] = s["first_check"]
    names = list(ALERTS) if report.status == "healthy" else ["LaggardHang" if report.status == "hang" else "LaggardIrregularity"]
    alerts = []
    for name in names:
        alert: dict[str, Any] = {"labels": {"alertname": name, "job": report.job, "severity": ALERTS[name]},
                                 "annotations": dict(annotations), "startsAt": stamp}
        if report.status == "healthy":
            alert["endsAt"] = stamp
        if link:
            alert["generatorURL"] = link
        alerts.append(alert)
    return alerts


def detect_format(url: str) -> str:
    """Alertmanager when the URL is its alerts API, otherwise a Slack-compatible webhook."""
    path = url.split("?", 1)[0].rstrip("/")
    return "alertmanager" if path.endswith(("/api/v2/alerts", "/api/v1/alerts")) else "slack"
