"""Strict validation of a trace directory against the contract; every problem, one line each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from collector.errors import TraceError
from collector.meta import JobMeta
from collector.schema import EVIDENCE, FLOW_PROTOS, OPS
from collector.traceio import find_evidence, log_paths, read_table


@dataclass(frozen=True)
class Problem:
    where: str
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.where}: {self.what} — {self.fix}"


def validate_trace(path: Path) -> list[Problem]:
    """Check meta and every evidence file; return all problems found (empty list = valid)."""
    problems: list[Problem] = []
    if not path.is_dir():
        return [Problem(str(path), "not a trace directory", "pass the directory that holds meta.json")]
    try:
        meta = JobMeta.load(path / "meta.json")
    except TraceError as exc:
        return [Problem(str(path / "meta.json"), exc.what.split(": ", 1)[-1], exc.fix)]
    problems += _check_meta(meta, path / "meta.json")
    found = {k: f for k in EVIDENCE if (f := find_evidence(path, k)) is not None}
    has_logs = bool(log_paths(path))
    if not found and not has_logs:
        problems.append(Problem(str(path), "no evidence file", "add commops.parquet, flows.parquet or logs/<host>.log"))
    if "commops" in found:
        problems += _check_commops(found["commops"], meta)
    if "flows" in found:
        problems += _check_flows(found["flows"])
    return problems


def _check_meta(meta: JobMeta, where: Path) -> list[Problem]:
    out: list[Problem] = []
    w = str(where)
    if meta.world_size <= 0:
        out.append(Problem(w, f"world_size is {meta.world_size}", "set it to the number of ranks"))
    if meta.ranks and set(meta.ranks) != set(range(meta.world_size)):
        out.append(Problem(w, f"ranks cover {len(meta.ranks)} of world_size {meta.world_size}", "list ranks 0..world_size-1"))
    for g, members in meta.groups.items():
        bad = [m for m in members if m not in meta.ranks]
        if bad:
            out.append(Problem(w, f"group '{g}' names unknown rank(s) {bad[:5]}", "groups may only hold ranks listed in 'ranks'"))
    return out


def _check_commops(path: Path, meta: JobMeta) -> list[Problem]:
    where = str(path)
    try:
        t = read_table(path, EVIDENCE["commops"][1])
    except TraceError as exc:
        return [Problem(where, exc.what.split(": ", 1)[-1], exc.fix)]
    out: list[Problem] = []
    if t.num_rows == 0:
        return [Problem(where, "empty: no operator rows", "record at least one step, or drop the file")]
    rank = t.column("rank").to_numpy()
    unknown = np.setdiff1d(np.unique(rank), np.fromiter(meta.ranks.keys(), dtype=np.int64, count=len(meta.ranks)))
    if unknown.size:
        out.append(Problem(where, f"rank(s) {unknown[:5].tolist()} not in meta.json ranks", "add them to meta.json or drop their rows"))
    start = t.column("start_ns").to_numpy()
    end = t.column("end_ns").to_numpy()
    n_bad = int((end < start).sum())
    if n_bad:
        first = int(np.flatnonzero(end < start)[0])
        out.append(Problem(where, f"{n_bad} row(s) with end_ns < start_ns (first at row {first})", "fix the clock source or drop those rows"))
    ops = pc.unique(t.column("op")).to_pylist()
    bad_ops = sorted(set(ops) - set(OPS))
    if bad_ops:
        out.append(Problem(where, f"unknown op(s) {bad_ops[:5]}", f"op must be one of {', '.join(OPS)}"))
    keys = t.select(["rank", "group", "op", "seq", "peer"]).to_pandas()
    dup = int(keys.duplicated().sum())
    if dup:
        out.append(Problem(where, f"{dup} duplicate row(s) (same rank, group, op, seq, peer)", "deduplicate; each rank logs an operator once"))
    if (t.column("nbytes").to_numpy() < 0).any():
        out.append(Problem(where, "negative nbytes", "payload sizes are >= 0"))
    return out


def _check_flows(path: Path) -> list[Problem]:
    where = str(path)
    try:
        t = read_table(path, EVIDENCE["flows"][1])
    except TraceError as exc:
        return [Problem(where, exc.what.split(": ", 1)[-1], exc.fix)]
    out: list[Problem] = []
    if t.num_rows == 0:
        return [Problem(where, "empty: no flow rows", "capture some traffic, or drop the file")]
    if (t.column("end_ns").to_numpy() < t.column("start_ns").to_numpy()).any():
        out.append(Problem(where, "row(s) with end_ns < start_ns", "fix the capture timestamps"))
    protos = set(pc.unique(t.column("proto")).to_pylist()) - set(FLOW_PROTOS)
    if protos:
        out.append(Problem(where, f"unknown proto(s) {sorted(protos)}", f"proto must be one of {', '.join(FLOW_PROTOS)}"))
    return out
