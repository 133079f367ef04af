"""Abnormal-operator summaries, and the localizer path that starts from them.

Detection runs where the records are (the sidecar on each node); only a compact summary
travels. The central localizer reads the summaries of every node, finds the irregular steps,
the ranks that computed longest and the groups where operators were abnormal, and fetches full
records only for a few of those groups' members and a few steps (`Trace.commops(ranks=...,
steps=...)`).

Summary format — `summary.parquet` (or `.jsonl`/`.csv`, or a directory `summary/` of one
Parquet file per node and window) in the trace directory. A summary describes hosts, not
ranks, wherever that is all the central localizer needs; one row per

- (host, step) with `rank` = -1 and `group` = "*": the host's step — `step_end_ns` and
  `step_start_ns` (medians over its ranks of the end of their last operator of the step and the
  start of their first, the host's own clock: a step logged without the one before it, sampled
  steps, is measured from its own start) and
  `compute_s` (low quartile over its ranks of the time with no operator in flight: compute,
  what its healthy ranks spent);
- (host, rank, step) with `group` = "*" for a rank that computed over OUTLIER x its host's
  typical rank in that step (a slow GPU stands out on its own node): its `compute_s`, `step_end_ns`;
- (host, step, group) with `rank` = -1 where the host's ranks had abnormal operators in that
  group: `abnormal` (how many), `abnormal_s` (their total elapsed time).

| column | type | meaning |
|---|---|---|
| host | string | host of the ranks summarized |
| rank | int32 | global rank of an outlier row, else -1 |
| step | int32 | training step |
| group | string | process group, or "*" for step rows |
| abnormal | int32 | abnormal operators (0 on "*" rows) |
| abnormal_s | float64 | their total elapsed time |
| compute_s | float64 | "*" rows: compute time of the step; else 0 |
| step_end_ns | int64 | "*" rows: own-clock end of the step; else 0 |
| step_start_ns | int64 | "*" rows: own-clock start of the step; else 0 (0 everywhere: unknown) |

Node-local detection can only see the node's own copies of an operator, so it judges each
operator against its own history (drift-normalized robust rule, `detector.rule_detect`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from collector.inputs.errors import TraceError
from collector.trace.groupnames import kind_in_name
from collector.trace.meta import JobMeta
from collector.trace.traceio import FORMATS, Trace, read_table, write_table
from localize.candidates import (
    few_irregular,
    imbalance_verdict,
    lasting_over_few_steps,
    step_times_past_warmup,
)
from localize.commops import COLUMNS, USUAL_MIN_NORMAL, analyse_ops, candidate_ranks, partial_first
from localize.detect.detector import rule_detect
from localize.ops.groupkinds import group_kinds, with_observed_groups
from localize.ops.lone import lone_copies
from localize.ops.steps import StepView, with_steps
from localize.ops.table import Ops, prepare_ops
from localize.verdict import Verdict
from localize.waits.persistent import (
    Imbalance,
    first_apart,
    first_slow_step,
    grown_devices,
    imbalance,
    later_onset,
    persistent_imbalance,
    worker_onset,
)
from localize.waits.ranking import RankUnit, pipeline_stages
from timeline.steps import durations_from_bounds, judge_window, predecessors

SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("host", pa.string(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("group", pa.string(), nullable=False),
        pa.field("abnormal", pa.int32(), nullable=False),
        pa.field("abnormal_s", pa.float64(), nullable=False),
        pa.field("compute_s", pa.float64(), nullable=False),
        pa.field("step_end_ns", pa.int64(), nullable=False),
        pa.field("step_start_ns", pa.int64(), nullable=False),
    ]
)
OUTLIER = 1.05  # a rank computing this much over its host's typical rank is summarized on its own
LOW = 0.25  # a host's typical rank: the low quartile of its ranks' compute (one slow GPU cannot move it),
# taken as one rank's own value: interpolated, on a host of two ranks a slow one lifts its peer by a quarter
#: a step's duration: this quantile of its hosts' (own-clock) durations. Stages that do not sync at
#: a step's end cut the same time into steps at different points, and a slow step shows on one
#: stage's hosts then and on another's a step later: the median of the two missed it; a few
#: odd hosts cannot move this one
HOST_QUANTILE = 0.9
#: hosts judged each on its own where no step of the job is (`first_slow_hosts`), spread over the job
SPILL_HOSTS = 32
#: passes that place each host's step ends against the others' (`aligned_cadence`)
ALIGN_ROUNDS = 3
MAX_STEPS = 3  # irregular steps fetched in full (each with the step before it; four where a fault took turns in two places)
EXPLAIN_SHARE = 0.25  # ranks that computed longer explain a step when their excess is this share of its lost time
CONTEXT_EXCESS = 0.5  # ... which is judged too when irregular by this share of their least excess (a normal step that slow is no history)
LOSS_CAP = 3.0  # a step weighs at most this many times the median irregular step's lost time (`time_weighted_median`)
ALIKE_LOSS = 3.0  # an irregular step is another place of the fault when it lost within this factor of the typical step's time
#: normal steps fetched in full as the operators' history (a busy host's noise included): as many as
#: the full records' 90th-percentile rule needs (`commops.USUAL_MIN_NORMAL`); with twelve, a real
#: HSDP job's throttled NIC read as the link to its shard peer in 3 of 5 runs
MAX_NORMAL = USUAL_MIN_NORMAL
MAX_RANKS = 32  # budget of ranks fetched in full around ranks that computed longest, per irregular step fetched
MAX_RANKS_NET = 1024  # the budget when no rank did (a network fault)
UNSEEN_STEPS = 3  # steps of every rank's records read for waits on ranks that logged nothing, slow from the start


def groups_within(groups: Mapping[str, Sequence[int]], ranks: Collection[int]) -> dict[str, list[int]]:
    """The groups all of whose members are among `ranks` (one node's): the only ones a node can
    read whole, and so tell which of their members were not logged at all."""
    mine = set(ranks)
    return {g: list(m) for g, m in groups.items() if m and set(m) <= mine}


def host_rows(df: pd.DataFrame, ranks: Collection[int], steps: tuple[int, int]) -> pd.DataFrame:
    """The rows of `ranks` within `steps` (inclusive) out of all of one host's rows: numbered as
    that host's summary numbered them where the logger wrote no step numbers (`with_steps` on the
    same rows), so a fetched step is the step the summary named."""
    df = with_steps(df)
    step = df["step"].to_numpy()
    keep = df["rank"].isin(list(ranks)).to_numpy() & (step >= steps[0]) & (step <= steps[1])
    return df[keep].reset_index(drop=True)


def node_normal_steps(ops: Ops) -> np.ndarray:
    """The steps a node ran normally, judged on its own ranks' step spans (median over its ranks)
    as timeline/ judges a job's steps; all of them when none did. A fault on for over a quarter of
    the steps would otherwise widen the operators' history until its own were not abnormal, and
    the fetch plan missed the faulty host's groups. One normal step is history enough (each of its
    operators has many copies): a fault from the first steps of a sampled log leaves no more."""
    steps = np.unique(ops.step)
    if len(steps) < 6:
        return steps
    frame = pd.DataFrame({"step": ops.step, "rank": ops.rank, "start": ops.times.start(),
                          "end": ops.times.end()})
    per_rank = frame.groupby(["step", "rank"], sort=True).agg(start=("start", "min"), end=("end", "max"))
    span = ((per_rank["end"] - per_rank["start"]) / 1e9).groupby(level="step").median()  # (sampled steps too)
    table, _, _ = judge_window(span.iloc[1:])
    ok = ~table["irregular"].astype(bool) & (table["pattern"] != "warm-up") & np.isfinite(table["duration_s"])
    normal = table.loc[ok, "step"].to_numpy(np.int64)
    return normal if len(normal) else steps


def summarize(df: pd.DataFrame, host_of: Callable[[int], str] | None = None,
              groups: Mapping[str, Sequence[int]] | None = None) -> pd.DataFrame:
    """The summary of one node's (or any set of ranks') CommOps rows, in SUMMARY_SCHEMA.

    `host_of` maps a rank to its host (default: every rank is a host of its own, "rank-R").
    `groups`: the groups read whole here (`groups_within`); a rank's time in their operators that
    no other member logged counts as its compute, as on the full-record path (`localize.ops.lone`).
    Rows logged without step numbers are numbered on this node's rows alone (`with_steps`, as the
    timeline numbers a whole job's); the fetch numbers them the same way (`host_rows`)."""
    ops = prepare_ops(with_steps(df))
    own = ops.gap + np.where(lone_copies(ops, groups), ops.elapsed, 0.0) if groups else ops.gap
    steps = ops.step
    # operators are judged against the node's own normal steps (no step table: no drift scaling)
    det = rule_detect(ops, None, node_normal_steps(ops))
    rank = ops.rank
    ranks = np.unique(rank)
    names = [host_of(int(r)) if host_of is not None else f"rank-{int(r)}" for r in ranks]
    hcode, hosts = pd.factorize(np.asarray(names, dtype=object))
    host = hcode[np.searchsorted(ranks, rank)]  # per row, as an integer: grouping on strings is slow
    per_rank = pd.DataFrame({"host": host, "rank": rank, "step": steps, "compute_s": own,
                             "step_end_ns": ops.times.end(),
                             "step_start_ns": ops.times.start()}).groupby(
        ["host", "rank", "step"], sort=True).agg(compute_s=("compute_s", "sum"), step_end_ns=("step_end_ns", "max"),
                                                 step_start_ns=("step_start_ns", "min")).reset_index()
    by_host = per_rank.groupby(["host", "step"], sort=True)
    med = by_host.agg(step_end_ns=("step_end_ns", "median"), step_start_ns=("step_start_ns", "median")).reset_index()
    med["compute_s"] = by_host["compute_s"].quantile(LOW, interpolation="lower").to_numpy()
    med["rank"] = -1
    for col in ("step_end_ns", "step_start_ns"):
        med[col] = med[col].round().astype(np.int64)
    typical = per_rank[["host", "step"]].merge(med[["host", "step", "compute_s"]], on=["host", "step"], how="left")["compute_s"].to_numpy()
    out = pd.concat([med, per_rank[per_rank["compute_s"] > OUTLIER * typical]], ignore_index=True)
    out = out.assign(group="*", abnormal=0, abnormal_s=0.0)
    ab = pd.DataFrame({"host": host, "step": steps, "group": ops.group_code,
                       "abnormal": det.abnormal.astype(np.int32), "abnormal_s": np.where(det.abnormal, ops.elapsed, 0.0)})
    ab = ab[det.abnormal].groupby(["host", "step", "group"], sort=True).sum().reset_index()
    ab = ab.assign(rank=-1, compute_s=0.0, step_end_ns=0, step_start_ns=0, group=np.asarray(ops.groups, dtype=object)[ab["group"].to_numpy()])
    res = pd.concat([out, ab], ignore_index=True)
    res["host"] = np.asarray(hosts, dtype=object)[res["host"].to_numpy()]
    res = res[list(SUMMARY_SCHEMA.names)]
    return res.sort_values(["host", "rank", "step", "group"]).reset_index(drop=True)


