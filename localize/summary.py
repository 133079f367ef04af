"""Abnormal-operator summaries, and the localizer path that starts from them.

Detection runs where the records are (the sidecar on each node); only a compact summary
travels. The central localizer reads the summaries of every node, finds the irregular steps
and the groups where operators were abnormal, and fetches full records only for the members
of those groups and a few steps (`Trace.commops(ranks=..., steps=...)`).

Summary format — `summary.parquet` (or `.jsonl`/`.csv`, or a directory `summary/` of one
Parquet file per node) in the trace directory; one row per

- (rank, step) with `group` = "*": the rank's step totals, always present —
  `step_end_ns` (end of the rank's last operator of the step, its own clock), `compute_s`
  (time between its operators in the step: compute), `ops`, `elapsed_s`;
- (rank, step, group) where the rank had abnormal operators in that group —
  `ops` (operators of the group in the step), `abnormal` (how many were abnormal),
  `elapsed_s`, `abnormal_s` (their total elapsed time).

| column | type | meaning |
|---|---|---|
| rank | int32 | global rank |
| step | int32 | training step |
| group | string | process group, or "*" for the rank's step totals |
| ops | int32 | operators counted |
| abnormal | int32 | abnormal operators among them (0 on "*" rows) |
| elapsed_s | float64 | total elapsed time of the operators counted |
| abnormal_s | float64 | total elapsed time of the abnormal ones |
| compute_s | float64 | "*" rows: compute time of the step; else 0 |
| step_end_ns | int64 | "*" rows: own-clock end of the step; else 0 |

Node-local detection can only see the node's own copies of an operator, so it judges each
operator against its own history (drift-normalized robust rule, `detector.rule_detect`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from collector.errors import TraceError
from collector.meta import JobMeta
from collector.traceio import FORMATS, Trace, read_table, write_table
from localize.commops import COLUMNS, analyse_ops
from localize.detector import rule_detect
from localize.features import prepare_ops
from localize.steps import StepView, judge
from localize.verdict import Verdict

SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("group", pa.string(), nullable=False),
        pa.field("ops", pa.int32(), nullable=False),
        pa.field("abnormal", pa.int32(), nullable=False),
        pa.field("elapsed_s", pa.float64(), nullable=False),
        pa.field("abnormal_s", pa.float64(), nullable=False),
        pa.field("compute_s", pa.float64(), nullable=False),
        pa.field("step_end_ns", pa.int64(), nullable=False),
    ]
)
MAX_STEPS = 3  # irregular steps fetched in full
REF_STEPS = 3  # normal steps fetched for the operators' own history
MAX_RANKS = 1024  # budget of ranks fetched in full


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """The summary of one node's (or any set of ranks') CommOps rows, in SUMMARY_SCHEMA."""
    ops = prepare_ops(df)
    steps = ops.step
    uniq = np.unique(steps)
    # the node's own step table, for drift normalization; history from all its steps
    det = rule_detect(ops, None, uniq)
    rank = ops.rank
    end = ops.df["end_ns"].to_numpy(np.int64)
    tot = pd.DataFrame({"rank": rank, "step": steps, "ops": 1, "elapsed_s": ops.elapsed, "compute_s": ops.gap,
                        "step_end_ns": end}).groupby(["rank", "step"], sort=True).agg(
        ops=("ops", "sum"), elapsed_s=("elapsed_s", "sum"), compute_s=("compute_s", "sum"), step_end_ns=("step_end_ns", "max")
    ).reset_index()
    tot["group"] = "*"
    tot["abnormal"] = 0
    tot["abnormal_s"] = 0.0
    ab = pd.DataFrame({"rank": rank, "step": steps, "group": ops.groups[ops.group_code], "ops": 1,
                       "abnormal": det.abnormal.astype(np.int32), "elapsed_s": ops.elapsed,
                       "abnormal_s": np.where(det.abnormal, ops.elapsed, 0.0)})
    per = ab.groupby(["rank", "step", "group"], sort=True).sum().reset_index()
    per = per[per["abnormal"] > 0].assign(compute_s=0.0, step_end_ns=0)
    out = pd.concat([tot, per], ignore_index=True)
    return out[list(SUMMARY_SCHEMA.names)]


def write_summaries(trace: Trace, out_name: str = "summary") -> Path:
    """Summarize a trace node by node (as the sidecars would) into `summary/<host>.parquet`."""
    d = trace.path / out_name
    d.mkdir(exist_ok=True)
    by_host: dict[str, list[int]] = {}
    for r, info in trace.meta.ranks.items():
        by_host.setdefault(info.host, []).append(r)
    for host, ranks in by_host.items():
        df = trace.commops(columns=COLUMNS, ranks=ranks)
        if len(df):
            write_table(summarize(df), d / f"{host}.parquet", SUMMARY_SCHEMA)
    return d


def find_summary(trace: Trace) -> Path | None:
    for ext in FORMATS:
        p = trace.path / f"summary{ext}"
        if p.is_file():
            return p
    d = trace.path / "summary"
    return d if d.is_dir() and any(d.glob("*.parquet")) else None


def read_summary(trace: Trace) -> pd.DataFrame:
    p = find_summary(trace)
    if p is None:
        raise TraceError(f"{trace.path}: no abnormal-operator summary", "run the sidecar, or `write_summaries` on the trace")
    return read_table(p, SUMMARY_SCHEMA).to_pandas()


@dataclass
class FetchPlan:
    """What the summary says to fetch in full."""

    irregular: list[int]
    fetch_steps: list[int]
    ranks: list[int]
    groups: list[str] = field(default_factory=list)
    rows_fetched: int = 0


def step_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Step durations from the summaries: each rank's own-clock step ends, median over ranks."""
    star = summary[summary["group"] == "*"]
    ends = star.pivot_table(index="rank", columns="step", values="step_end_ns", aggfunc="max").sort_index(axis=1)
    dur = ends.diff(axis=1).median(axis=0) * 1e-9
    dur = dur.iloc[1:] if len(dur) > 1 else dur
    return judge(dur.rename("duration_s"))


