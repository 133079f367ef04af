"""Assemble a `Report` from a trace, its timeline, the verdict and the diagnosis.

This is the only report module that reads the trace; everything it computes lands in the
`Report`, which the renderers turn into HTML, Markdown or JSON.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta
from collector.trace.traceio import Trace
from explain.report.evidence import flow_evidence, log_evidence, step_start_utc, suspect_hosts
from explain.report.model import Report, confidence_label, irregular_windows, tie_words
from explain.report.waits import (
    annotate_waits,
    gantt_rows,
    joined_edges,
    joined_wait_matrix,
    wait_edges,
    wait_matrix,
    wait_path,
)
from explain.story import Story
from localize.verdict import Verdict

GANTT_RANKS = 12
#: CommOps rows the wait figures read at a time (whole steps): the report's memory follows this, not the trace
WAIT_CHUNK_ROWS = 1 << 18
WAIT_COLUMNS = ["rank", "group", "op", "seq", "peer", "start_ns", "end_ns", "step"]


def build_report(trace: Trace, timeline: Any | None, verdict: Verdict, diagnosis: Any | None = None) -> Report:
    """Everything the page shows; `timeline` is a timeline.model.Timeline (or None without CommOps)."""
    report = report_from_verdict(verdict, trace.meta, diagnosis)
    if timeline is not None:
        _add_timeline(report, timeline)
    if trace.has("commops"):
        _add_waits(report, trace, timeline)
    suspects = suspect_hosts(report.candidates, trace.meta)
    if trace.has("flows"):
        report.flows = flow_evidence(trace.flows(), trace.meta, suspects)
    if trace.has("logs"):
        report.logs = log_evidence(trace, suspects)
    return report


def report_from_verdict(verdict: Verdict, meta: JobMeta | None, diagnosis: Any | None = None,
                        world_size: int | None = None) -> Report:
    """The parts of a report a verdict alone gives (the service has no trace, only summaries)."""
    cands = []
    for c in verdict.candidates:
        d = c.to_dict()
        d["device"] = c.device()
        cands.append(d)
    diag = _diagnosis_dict(diagnosis)
    story = Story.of(verdict)
    evidence = [e for c in verdict.candidates[:1] for e in c.evidence]
    evidence += [f"{c.device()}: {e}" for c in verdict.candidates[1:3] for e in c.evidence[:2]]
    report = Report(
        job=verdict.job,
        status=story.status,
        world_size=world_size or (meta.world_size if meta else 0),
        slowdown=story.slowdown,
        irregular_steps=[int(s) for s in verdict.irregular_steps],
        since_step=story.onset_step,
        from_start=story.from_start,
        story=story.headline(),
        tie=story.tie_text,
        candidates=cands,
        confidence=confidence_label(cands),
        evidence=evidence + _diag_evidence(diag),
        checks=[_probe_line(p) for p in diag.get("probes", [])],
        actions=[_action_line(a) for a in diag.get("remediation", [])],
        explanation=_explanation(diag),
        diagnosis=diag,
        notes=[str(n) for n in verdict.extra.get("notes", [])],
    )
    return report


def _add_timeline(report: Report, timeline: Any) -> None:
    steps: pd.DataFrame = timeline.steps
    if "step" in steps.columns:  # the figures mark the verdict's irregular steps, the ones every surface names
        steps = steps.assign(irregular=steps["step"].isin(report.irregular_steps))
    report.steps = steps
    report.windows = irregular_windows(steps)
    report.expected_step_s = getattr(timeline, "expected_step_s", None)
    report.notes += [str(n) for n in getattr(timeline, "notes", [])]
    # status, onset, slowdown and irregular steps are the verdict's (one story on every surface); the
    # timeline adds the per-step figures, and the time lost over the verdict's irregular steps
    if {"duration_s", "baseline_s"} <= set(steps.columns) and report.irregular_steps:
        irr = steps[steps["step"].isin(report.irregular_steps)]
        report.lost_s = float(np.clip(irr["duration_s"] - irr["baseline_s"], 0, None).sum())


def _add_waits(report: Report, trace: Trace, timeline: Any | None) -> None:
    """Who waited on whom, read a chunk of whole steps at a time (`WAIT_CHUNK_ROWS`): each chunk's
    waits, blame and per-step time are summed, then the two steps the Gantt charts show are read."""
    group_kind = dict(getattr(timeline, "group_kind", {}) or {})
    window = report.irregular_steps or None
    matrices, edges, blame, elapsed = [], [], [], []
    ranks: set[int] = set()
    for steps in step_chunks(trace, WAIT_CHUNK_ROWS):
        ops = annotate_waits(trace.commops(columns=WAIT_COLUMNS, steps=steps))
        if ops.empty:
            continue
        matrices.append(wait_matrix(ops))
        edges.append(wait_edges(ops, group_kind, window))
        in_window = ops[ops["step"].isin(report.irregular_steps)] if report.irregular_steps else ops
        blame.append(in_window[in_window["rank"] != in_window["blocker"]].groupby("blocker")["wait_s"].sum())
        elapsed.append(ops[ops["step"] >= 0].groupby("step")["elapsed_s"].sum())
        ranks.update(ops["rank"].unique().tolist())
        if report.since_step is not None and steps[0] <= report.since_step <= steps[1]:
            report.since_utc = step_start_utc(ops, report.since_step)
        del ops
    if not matrices:
        return
    report.waits = joined_wait_matrix(matrices)
    roots = _root_ranks(report, trace.meta, pd.concat(blame).groupby(level=0).sum())
    report.path = wait_path(joined_edges(edges), roots)
    slow, normal = _gantt_steps(report, pd.concat(elapsed).groupby(level=0).sum())
    if slow is None or normal is None:
        return
    # up to 4 ranks per level, spread over the level (a link's root ranks sit on two hosts)
    shown = [r for hop in report.path for r in hop.ranks[:: max(1, len(hop.ranks) // 4)][:4]][:GANTT_RANKS]
    shown = shown or sorted(ranks)[:8]
    report.gantt_steps = (slow, normal)
    report.gantt_slow = gantt_rows(annotate_waits(trace.commops(columns=WAIT_COLUMNS, steps=(slow, slow))), slow, shown)
    report.gantt_normal = gantt_rows(annotate_waits(trace.commops(columns=WAIT_COLUMNS, steps=(normal, normal))), normal,
                                     shown)


def step_chunks(trace: Trace, rows: int) -> list[tuple[int, int]]:
    """Inclusive step ranges covering every CommOps row, each of about `rows` rows or one step."""
    step = trace.commops(columns=["step"])["step"].to_numpy(np.int64)
    if not len(step):
        return []
    values, counts = np.unique(step, return_counts=True)
    bucket = (np.cumsum(counts) - counts) // max(rows, 1)  # (steps that start within the same `rows` rows)
    cut = np.flatnonzero(np.diff(bucket)) + 1
    return [(int(v[0]), int(v[-1])) for v in np.split(values, cut)]


def _root_ranks(report: Report, meta: JobMeta, blame: pd.Series) -> list[int]:
    """Ranks of the top candidate; without one, the rank everybody waited on most (`blame`:
    seconds waited on each blocker in the irregular steps, or all)."""
    root = report.root
    if root:
        if root.get("rank") is not None:
            return [int(root["rank"])]
        hosts = set(suspect_hosts([root], meta))
        ranks = [r for r, info in meta.ranks.items() if info.host in hosts]
        if ranks:
            return sorted(ranks)
    return [_argmax(blame)] if len(blame) and report.status != "healthy" else []


def _gantt_steps(report: Report, elapsed: pd.Series) -> tuple[int | None, int | None]:
    """The slowest irregular step and the normal step closest to it (`elapsed`: operator seconds
    per step, read when the report has no step table)."""
    steps = report.steps
    if steps is None or steps.empty:
        if elapsed.empty:
            return None, None
        return _argmax(elapsed), _argmax(-elapsed)
    s = steps.set_index("step")
    marked = s.index.isin(report.irregular_steps)
    irr = s[marked]
    normal = s[~marked]
    if normal.empty or irr.empty:
        return None, None  # no slow step beside a normal one (healthy, or slow from the start): no pair to show
    slow = _argmax(irr["duration_s"]) if not irr.empty else _argmax(s["duration_s"])
    idx = normal.index.to_numpy()
    return slow, int(idx[np.argmin(np.abs(idx - slow))])


def _argmax(values: pd.Series) -> int:
    return int(values.index.to_numpy()[int(np.argmax(values.to_numpy()))])


def _diagnosis_dict(diagnosis: Any | None) -> dict[str, Any]:
    if diagnosis is None:
        return {}
    if isinstance(diagnosis, dict):
        return diagnosis
    to_dict = getattr(diagnosis, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else {}


def _probe_line(p: dict[str, Any]) -> str:
    """A read-only probe the diagnosis chose: what, where, the command, and what it found."""
    where = f" on {p['host']}" if p.get("host") else ""
    cmd = " ".join(p.get("argv") or [])
    found = "; ".join(str(f) for f in p.get("findings") or []) or p.get("summary") or ""
    return f"{p.get('probe', 'probe')}{where}: `{cmd}`" + (f" — {found}" if found else "")


def _action_line(a: dict[str, Any]) -> str:
    """A remediation proposal; anything not yet applied waits for a person's approval."""
    target = ", ".join(f"{k} {v}" for k, v in (a.get("target") or {}).items())
    cmds = "; ".join(" ".join(argv) for argv in a.get("argvs") or [])
    status = a.get("status", "proposed")
    gate = " [needs approval: rerun with --approve]" if status == "proposed" else f" [{status}]"
    return (f"{a.get('action', 'action')}" + (f" ({target})" if target else "") + f": {a.get('why', '')}"
            + (f" — `{cmds}`" if cmds else "") + gate)


def _explanation(diag: dict[str, Any]) -> str:
    cause = diag.get("cause")
    if not cause:
        return ""
    conf = diag.get("confidence")
    head = f"Most likely cause: {cause.get('title')} ({cause.get('category')})" + tie_words(diag)
    if isinstance(conf, int | float):
        head += f", confidence {conf:.2f}, " + str(diag.get("confirmation") or ("confirmed by a probe" if diag.get("confirmed") else "not confirmed by a probe"))
    claims = [c["text"] for c in diag.get("claims", []) if isinstance(c, dict) and c.get("text")]
    return "\n".join([head + ".", str(cause.get("text", "")), *claims]).strip()


def _diag_evidence(diag: dict[str, Any]) -> list[str]:
    """Evidence the diagnosis added beyond the verdict (log lines, alerts)."""
    return [f"{e.get('source')}: {e.get('text')}" for e in diag.get("evidence", [])
            if isinstance(e, dict) and e.get("source") not in ("verdict", "candidate", "probe") and e.get("text")]
