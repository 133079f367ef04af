"""One localization round of one job, from what its node agents posted (runs in the worker process).

This is wiring around localize/'s summary-first path, not analysis: the posted summaries (one
format, `localize.summary`) and the agents' rank descriptions become a trace directory, and
`localize.summary.localize_from_summary` localizes it. When the summaries point at ranks and
steps whose full records the service does not have, the round asks the nodes for them (a fetch
request the agents answer) and localizes once they arrive, from the same summaries it planned on.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from collector.commops.layout import PENDING_SCHEMA, write_meta
from collector.trace.meta import JobMeta, RankInfo
from collector.trace.schema import COMMOPS_SCHEMA
from collector.trace.traceio import Trace
from explain.report.build import report_from_verdict
from explain.report.html import render_html
from explain.report.markdown import render_markdown
from explain.report.model import Report, irregular_windows
from laggard.service.schema import members
from laggard.service.store import Store
from localize.commops import COLUMNS
from localize.summary import SUMMARY_SCHEMA, WIRE_US, localize_summary, plan_fetch, step_table
from localize.verdict import Verdict
from localize.waits.hang import find_hang

FETCH_TIMEOUT_S = 30.0  # nodes that have not answered by then: plan again (the job may have moved on)


@dataclass
class Localized:
    job: str
    verdict: dict[str, Any]
    report: dict[str, Any]
    markdown: str
    seconds: float
    onset_unix_s: float | None = None
    lost_s: dict[int, float] = field(default_factory=dict)  # per irregular step: seconds lost (wall)
    world_size: int = 0
    upto: int = 0  # the newest summary (store id) this verdict was planned on
    evidence: int = 0  # the newest of them that carried steps or stuck operators: rounds agree on new ones only


@dataclass
class Round:
    """What a round did: a verdict, or a request for records (or neither: waiting for answers)."""

    job: str
    localized: Localized | None = None
    fetch: dict[str, dict[str, list[int]]] | None = None
    request: int = 0
    done_request: int | None = None
    stale: bool = False  # posts arrived after the summaries this verdict was planned on: go again


@dataclass
class _Post:
    """One stored post's rows as columns (numpy), parsed once."""

    id: int
    node: str
    last_step: int
    cols: dict[str, np.ndarray]
    pending: pd.DataFrame | None = None  # the node's stuck operators when it posted (None: nothing stuck)

    @property
    def evidence(self) -> bool:
        """Whether it says anything new of the job: steps, or operators stuck (a node's post that its
        ranks exited, or that a hang cleared, carries neither)."""
        return len(self.cols["rank"]) > 0 or self.pending is not None


@dataclass
class _JobCache:
    """What the worker already parsed of one job: posts by id, and the meta planned on per request."""

    last_id: int = 0
    posts: list[_Post] = field(default_factory=list)
    metas: dict[int, JobMeta] = field(default_factory=dict)


_CACHE: OrderedDict[tuple[str, str], _JobCache] = OrderedDict()
MAX_CACHED_JOBS = 256  # least recently localized jobs are parsed again from the store if they come back
_TYPES = {"rank": np.int32, "step": np.int32, "group": object, "abnormal": np.int32, "abnormal_us": np.int64,
          "compute_us": np.int64, "step_end_us": np.int64, "step_start_us": np.int64}


def parse_post(pid: int, node: str, body: str) -> _Post:
    raw = json.loads(body)
    stuck = raw.get("pending") or {}
    pending = pd.DataFrame({f.name: stuck[f.name] for f in PENDING_SCHEMA}) if stuck.get("rank") else None
    rows = {"step_start_us": [0] * len(raw["rows"]["rank"]), **{c: v for c, v in raw["rows"].items() if len(v)}}
    # (an older agent posts no step starts: 0, unknown)
    return _Post(pid, node, int(raw["last_step"]), {c: np.asarray(rows.get(c, []), t) for c, t in _TYPES.items()},
                 pending)


def stuck_now(posts: list[_Post]) -> pd.DataFrame | None:
    """The stuck operators each node reported in its latest post (a node that posted none is not stuck)."""
    latest = {p.node: p for p in posts}  # posts are in store order: the last one per node wins
    frames = [p.pending for p in latest.values() if p.pending is not None]
    return pd.concat(frames, ignore_index=True) if frames else None


def hang_verdict(meta: JobMeta, stuck: pd.DataFrame) -> Verdict | None:
    """localize/hang's attribution of the nodes' stuck operators (a trace of meta.json and the
    pending operators alone; the agents already kept only the ones stuck long enough)."""
    with tempfile.TemporaryDirectory(prefix="laggard-hang-") as tmp:
        root = Path(tmp)
        write_meta(root, meta)
        pq.write_table(COMMOPS_SCHEMA.empty_table(), root / "commops.parquet")
        pq.write_table(pa.Table.from_pandas(stuck, schema=PENDING_SCHEMA, preserve_index=False),
                       root / "pending.parquet")
        return find_hang(Trace.open(root), min_wait_s=0.0)


