"""What an irregularity report says, independent of how it is rendered (HTML, Markdown, JSON).

Renderers take a `Report` and nothing else, so they are pure and testable with hand-built data;
`explain.report.build` is the one place that reads a trace to fill it in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from explain.report.waits import PathHop, WaitMatrix


@dataclass
class FlowEvidence:
    """Per-host network throughput from flow bursts; slow hosts stand out."""

    hosts: list[str]
    gbps: list[float]  # median burst throughput of flows leaving each host
    bursts: list[int]
    flagged: list[str] = field(default_factory=list)


@dataclass
class LogEvidence:
    """Suspicious log lines per host and a few examples from the hosts that matter most."""

    hosts: list[str]
    counts: list[int]
    lines: list[tuple[str, str]] = field(default_factory=list)  # (host, line)


@dataclass
class Report:
    job: str
    status: str  # irregular | healthy | hang
    world_size: int
    slowdown: float = 1.0
    irregular_steps: list[int] = field(default_factory=list)
    windows: list[tuple[int, int, str]] = field(default_factory=list)  # (first, last, pattern)
    since_step: int | None = None
    since_utc: str | None = None
    lost_s: float = 0.0  # extra wall time over the baseline, summed over irregular steps
    expected_step_s: float | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)  # Candidate.to_dict() + "device"
    confidence: str = "none"  # high | medium | low | none
    evidence: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    explanation: str = ""
    steps: pd.DataFrame | None = None  # step, duration_s, baseline_s, irregular, pattern
    waits: WaitMatrix | None = None
    path: list[PathHop] = field(default_factory=list)
    gantt_slow: pd.DataFrame | None = None
    gantt_normal: pd.DataFrame | None = None
    gantt_steps: tuple[int, int] | None = None  # (slow step, normal step)
    flows: FlowEvidence | None = None
    logs: LogEvidence | None = None
    notes: list[str] = field(default_factory=list)
    diagnosis: dict[str, Any] = field(default_factory=dict)
    from_start: bool = False  # slow from the first step: no normal iteration, no time-lost figure
    story: str = ""  # explain.story headline: the same first line localize and explain print
    tie: str = ""  # explain.story's tie wording of the root cause ('' when no other device shares its score)

    @property
    def gpu_hours_lost(self) -> float:
        """Extra wall time × GPUs: every GPU of a synchronous job idles while the job is slow."""
        return self.lost_s * self.world_size / 3600.0

    def gpu_hours_text(self) -> str:
        h = self.gpu_hours_lost
        return "0" if h == 0 else "<0.001" if h < 0.001 else f"{h:.3f}" if h < 10 else f"{h:,.1f}"

    @property
    def root(self) -> dict[str, Any] | None:
        return self.candidates[0] if self.candidates else None

    def headline(self) -> str:
        """One line for a pager: the answer before the details."""
        if self.status == "healthy":
            return f"{self.job}: healthy — no irregular iteration found"
        if self.from_start:
            what = f"slow from the first step, ~{self.slowdown:.2f}×"
        else:
            what = "STUCK (hang)" if self.status == "hang" else f"irregular, {self.slowdown:.2f}× slower"
        since = f" since step {self.since_step}" if self.since_step is not None and not self.from_start else ""
        root = self.root
        tie = f" {self.tie}" if self.tie else ""
        cause = (f"; root cause {root['device']} (confidence {self.confidence}, score {root['score']:.2f}){tie}"
                 if root else "; root cause not found")
        lost = f"; {self.gpu_hours_text()} GPU-hours lost" if self.lost_s > 0 else ""
        return f"{self.job}: {what}{since}{lost}{cause}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: stable keys for scripts; figures are left to the HTML form."""
        out: dict[str, Any] = {
            "job": self.job,
            "status": self.status,
            "headline": self.headline(),
            "story": self.story,
            "onset_step": self.since_step,
            "slow_from_start": self.from_start,
            "world_size": self.world_size,
            "irregular_steps": [int(s) for s in self.irregular_steps],
            "windows": [{"first": a, "last": b, "pattern": p} for a, b, p in self.windows],
            "since_step": self.since_step,
            "since_utc": self.since_utc,
            "slowdown": round(float(self.slowdown), 4),
            "lost_s": round(self.lost_s, 3),
            "gpu_hours_lost": round(self.gpu_hours_lost, 4),
            "expected_step_s": self.expected_step_s,
            "root_cause": self.root,
            "confidence": self.confidence,
            "candidates": self.candidates,
            "evidence": self.evidence,
            "checks": self.checks,
            "actions": self.actions,
            "explanation": self.explanation,
            "wait_path": [h.to_dict() for h in self.path],
            "notes": self.notes,
        }
        if self.steps is not None:
            cols = [c for c in ("step", "duration_s", "baseline_s", "irregular", "pattern") if c in self.steps]
            out["steps"] = self.steps[cols].to_dict(orient="records")
        if self.gantt_steps:
            out["gantt_steps"] = {"slow": self.gantt_steps[0], "normal": self.gantt_steps[1]}
        if self.flows:
            out["flows"] = {"hosts": self.flows.hosts, "gbps": self.flows.gbps, "flagged": self.flows.flagged}
        if self.logs:
            out["logs"] = {"hosts": self.logs.hosts, "counts": self.logs.counts,
                           "lines": [{"host": h, "line": ln} for h, ln in self.logs.lines]}
        if self.diagnosis:
            out["diagnosis"] = self.diagnosis
        return out


