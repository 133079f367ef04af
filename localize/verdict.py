"""The verdict contract (DESIGN.md): what `laggard localize --format json` prints.

Keep it stable: add fields, never rename them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["irregular", "healthy", "hang"]


@dataclass
class Candidate:
    """One suspected root-cause device, ranked by score (0..1)."""

    kind: str  # gpu, host, nic, link, switch, config, data
    score: float
    evidence: list[str] = field(default_factory=list)
    rank: int | None = None
    host: str | None = None
    gpu: int | None = None
    hosts: list[str] | None = None
    switch: str | None = None
    source: str | None = None  # which evidence produced it: commops, flows, logs
    stage: int | None = None  # pipeline stage, for kind config (stage imbalance)
    tie: int | None = None  # devices the evidence cannot tell apart, this one included (same score)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v is not None}
        d["score"] = round(float(self.score), 4)
        return d

    def device(self) -> str:
        """A short, human name of the device: 'gpu rank 12 (node-3 gpu 4)'."""
        if self.kind == "gpu" and self.rank is not None:
            return f"gpu rank {self.rank} ({self.host} gpu {self.gpu})"
        if self.kind == "link" and self.hosts:
            return f"link {'<->'.join(self.hosts)}"
        if self.kind == "switch":
            return f"switch {self.switch}"
        if self.host:
            return f"{self.kind} {self.host}"
        return self.kind


@dataclass
class Verdict:
    job: str
    status: Status
    irregular_steps: list[int] = field(default_factory=list)
    slowdown: float = 1.0
    candidates: list[Candidate] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    onset_step: int | None = None  # first irregular step, or the first step of a job slow from the start

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "status": self.status,
            "irregular_steps": [int(s) for s in self.irregular_steps],
            "slowdown": round(float(self.slowdown), 4),
            "candidates": [c.to_dict() for c in self.candidates],
            "onset_step": None if self.onset_step is None else int(self.onset_step),
        }
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Verdict:
        known = {"job", "status", "irregular_steps", "slowdown", "candidates", "onset_step"}
        cand_fields = set(Candidate.__dataclass_fields__)
        return cls(
            job=raw["job"],
            status=raw["status"],
            irregular_steps=list(raw.get("irregular_steps", [])),
            slowdown=float(raw.get("slowdown", 1.0)),
            candidates=[Candidate(**{k: v for k, v in c.items() if k in cand_fields}) for c in raw.get("candidates", [])],
            extra={k: v for k, v in raw.items() if k not in known},
            onset_step=None if raw.get("onset_step") is None else int(raw["onset_step"]),
        )