def summary_frame(posts: list[_Post]) -> pd.DataFrame:
    """The posts' rows as localize/summary.py's summary (SUMMARY_SCHEMA: seconds and ns, host = the node)."""
    if not posts:
        return pd.DataFrame({c: pd.Series(dtype=t.to_pandas_dtype()) for c, t in zip(
            SUMMARY_SCHEMA.names, SUMMARY_SCHEMA.types, strict=True)})
    sizes = [len(p.cols["rank"]) for p in posts]
    cols = {c: np.concatenate([p.cols[c] for p in posts]) for c in _TYPES}
    df = pd.DataFrame({"host": np.repeat(np.asarray([p.node for p in posts], dtype=object), sizes),
                       "rank": cols["rank"], "step": cols["step"], "group": cols["group"],
                       "abnormal": cols["abnormal"]})
    for col, wire in WIRE_US.items():
        df[col] = cols[wire] * 1000 if col.endswith("_ns") else cols[wire] * 1e-6
    return df[list(SUMMARY_SCHEMA.names)]


def build_meta(job: str, nodes: dict[str, tuple[int, dict[int, dict[str, Any]]]], groups: dict[str, str]) -> JobMeta:
    """meta.json from the agents: each node's ranks (host = the node) and the groups they posted."""
    ranks = {r: RankInfo(host=node, gpu=int(info.get("gpu", 0)), ip=str(info.get("ip", "")))
             for node, (_, rs) in sorted(nodes.items()) for r, info in rs.items()}
    world = max((w for w, _ in nodes.values()), default=1)
    grp = {g: members(json.loads(spec) if spec.startswith("[") else spec) for g, spec in groups.items()}
    return JobMeta(job=job, world_size=world, ranks=ranks, groups=grp)


def _update(cache: _JobCache, store: Store, job: str, keep_steps: int) -> None:
    rows = store.rows_since(job, cache.last_id)
    cache.posts += [parse_post(pid, node, body) for pid, node, body in rows]
    if rows:
        cache.last_id = rows[-1][0]
    newest = max((p.last_step for p in cache.posts), default=0)
    cache.posts = [p for p in cache.posts if p.last_step > newest - keep_steps]


def _summary(cache: _JobCache, upto: int | None = None) -> pd.DataFrame:
    return summary_frame([p for p in cache.posts if upto is None or p.id <= upto])


def _evidence(cache: _JobCache, upto: int) -> int:
    """The newest post up to `upto` that carried evidence (`_Post.evidence`)."""
    return max((p.id for p in cache.posts if p.id <= upto and p.evidence), default=0)


def localize_round(db: str, job: str, keep_steps: int = 400, top: int = 5) -> Round:
    """Plan, ask for records, or localize: whichever this job's state calls for now."""
    cache = _CACHE.setdefault((db, job), _JobCache())
    _CACHE.move_to_end((db, job))
    while len(_CACHE) > MAX_CACHED_JOBS:
        _CACHE.popitem(last=False)
    store = Store(db)
    try:
        _update(cache, store, job, keep_steps)
        pending = store.fetch(job)
        if pending is not None:
            meta = cache.metas.get(pending.request)
            if meta is not None and set(pending.plan) <= store.answered(job, pending.request):
                records = store.records(job, pending.request)
                store.clear_fetch(job)
                cache.metas.clear()
                return Round(job, _localize(job, meta, _summary(cache, pending.upto), records, top, pending.upto,
                                            _evidence(cache, pending.upto)),
                             done_request=pending.request, stale=cache.last_id > pending.upto)
            if meta is not None and time.time_ns() - pending.created_ns < FETCH_TIMEOUT_S * 1e9:
                return Round(job)  # still waiting for some nodes
        meta = build_meta(job, store.nodes(job), store.groups(job))
        stuck = stuck_now(cache.posts)
        hang = hang_verdict(meta, stuck) if stuck is not None else None
        if stuck is not None and hang is not None:  # stuck, not slow: no steps finish, nothing to fetch
            if pending is not None:
                store.clear_fetch(job)
            return Round(job, _localized(job, meta, hang, _summary(cache), cache.last_id, _evidence(cache, cache.last_id),
                                         time.perf_counter(), float(stuck["start_ns"].min()) / 1e9))
        summary = _summary(cache)
        if summary.empty:
            return Round(job)
        plan = plan_fetch(summary, meta, step_table(summary)[0])
        ask: dict[str, dict[str, list[int]]] = {}
        for r in plan.ranks if plan.irregular else []:
            if r in meta.ranks:
                ask.setdefault(meta.host_of(r), {"ranks": [], "steps": list(plan.fetch_steps)})["ranks"].append(int(r))
        if not ask:
            if pending is not None:
                store.clear_fetch(job)
            return Round(job, _localize(job, meta, summary, {}, top, cache.last_id, _evidence(cache, cache.last_id)))
        request = store.set_fetch(job, ask, cache.last_id)
        cache.metas = {request: meta}
        return Round(job, fetch=ask, request=request)
    finally:
        store.close()


