"""Strict validation of a trace directory against the contract; every problem, one line each.

The checks themselves live in collector.trace.contract and are the same ones every reader applies,
so a trace `laggard validate` accepts is one no verb crashes on.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from collector.inputs.errors import TraceError
from collector.inputs.safeio import check_regular
from collector.trace.contract import (
    DUP_KEYS,
    Problem,
    commops_problems,
    flows_problems,
    hang_snapshot,
    log_problems,
    meta_problems,
)
from collector.trace.meta import JobMeta
from collector.trace.schema import EVIDENCE
from collector.trace.traceio import find_evidence, log_paths, read_table

__all__ = ["Problem", "validate_trace"]


def validate_trace(path: Path) -> list[Problem]:
    """Check meta, every evidence file and logs/; return all problems found (empty list = valid)."""
    if not path.is_dir():
        return [Problem(str(path), "not a trace directory", "pass the directory that holds meta.json")]
    try:
        meta = JobMeta.load(path / "meta.json")
    except TraceError as exc:
        return [Problem(str(path / "meta.json"), exc.what.split(": ", 1)[-1], exc.fix)]
    problems = meta_problems(meta, str(path / "meta.json"))
    found = {k: f for k in EVIDENCE if (f := find_evidence(path, k)) is not None}
    logs = log_paths(path)
    if not found and not logs:
        problems.append(Problem(str(path), "no evidence file", "add commops.parquet, flows.parquet or logs/<host>.log"))
    for kind, f in found.items():
        schema = EVIDENCE[kind][1]
        passes = COMMOPS_PASSES if kind == "commops" and _has_columns(f, schema) else (None,)
        for cols in passes:  # (Parquet: a few columns at a time, so a pass holds only those)
            try:
                table = read_table(f, schema, cols, dictionary=True)
            except TraceError as exc:
                problems.append(Problem(str(f), exc.what.split(": ", 1)[-1], exc.fix))
                break
            found_now = (commops_problems(table, meta, str(f), full=True, pending=hang_snapshot(path))
                         if kind == "commops" else flows_problems(table, str(f)))
            del table
            problems += [p for p in found_now if p not in problems]
    problems += log_problems(logs)
    return problems


#: CommOps columns checked together: the duplicate check's keys, the step-span check's, the rest
COMMOPS_PASSES: tuple[tuple[str, ...] | None, ...] = (
    DUP_KEYS, ("rank", "step"), ("start_ns", "end_ns", "nbytes"))


def _has_columns(path: Path, schema: pa.Schema) -> bool:
    """Whether a Parquet evidence file (or shard directory) has every contract column: checked
    column by column then. Other formats, and files short of a column, are read whole, so a
    missing column is named in the reader's own words."""
    if not (path.is_dir() or path.suffix == ".parquet"):
        return False
    try:
        for f in sorted(path.glob("*.parquet")) if path.is_dir() else [path]:
            check_regular(f)  # (a FIFO would block the schema read: the reader says what it is)
        names = set(ds.dataset(path, format="parquet").schema.names)
    except (TraceError, pa.ArrowInvalid, OSError):
        return False
    return set(schema.names) <= names
