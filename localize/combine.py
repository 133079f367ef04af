"""Localize from every kind of evidence a trace has, and merge what each localizer found.

Localizers are found by module name through `LOCALIZERS`, so the flow, log and hang
localizers (their own modules, written on their own branches) plug in without this file
changing: a module that is not installed is simply skipped, unless the user asked for it.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from collections.abc import Callable
from types import ModuleType
from typing import Any

from collector.inputs.errors import UserError
from collector.inputs.limits import ENV, limits
from collector.trace.meta import coverage_note
from collector.trace.traceio import Trace
from localize.verdict import Candidate, Verdict

#: evidence kind -> (module, function) of its localizer
LOCALIZERS: dict[str, tuple[str, str]] = {
    "commops": ("localize.commops", "localize_commops"),
    "flows": ("localize.flows", "localize_flows"),
    "logs": ("localize.logs.analysis", "localize_logs"),
}
HANG = ("localize.waits.hang", "find_hang")
#: how much a source's score counts when several sources name the same device
SOURCE_WEIGHT = {"commops": 1.0, "flows": 0.85, "logs": 0.7}
#: a tied device's share of its tie's score once another source named a different one of them
DECIDED_AWAY = 0.5
#: how many candidates CommOps lists when other evidence may break its ties
TIE_LIST = 2048


def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            return None
        raise


def _function(spec: tuple[str, str]) -> Callable[..., Any] | None:
    mod = _module(spec[0])
    fn = getattr(mod, spec[1], None) if mod is not None else None
    return fn if callable(fn) else None


def available(trace: Trace) -> tuple[str, ...]:
    """Evidence kinds the trace holds and a localizer exists for."""
    return tuple(k for k in LOCALIZERS if trace.has(k) and _function(LOCALIZERS[k]) is not None)


def run_one(kind: str, trace: Trace, steps: tuple[int, int] | None, top: int) -> Verdict:
    fn = _function(LOCALIZERS[kind])
    if fn is None:
        raise UserError(f"no {kind} localizer is installed", "use another evidence flag, or none to use what exists")
    if kind == "commops":
        cap = limits().full_rows
        if steps is None and (rows := trace.parquet_rows("commops") or 0) > cap:
            return _from_summaries(trace, rows, cap, top)
        from localize.ops.steps import step_view

        view = step_view(trace, steps)
        return fn(trace, view, steps, top)  # type: ignore[no-any-return]
    if kind == "flows":
        return fn(trace, steps, top)  # type: ignore[no-any-return]
    return fn(trace, top)  # type: ignore[no-any-return]


def _from_summaries(trace: Trace, rows: int, cap: int, top: int) -> Verdict:
    """The summary-first localizer (the sidecars' method, `localize.summary`) in this process, for a
    trace with more CommOps rows than the full records path holds: its memory follows one host's
    rows and the steps it fetches, not the whole trace."""
    from localize.distributed import Serial, Source, localize_distributed

    verdict, _ = localize_distributed(Source.open(trace.path), Serial(), top, check_hang=False)
    verdict.extra["summary_first"] = (
        f"{rows:,} CommOps rows, more than the full records path holds in one process "
        f"({cap:,}, {ENV['full_rows']}): localized from per-host summaries as the sidecars do")
    return verdict


def localize_trace(trace: Trace, evidence: tuple[str, ...] | None = None, steps: tuple[int, int] | None = None,
                   top: int = 5) -> Verdict:
    """The verdict of docs/verdict.md from the requested (or all available) evidence."""
    hang = _function(HANG)
    if hang is not None:
        stuck = hang(trace)
        if stuck is not None:
            return stuck  # type: ignore[no-any-return]
    if evidence:
        for kind in evidence:
            if kind not in LOCALIZERS:
                raise UserError(f"unknown evidence '{kind}'", f"use one of {', '.join(LOCALIZERS)}")
            if not trace.has(kind):
                raise UserError(f"{trace.path}: trace has no {kind} evidence", "drop the flag to use the evidence it has")
        kinds = evidence
    else:
        kinds = available(trace)
        if not kinds:
            raise UserError(f"{trace.path}: no evidence this installation can localize from",
                            "add commops.parquet (see docs/traces.md)")
    # each source lists more than asked, so a device named by several is merged, then cut;
    # CommOps lists every device it could not tell apart, so another source can pick among them
    wide = top if len(kinds) == 1 else max(4 * top, 20)
    verdicts: list[Verdict] = []
    unjudged: list[str] = []
    for k in kinds:
        try:
            v = run_one(k, trace, steps, max(wide, TIE_LIST) if k == "commops" and len(kinds) > 1 else wide)
        except UserError as exc:  # evidence that cannot be judged (a capture too short, no job in it)
            if len(kinds) == 1 or not getattr(exc, "unjudged", False) or (k == kinds[-1] and not verdicts):
                raise
            unjudged.append(f"{k}: {exc.what}")
            continue
        v.extra.setdefault("source", k)
        verdicts.append(v)
    verdict = merge(trace.meta.job, verdicts, top)
    if unjudged:
        verdict.extra["unjudged"] = unjudged
    if note := coverage_note(trace.meta):  # a partial rank set is said, never passed off as the whole job
        verdict.extra["coverage"] = {"ranks_present": trace.meta.extra["ranks_present"],
                                     "ranks_missing": trace.meta.extra["ranks_missing"], "note": note}
    return verdict


def _device_key(c: Candidate) -> tuple[Any, ...]:
    return (c.kind, c.rank, c.host if c.kind != "gpu" else None, tuple(sorted(c.hosts or ())), c.switch)


def merge(job: str, verdicts: list[Verdict], top: int = 5) -> Verdict:
    """One verdict: the worst status, the commops steps when present, devices merged across
    sources (a device named by several sources gains: 1 - prod(1 - weight * score))."""
    if len(verdicts) == 1:
        v = verdicts[0]
        v.candidates = v.candidates[:top]
        return v
    order = {"hang": 2, "irregular": 1, "healthy": 0}
    status = max((v.status for v in verdicts), key=lambda s: order[s])
    steps: list[int] = []
    for v in verdicts:
        if v.irregular_steps:
            steps = v.irregular_steps
            if v.extra.get("source") == "commops":
                break
    merged: dict[tuple[Any, ...], Candidate] = {}
    miss: dict[tuple[Any, ...], float] = {}
    support: dict[tuple[Any, ...], float] = {}
    tie_score: dict[tuple[Any, ...], tuple[float, float]] = {}  # device -> (its tie's score, its weight)
    for v in verdicts:
        for c in v.candidates:
            key = _device_key(c)
            w = SOURCE_WEIGHT.get(c.source or "", 0.7)
            miss[key] = miss.get(key, 1.0) * (1 - w * c.score)
            support[key] = support.get(key, 0.0) + w * c.score
            if c.tie and key not in tie_score:
                tie_score[key] = (round(c.score, 6), w * c.score)
            if key in merged:
                m = merged[key]
                m.evidence = m.evidence + c.evidence
                m.source = "+".join(sorted(set((m.source or "").split("+")) | {c.source or ""}))
            else:
                merged[key] = Candidate(**{**c.__dict__, "evidence": list(c.evidence)})
    for key, c in merged.items():
        c.score = 1 - miss[key]
    _mark_ties(merged, support, tie_score)
    # at equal scores (one source already certain), the device more sources name comes first:
    # a tie CommOps could not break is broken by the flows that name one of its devices
    ranked = sorted(merged, key=lambda k: (-merged[k].score, -support[k]))
    cands = [merged[k] for k in ranked][:top] if status != "healthy" else []
    extra: dict[str, Any] = {"sources": [v.extra.get("source", "?") for v in verdicts]}
    onsets = [v.onset_step for v in verdicts if v.onset_step is not None and v.status == status]
    commops = [v.onset_step for v in verdicts if v.extra.get("source") == "commops" and v.onset_step is not None]
    found = commops or onsets
    onset = found[0] if found and status != "healthy" else None
    return Verdict(job, status, steps, max(v.slowdown for v in verdicts), cands, extra, onset_step=onset)  # type: ignore[arg-type]


def _mark_ties(merged: dict[tuple[Any, ...], Candidate], support: dict[tuple[Any, ...], float],
               tie_score: dict[tuple[Any, ...], tuple[float, float]]) -> None:
    """A source's tie stays a tie only while the merged evidence still cannot tell its devices
    apart. Another source that names some of them lifts those out: the devices it left behind
    score DECIDED_AWAY of their tie's score, and the lifted ones rank by how strongly the other
    source named them (a device CommOps was sure of may score 1 before flows confirm it, so
    without this every lifted device would stay at 1, the flows' order unseen in the scores)."""
    ties: dict[float, list[tuple[Any, ...]]] = defaultdict(list)
    for k, (score, _) in tie_score.items():
        ties[score].append(k)
    for members in ties.values():
        other = {k: support[k] - tie_score[k][1] for k in members if "+" in (merged[k].source or "")}
        if not other:
            continue
        best = max(other.values())
        for k in members:
            c = merged[k]
            if k not in other:
                c.score *= DECIDED_AWAY
                c.evidence.append("another source names a device CommOps could not tell from this one")
            elif other[k] < best - 1e-6:
                c.score *= DECIDED_AWAY + (1 - DECIDED_AWAY) * other[k] / best
                c.evidence.append("another source names a device CommOps could not tell from this one more strongly")
    tied = [k for k, c in merged.items() if c.tie]
    for k in tied:
        c = merged[k]
        n = sum(1 for o in tied if abs(merged[o].score - c.score) <= 1e-6 and abs(support[o] - support[k]) <= 1e-6)
        c.tie = n if n > 1 else None
