"""Strict validation of a trace directory against the contract; every problem, one line each.

The checks themselves live in collector.contract and are the same ones every reader applies,
so a trace `laggard validate` accepts is one no verb crashes on.
"""

from __future__ import annotations

from pathlib import Path

from collector.contract import (
    Problem,
    commops_problems,
    flows_problems,
    hang_snapshot,
    log_problems,
    meta_problems,
)
from collector.errors import TraceError
from collector.meta import JobMeta
from collector.schema import EVIDENCE
from collector.traceio import find_evidence, log_paths, read_table

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
        try:
            table = read_table(f, EVIDENCE[kind][1])
        except TraceError as exc:
            problems.append(Problem(str(f), exc.what.split(": ", 1)[-1], exc.fix))
            continue
        if kind == "commops":
            problems += commops_problems(table, meta, str(f), full=True, pending=hang_snapshot(path))
        else:
            problems += flows_problems(table, str(f))
    problems += log_problems(logs)
    return problems