def plan_fetch(summary: pd.DataFrame, meta: JobMeta, table: pd.DataFrame) -> FetchPlan:
    """Steps: the most irregular few plus the normal ones before them. Ranks: every member of
    the groups with the most abnormal time (the one normal copy among waiting ones is what the
    wait graph needs), and the ranks that computed longest in those steps with their groups."""
    irr_tab = table[table["irregular"].astype(bool)]
    irregular = [int(s) for s in irr_tab["step"]]
    if not irregular:
        return FetchPlan([], [], [])
    worst = sorted(irr_tab.nlargest(MAX_STEPS, "ratio")["step"].astype(int).tolist())
    normal = table.loc[~table["irregular"].astype(bool) & (table["step"] < worst[0]), "step"].astype(int).tolist()
    if not normal:
        normal = table.loc[~table["irregular"].astype(bool), "step"].astype(int).tolist()
    fetch_steps = sorted(set(worst) | set(normal[-REF_STEPS:]))
    sub = summary[summary["step"].isin(worst)]
    per_group = sub[sub["group"] != "*"].groupby("group")["abnormal_s"].sum().sort_values(ascending=False)
    star = sub[sub["group"] == "*"]
    comp = star.groupby("rank")["compute_s"].median()
    slow_ranks = comp[comp > 1.1 * comp.median()].nlargest(16).index.tolist()
    rank_groups: dict[int, list[str]] = {}
    for g, mem in meta.groups.items():
        for r in mem:
            rank_groups.setdefault(r, []).append(g)
    chosen: list[str] = []
    ranks: set[int] = set()
    for r in slow_ranks:
        for g in rank_groups.get(int(r), []):
            if g not in chosen and len(ranks) + len(meta.groups[g]) <= MAX_RANKS:
                chosen.append(g)
                ranks.update(meta.groups[g])
    for g in per_group.index:
        mem = meta.groups.get(str(g), [])
        if len(ranks | set(mem)) > MAX_RANKS:
            continue
        chosen.append(str(g))
        ranks.update(mem)
    return FetchPlan(irregular, fetch_steps, sorted(ranks), chosen)


def localize_from_summary(trace: Trace, top: int = 5, forest: bool = False) -> tuple[Verdict, FetchPlan]:
    """Localize from summaries, fetching full records only for the planned ranks and steps.

    The fetched operators are judged with the same robust rule the sidecars use (`forest`
    switches to the random forest, about three times slower)."""
    summary = read_summary(trace)
    table = step_table(summary)
    plan = plan_fetch(summary, trace.meta, table)
    if not plan.irregular:
        return Verdict(trace.meta.job, "healthy", [], 1.0, [], {"source": "commops", "from": "summary"}), plan
    df = trace.commops(columns=COLUMNS, ranks=plan.ranks, steps=(plan.fetch_steps[0], plan.fetch_steps[-1]))
    df = df[df["step"].isin(plan.fetch_steps)].reset_index(drop=True)
    plan.rows_fetched = len(df)
    fetched = set(plan.ranks)
    partial = {g for g, m in trace.meta.groups.items() if not set(m) <= fetched}
    worst = [s for s in plan.fetch_steps if s in set(plan.irregular)]
    sub_table = table[table["step"].isin(plan.fetch_steps)]
    irr = table[table["irregular"].astype(bool)]
    slow = float(irr["duration_s"].median() / table.loc[~table["irregular"].astype(bool), "duration_s"].median())
    view = StepView(trace.meta.job, trace.meta, sub_table, worst, slow, "irregular")
    verdict, _ = analyse_ops(df, trace.meta, view, top, partial, forest)
    verdict.irregular_steps = plan.irregular
    verdict.extra.update({"from": "summary", "ranks_fetched": len(plan.ranks), "rows_fetched": plan.rows_fetched})
    return verdict, plan
