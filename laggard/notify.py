"""Post a report's alert to a Slack-compatible webhook or an Alertmanager endpoint."""

from __future__ import annotations

from typing import Any

import httpx

from collector.errors import UserError
from explain.report.alert import alertmanager_payload, detect_format, slack_payload
from explain.report.model import Report

TIMEOUT_S = 10.0


def alert_payload(report: Report, url: str, fmt: str = "auto", link: str | None = None) -> Any:
    """The JSON body for `url`: Alertmanager's alert list, or Slack's {text, blocks}."""
    kind = detect_format(url) if fmt == "auto" else fmt
    return alertmanager_payload(report, link) if kind == "alertmanager" else slack_payload(report, link)


def notify(report: Report, url: str, fmt: str = "auto", link: str | None = None) -> int:
    """POST the alert; returns the HTTP status, raises UserError when the receiver refuses it."""
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--notify '{url}' is not an http(s) URL",
                        "give a webhook URL, e.g. https://hooks.slack.com/services/... or http://am:9093/api/v2/alerts")
    try:
        resp = httpx.post(url, json=alert_payload(report, url, fmt, link), timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise UserError(f"could not post the alert to {url} ({type(exc).__name__}: {exc})",
                        "check that the receiver is up and the URL is right; the report itself was written") from exc
    if resp.status_code >= 300:
        raise UserError(f"{url} refused the alert: HTTP {resp.status_code} {resp.text[:200].strip()}",
                        "check the URL and --notify-format (slack or alertmanager); the report itself was written")
    return resp.status_code
