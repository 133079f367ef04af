"""When the service names a root cause: once consecutive rounds on new evidence agree on it.

Early in an irregularity a round sees only a few slow steps, and its top candidate can be a
victim of the real one (a peer that waited on it). A device that a page, a metric or an alert
names should not change a second later, so a round's device is published only once the last
`needed` rounds, each planned on summaries the one before had not seen, named the same top
device (a tie counts as its set of devices). Until then the job is shown as it is, irregular
or hung, but "localizing": no candidates, and a `localizing` field saying how far along it is.
A healthy round is shown at once (nothing to name). A round on the same summaries as the last
one (a manual re-localize), or on posts that add nothing (a node saying its ranks exited, or
that a hang cleared), is no new evidence and does not count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

NEEDED = 2  # rounds that must agree; 1 publishes every round's device as it comes


@dataclass(frozen=True)
class Agreement:
    """One job's run of agreeing rounds: the device they named and the newest summary they saw."""

    device: str | None = None
    upto: int = -1
    rounds: int = 0


def device_key(verdict: dict[str, Any]) -> str | None:
    """The top device of a verdict (all of them, for a tie), as a comparable string; None: none named."""
    cands = verdict.get("candidates") or []
    if not cands:
        return None
    tied = int(cands[0].get("tie") or 1)
    keep = ("kind", "rank", "host", "gpu", "hosts", "switch")
    devices = sorted(json.dumps({k: c.get(k) for k in keep if c.get(k) is not None}, sort_keys=True)
                     for c in cands[:max(tied, 1)])
    return "|".join(devices)


def publish(prev: Agreement, verdict: dict[str, Any], upto: int,
            needed: int = NEEDED) -> tuple[Agreement, dict[str, Any]]:
    """The job's new agreement, and the verdict to show for a round whose newest evidence is the
    summary `upto` (`Localized.evidence`)."""
    key = device_key(verdict)
    if verdict.get("status") == "healthy" or key is None:
        return Agreement(None, max(upto, prev.upto), 0), verdict
    # a new device starts its count; the same one counts a round only on summaries not seen before
    same = key == prev.device
    rounds = 1 if not same else prev.rounds + (upto > prev.upto)
    now = Agreement(key, max(upto, prev.upto), rounds)
    if rounds >= needed:
        return now, verdict
    return now, withheld(verdict, rounds, needed)


def withheld(verdict: dict[str, Any], rounds: int, needed: int) -> dict[str, Any]:
    """The verdict without its device, saying that the device awaits confirmation."""
    out = dict(verdict, candidates=[])
    out["localizing"] = {
        "rounds_agreeing": rounds, "rounds_needed": needed,
        "detail": f"{verdict.get('status', 'irregular')}; the root cause is named once {needed} consecutive "
                  f"localization rounds on new summaries agree ({rounds} so far)"}
    return out