def irregular_windows(steps: pd.DataFrame) -> list[tuple[int, int, str]]:
    """Runs of consecutive irregular steps, each with its most common pattern."""
    if steps is None or steps.empty or "irregular" not in steps:
        return []
    s = steps.sort_values("step")
    irr = s[s["irregular"].astype(bool)]
    if irr.empty:
        return []
    step = irr["step"].to_numpy()
    pos = s.reset_index(drop=True).index[s["irregular"].astype(bool).to_numpy()].to_numpy()
    run = (pos[1:] != pos[:-1] + 1).cumsum() if len(pos) > 1 else []
    run_id = pd.Series([0, *list(run)])
    pattern = irr["pattern"].astype(str).to_numpy() if "pattern" in irr else [""] * len(irr)
    out = []
    for _, idx in run_id.groupby(run_id).groups.items():
        i = list(idx)
        pats = pd.Series(pattern[i[0]: i[-1] + 1])
        top = pats[pats != ""].mode()
        out.append((int(step[i[0]]), int(step[i[-1]]), str(top.iloc[0]) if len(top) else ""))
    return out


def confidence_label(candidates: list[dict[str, Any]]) -> str:
    """High when the top score is strong and well ahead of the runner-up."""
    if not candidates:
        return "none"
    top = float(candidates[0].get("score", 0.0))
    second = float(candidates[1].get("score", 0.0)) if len(candidates) > 1 else 0.0
    if top >= 0.7 and top - second >= 0.2:
        return "high"
    if top >= 0.4 and top - second >= 0.1:
        return "medium"
    return "low"


def tied_root(diag: dict[str, Any]) -> tuple[str, str] | None:
    """(name, detail) of a tied root as the diagnosis left it: the device a probe picked out of the tie,
    or the tie itself when no probe decided; None when the root was not tied."""
    tie = diag.get("tie")
    if not isinstance(tie, dict):
        return None
    if tie.get("decided"):
        return str(tie.get("device")), str(tie.get("decision"))
    return f"tie of {tie.get('size')}", f"{tie.get('words')}; no probe decided which"


def tie_words(diag: dict[str, Any]) -> str:
    """Where the diagnosis put the cause when the localizer's first candidate was tied ('' when it was not)."""
    said = tied_root(diag)
    if said is None:
        return ""
    return f" on {said[0]} ({said[1]})" if diag["tie"].get("decided") else f", among a {said[1]}"