def _records(bodies: dict[str, str]) -> pa.Table:
    tables = []
    for body in bodies.values():
        rows = json.loads(body)["rows"]
        tables.append(pa.table({f.name: pa.array(rows[f.name], f.type) for f in COMMOPS_SCHEMA}, schema=COMMOPS_SCHEMA))
    return pa.concat_tables(tables) if tables else COMMOPS_SCHEMA.empty_table()


def _localize(job: str, meta: JobMeta, summary: pd.DataFrame, records: dict[str, str], top: int,
              upto: int, evidence: int) -> Localized:
    t0 = time.perf_counter()
    rows = _records(records).to_pandas()

    def fetch(ranks: list[int], steps: tuple[int, int]) -> pd.DataFrame:
        """The records the nodes sent, as localize/ asks for them (the plan's ranks and steps)."""
        keep = rows["rank"].isin(ranks) & rows["step"].between(steps[0], steps[1])
        return rows.loc[keep, list(COLUMNS)].sort_values(["rank", "start_ns"]).reset_index(drop=True)

    verdict, _ = localize_summary(summary, meta, fetch, top)
    return _localized(job, meta, verdict, summary, upto, evidence, t0)


def _localized(job: str, meta: JobMeta, verdict: Verdict, summary: pd.DataFrame, upto: int, evidence: int,
               t0: float, onset: float | None = None) -> Localized:
    """A verdict with its report, onset and lost time, as the service stores and exports it."""
    steps = step_table(summary)[0] if not summary.empty else pd.DataFrame()
    v = verdict.to_dict()
    v.update(summaries_rows=len(summary), nodes=int(summary["host"].nunique()) if len(summary) else 0,
             steps_seen=[int(steps["step"].min()), int(steps["step"].max())] if len(steps) else [])
    report = service_report(v, steps, meta.world_size)
    irr = steps[steps["irregular"].astype(bool)] if len(steps) else steps
    lost = {} if irr.empty else dict(zip(irr["step"].astype(int), (irr["duration_s"] - irr["baseline_s"]).clip(
        lower=0).astype(float), strict=True))
    return Localized(job, v, report.to_dict(), render_markdown(report), time.perf_counter() - t0,
                     onset if onset is not None else onset_time(summary, v), lost, meta.world_size, upto, evidence)


def onset_time(summary: pd.DataFrame, verdict: dict[str, Any]) -> float | None:
    """Wall time the first irregular step began: the hosts' median end of the step before it."""
    steps = verdict.get("irregular_steps") or []
    if verdict.get("status") == "healthy" or not steps:
        return None
    first = int(verdict.get("onset_step", min(steps)))
    star = summary[(summary["group"] == "*") & (summary["rank"] < 0)]
    for s in (first - 1, first):
        ends = star.loc[star["step"] == s, "step_end_ns"]
        if len(ends):
            return float(ends.median()) / 1e9
    return None


def service_report(verdict: dict[str, Any], steps: pd.DataFrame, world: int) -> Report:
    """The report the service serves: the verdict, the step times, and where they came from."""
    report = report_from_verdict(Verdict.from_dict(verdict), None, None, world_size=world)
    if not steps.empty:
        report.steps = steps
        report.windows = irregular_windows(steps)
        irr = steps[steps["irregular"].astype(bool)]
        report.lost_s = float((irr["duration_s"] - irr["baseline_s"]).clip(lower=0).sum())
    report.notes.append(f"from the summaries of {verdict.get('nodes')} node agents "
                        f"({verdict.get('summaries_rows')} rows), steps {verdict.get('steps_seen')}")
    return report


def rerender(verdict: dict[str, Any], report: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The report and markdown of another verdict over the same steps (a withheld device)."""
    rep = service_report(verdict, pd.DataFrame(report.get("steps", [])), int(report["world_size"]))
    if verdict.get("localizing"):
        rep.notes.append(str(verdict["localizing"]["detail"]))
    return rep.to_dict(), render_markdown(rep)


def render_job_html(verdict: dict[str, Any], report: dict[str, Any]) -> str:
    """HTML of a stored report, rendered when someone asks for it (figures cost seconds)."""
    return render_html(service_report(verdict, pd.DataFrame(report.get("steps", [])), int(report["world_size"])))
