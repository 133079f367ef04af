"""Evidence items: everything a claim may cite, each with a stable id (E* verdict, L* logs, A* alert, P* probes).

Log and alert text is untrusted: it is quoted, truncated, and only ever matched with regular
expressions; nothing in it can choose a command.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from explain.knowledge import Entry
from localize.verdict import Verdict

MAX_LOG_BYTES = 32 << 20  # read at most the last 32 MiB of each host log
MAX_HITS_PER_ENTRY = 3
TIE_ITEMS = 5  # candidates of a tie listed one item each; the rest of the tie is one item


@dataclass
class EvidenceItem:
    id: str
    source: str  # verdict | candidate | log | alert | probe
    text: str
    entries: list[str] = field(default_factory=list)  # KB entries whose signature this item matches
    host: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, [])}


def clip(text: str, n: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def verdict_evidence(verdict: Verdict) -> list[EvidenceItem]:
    items = [EvidenceItem("E1", "verdict", (
        f"job {verdict.job} is {verdict.status}; slowdown {verdict.slowdown:.2f}x; "
        f"{len(verdict.irregular_steps)} irregular step(s)"
        + (f" from {min(verdict.irregular_steps)} to {max(verdict.irregular_steps)}" if verdict.irregular_steps else "")))]
    top = verdict.candidates[0] if verdict.candidates else None
    tied_rest: list[str] = []
    for i, c in enumerate(verdict.candidates, start=2):
        if top is not None and i - 1 > TIE_ITEMS and top.tie and c.tie and abs(c.score - top.score) <= 1e-6:
            tied_rest.append(c.device())  # the rest of a long tie: one item, not one each
            continue
        detail = "; ".join(clip(e, 160) for e in c.evidence[:3])
        items.append(EvidenceItem(f"E{len(items) + 1}", "candidate", clip(
            f"candidate {i - 1}: {c.device()} kind={c.kind} score={c.score:.2f}"
            + (f" from {c.source}" if c.source else "") + (f": {detail}" if detail else ""), 400), host=c.host))
    if tied_rest and top is not None:
        items.append(EvidenceItem(f"E{len(items) + 1}", "candidate", clip(
            f"{len(tied_rest)} more devices tied with candidate 1 at score {top.score:.2f}: {', '.join(tied_rest)}", 400)))
    return items


def log_evidence(log_files: Iterable[Path], entries: Iterable[Entry]) -> list[EvidenceItem]:
    """Lines in the hosts' logs that match a knowledge-base log pattern, a few per entry and host."""
    patterns = [(e.id, rx) for e in entries for rx in e.log_regexes()]
    items: list[EvidenceItem] = []
    for path in sorted(log_files):
        host = path.name.split(".log")[0]
        text = _tail(path)
        hits: dict[tuple[str, str], EvidenceItem] = {}
        counts: dict[str, int] = {}
        for eid, rx in patterns:
            for m in rx.finditer(text):
                if counts.get(eid, 0) >= MAX_HITS_PER_ENTRY:
                    break
                start = text.rfind("\n", 0, m.start()) + 1
                end = text.find("\n", m.end())
                line = text[start:end if end >= 0 else len(text)]
                lineno = text.count("\n", 0, start) + 1
                key = (path.name, str(lineno))
                if key in hits:
                    if eid not in hits[key].entries:
                        hits[key].entries.append(eid)
                else:
                    hits[key] = EvidenceItem("", "log", f"{path.name}:{lineno}: {clip(line)}", [eid], host)
                counts[eid] = counts.get(eid, 0) + 1
        items += sorted(hits.values(), key=lambda it: int(it.text.split(":")[1]))
    for i, it in enumerate(items, start=1):
        it.id = f"L{i}"
    return items


def _tail(path: Path) -> str:
    size = path.stat().st_size
    with path.open("rb") as fh:
        if size > MAX_LOG_BYTES:
            fh.seek(size - MAX_LOG_BYTES)
        return fh.read().decode("utf-8", errors="replace")


def alert_evidence(alert: str, entries: Iterable[Entry]) -> list[EvidenceItem]:
    matched = [e.id for e in entries if any(rx.search(alert) for rx in e.log_regexes())]
    return [EvidenceItem("A1", "alert", clip(alert, 600), matched)] if alert.strip() else []


def ids(items: Iterable[EvidenceItem]) -> set[str]:
    return {it.id for it in items}


_CITE = re.compile(r"^[EALP]\d{1,4}\Z")


def valid_citation(ref: Any, known: set[str]) -> bool:
    return isinstance(ref, str) and bool(_CITE.match(ref)) and ref in known
