"""The one story every surface tells about a verdict: status, onset step, slowdown, top candidate.

`laggard localize`, `laggard explain` and `laggard report` all word their first line from here, so
they cannot disagree: the figures come from the verdict alone (the onset is the verdict's own
`onset_step`, never recomputed here), and a job slow from its first step is worded as such
rather than as "irregular since step N" or "0 irregular steps".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localize.verdict import Candidate, Verdict

#: how each evidence source is named when it cannot tell tied devices apart
_SOURCE_NAME = {"commops": "CommOps", "flows": "the flows", "logs": "the logs"}


def tie_words(c: Candidate) -> str:
    """'(tie of 4: CommOps cannot tell these apart)' for a tied candidate, '' otherwise: a tie is
    part of the answer (any of these devices may be the cause), never hidden behind its first name."""
    if not c.tie or c.tie < 2:
        return ""
    return f"(tie of {c.tie}: {sources_in_words(c.source, 'the evidence')} cannot tell these apart)"


def sources_in_words(source: str | None, unknown: str) -> str:
    """'CommOps and the flows' for the source 'commops+flows'; `unknown` when no source is recorded."""
    return " and ".join(_SOURCE_NAME.get(s, s) for s in source.split("+")) if source else unknown


@dataclass(frozen=True)
class Story:
    job: str
    status: str  # irregular | healthy | hang
    onset_step: int | None  # the verdict's onset (first irregular step, or first step of a job slow from the start)
    slowdown: float
    irregular_steps: int
    from_start: bool  # slow from the first step: no normal iteration to compare with
    top: str | None  # the first candidate's device, as Candidate.device() names it
    top_kind: str | None
    top_score: float | None
    top_tie: int | None  # devices tied with the first candidate at its score, itself included
    tie_text: str  # tie_words() of the first candidate ('' when it is not tied)

    @classmethod
    def of(cls, v: Verdict) -> Story:
        onset = v.onset_step
        top = v.candidates[0] if v.candidates else None
        from_start = v.status == "irregular" and not v.irregular_steps
        return cls(v.job, v.status, int(onset) if onset is not None else None, float(v.slowdown),
                   len(v.irregular_steps), from_start, top.device() if top else None, top.kind if top else None,
                   float(top.score) if top else None, top.tie if top and top.tie and top.tie > 1 else None,
                   tie_words(top) if top else "")

    def when(self) -> str:
        """'since step 8', 'from the first step (step 0)', or '' when the verdict has no onset."""
        if self.from_start:
            return "from the first step" + (f" (step {self.onset_step})" if self.onset_step is not None else "")
        return f"since step {self.onset_step}" if self.onset_step is not None else ""

    def status_line(self) -> str:
        """Status, onset and slowdown in words (the headline without the candidate)."""
        if self.status == "healthy":
            return f"{self.job}: healthy — no irregular iteration, nothing to blame"
        if self.status == "hang":
            return f"{self.job}: STUCK — a collective never completed"
        if self.from_start:
            return f"{self.job}: SLOW {self.when()} (~{self.slowdown:.2f}x), no normal iteration to compare with"
        since = f" {self.when()}" if self.when() else ""
        return f"{self.job}: IRREGULAR{since} ({self.irregular_steps} slow step{'' if self.irregular_steps == 1 else 's'}, {self.slowdown:.2f}x their normal time)"

    def headline(self) -> str:
        """The first line of every surface: the answer before the details."""
        if self.status == "healthy":
            return self.status_line()
        tie = f" {self.tie_text}" if self.tie_text else ""
        cause = f"; top candidate {self.top} (score {self.top_score:.2f}){tie}" if self.top else "; no device stands out"
        return self.status_line() + cause

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "onset_step": self.onset_step, "slowdown": round(self.slowdown, 4),
                "slow_from_start": self.from_start, "irregular_steps": self.irregular_steps, "top_kind": self.top_kind,
                "top_candidate": self.top, "top_tie": self.top_tie, "headline": self.headline()}
