"""Post a report's alert to a Slack-compatible webhook or an Alertmanager endpoint, with retries.

A receiver that is restarting or briefly overloaded (a connection error, 429, 5xx) is retried
with exponential backoff; a refusal (any other 4xx) is final: retrying would not change it.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx

from collector.inputs.errors import UserError
from explain.report.alert import alertmanager_payload, detect_format, slack_payload
from explain.report.model import Report
from laggard.cliutil import emit

TIMEOUT_S = 10.0
ATTEMPTS = 4
BACKOFF_S = 0.5  # first wait; doubles each retry, with jitter


def alert_payload(report: Report, url: str, fmt: str = "auto", link: str | None = None,
                  starts_at: datetime | None = None) -> Any:
    """The JSON body for `url`: Alertmanager's alert list (startsAt = `starts_at`, the onset, when
    known), or Slack's {text, blocks}."""
    kind = detect_format(url) if fmt == "auto" else fmt
    return alertmanager_payload(report, link, starts_at) if kind == "alertmanager" else slack_payload(report, link)


def check_url(url: str) -> None:
    """Refuse a --notify URL that is not http(s), before any work that would be wasted on it."""
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--notify '{url[:80]}' is not an http(s) URL",
                        "give a webhook URL, e.g. https://hooks.slack.com/services/... or http://am:9093/api/v2/alerts")


def notify(report: Report, url: str, fmt: str = "auto", link: str | None = None,
           starts_at: datetime | None = None, attempts: int = ATTEMPTS, backoff_s: float = BACKOFF_S,
           sleep: Callable[[float], None] = time.sleep) -> int:
    """POST the alert, retrying transient failures; returns the HTTP status, raises UserError when
    the receiver refuses it or stays unreachable."""
    check_url(url)
    body = alert_payload(report, url, fmt, link, starts_at)
    for attempt in range(1, attempts + 1):
        last = attempt == attempts
        try:
            resp = httpx.post(url, json=body, timeout=TIMEOUT_S)
        except httpx.HTTPError as exc:
            if last:
                raise UserError(f"could not post the alert to {url} after {attempts} tries ({type(exc).__name__}: "
                                f"{exc})", "check that the receiver is up and the URL is right; the report itself "
                                "was written") from exc
        else:
            if resp.status_code < 300:
                return resp.status_code
            if last or not (resp.status_code == 429 or resp.status_code >= 500):
                raise UserError(f"{url} refused the alert: HTTP {resp.status_code} {resp.text[:200].strip()}",
                                "check the URL and --notify-format (slack or alertmanager); the report itself "
                                "was written")
        sleep(backoff_s * 2 ** (attempt - 1) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def notify_with_retry(report: Report, url: str, link: str | None = None, starts_at: datetime | None = None,
                      attempts: int = 6) -> bool:
    """The service's alert: retried for about half a minute; a failure is logged, never raised."""
    try:
        notify(report, url, "auto", link, starts_at, attempts=attempts)
    except UserError as exc:
        emit(f"laggard serve: alert for {report.job} not delivered: {exc}", file=sys.stderr)
        return False
    return True
