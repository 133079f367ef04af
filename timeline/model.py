"""The Timeline: what the timeline stage hands to localize/ and prints for people.

One row per training step with its duration, the rolling baseline it was judged against and
whether it is δ-irregular; plus the kind of every process group and the job-level verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd

from collector.trace.meta import JobMeta

STEP_COLUMNS = ("step", "duration_s", "baseline_s", "ratio", "irregular", "pattern")
PATTERNS = ("spike", "fluctuation", "persistent")
Status = Literal["irregular", "healthy", "hang"]  # hang: operators entered, none completed


def empty_steps() -> pd.DataFrame:
    """A steps table with the contract's columns and no rows."""
    return pd.DataFrame(
        {
            "step": pd.Series(dtype="int64"),
            "duration_s": pd.Series(dtype="float64"),
            "baseline_s": pd.Series(dtype="float64"),
            "ratio": pd.Series(dtype="float64"),
            "irregular": pd.Series(dtype="bool"),
            "pattern": pd.Series(dtype="object"),
        }
    )


@dataclass
class Timeline:
    """Per-job timeline: group kinds, per-step durations and δ-irregular steps."""

    job: str
    meta: JobMeta
    group_kind: dict[str, str]
    steps: pd.DataFrame
    irregular_steps: list[int] = field(default_factory=list)
    slowdown: float = 1.0
    status: Status = "healthy"
    expected_step_s: float | None = None
    notes: list[str] = field(default_factory=list)
    delta: float = 1.1  # the δ steps were judged with
    onset_step: int | None = None  # where the irregularity began (isolated slow steps before it aside)
    warmup_steps: list[int] = field(default_factory=list)  # slow first steps that are not a fault
    slow_from_start: bool = False  # no step is irregular, yet some workers were slow beside their peers

    def mark_slow_from_start(self, onset: int | None, slowdown: float, who: str) -> None:
        """The job ran slow from its first step, or from `onset` on steps too noisy to show it (found
        by comparing ranks, which steps alone cannot show): every surface then tells the same story
        as the localizer. `who`: the device to name in the note."""
        self.status = "irregular"
        self.slow_from_start = True
        self.onset_step = onset
        self.slowdown = slowdown
        self.notes.append(f"slow {self.slow_since()}: {who}")

    def slow_since(self) -> str:
        """When a job slow beside its peers became so: "from the first step", or "since step N"
        when its workers' compute beside their peers' shows a later start."""
        first = int(self.steps["step"].min()) if len(self.steps) else None
        if self.onset_step is None or first is None or self.onset_step <= first:
            return "from the first step"
        return f"since step {self.onset_step}"

    def since(self) -> int | None:
        """The onset step (the first irregular one unless told), or None when the job is healthy."""
        if self.slow_from_start:
            return self.onset_step
        if not self.irregular_steps:
            return None
        return self.onset_step if self.onset_step is not None else self.irregular_steps[0]

    def kinds_summary(self) -> dict[str, int]:
        """How many groups of each kind (dp/tp/pp/ep/cp), for the one-line summary."""
        out: dict[str, int] = {}
        for kind in self.group_kind.values():
            out[kind] = out.get(kind, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`laggard timeline --format json`); keys are stable, add rather than rename."""
        records: list[dict[Any, Any]] = self.steps.to_dict("records")
        rows = [
            {
                "step": int(r["step"]),
                "duration_s": _num(r["duration_s"]),
                "baseline_s": _num(r["baseline_s"]),
                "ratio": _num(r["ratio"]),
                "irregular": bool(r["irregular"]),
                "pattern": str(r["pattern"]),
            }
            for r in records
        ]
        return {
            "job": self.job,
            "status": self.status,
            "since_step": self.since(),
            "onset_step": self.since(),
            "warmup_steps": [int(s) for s in self.warmup_steps],
            "slow_from_start": self.slow_from_start,
            "irregular_steps": [int(s) for s in self.irregular_steps],
            "slowdown": round(float(self.slowdown), 4),
            "delta": self.delta,
            "expected_step_s": _num(self.expected_step_s),
            "world_size": self.meta.world_size,
            "group_kind": dict(sorted(self.group_kind.items())),
            "group_kinds_summary": self.kinds_summary(),
            "steps": rows,
            "notes": list(self.notes),
        }


def _num(x: float | None) -> float | None:
    """Round for JSON; NaN and None become null."""
    if x is None or pd.isna(x):
        return None
    return round(float(x), 6)
