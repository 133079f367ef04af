"""What node agents post: summaries in localize/summary.py's format, and the records the localizer fetched.

One summary format: a post carries the rows `localize.summary.summarize` produced for one node
and a run of steps, as columns, with times in integer microseconds (`summary.to_wire`). A post
also says which ranks the node runs (GPU, IP) and, once, which groups they are in, so the service
can build the job's meta.json from its agents alone.

Every number is bounded before anything is stored or allocated: integers to their column's
type, group ranges by their length (computed, never expanded), lists by count. Anything outside
is refused with a reason, never truncated or clamped.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from collector.trace.schema import OPS

NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$"
GROUP = r"^(\*|[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127})$"  # "*" marks a step row (localize/summary.py)
OP_PATTERN = "^(" + "|".join(OPS) + ")$"
I32 = 2**31 - 1
I64 = 2**63 - 1
MAX_WORLD = 1 << 18  # 262,144 ranks: larger than any job today; a bigger claim is a broken agent
MAX_RANKS_PER_NODE = 64
MAX_GROUPS = 256
MAX_ROWS = 100_000  # summary rows per post (a node's few hundred steps)
MAX_RECORDS = 500_000  # full records per fetch answer (the planned ranks of a node, a few steps)
MAX_STEP_SPAN = 100_000  # steps one post may span
MAX_PENDING = 256  # stuck operators per post (agents send at most 64, the longest waits)

Rank = Annotated[int, Field(ge=0, lt=MAX_WORLD)]
Step = Annotated[int, Field(ge=-1, le=I32)]
Count = Annotated[int, Field(ge=0, le=I32)]
Micros = Annotated[int, Field(ge=0, le=I64 // 1000)]
Nanos = Annotated[int, Field(ge=0, le=I64)]
Int64 = Annotated[int, Field(ge=-I64 - 1, le=I64)]
GroupName = Annotated[str, Field(pattern=GROUP)]


class RankSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu: int = Field(default=0, ge=0, le=1023)
    ip: str = Field(default="", max_length=64, pattern=r"^[0-9A-Fa-f.:]*$")


class SummaryRows(BaseModel):
    """localize/summary.py's SUMMARY_SCHEMA without `host` (the posting node), on the wire."""

    model_config = ConfigDict(extra="forbid")
    rank: list[Annotated[int, Field(ge=-1, lt=MAX_WORLD)]] = Field(max_length=MAX_ROWS)
    step: list[Step] = Field(max_length=MAX_ROWS)
    group: list[GroupName] = Field(max_length=MAX_ROWS)
    abnormal: list[Count] = Field(max_length=MAX_ROWS)
    abnormal_us: list[Micros] = Field(max_length=MAX_ROWS)
    compute_us: list[Micros] = Field(max_length=MAX_ROWS)
    step_end_us: list[Micros] = Field(max_length=MAX_ROWS)
    # (an agent from before steps carried their start posts none: unknown, steps measured end to end)
    step_start_us: list[Micros] = Field(default_factory=list, max_length=MAX_ROWS)

    def __len__(self) -> int:
        return len(self.rank)


class PendingRows(BaseModel):
    """Operators a node's ranks entered and have not completed for a while (the logger's pending/
    files, `collector.commops.layout.PENDING_SCHEMA`): the evidence of a hang."""

    model_config = ConfigDict(extra="forbid")
    rank: list[Rank] = Field(default_factory=list, max_length=MAX_PENDING)
    group: list[Annotated[str, Field(pattern=NAME)]] = Field(default_factory=list, max_length=MAX_PENDING)
    op: list[Annotated[str, Field(pattern=OP_PATTERN)]] = Field(default_factory=list, max_length=MAX_PENDING)
    seq: list[Annotated[int, Field(ge=0, le=I64)]] = Field(default_factory=list, max_length=MAX_PENDING)
    peer: list[Annotated[int, Field(ge=-1, lt=MAX_WORLD)]] = Field(default_factory=list, max_length=MAX_PENDING)
    nbytes: list[Annotated[int, Field(ge=0, le=I64)]] = Field(default_factory=list, max_length=MAX_PENDING)
    start_ns: list[Nanos] = Field(default_factory=list, max_length=MAX_PENDING)
    step: list[Step] = Field(default_factory=list, max_length=MAX_PENDING)
    seen_ns: list[Nanos] = Field(default_factory=list, max_length=MAX_PENDING)
    failed: list[bool] = Field(default_factory=list, max_length=MAX_PENDING)