def write_summaries(trace: Trace, out_name: str = "summary") -> Path:
    """Summarize a trace node by node (as the sidecars would) into `summary/<host>.parquet`."""
    d = trace.path / out_name
    d.mkdir(exist_ok=True)
    for host, ranks in trace.meta.ranks_by_host().items():
        df = trace.commops(columns=COLUMNS, ranks=ranks)
        if len(df):
            write_table(summarize(df, trace.meta.host_of, groups_within(trace.meta.groups, ranks)),
                        d / f"{host}.parquet", SUMMARY_SCHEMA)
    return d


def find_summary(trace: Trace) -> Path | None:
    for ext in FORMATS:
        p = trace.path / f"summary{ext}"
        if p.is_file():
            return p
    d = trace.path / "summary"
    return d if d.is_dir() and any(d.glob("*.parquet")) else None


#: on the wire, times travel as integer microseconds (delta-encoded they take a byte or two)
WIRE_US = {"abnormal_s": "abnormal_us", "compute_s": "compute_us", "step_end_ns": "step_end_us",
           "step_start_ns": "step_start_us"}


def to_wire(summary: pd.DataFrame) -> pd.DataFrame:
    out = summary.copy()
    for col, wire in WIRE_US.items():
        x = out.pop(col).to_numpy()
        out[wire] = (x // 1000 if col.endswith("_ns") else np.rint(x * 1e6)).astype(np.int64)
    return out


def read_summary(trace: Trace) -> pd.DataFrame:
    p = find_summary(trace)
    if p is None:
        raise TraceError(f"{trace.path}: no abnormal-operator summary", "run the sidecar, or `write_summaries` on the trace")
    if p.is_dir():  # the sidecars' files (<host>-w<first>-<last>.parquet): microseconds on the wire
        files = sorted(p.glob("*.parquet"))
        table = ds.dataset(files, format="parquet").to_table()
        df = table.to_pandas()
        if "host" not in df:  # one host per file, named by the file
            sizes = [f.metadata.num_rows for f in ds.dataset(files, format="parquet").get_fragments()]
            df["host"] = np.repeat([f.name.rsplit("-w", 1)[0] for f in files], sizes)
        for col, wire in WIRE_US.items():
            if wire in df:
                x = df.pop(wire).to_numpy(np.int64)
                df[col] = x * 1000 if col.endswith("_ns") else x * 1e-6
        df = with_start(df)
        return pa.Table.from_pandas(df[list(SUMMARY_SCHEMA.names)], schema=SUMMARY_SCHEMA, preserve_index=False).to_pandas()
    try:
        return read_table(p, SUMMARY_SCHEMA).to_pandas()
    except TraceError:  # written before steps carried their start: read without it, then say so again if still wrong
        earlier = [n for n in SUMMARY_SCHEMA.names if n != "step_start_ns"]
        return with_start(read_table(p, SUMMARY_SCHEMA, earlier).to_pandas())


def with_start(summary: pd.DataFrame) -> pd.DataFrame:
    """A summary written before steps carried their start (`step_start_ns`): 0, unknown."""
    return summary if "step_start_ns" in summary else summary.assign(step_start_ns=np.int64(0))


@dataclass
class FetchPlan:
    """What the summary says to fetch in full."""

    irregular: list[int]
    fetch_steps: list[int]
    ranks: list[int]
    groups: list[str] = field(default_factory=list)
    rows_fetched: int = 0
    judged: list[int] = field(default_factory=list)  # the irregular steps judged; the others fetched are context
    history: list[int] = field(default_factory=list)  # the normal steps fetched as the operators' history


def step_table(summary: pd.DataFrame) -> tuple[pd.DataFrame, int | None]:
    """Step durations from the summaries (each host's own-clock step ends, HOST_QUANTILE over hosts;
    on a log of consecutive steps, the hosts' `aligned_cadence`), judged as the timeline judges them
    (δ against the job's own noise, change points, warm-up and noise left out); and the onset step."""
    star = summary[(summary["group"] == "*") & (summary["rank"] < 0)]
    ends = star.pivot_table(index="host", columns="step", values="step_end_ns", aggfunc="max").sort_index(axis=1)
    starts = star.assign(step_start_ns=star["step_start_ns"].where(star["step_start_ns"] > 0)).pivot_table(
        index="host", columns="step", values="step_start_ns", aggfunc="min", dropna=False).reindex_like(ends)
    steps = ends.columns.to_numpy(np.int64)
    end_ns = ends.to_numpy(np.float64)
    per_host = durations_from_bounds(steps, starts.to_numpy(np.float64), end_ns)
    consecutive = len(steps) > 1 and bool(predecessors(steps)[1][1:].all())
    table, onset = judged_over_hosts(per_host, steps, aligned_cadence(steps, end_ns) if consecutive else None)
    if not table["irregular"].any() and (first := first_slow_hosts(per_host, steps)) is not None:
        return first
    return table, onset


def aligned_cadence(steps: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per step (consecutive steps): how long after the previous step the job's hosts ended it, each
    host's ends moved by its typical lead or lag (its clock's offset and its stage's place, alike in
    every step), HOST_QUANTILE over the hosts that logged both; NaN for the first step.

    A host's own step, end to end, holds the spill of the step before where no sync ends a step: the
    last stage waits at the start of the step after a slow one. The ends of all hosts together do
    not: once moved to their typical places they run late together from the slow step on, as the
    aligned clocks of the full records show the job's steps."""
    lag = np.zeros((ends.shape[0], 1))
    with warnings.catch_warnings():  # a host or a step with no end logged
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(ALIGN_ROUNDS):  # (the reference moves with the hosts that logged each step)
            reference = np.nanmedian(ends - lag, axis=0, keepdims=True)
            lag = np.nan_to_num(np.nanmedian(ends - reference, axis=1, keepdims=True))
        aligned = ends - lag
        at, has_prev = predecessors(steps)
        before = np.where(has_prev, aligned[:, at], np.nan)
        both = np.isfinite(aligned) & np.isfinite(before)
        return np.asarray(np.nanquantile(np.where(both, aligned, np.nan), HOST_QUANTILE, axis=0)
                          - np.nanquantile(np.where(both, before, np.nan), HOST_QUANTILE, axis=0))


def first_slow_hosts(per_host: np.ndarray, steps: np.ndarray) -> tuple[pd.DataFrame, int | None] | None:
    """The steps table of the hosts whose own slow steps begin first, where most hosts have some
    and the job's steps have none (None otherwise).

    With no sync at a step's end, the last stages' hosts see the first stage's slow step one step
    later: a fault on and off in every other step is slow on some host in every step, so the
    quantile over hosts has no normal step to measure against ("healthy" from the summaries, a NIC at
    1.64x on the independent generator). A cause comes before its spill: the hosts slow first hold
    the fault's steps. Up to SPILL_HOSTS hosts, spread over the job, are judged; most of them must
    have slow steps, or a quarter of them (two at least) agree on the first: where steps are sampled,
    the last stage's hosts also end the step after each unlogged slow one late, and their noise hid a
    1.35x switch that the first stage's hosts, half of a pp2 job's, showed cleanly."""
    pick = np.unique(np.linspace(0, len(per_host) - 1, min(len(per_host), SPILL_HOSTS)).round().astype(int))
    onsets: dict[int, int | None] = {}
    for h in pick:  # (a bounded number of hosts, one rolling judgement each)
        row = pd.Series(per_host[h] * 1e-9, index=pd.Index(steps, name="step"), name="duration_s").dropna()
        if len(row) >= 4:
            onsets[int(h)] = judge_window(row)[2]
    slow = {h: on for h, on in onsets.items() if on is not None}
    if not slow:
        return None
    first = min(slow.values())
    agree = [h for h, on in slow.items() if on == first]
    if 2 * len(slow) <= len(onsets) and len(agree) < max(2, len(onsets) / 4):
        return None
    table, onset = judged_over_hosts(per_host[agree], steps)
    return (table, onset) if table["irregular"].any() else None


def judged_over_hosts(per_host: np.ndarray, steps: np.ndarray,
                      cadence: np.ndarray | None = None) -> tuple[pd.DataFrame, int | None]:
    """The steps table of hosts × steps durations (ns): HOST_QUANTILE over the hosts, or the
    `aligned_cadence` where one is given and known, judged as the timeline judges steps; and the
    onset step."""
    with warnings.catch_warnings():  # a step no host measured has no duration (NaN)
        warnings.simplefilter("ignore", RuntimeWarning)
        ns = np.nanquantile(per_host, HOST_QUANTILE, axis=0)
    if cadence is not None:
        ns = np.where(np.isfinite(cadence), cadence, ns)
    dur = pd.Series(ns * 1e-9, index=pd.Index(steps, name="step"))
    table, _, onset = judge_window(dur.rename("duration_s"))
    return table, onset


#: rank x step compute, which ranks are known, the steps (`compute_matrix`)
Matrix = tuple[np.ndarray, np.ndarray, list[int]]


def compute_matrix(summary: pd.DataFrame, meta: JobMeta, keep_first: bool = False) -> Matrix:
    """Rank × step compute from the summaries: each rank's own row where it was an outlier on
    its host, else its host's median; which ranks are known; the steps (the first, warm-up, left
    out when there are more than two, unless `keep_first`)."""
    star = summary[summary["group"] == "*"]
    steps = sorted(int(s) for s in star["step"].unique())
    if len(steps) > 2 and not keep_first:
        steps = steps[1:]
    world = max(meta.world_size, int(summary["rank"].max()) + 1) if len(summary) else meta.world_size
    hosts = star[(star["rank"] < 0) & star["step"].isin(steps)]
    # each rank reads its host's rows (a summary made without a host map names ranks "rank-R")
    host_name = np.array([meta.host_of(r) if r in meta.ranks else f"rank-{r}" for r in range(world)], dtype=object)
    codes, names = pd.factorize(np.r_[host_name, hosts["host"].to_numpy(object)])
    rank_host, row_host = codes[:world], codes[world:]
    table = np.full((len(names), len(steps)), np.nan)
    table[row_host, np.searchsorted(steps, hosts["step"].to_numpy(np.int64))] = hosts["compute_s"].to_numpy(np.float64)
    comp = table[rank_host]
    own = star[(star["rank"] >= 0) & star["step"].isin(steps)]
    if len(own):
        rr = own["rank"].to_numpy(np.int64)
        cc = np.searchsorted(steps, own["step"].to_numpy(np.int64))
        comp[rr, cc] = np.fmax(comp[rr, cc], own["compute_s"].to_numpy(np.float64))
    apart = keep_first and len(steps) > 2  # the first column is read apart (NaN where unknown)
    seen = np.isfinite(comp[:, 1:] if apart else comp).all(axis=1)
    out = np.nan_to_num(comp)
    if apart:
        out[:, 0] = comp[:, 0]
    return out, seen, steps


def slow_ranks(ranks: np.ndarray, slow: np.ndarray, bar: float, most: int) -> list[int]:
    """Up to `most` of `_slow_ratios`' ranks that computed longer in some of its steps than in the
    normal ones, by more than its bar; the slowest of each step in turn (interleaved step by step).
    A fault that moves from step to step (a different replica's data each time) is seen in every
    step, one that stays (a slow GPU) in all of them."""
    if not slow.size:
        return []
    order = np.argsort(-slow, axis=0, kind="stable")
    picked = ranks[order.ravel()][np.take_along_axis(slow, order, axis=0).ravel() > bar]
    return [int(r) for r in dict.fromkeys(picked.tolist())][:most]


def _slow_ratios(matrix: Matrix, steps: list[int], normal: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """How much longer each rank computed in `steps` than in the `normal` ones, from `compute_matrix`'s
    table: the ranks known, the steps of `steps` known (columns), each rank's compute over the
    step's typical rank and over its own level in the normal steps (a last stage computes longer
    every step: that is its role, not a fault), and the bar a slow rank must pass: 1.1x and
    more than any rank strayed from its own level in a normal step (the ranks' noise)."""
    comp, seen, all_steps = matrix
    ranks = np.flatnonzero(seen)

    def ratio(at: list[int]) -> np.ndarray:
        x = comp[np.ix_(ranks, np.flatnonzero(np.isin(all_steps, at)))]
        return x / np.maximum(np.median(x, axis=0), 1e-12) if x.size else x

    cols = np.asarray(all_steps, dtype=np.int64)[np.isin(all_steps, steps)]
    slow, calm = ratio(steps), ratio(normal)
    if not slow.size:
        return ranks, cols, slow, 1.1
    level = np.median(calm, axis=1, keepdims=True) if calm.size else np.ones((len(ranks), 1))
    slow, calm = slow / np.maximum(level, 1e-12), calm / np.maximum(level, 1e-12)
    return ranks, cols, slow, max(1.1, float(calm.max(initial=0.0)))


def slow_leaders(ranks: np.ndarray, cols: np.ndarray, slow: np.ndarray, bar: float) -> dict[int, frozenset[int]]:
    """Each step's ranks that passed the bar (`_slow_ratios`' columns), where any did. Ranks, not
    their hosts: where every host holds both replicas of a stage, a replica's turn and the other's
    fall on the same hosts."""
    over = slow > bar
    return {int(cols[j]): frozenset(int(r) for r in ranks[over[:, j]]) for j in np.flatnonzero(over.any(axis=0))}


def time_weighted_median(log_ratio: np.ndarray) -> float:
    """The median slowdown of the time the irregular steps lost (each step weighs its ratio - 1,
    at most LOSS_CAP times the plain median step's): a straggler's 15x steps among a busy
    machine's more numerous 1.8x hiccups are the typical ones, which a plain median of the steps
    put among the hiccups (fetched, they read "host"); a few 10x checkpoint stalls among a mild
    fault's many 1.2x steps are not."""
    order = np.argsort(log_ratio)
    excess = np.clip(np.expm1(log_ratio[order]), 1e-9, None)
    weight = np.minimum(excess, LOSS_CAP * float(np.median(excess)))
    half = np.searchsorted(np.cumsum(weight), 0.5 * weight.sum())
    return float(log_ratio[order][min(int(half), order.size - 1)])


def typical_steps(irr_tab: pd.DataFrame, leaders: Mapping[int, frozenset[Hashable]]) -> list[int]:
    """MAX_STEPS irregular steps to fetch: the most typical ones (nearest the median slowdown of the
    time lost, `time_weighted_median`; the slowest hold the fault plus whatever else disturbed the
    job then, a busy host, which makes every transfer look slow), those whose slow ranks
    (`leaders`) share none with the steps taken first: a fault that moves from replica to replica
    is seen moving, not twice in one place by chance (a data fault whose three fetched steps fell
    to one replica twice read as a device).
    Where most irregular steps had slow ranks, the fault is theirs and those steps come first: a
    step with none is one the fault did not show in (a busy machine's step before it, which, taken,
    left no rank slow in most fetched steps: nothing was fetched and the job read healthy).
    Where the fault showed in just two places, a second step of each: two replicas taking turns
    show it only as two turns each (one of three steps is no turn; a device holds every one)."""
    log_ratio = np.log(irr_tab["ratio"].astype(float).to_numpy())
    typical = time_weighted_median(log_ratio)
    off = np.abs(log_ratio - typical)
    ranked = irr_tab.assign(off=off).sort_values(["off", "step"])["step"].astype(int).tolist()
    # a place the fault moved to loses about as much time as the typical step; a busy machine's
    # 1.8x hiccup led by another rank is no turn of a straggler's 15x
    lost = np.log(np.clip(np.expm1(log_ratio), 1e-9, None) / max(np.expm1(typical), 1e-9))
    alike = set(irr_tab["step"].astype(int).to_numpy()[np.abs(lost) <= np.log(ALIKE_LOSS)].tolist())
    shown = [s for s in ranked if leaders.get(s)]
    theirs = 2 * len(shown) >= len(ranked)  # the fault shows as ranks that computed longer
    if theirs:
        ranked = shown + [s for s in ranked if not leaders.get(s)]
    picked: list[int] = []
    taken: set[Hashable] = set()
    for s in shown if theirs else ranked:
        own = leaders.get(s, frozenset())
        if len(picked) < MAX_STEPS and s in alike and not (own & taken):
            picked.append(s)
            taken.update(own)
    if theirs and len(picked) == 2:
        for first in list(picked):
            again = [s for s in shown if s not in picked and s in alike and leaders[s] & leaders[first]]
            picked += again[:1]
    picked += [s for s in ranked if s not in picked][:max(MAX_STEPS - len(picked), 0)]
    return sorted(picked)


def plan_fetch(summary: pd.DataFrame, meta: JobMeta, table: pd.DataFrame) -> FetchPlan:
    """Steps: the most typical irregular ones, each with the step logged before it, and the last normal
    ones before. Ranks: the groups of the ranks that computed longest in each of those steps
    (`slow_ranks`), smallest groups first, within a small budget of ranks per step; when no rank did
    (a network fault), the groups with the most abnormal time within a wide one. A group not
    fetched whole is never judged."""
    irr_tab = table[table["irregular"].astype(bool)]
    irregular = [int(s) for s in irr_tab["step"]]
    if not irregular:
        return FetchPlan([], [], [])
    usable = ~table["irregular"].astype(bool) & ~table["pattern"].isin(["warm-up"])
    logged = np.sort(table["step"].astype(int).to_numpy())
    # the run's first recorded step may be partial (a logger starting mid-step): never history, as on
    # the full path (`commops.partial_first`); every step fetched as history is then whole
    first = partial_first(logged)
    if first is not None and (usable & (table["step"] != first)).any():
        usable &= table["step"] != first
    # a step under δ that lost a fault step's share of time (an on-and-off fault's milder turns) is
    # no history either: two such steps of five widened a ring's usual range until no transfer read slow
    least = float(irr_tab["ratio"].astype(float).min()) - 1.0
    mild = table["ratio"].astype(float) - 1.0 >= CONTEXT_EXCESS * least
    if (usable & ~mild).any():
        usable &= ~mild
    # the step logged right before a slow run began: hosts' own-clock step ends (a quantile over
    # hosts) show a fault's first step late when only a few hosts ran it slow, so it may hold the
    # fault's start; it is context, not history, while enough normal steps are left without it (the
    # full path counts it: a real HSDP job's NIC throttled at step 18 left fourteen normal steps
    # before it, too few for the 90th-percentile rule, and the summaries named its link)
    irr_set = set(irregular)
    border = table["step"].isin({int(logged[i - 1]) for i, s in enumerate(logged) if i and int(s) in irr_set
                                 and int(logged[i - 1]) == int(s) - 1 and int(s) - 1 not in irr_set})
    clean = usable & ~border if (usable & ~border).any() else usable

    def normal_before(first: int) -> list[int]:
        before = table["step"] < first
        for steps in (clean & before, usable & before):
            normal = table.loc[steps, "step"].astype(int).tolist()
            if len(normal) >= MAX_NORMAL:
                return normal
        return table.loc[clean, "step"].astype(int).tolist()

    matrix = compute_matrix(summary, meta)
    worst = typical_steps(irr_tab, slow_leaders(*_slow_ratios(matrix, irregular, normal_before(irregular[0])[-MAX_NORMAL:])))
    normal = normal_before(worst[0])
    # each step with the one logged before it: a rank's operator streams run across step boundaries,
    # and the wait graph measures a rank's compute only between consecutive records of a stream
    # (the normal step only gives the operators' history: it needs no predecessor)
    before = logged[np.maximum(np.searchsorted(logged, worst) - 1, 0)]
    fetch_steps = sorted({*worst, *before.tolist(), *normal[-MAX_NORMAL:]})
    # a step fetched before one of them is judged too when it was as slow as they were (more of the
    # fault); one far less slow is context only -- without a sync at a step's end, the step after a
    # spike reads slow from hosts' own clocks (those that finished early wait in it) and is normal
    excess = irr_tab.set_index("step")["ratio"].astype(float) - 1.0
    floor = CONTEXT_EXCESS * float(excess.reindex(worst).min())
    judged = sorted({*worst, *(int(b) for b in before if int(b) in excess.index and excess[int(b)] >= floor)})
    sub = summary[summary["step"].isin(worst)]
    per_group = abnormal_beyond_peers(sub[sub["group"] != "*"].groupby("group")["abnormal_s"].sum(), meta)
    # ranks that computed longer explain the slowdown only when they did in most of the steps
    # (one rank's noise in one of them is no straggler: a link's slow steps then read as a GPU)
    known, cols, ratio, bar = _slow_ratios(matrix, worst, normal[-MAX_NORMAL:])
    # ... and by a good part of what the step lost (a 1.15x compute hiccup of one rank in one of two
    # steps was fetched as the straggler of a GPU that logged nothing and 2.2x)
    explained = False
    if ratio.size:
        comp, _, all_steps = matrix
        typical = np.median(comp[np.ix_(known, np.flatnonzero(np.isin(all_steps, cols)))], axis=0)
        lost = (irr_tab["duration_s"] - irr_tab["baseline_s"]).set_axis(irr_tab["step"].astype(int)).reindex(cols)
        big = (ratio > bar) & ((ratio - 1) * typical >= EXPLAIN_SHARE * np.nan_to_num(lost.to_numpy(float)))
        explained = float(big.any(axis=0).mean()) >= 0.5 and not lone_flukes(known, ratio, big, bar, meta)
    slow = slow_ranks(known, ratio, bar, MAX_RANKS * len(worst)) if explained else []
    # no rank computed longer: slow transfers, which only many groups side by side can pin on
    # one NIC, link or switch -- the wide budget; so too ranks on several hosts slow in one step
    # (a replica's data, a stage): whether the whole replica was slow, and not one of its hosts, shows
    # only in its peers' waits on all of it (the data-parallel groups, which span the job)
    # (each irregular step may have its own slowest ranks -- a different replica's data each time --
    # and a unit is told from its peers only with their groups fetched whole)
    spread = any(len({meta.host_of(int(r)) for r in known[col > bar] if int(r) in meta.ranks}) > 1 for col in ratio.T)
    budget = MAX_RANKS * len(worst) if slow and not spread else MAX_RANKS_NET
    rank_groups: dict[int, list[str]] = {}
    for g, mem in meta.groups.items():
        for r in mem:
            rank_groups.setdefault(r, []).append(g)
    chosen: list[str] = []
    ranks: set[int] = set()
    every = sorted(meta.groups, key=lambda g: (len(meta.groups[g]), g))
    # smallest groups first over all slow ranks: a slow host's ranks each get their nearest peers
    around = {g for r in slow for g in rank_groups.get(int(r), [])}
    wanted = [g for g in every if g in around]
    # around slow ranks their own groups are the wait graph's evidence; without, the abnormal ones
    # first, then every other group while the budget lasts: the ranks that waited abnormally are
    # a slow NIC's victims, and its own host's ranks, which sent late but never waited, may show
    # no abnormal time at all (a real throttled NIC: its host was not fetched, and the summaries
    # named a GPU of a host it fed at 0.01)
    abnormal = [str(g) for g in per_group.index]
    # with no slow rank, whole hosts where the budget allows: their groups that never leave the
    # host are what tells a slow host from its NIC, and the ones that stayed normal clear devices
    on_host = meta.ranks_by_host()
    # slow ranks on several hosts in one step are no one device's: their groups first, then the
    # abnormal ones and the rest as for a network fault (a NIC's one-step spike on a 4,096-GPU
    # job made 44 ranks on 44 hosts compute 3x; fetched around them alone, the NIC's host was not,
    # and a GPU they shared a group with was named where the full records name the NIC)
    narrow = bool(slow) and not spread
    listed = set(wanted) | set(abnormal)
    for g in wanted if narrow else [*wanted, *abnormal, *(g for g in every if g not in listed)]:
        if len(ranks) >= budget:
            break
        members = set(meta.groups.get(g, []))
        if g in chosen or not members or len(ranks | members) > budget:
            continue
        chosen.append(g)
        hosts_ranks = {x for r in members if r in meta.ranks for x in on_host[meta.host_of(r)]}
        ranks.update(members if wanted or len(ranks | members | hosts_ranks) > budget else members | hosts_ranks)
    return FetchPlan(irregular, fetch_steps, sorted(ranks), chosen, judged=judged, history=normal[-MAX_NORMAL:])


def lone_flukes(ranks: np.ndarray, ratio: np.ndarray, big: np.ndarray, bar: float, meta: JobMeta) -> bool:
    """Whether the ranks that passed the bar (`big`: rank × step, True where it passed; `ratio`, its
    compute over its level) are the ranks' noise: each step's one lone host, in two steps or more
    with no host in two of them, or in one step of several, none by more than twice the normal
    steps' largest stray (one lone host in one of two steps named a GPU for a switch's spike, from
    one prolonged operator, on the independent generator). A straggler
    holds its place from step to step, a replica's data spans hosts; and the largest of hundreds
    of ranks in a slow step passes the largest of the normal steps' about one time in three (a
    switch's two-step spike on 256 GPUs: two ranks on two hosts just over the bar narrowed the
    fetch to their groups, the switch was not fetched, and the summaries said "data")."""
    per_step = [{meta.host_of(int(r)) if int(r) in meta.ranks else f"rank-{int(r)}" for r in ranks[col]}
                for col in big.T if col.any()]
    if not per_step or any(len(h) > 1 for h in per_step) or (ratio[big] - 1 >= 2 * (bar - 1)).any():
        return False
    if len(per_step) == 1:  # one lone host in one of the steps: the others slowed without it
        return big.shape[1] > 1
    seen = [h for hosts in per_step for h in hosts]
    return len(set(seen)) == len(seen)


def abnormal_beyond_peers(per_group: pd.Series, meta: JobMeta) -> pd.Series:
    """Abnormal groups (group -> abnormal seconds), most abnormal beside their peers first: by the
    ratio to the median of the abnormal groups of their size (a group's kind: rings with rings,
    pipeline chains with chains), then by the seconds. A slow NIC makes every data-parallel ring
    of the job wait, evenly, and its own pipeline groups several times more than the other
    pipeline groups: ranked by seconds alone, the rings filled the budget of a 4,096-GPU job and
    the NIC's pipeline transfers were never fetched (a tie of 288 devices, where the full
    records name the NIC). The most abnormal group of each size leads, though: on an 8,192-GPU job
    a slow link crossed only by rings of 512 ranks left small groups that waited on the ring far
    above their peers, which filled the budget; no ring was fetched, no transfer judged, and a
    host was named at 0.009."""
    if per_group.empty:
        return per_group
    size = pd.Series([len(meta.groups.get(str(g), ())) for g in per_group.index], index=per_group.index)
    ratio = per_group / per_group.groupby(size).transform("median").clip(lower=1e-12)
    ranked = pd.DataFrame({"ratio": ratio, "s": per_group, "size": size}).sort_values(["ratio", "s"], ascending=False)
    head = ~ranked["size"].duplicated()
    return per_group.reindex([*ranked.index[head], *ranked.index[~head]])


#: fetches the full CommOps rows (COLUMNS) of some ranks over an inclusive step range, in trace order
Fetch = Callable[[list[int], tuple[int, int]], pd.DataFrame]


def localize_from_summary(trace: Trace, top: int = 5, forest: bool = False) -> tuple[Verdict, FetchPlan]:
    """Localize from the trace's summaries, fetching full records only for the planned ranks and
    steps (whole hosts' rows, numbered as their summaries were, where the logger wrote no step numbers)."""
    hosts = trace.meta.ranks_by_host()
    probe = trace.commops(columns=["step"], ranks=[min(trace.meta.ranks, default=0)])["step"].to_numpy()
    numbered = not len(probe) or bool((probe >= 0).any())

    def fetch(ranks: list[int], steps: tuple[int, int]) -> pd.DataFrame:
        if numbered:
            return trace.commops(columns=COLUMNS, ranks=ranks, steps=steps)
        parts = [host_rows(trace.commops(columns=COLUMNS, ranks=hosts[h]), ranks, steps)
                 for h in sorted({trace.meta.host_of(r) for r in ranks})]
        return pd.concat(parts, ignore_index=True) if parts else trace.commops(columns=COLUMNS, ranks=[])

    return localize_summary(read_summary(trace), trace.meta, fetch, top, forest)


def localize_summary(summary: pd.DataFrame, meta: JobMeta, fetch: Fetch, top: int = 5,
                     forest: bool = False) -> tuple[Verdict, FetchPlan]:
    """Localize from summaries, fetching full records through `fetch` only for the planned ranks
    and steps (the same reduce whether the rows come from this process or a cluster's workers).

    The fetched operators are judged with the same robust rule the sidecars use (`forest`
    switches to the random forest, about three times slower). With no irregular step, the
    summaries' compute says whether the job was slow from the start (`localize.waits.persistent`)."""
    table, onset = without_partial_first(*step_table(summary))
    observed = not meta.groups
    meta, sample = _with_groups(summary, meta, fetch)
    plan = plan_fetch(summary, meta, table)
    if not plan.irregular:
        return _persistent_from_summary(summary, meta, fetch, top, sample), plan
    df = fetch(plan.ranks, (plan.fetch_steps[0], plan.fetch_steps[-1]))
    df = df[df["step"].isin(plan.fetch_steps)].reset_index(drop=True)
    plan.rows_fetched = len(df)
    fetched = set(plan.ranks)
    if observed:
        meta = without_singletons(meta)
    partial = {g for g, m in meta.groups.items() if not set(m) <= fetched}
    worst = plan.judged
    sub_table = table[table["step"].isin(plan.fetch_steps)].assign(history=lambda t: t["step"].isin(plan.history))
    irr = table[table["irregular"].astype(bool)]
    slow = float(irr["duration_s"].median() / table.loc[~table["irregular"].astype(bool), "duration_s"].median())
    view = StepView(meta.job, meta, sub_table, worst, slow, "irregular")
    recorded = set(summary["host"].astype(str))
    quiet = np.array([(info := meta.ranks.get(r)) is not None and info.host not in recorded for r in range(meta.world_size)])
    # ranks asked for that logged nothing: the plan's, and every rank where one step of each was read
    asked, logged = set(fetched), set(pd.unique(df["rank"]).tolist())
    if sample is not None:
        asked |= set(meta.ranks)
        logged |= set(pd.unique(sample["rank"]).tolist())
    unlogged = bool(asked - logged)
    verdict, analysis = analyse_ops(df, meta, view, top, partial, forest, unlisted=observed, quiet=quiet,
                                    some_unlogged=unlogged)
    verdict.irregular_steps = list(plan.irregular)
    verdict.onset_step = onset if verdict.status == "irregular" else None
    top_c = verdict.candidates[0] if verdict.candidates else None
    if verdict.onset_step is not None and top_c is not None and top_c.kind in ("gpu", "host"):
        comp, seen, steps = compute_matrix(summary, meta)
        kinds = group_kinds(analysis.ops) if analysis is not None else {}
        ranks, steps_of = candidate_ranks(top_c, meta), np.asarray(steps, dtype=np.int64)
        verdict.onset_step = later_onset(worker_onset(comp, seen, steps_of, meta, kinds, ranks), verdict.onset_step,
                                         plan.irregular, table)
        first = first_slow_step(comp, seen, steps_of, meta, kinds, ranks, plan.irregular)
        if first is not None and first < verdict.onset_step:
            verdict.onset_step = first  # (on and off: its first slow step)
    verdict.extra.update({"from": "summary", "ranks_fetched": len(plan.ranks), "rows_fetched": plan.rows_fetched,
                          "steps_judged": plan.judged})
    if few_irregular(verdict.irregular_steps, table):
        verdict = lasting_over_few_steps(verdict, _persistent_from_summary(summary, meta, fetch, top, sample), table)
    return verdict, plan


def without_partial_first(table: pd.DataFrame, onset: int | None) -> tuple[pd.DataFrame, int | None]:
    """The step table with its first recorded step not irregular when it is partial (warm-up, a
    logger starting mid-step: `commops.partial_first`, as on the full path) and another is
    irregular; the onset moves to the next irregular step. Planned as a slow step, a warm-up spike
    took the fetch's budget and its history (the normal steps before the first judged one)."""
    first = partial_first(table["step"].astype(int).to_numpy())
    irregular = table["irregular"].astype(bool).to_numpy()
    if first is None or not irregular[1:].any() or not irregular[0] or int(table["step"].iloc[0]) != first:
        return table, onset
    table = table.assign(irregular=np.r_[False, irregular[1:]],
                         pattern=np.r_[["warm-up"], table["pattern"].to_numpy(object)[1:]])
    if onset == first:
        onset = int(table.loc[table["irregular"].astype(bool), "step"].iloc[0])
    return table, onset


def without_singletons(meta: JobMeta) -> JobMeta:
    """`meta` less its groups of one member: groups observed in fetched rows, where one rank logged
    a group whose other members did not log (no job runs a collective over a group of one).
    Listed so, the group would read as whole, and its waits as no one's (`localize.ops.lone`)."""
    return replace(meta, groups={g: m for g, m in meta.groups.items() if len(m) > 1})


def _with_groups(summary: pd.DataFrame, meta: JobMeta, fetch: Fetch) -> tuple[JobMeta, pd.DataFrame | None]:
    """`meta`, with its groups read from one fetched step of every rank when meta.json has none
    (the contract allows it): the fetch plan picks groups to read whole, and needs their members.
    Also that step's rows (None when nothing was fetched)."""
    if meta.groups or summary.empty:
        return meta, None
    last = int(summary["step"].max())
    sample = fetch(sorted(meta.ranks), (last, last))
    return (with_observed_groups(meta, prepare_ops(sample)) if len(sample) else meta), sample


def _persistent_from_summary(summary: pd.DataFrame, meta: JobMeta, fetch: Fetch, top: int,
                             sample: pd.DataFrame | None = None) -> Verdict:
    """Slow from the start, judged on the summaries' compute per rank and step: worker against
    its stage peers, stage against stage (the group kinds from one fetched step when the group
    names do not say them). `sample`: the last step of every rank's records, when fetched already
    (meta.json listed no groups)."""
    comp, seen, all_steps = compute_matrix(summary, meta, keep_first=True)
    before, comp, steps = first_apart(comp, all_steps)
    extra: dict[str, object] = {"from": "summary"}
    if not steps or not seen.any():
        return Verdict(meta.job, "healthy", [], 1.0, [], {"source": "commops", **extra})
    kinds = {g: k for g in meta.groups if (k := kind_in_name(g)) is not None}
    observed = sample is not None
    if len(kinds) < len(meta.groups):
        if sample is None:
            sample = fetch(sorted(meta.ranks), (steps[-1], steps[-1]))
        kinds = {**kinds, **group_kinds(prepare_ops(sample))} if len(sample) else kinds  # (names: groups none logged)
    table, _ = step_table(summary)
    durations = step_times_past_warmup(table)
    # a rank without a summary row of its own reads its host's: where no group tells its stage,
    # that copy would join stage 0's peers (a slow stage's unlogged ranks, slow workers there)
    stage, staged = pipeline_stages(meta, len(seen), kinds)
    seen &= staged
    found = imbalance(comp, seen, np.asarray(steps, dtype=np.int64), meta, kinds, top, before=before)
    first = found.units[0] if found.units else None
    by_host = pd.Series(stage).groupby([meta.host_of(r) if r in meta.ranks else "" for r in range(len(seen))])

    @functools.cache
    def judged_recent() -> Imbalance | None:
        """The last UNSEEN_STEPS steps of every rank's records, judged stage against stage:
        fetched once, for either reason below."""
        recent = fetch(sorted(meta.ranks), (steps[-min(len(steps), UNSEEN_STEPS)], steps[-1]))
        return persistent_imbalance(recent, without_singletons(meta), top, kinds) if len(recent) else None

    if first is not None and (by_host.nunique() > 1).any():
        # a host holds several pipeline stages: its summary's median is none of them (a stage given
        # more work hid in its hosts' medians, and an outlier rank of it read as a slow GPU); what
        # the summaries found is judged again, stage against stage, on the last steps of every
        # rank's records, which win where they name another unit
        whole = judged_recent()
        if whole is not None and whole.units and (
                (whole.units[0].kind, whole.units[0].ranks) != (first.kind, first.ranks)):
            found, first = whole, whole.units[0]
            extra["note"] = f"judged on the last {UNSEEN_STEPS} steps of every rank's records (hosts that hold several stages)"
    if (first is None or first.kind not in ("gpu", "host")) and (observed or set(meta.hosts()) - set(summary["host"])):
        # hosts none of whose ranks logged, or no groups listed: an unlogged rank's delay shows only
        # as its peers' waits in collectives no other member logged, which a node cannot tell from
        # groups whose other members log elsewhere; the last steps of every rank's records can (as
        # on the full-record path). Only that is taken from them: what the summaries could see and
        # did not is no finding (one step's noise)
        whole = judged_recent()
        if whole is not None and whole.units and whole.units[0].via is not None:
            found, first = whole, whole.units[0]
            extra["note"] = f"judged on the last {UNSEEN_STEPS} steps of every rank's records (ranks that logged nothing)"
    if first is not None and first.kind in ("gpu", "host") and found.since is not None:
        # slow since a step: what grew in the unit's own records, each rank against its earlier steps
        # (on their hosts: a host's other logged ranks say whether the host is the cause)
        near = sorted({r for r in meta.ranks if meta.host_of(r) in {meta.host_of(x) for x in first.ranks}} | set(first.ranks))
        rows = fetch(near, (int(summary["step"].min()), int(summary["step"].max())))
        grown = grown_devices(rows, meta, kinds, found.since, groups_within(meta.groups, near))
        if grown and set(grown[0].witnesses) <= set(first.ranks):
            grown[0].share = first.share
            found.units[0] = grown[0]
        if found.units[0].also:
            # still a GPU or its host (the host's one logged rank): whether its unlogged peers were
            # slow too shows in their waits over the last slow steps of every rank's records
            slow = found.on_off or [int(s) for s in steps if s >= found.since]
            rows = fetch(sorted(meta.ranks), (slow[-min(len(slow), 2 * UNSEEN_STEPS)], slow[-1]))
            found.units[0] = unlogged_wait(found.units[0], rows[rows["step"].isin(slow)], meta, kinds, top)
    elif first is not None and first.kind in ("gpu", "host"):
        if sample is None:
            sample = fetch(sorted(meta.ranks), (steps[-1], steps[-1]))
        found.units[0] = unlogged_wait(first, sample, meta, kinds, top)
    return imbalance_verdict(meta, found, int(summary["step"].min()), extra, steps=np.asarray(steps), durations=durations)


def unlogged_wait(unit: RankUnit, rows: pd.DataFrame, meta: JobMeta, kinds: dict[str, str], top: int) -> RankUnit:
    """`unit` (a GPU or host the summaries name), or what its records show it stands for: a host's
    compute counts the time its ranks waited in collectives whose other members logged nothing,
    and its unlogged GPUs its logged ones' compute, which the summaries cannot tell apart; a step
    of every rank's records (`rows`) can."""
    if not len(rows):
        return unit
    for u in persistent_imbalance(rows, without_singletons(meta), top, kinds).units:
        if u.kind in ("gpu", "host") and set(u.witnesses) <= set(unit.ranks):
            u.share = unit.share
            return u
    return unit
