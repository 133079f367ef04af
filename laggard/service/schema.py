"""What a sidecar posts: one summary per node per window (about 10 s) of abnormal operators.

Only abnormal operators travel (docs/design.md "Scale"); a node with nothing abnormal still posts
its per-step times, which is how the service knows the node is alive and how fast steps run.
Limits keep one post bounded; anything larger is refused with a reason, never truncated.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from collector.schema import OPS

NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$"
OP_PATTERN = "^(" + "|".join(OPS) + ")$"  # checked in pydantic's core: no Python call per operator
MAX_RANKS_PER_NODE = 64
MAX_OPS = 20_000
MAX_STEPS = 1_000
MAX_GROUPS = 256


class AbnormalOp(BaseModel):
    """One operator copy the node's detector flagged (it ran long, usually because it waited)."""

    model_config = ConfigDict(extra="forbid")
    rank: int = Field(ge=0)
    group: str = Field(pattern=NAME)
    op: str = Field(pattern=OP_PATTERN)
    seq: int = Field(ge=0)
    elapsed: float = Field(ge=0, le=86_400, description="seconds on the rank's own clock")
    step: int = Field(ge=-1)
    score: float = Field(ge=0, le=1, description="detector's abnormal probability")
    peer: int = Field(default=-1, ge=-1)


class StepTime(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int = Field(ge=0)
    duration_s: float = Field(gt=0, le=86_400)


class Summary(BaseModel):
    """A per-node, per-window summary of abnormal operators."""

    model_config = ConfigDict(extra="forbid")
    job: str = Field(pattern=NAME)
    node: str = Field(pattern=NAME)
    window: int = Field(ge=0, description="the sidecar's window number; (job, node, window) is unique")
    window_start_ns: int = Field(ge=0)
    window_end_ns: int = Field(ge=0)
    world_size: int = Field(ge=1, le=1_000_000)
    ranks: list[int] = Field(min_length=1, max_length=MAX_RANKS_PER_NODE)
    gpus: dict[int, int] = Field(default_factory=dict, description="rank -> local GPU index")
    groups: dict[str, list[int] | str] = Field(
        default_factory=dict, max_length=MAX_GROUPS,
        description="members of the groups the node's ranks are in: a list, or 'start:stop:step' "
                    "(a Python range; Megatron groups are arithmetic, so a DP group of 512 is one string)")
    steps: list[StepTime] = Field(default_factory=list, max_length=MAX_STEPS)
    ops: list[AbnormalOp] = Field(default_factory=list, max_length=MAX_OPS)

    def members(self) -> dict[str, list[int]]:
        """Group membership with ranges expanded (the validator already expanded them)."""
        return {g: m for g, m in self.groups.items() if isinstance(m, list)}

    @model_validator(mode="after")
    def _consistent(self) -> Summary:
        if self.window_end_ns < self.window_start_ns:
            raise ValueError("window_end_ns is before window_start_ns")
        ranks = set(self.ranks)
        if any(r >= self.world_size for r in ranks):
            raise ValueError(f"a rank is >= world_size {self.world_size}")
        stray = sorted({o.rank for o in self.ops} - ranks)
        if stray:
            raise ValueError(f"ops of rank(s) {stray[:5]} that are not on node {self.node} (ranks {sorted(ranks)[:8]})")
        for g, spec in list(self.groups.items()):
            members = spec if isinstance(spec, list) else _range(g, spec)
            self.groups[g] = members
            if members and (len(members) > self.world_size or min(members) < 0 or max(members) >= self.world_size):
                raise ValueError(f"group {g} has members outside 0..world_size-1")
        return self


def _range(group: str, spec: str) -> list[int]:
    try:
        start, stop, step = (int(x) for x in spec.split(":"))
        members = list(range(start, stop, step))
    except ValueError as exc:
        raise ValueError(f"group {group}: '{spec}' is neither a list of ranks nor 'start:stop:step'") from exc
    if not members:
        raise ValueError(f"group {group}: range '{spec}' is empty")
    return members