class SummaryPost(BaseModel):
    """One node's summary of the steps first_step..last_step; (job, node, window) is its key."""

    model_config = ConfigDict(extra="forbid")
    job: str = Field(pattern=NAME)
    node: str = Field(pattern=NAME)
    window: int = Field(ge=0, le=I64, description="the agent's post number; a retry repeats it")
    first_step: int = Field(ge=0, le=I32)
    last_step: int = Field(ge=0, le=I32)
    world_size: int = Field(ge=1, le=MAX_WORLD)
    ranks: dict[Rank, RankSpec] = Field(min_length=1, max_length=MAX_RANKS_PER_NODE)
    groups: dict[GroupName, list[Rank] | str] = Field(
        default_factory=dict, max_length=MAX_GROUPS,
        description="members of the node's groups: a list, or 'start:stop:step' (a Python range)")
    rows: SummaryRows
    dropped: int = Field(default=0, ge=0, le=I64, description="summaries the agent's spool had to drop")
    pending: PendingRows = Field(default_factory=PendingRows,
                                 description="the node's operators stuck now (none: nothing is stuck)")
    ended: bool = Field(default=False, description="every rank of the node has exited: no more steps come from it")

    @model_validator(mode="after")
    def _consistent(self) -> SummaryPost:
        if self.last_step < self.first_step or self.last_step - self.first_step > MAX_STEP_SPAN:
            raise ValueError(f"steps {self.first_step}..{self.last_step} are not a run of at most {MAX_STEP_SPAN}")
        n = len(self.rows.rank)
        lengths = {len(getattr(self.rows, c)) for c in SummaryRows.model_fields
                   if c != "step_start_us" or self.rows.step_start_us}
        if lengths != {n}:
            raise ValueError(f"rows: columns have different lengths {sorted(lengths)}")
        if max(self.ranks) >= self.world_size:
            raise ValueError(f"rank {max(self.ranks)} is >= world_size {self.world_size}")
        stray = sorted({r for r in self.rows.rank if r >= 0} - set(self.ranks))
        if stray:
            raise ValueError(f"rows of rank(s) {stray[:5]} that are not on node {self.node}")
        p = self.pending
        if {len(getattr(p, c)) for c in PendingRows.model_fields} != {len(p.rank)}:
            raise ValueError("pending: columns have different lengths")
        stray = sorted(set(p.rank) - set(self.ranks))
        if stray:
            raise ValueError(f"pending operators of rank(s) {stray[:5]} that are not on node {self.node}")
        if any(seen < start for start, seen in zip(p.start_ns, p.seen_ns, strict=True)):
            raise ValueError("pending: an operator seen before it started (seen_ns < start_ns)")
        if any(s < self.first_step or s > self.last_step for s in (min(self.rows.step, default=self.first_step),
                                                                    max(self.rows.step, default=self.last_step))):
            raise ValueError(f"rows outside steps {self.first_step}..{self.last_step}")
        for g, spec in self.groups.items():
            size, lo, hi = range_extent(g, spec) if isinstance(spec, str) else (len(spec), min(spec, default=0),
                                                                                 max(spec, default=0))
            if size == 0 or size > self.world_size or lo < 0 or hi >= self.world_size:
                raise ValueError(f"group {g}: {size} members in {lo}..{hi}, outside 0..world_size-1 "
                                 f"({self.world_size})")
        return self


def range_extent(group: str, spec: str) -> tuple[int, int, int]:
    """(size, first, last) of a 'start:stop:step' group without building it; each number is first held
    within the largest world (ranks, and so any group's start, stop and step, lie within it), so the
    range's length is a machine integer."""
    try:
        start, stop, step = (int(x) for x in spec.split(":"))
        r = range(start, stop, step)
    except ValueError as exc:
        raise ValueError(f"group {group}: '{spec[:40]}' is neither a list of ranks nor 'start:stop:step'") from exc
    if any(abs(x) > MAX_WORLD for x in (start, stop, step)):
        raise ValueError(f"group {group}: range '{spec[:40]}' has a number outside -{MAX_WORLD}..{MAX_WORLD}")
    if len(r) == 0:
        raise ValueError(f"group {group}: range '{spec}' is empty")
    return len(r), min(r[0], r[-1]), max(r[0], r[-1])


def members(spec: list[int] | str) -> list[int]:
    """A group's members; a range is expanded only after `range_extent` bounded it."""
    if isinstance(spec, str):
        start, stop, step = (int(x) for x in spec.split(":"))
        return sorted(range(start, stop, step))
    return sorted(spec)


class RecordRows(BaseModel):
    """Full CommOps records (the contract's commops columns) of the ranks and steps asked for."""

    model_config = ConfigDict(extra="forbid")
    rank: list[Rank] = Field(max_length=MAX_RECORDS)
    group: list[Annotated[str, Field(pattern=NAME)]] = Field(max_length=MAX_RECORDS)
    op: list[Annotated[str, Field(pattern=OP_PATTERN)]] = Field(max_length=MAX_RECORDS)
    seq: list[Annotated[int, Field(ge=0, le=I64)]] = Field(max_length=MAX_RECORDS)
    peer: list[Annotated[int, Field(ge=-1, lt=MAX_WORLD)]] = Field(max_length=MAX_RECORDS)
    nbytes: list[Annotated[int, Field(ge=0, le=I64)]] = Field(max_length=MAX_RECORDS)
    start_ns: list[Nanos] = Field(max_length=MAX_RECORDS)
    end_ns: list[Nanos] = Field(max_length=MAX_RECORDS)
    step: list[Step] = Field(max_length=MAX_RECORDS)


class RecordsPost(BaseModel):
    """A node's answer to a fetch request."""

    model_config = ConfigDict(extra="forbid")
    job: str = Field(pattern=NAME)
    node: str = Field(pattern=NAME)
    request: int = Field(ge=0, le=I64)
    rows: RecordRows

    @model_validator(mode="after")
    def _consistent(self) -> RecordsPost:
        n = len(self.rows.rank)
        lengths = {len(getattr(self.rows, c)) for c in RecordRows.model_fields}
        if lengths != {n}:
            raise ValueError(f"rows: columns have different lengths {sorted(lengths)}")
        if any(e < s for s, e in zip(self.rows.start_ns, self.rows.end_ns, strict=True)):
            raise ValueError("a record ends before it starts (end_ns < start_ns)")
        return self
