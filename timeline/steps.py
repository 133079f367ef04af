"""Per-step durations that survive unsynchronized clocks, hidden step numbers, and δ-irregularity.

Times of different hosts are never compared raw. Per rank, a step lasts from its first
operator of step k to its first of step k+1 on its own clock (`step_durations_per_rank`, what
localization compares across ranks). For the job, host clocks are first aligned on the
operators they share (`timeline.instances.estimate_clock_offsets`), and the job's step ends
when its last rank ends it, as the training loop sees it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta
from collector.trace.schema import P2P_OPS
from timeline.columns import codes
from timeline.instances import estimate_clock_offsets, host_codes, instance_ids

#: Normal steps the rolling baseline looks back over (Holmes' sliding window).
WINDOW = 10
#: a first recorded step is whole when each rank logged this share of an average step's operators
WHOLE_FIRST = 0.9
#: ... and when judged against the faster half of all steps (`judge_from_fast_half`)
FAST_HALF_WINDOW = 8
#: steps beyond this many σ of the job's own step noise are irregular, if that exceeds δ
NOISE_SIGMAS = 4.0
#: lower quartile of |a - b| for a, b ~ N(0, σ²), in units of σ
HALF_NORMAL_Q25 = 0.4506
#: successive steps this many times further apart than steps two apart: a fault on and off, not noise
#: (noise moves both alike; at 3, a real on-and-off GPU's 2.8x and 3.9x split the two paths)
ALTERNATION = 2.0
#: Irregular steps at most this many steps apart belong to one episode.
EPISODE_GAP = 4
#: An episode with at least this share of its steps irregular, whose 90th/10th percentile
#: ratios stay within PERSISTENT_SPREAD of each other, is one persistent level.
PERSISTENT_DENSITY = 0.9
PERSISTENT_SPREAD = 1.25
#: A job's first steps run slow for reasons that are not faults (allocator, communicator set-up,
#: compilation): a leading run of at most this many irregular steps (or this share of the steps),
#: followed by WARMUP_NORMAL_AFTER normal ones, is warm-up.
WARMUP_MAX_STEPS = 3
WARMUP_MAX_SHARE = 0.1
WARMUP_NORMAL_AFTER = 3
#: ... and one step more when it is the warm-up's tail: at most this share of the excess of the
#: block's other steps (a host clock that ended the last warm-up step early shows its spill in the next)
WARMUP_TAIL = 0.5
#: ... a longer leading block is warm-up if no step of it runs over this share above the one before
#: (it fades), up to this many steps
WARMUP_FADE_SLACK = 0.1
WARMUP_FADE_STEPS = 8
#: ... and a leading block followed by a normal step is warm-up when each of its steps lost at least
#: this many times the excess of the irregular steps after it: no one fault ran at both levels
WARMUP_ABOVE = 1.8
#: Irregular steps that together lost less than this share of the window's time, none of them
#: SPIKE_RATIO times its baseline, are noise (a busy host now and then), not an irregularity ...
MIN_LOST_SHARE = 0.02
SPIKE_RATIO = 1.5
#: ... nor, in a job whose steps repeat closely, two steps in a row this many σ of its step noise
#: beyond their baseline (one such step is a real healthy job's blip now and then).
SPIKE_SIGMAS = 6.0
#: ... unless it stands LONE_SIGMAS σ of the other steps' spread (`spread_of_normal_steps`) and
#: LONE_RATIO beyond its baseline: the largest stray of 18 real gloo runs on a loaded machine was
#: 4.7σ (9σ of successive differences in ~35 earlier runs), real blips among steps within 0.5% reach
#: 1.15x (13σ and more), while a fault's slow step seen once in sampled steps stood at 1.23-1.49x, 14-80σ.
LONE_SIGMAS = 12.0
LONE_RATIO = 1.2
#: ... nor a run of this many consecutive steps, each beyond the noise (NOISE_SIGMAS σ, as δ is
#: widened), that holds a δ-irregular step: one slowdown, its steps under δ in it too
SUSTAINED_STEPS = 3
#: The onset is the first step of the first episode that lost at least this share of the time lost.
ONSET_SHARE = 0.2
#: ... and it starts at the episode's first step that lost this share of its median step's loss.
ONSET_LEVEL = 0.5
#: An earlier episode whose steps each lost this share of the typical irregular step's loss is the
#: fault's own first steps (on and off, sampled), however short: a blip of noise loses less.
ONSET_LIKE = 0.8
#: A lasting move of the step time to a higher level (a change point) is believed when the later
#: segment's mean log step time sits SHIFT_SIGMAS standard errors above the earlier one's, each
#: segment holds SHIFT_MIN_STEPS steps, and -- unless the later level is DRIFT_MAX times the
#: earlier or more, which is worth saying whatever its shape -- a step fits the durations clearly
#: better than a steady drift does (squared residuals under SHIFT_OVER_TREND x the line's).
SHIFT_SIGMAS = 5.0
#: Step times at two levels (a fault on and off) when the levels lie this many robust σ of the
#: wider one apart, each level holding TWO_LEVEL_MIN_STEPS steps and TWO_LEVEL_MIN_SHARE of them or
#: more (a few blips are spikes, which δ judges).
TWO_LEVEL_SIGMAS = 5.0
TWO_LEVEL_MIN_STEPS = 3
TWO_LEVEL_MIN_SHARE = 0.2
#: ... and, for `calm_delta`, the gap between them this many times the lower level's whole range
GAP_OVER_RANGE = 3.0
#: ... and the upper level comes and goes: at least this many separate runs of its steps
TWO_LEVEL_RUNS = 3
SHIFT_MIN_STEPS = 3
SHIFT_OVER_TREND = 0.5
DRIFT_MAX = 1.5
#: a lone fastest step of the first window may be passed over for the next when the window holds
#: this many normal-looking steps (`_seed`)
LONE_FAST_MIN_STEPS = 4
#: Largest anchor-cycle length (anchor operators per step) that step inference tries.
MAX_CYCLE = 256
#: Fraction of anchor comparisons allowed to break the period (lost rows, reordered streams):
#: a lost anchor spoils two comparisons, while a wrong period spoils half or more.
PERIOD_TOLERANCE = 0.25
#: For pipeline (send/recv) anchors, a shorter period must match almost as well as the best.
PERIOD_SLACK = 0.05


def step_durations_per_rank(df: pd.DataFrame) -> pd.DataFrame:
    """Step × rank table of step durations in seconds, each on the rank's own clock.

    Needs columns rank, step, start_ns, end_ns; rows with step < 0 are ignored. Step k lasts from
    the rank's first operator start in k to its first start in k+1; the last step (no k+1) is
    its last end minus first start plus the rank's typical gap between a step's last end and
    the next step's first start. Steps missing on a rank are NaN.
    """
    known = df[df["step"].to_numpy() >= 0]
    if known.empty:
        return pd.DataFrame(dtype="float64")
    agg = known.groupby(["step", "rank"], sort=True).agg(first=("start_ns", "min"), last=("end_ns", "max"))
    first = agg["first"].unstack("rank").astype("float64")
    last = agg["last"].unstack("rank").astype("float64")
    full = pd.RangeIndex(int(first.index.min()), int(first.index.max()) + 1, name="step")
    first = first.reindex(full)
    last = last.reindex(full)
    nxt = first.shift(-1)
    dur = nxt - first
    gap = (nxt - last).median(axis=0, skipna=True).fillna(0.0).clip(lower=0.0)
    open_end = first.notna() & first.bfill().shift(-1).isna()  # the rank's last step
    dur = dur.where(~open_end, last - first + gap)
    out: pd.DataFrame = dur / 1e9
    out.columns.name = "rank"
    return out


def step_rank_extent(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (step, rank) that has rows, in (step, rank) order: step, rank, first start_ns and
    last end_ns. `groupby(["step", "rank"]).agg(min, max)` over a table of the cells (steps x
    ranks: few steps, every rank), which keeps no row-sized copy of the keys beside the rows."""
    if df.empty:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    step = df["step"].to_numpy()
    rank = df["rank"].to_numpy()
    s_lo, r_lo = int(step.min()), int(rank.min())
    s_val, r_val = _present(step, s_lo), _present(rank, r_lo)
    if len(s_val) * len(r_val) > 4 * len(step) + 4096:  # widely spread numbers: pandas' hash groupby
        agg = df.groupby(["step", "rank"], sort=True).agg(first=("start_ns", "min"), last=("end_ns", "max"))
        return (agg.index.get_level_values("step").to_numpy(np.int64),
                agg.index.get_level_values("rank").to_numpy(np.int64),
                agg["first"].to_numpy(np.int64), agg["last"].to_numpy(np.int64))
    n_cells = len(s_val) * len(r_val)
    kind = np.int32 if n_cells < 2**31 else np.int64  # (cell codes held narrow: a row-sized array)
    s_code = np.zeros(int(s_val[-1]) - s_lo + 1, dtype=kind)
    s_code[s_val - s_lo] = np.arange(len(s_val)) * len(r_val)
    r_code = np.zeros(int(r_val[-1]) - r_lo + 1, dtype=kind)
    r_code[r_val - r_lo] = np.arange(len(r_val))
    cell = s_code[step - s_lo]
    cell += r_code[rank - r_lo]
    never = np.iinfo(np.int64).max  # (no start_ns reaches it: the contract bounds them)
    first = np.full(n_cells, never, dtype=np.int64)
    np.minimum.at(first, cell, df["start_ns"].to_numpy(np.int64))
    last = np.full(n_cells, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, cell, df["end_ns"].to_numpy(np.int64))
    del cell
    at = np.flatnonzero(first != never)
    return s_val[at // len(r_val)], r_val[at % len(r_val)], first[at], last[at]


def _present(values: np.ndarray, lo: int) -> np.ndarray:
    """The distinct values of an integer column, sorted (by a table over their range when it is
    no wider than the column, else by a sort)."""
    span = int(values.max()) - lo + 1
    if span > len(values) + 4096:
        return np.unique(values).astype(np.int64)
    seen = np.zeros(span, dtype=bool)
    seen[values - lo] = True
    return np.flatnonzero(seen) + lo


def job_step_durations(df: pd.DataFrame, meta: JobMeta, offsets: pd.DataFrame | None = None) -> pd.Series:
    """One duration per step: from the job's step end to the next, on a common clock.

    A step ends when its last rank finishes it. Ranks cut the same stretch of time into steps
    at different points of the pipeline (a late stage's own step k+1 holds part of a slow step
    k), so per-rank periods smear one slow step over two. Instead each host's clock offset is
    estimated on a few sampled steps and interpolated between them (`clock_offsets_by_step`,
    computed here unless given), and a step ends at the latest corrected end of any rank.
    Needs rank, step, start_ns, end_ns (and group, op, seq, peer when offsets are not given).
    """
    keep = df["step"].to_numpy() >= 0
    known = df if keep.all() else df[keep]  # (no copy of every row when every row has its step)
    del keep
    if known.empty:
        return pd.Series(dtype="float64", name="duration_s")
    return extent_step_durations(step_rank_extent(known), meta,
                                 clock_offsets_by_step(known, meta) if offsets is None else offsets)


def extent_step_durations(extent: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], meta: JobMeta,
                          offset: pd.DataFrame) -> pd.Series:
    """`job_step_durations` from each (step, rank)'s extent (`step_rank_extent` of the rows with
    a step) and the clock offsets: what it needs of the rows, so they need not be kept for it."""
    steps, ranks, first, last = extent
    if len(steps) == 0:
        return pd.Series(dtype="float64", name="duration_s")
    host, _ = host_codes(meta, ranks)
    base = float(first.min())
    shift = offset.to_numpy()[np.searchsorted(offset.index.to_numpy(), steps), host]
    end = pd.Series(last.astype(np.float64) - base - shift).groupby(steps).max()
    starts = pd.Series(first.astype(np.float64) - base - shift).groupby(steps)
    begin = starts.min()
    present = end.index.to_numpy(np.int64)
    dur = durations_from_bounds(present, begin.to_numpy()[None, :], end.to_numpy()[None, :])[0]
    dur = _from_last_start(present, starts.quantile(LAST_START_QUANTILE).to_numpy(), end.to_numpy(), dur)
    out = pd.Series(dur / 1e9, index=pd.Index(present, name="step"), name="duration_s")
    if np.isin(present[1:] - 1, present).all():  # consecutive steps: keep a step no rank logged, as NaN
        out = out.reindex(pd.RangeIndex(int(present.min()), int(present.max()) + 1, name="step"))
    return out


#: where the last ranks begin a step, in the order ranks start it: a stage the previous step held
#: is at least a tenth of the ranks (pp <= 10), one slow GPU starting its own step late is not
LAST_START_QUANTILE = 0.95


def predecessors(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per logged step (`steps` sorted): the index of the step numbered one less (clipped into
    range where there is none), and whether it was logged."""
    at = np.minimum(np.searchsorted(steps, steps - 1), max(len(steps) - 1, 0))
    return at, (steps[at] == steps - 1) if len(steps) else np.zeros(0, dtype=bool)


def _from_last_start(steps: np.ndarray, latest: np.ndarray, end: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Durations (ns) with each step logged without its predecessor (sampled steps, a window's
    first step) measured from where its last ranks start it (`latest`, LAST_START_QUANTILE), on a common
    clock, to its end, plus the pause the consecutive logged steps show between a step's end and
    the next one's last start.

    A rank posts its first operator of a step once it finished the previous one, so the last
    rank to start is the one the previous step held longest, and its start is about that step's
    end. The job's span instead starts with a stage that finished early and posted the next
    step while another was still held: a normal step after a slow, unlogged one read 1.3x."""
    at, has_prev = predecessors(steps)
    alone = ~has_prev
    if not alone.any():
        return dur
    pause = latest[has_prev] - end[at][has_prev]
    typical = float(np.median(pause)) if pause.size else 0.0
    return np.where(alone, end - latest + typical, dur)


def durations_from_bounds(steps: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Clocks × steps durations (ns) from each step's begin and end on each clock (rows; NaN where
    a clock has no step): a step lasts from the previous step's end to its own. A step whose
    predecessor was not logged (sampled steps) lasts from its own begin, plus the pause that clock
    typically shows between a step's end and the next one's begin -- negative where stages overlap
    steps (no sync at a step's end: the last stage posts the next step's recv while the first
    stage still finishes this one), which a span alone overstates. The first step gets it too: a
    whole one, the first of the sampled steps, read 10% short without the pause an overlapped
    parameter all-gather fills. `steps` sorted. One rule for the job's clock (`job_step_durations`)
    and each host's (the summaries)."""
    at, has_prev = predecessors(steps)
    prev_end = np.where(has_prev, end[:, at], np.nan)
    pause = begin - prev_end
    with warnings.catch_warnings():  # a clock with no consecutive steps has no typical pause
        warnings.simplefilter("ignore", RuntimeWarning)
        typical = np.nan_to_num(np.nanmedian(pause, axis=1, keepdims=True))
    return np.where(np.isfinite(prev_end), end - prev_end, end - begin + typical)


def clock_offsets_by_step(df: pd.DataFrame, meta: JobMeta, steps: np.ndarray | None = None,
                          samples: int = 5, trusted: np.ndarray | None = None) -> pd.DataFrame:
    """Step × host clock offsets (ns), estimated on `samples` evenly spread steps, linear between.

    `steps` are all the job's steps (default: those in `df`); `df` needs rows of the sampled
    ones (`spread(steps, samples)`) only. Linear interpolation follows clocks that drift apart
    at a steady rate. A sampled step during a fault can mislead the estimate (a rank whose own
    egress is slow finishes its collectives before its peers do), so samples that stray from
    the robust line through all of them are left out; and where the caller knows which steps
    ran normally (`trusted`, at least two of them), only those are sampled: when the fault
    covers most steps, the misled samples outvote the others (a NIC fault moved its neighbours'
    offsets by 1.3 ms, and their healthy transfers looked slow). Columns are host indexes in
    `meta.hosts()` order.
    """
    step_col = df["step"].to_numpy()
    if steps is None:
        steps = np.unique(step_col[step_col >= 0])
    return clock_offsets_of(lambda s: df[step_col == s], meta, steps, samples, trusted)


def clock_offsets_of(rows_of: Callable[[int], pd.DataFrame], meta: JobMeta, steps: np.ndarray, samples: int = 5,
                     trusted: np.ndarray | None = None) -> pd.DataFrame:
    """`clock_offsets_by_step`, reading each sampled step's rows from `rows_of(step)` when it is
    estimated (a caller that rebuilds rows holds one step's at a time, not every sampled one's)."""
    picks = offset_samples(steps, samples, trusted)
    est = np.vstack([estimate_clock_offsets(rows_of(int(s)), meta).to_numpy(np.float64) for s in picks])
    keep = consistent_samples(picks.astype(np.float64), est)
    table = np.column_stack([np.interp(steps, picks[keep[:, h]], est[keep[:, h], h]) for h in range(est.shape[1])])
    return pd.DataFrame(table, index=pd.Index(steps, name="step"))


def offset_samples(steps: np.ndarray, samples: int = 5, trusted: np.ndarray | None = None) -> np.ndarray:
    """The steps `clock_offsets_by_step` estimates offsets on (the only rows of `df` it reads)."""
    normal = np.intersect1d(steps, trusted) if trusted is not None else np.empty(0, dtype=np.int64)
    return spread(normal if len(normal) >= 2 else steps, samples)


def consistent_samples(x: np.ndarray, est: np.ndarray, floor_ns: float = 1e6) -> np.ndarray:
    """Samples × hosts mask of offset estimates within 3 MADs (at least `floor_ns`) of each host's
    Theil-Sen line: a straight clock drift fits, a misled sample does not. Fewer than 3 samples
    are all kept (nothing to outvote them)."""
    n = len(x)
    if n < 3:
        return np.ones(est.shape, dtype=bool)
    i, j = np.triu_indices(n, 1)
    slope = np.median((est[j] - est[i]) / (x[j] - x[i])[:, None], axis=0)
    icept = np.median(est - slope * x[:, None], axis=0)
    resid = np.abs(est - (icept + slope * x[:, None]))
    mad = np.median(resid, axis=0)
    return resid <= np.maximum(3 * 1.4826 * mad, floor_ns)


def spread(steps: np.ndarray, keep: int) -> np.ndarray:
    """Up to `keep` evenly spread values of the sorted `steps`, first and last included."""
    if len(steps) <= keep:
        return steps
    return steps[np.unique(np.linspace(0, len(steps) - 1, keep).round().astype(int))]


def infer_steps(df: pd.DataFrame) -> np.ndarray:
    """Step number of every row when the trace does not say (step == -1 everywhere).

    Each rank repeats the same operator pattern every step. Its *anchor* is its least frequent
    group that still recurs (typically the data-parallel reduce-scatter/all-gather at the end
    of the step); the anchor's operators, each tagged with how many of the rank's operators
    preceded it, repeat with a period of c anchor operators per step (stretched where a rank
    repeats within a step, as a pipeline's last stage does every microbatch, so that every
    rank counts the same number of steps). Collective anchors are
    numbered by their seq, which all members share, so a row the logger lost shifts nothing;
    point-to-point anchors by their order on the rank. A row takes the cycle of the anchors
    around it; rows between two cycles go to the later one, except the step's tail (operators
    after its last anchor, measured against the head of the first step). Assumes the trace
    starts at a step boundary, as the sidecar and simulator write it.
    Needs columns rank, group, op, seq, nbytes, peer, start_ns; linear after one sort.
    """
    n = len(df)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    rank_all = df["rank"].to_numpy(np.int64)
    order = np.lexsort((df["start_ns"].to_numpy(), rank_all))
    rank = rank_all[order]
    gcode = codes(df["group"])[order]
    new_rank = np.r_[True, rank[1:] != rank[:-1]]
    rank_start = np.maximum.accumulate(np.where(new_rank, np.arange(n), 0))
    rank_end = np.minimum.accumulate(np.where(np.r_[new_rank[1:], True], np.arange(1, n + 1), n)[::-1])[::-1]
    pos = np.arange(n) - rank_start

    anchor_of = _anchor_groups(rank, gcode)
    is_anchor = gcode == anchor_of[rank]
    a_idx = np.flatnonzero(is_anchor)
    a_rank = rank[a_idx]
    a_pos = pos[a_idx]
    a_first = np.r_[True, a_rank[1:] != a_rank[:-1]]
    since = np.where(a_first, a_pos, a_pos - np.r_[0, a_pos[:-1]] - 1)
    op = codes(df["op"])[order][a_idx]
    tok = pd.DataFrame(
        {"op": op, "nbytes": df["nbytes"].to_numpy()[order][a_idx], "peer": df["peer"].to_numpy()[order][a_idx]}
    ).groupby(["op", "nbytes", "peer"], sort=False).ngroup().to_numpy()
    # anchor number j: seq since the group's first for collectives, order on the rank for p2p
    ordinal = np.arange(len(a_idx)) - np.maximum.accumulate(np.where(a_first, np.arange(len(a_idx)), 0))
    seq = df["seq"].to_numpy(np.int64)[order][a_idx]
    first_seq = pd.Series(seq).groupby(gcode[a_idx]).transform("min").to_numpy()
    p2p = np.asarray(df["op"].isin(P2P_OPS).to_numpy(), dtype=bool)[order][a_idx]
    a_j = np.where(p2p, ordinal, seq - first_seq)
    p2p_anchor = np.zeros(anchor_of.shape[0], dtype=bool)
    p2p_anchor[a_rank[p2p]] = True
    cycle = _common_step_count(_anchor_period(a_rank, a_j, tok, since, a_first, p2p_anchor), np.bincount(a_rank))
    c_a = cycle[a_rank]
    a_cyc = a_j // c_a

    # head of the first step = operators before the first anchor; a regular cycle start has
    # head + tail operators before it, so tail = regular - head
    head = np.zeros(anchor_of.shape[0], dtype=np.int64)
    head[a_rank[a_first]] = a_pos[a_first]
    starts = (a_j % c_a == 0) & ~a_first
    regular = pd.Series(since[starts]).groupby(a_rank[starts]).median()
    has = regular.index.to_numpy()
    own_tail = pd.Series(np.maximum(regular.to_numpy() - head[has], 0), index=has)
    # a lost head row only inflates a rank's tail, so the smallest among ranks playing the same
    # role (same anchor kind, period and operators per step) is the structural one: a whole
    # data-parallel group can lose rows together
    role = pd.DataFrame({"p2p": p2p_anchor[has], "c": cycle[has], "n": regular.to_numpy().round()})
    tail = np.zeros(anchor_of.shape[0], dtype=np.int64)
    tail[has] = own_tail.groupby(role.groupby(["p2p", "c", "n"]).ngroup().to_numpy()).transform("min").to_numpy(np.int64)

    # every row: cycle of the previous anchor (exclusive) and of the next anchor (inclusive),
    # found by running max/min of anchor indexes, not crossing into another rank
    idx = np.arange(n)
    cyc_at = np.zeros(n, dtype=np.int64)
    cyc_at[a_idx] = a_cyc
    prev_i = np.r_[-1, np.maximum.accumulate(np.where(is_anchor, idx, -1))[:-1]]
    next_i = np.minimum.accumulate(np.where(is_anchor, idx, n)[::-1])[::-1]
    has_prev = prev_i >= rank_start
    has_next = next_i < rank_end
    prev_cyc = cyc_at[np.maximum(prev_i, 0)]
    next_cyc = cyc_at[np.minimum(next_i, n - 1)]
    in_tail = idx - prev_i - 1 < tail[rank]  # within the step's tail after the previous anchor
    step = np.where(
        is_anchor | ~has_prev, next_cyc,  # an anchor's own cycle; before any anchor: the first step's head
        np.where(in_tail | (has_next & (next_cyc == prev_cyc)), prev_cyc,
                 np.where(has_next, next_cyc, prev_cyc + 1)),
    )
    out = np.empty(n, dtype=np.float64)
    out[order] = step
    # copies of one collective belong to one step: the median across its ranks outvotes a rank
    # whose anchors or head rows were lost (p2p pairs are left alone: two copies cannot vote)
    coll = ~np.asarray(df["op"].isin(P2P_OPS).to_numpy(), dtype=bool)
    voted = pd.Series(out[coll]).groupby(instance_ids(df[coll])).transform("median").to_numpy()
    out[coll] = np.ceil(voted)
    return out.astype(np.int32)


def first_step_whole(step: np.ndarray, rank: np.ndarray, first: int, n_steps: int) -> bool:
    """Whether every rank logged the first recorded step (`first`, of `n_steps`; `step` and `rank`
    per row) whole: at least WHOLE_FIRST of the operators of its average later step. A logger that
    started mid-step recorded only the step's tail, too short for a baseline and its compute
    meaningless; a whole one (the first of sampled steps) is a step like the others."""
    if n_steps < 2 or len(rank) == 0:
        return False
    size = int(rank.max()) + 1
    at_first = np.bincount(rank[step == first], minlength=size)
    later = (np.bincount(rank, minlength=size) - at_first) / (n_steps - 1)
    logged = later > 0
    return bool(logged.any() and (at_first[logged] >= WHOLE_FIRST * later[logged]).all())


def judge_steps(durations: pd.Series, delta: float = 1.1, window: int = WINDOW, first_whole: bool = False) -> pd.DataFrame:
    """δ-irregularity (Holmes): flag steps at least δ × the rolling median of recent normal steps.

    The baseline only learns from normal steps, so persistent degradation stays flagged for as
    long as it lasts, while slow drift (each step close to the last normal ones) is absorbed.
    It is seeded from the first window's fast steps so a fault that starts early is caught; the
    window's first step among them only when it is whole (`first_step_whole`).
    δ is widened to NOISE_SIGMAS × the job's own step-to-step noise when that is larger: Holmes'
    δ suits steps that repeat within a few percent, and noise is not an irregularity.
    Returns the steps table (step, duration_s, baseline_s, ratio, irregular, pattern).
    """
    steps = durations.index.to_numpy(np.int64)
    d = durations.to_numpy(np.float64)
    delta_base = delta
    delta = calm_delta(d, delta)
    base, irregular = _rolling_judge(d, delta, window, first_whole)
    # the first step holds the warm-up, and so may a block of slow steps after it: the level
    # before a shift is learned without them
    lead = 1 + leading_slow(d[1:], delta_base) if len(d) > 1 else 0
    shift = level_shift(d[lead:], delta_base) if len(d) > lead else None
    if shift is not None:
        at = shift + lead
        before = float(np.nanmedian(d[lead:at]))
        later = np.arange(len(d)) >= at
        above = later & np.isfinite(d) & (d >= delta_base * before)
        # the new level is δ above the old on average; its steps just under δ by noise, up to its
        # last step over δ, are in it too (left normal, they would teach the localizer the fault
        # as normal operation)
        within = np.arange(len(d)) <= (np.flatnonzero(above)[-1] if above.any() else -1)
        moved = above | (later & within & (d >= np.sqrt(delta_base) * before))
        # the new level's steps, and the normal ones before it, are measured against the old level,
        # not a baseline seeded from the shifted steps (a 2.15x NIC in 7 of the first 10 logged
        # steps made the 3 normal ones "bogus short" to the seed: their baseline 235 ms for 110 ms
        # steps, and every operator's normal time, scaled by it, read at half)
        base = np.where((moved | (np.arange(len(d)) < at)) & ~irregular, before, base)
        irregular |= moved
    ratio = d / base
    return pd.DataFrame(
        {
            "step": steps,
            "duration_s": d,
            "baseline_s": base,
            "ratio": ratio,
            "irregular": irregular,
            "pattern": classify_patterns(steps, irregular, ratio),
        }
    )


def _rolling_judge(d: np.ndarray, delta: float, window: int, first_whole: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each step's baseline (the median of the last `window` normal steps) and whether it ran δ
    or more above it."""
    base = np.full(d.shape, np.nan)
    irregular = np.zeros(d.shape, dtype=bool)
    # the first step may be a logger's partial one, too short for a baseline, unless it is whole
    # (its warm-up, too long, `_seed` leaves out like any slow step). A 2.15x switch from the second
    # of the sampled steps left the first the only normal one: without it every step read normal.
    history = list(_seed(d[1:] if len(d) >= 4 and not first_whole else d, delta, window))
    for k, x in enumerate(d):  # one iteration per step, not per operator
        if not history:
            if np.isfinite(x):
                history.append(x)
            continue
        base[k] = float(np.median(history[-window:]))
        if not np.isfinite(x):
            continue
        if x >= delta * base[k]:
            irregular[k] = True
        else:
            history.append(x)
    return base, irregular


def calm_delta(d: np.ndarray, delta: float) -> float:
    """δ widened to NOISE_SIGMAS x the step noise, that of the lower level where the steps sit at
    two levels with an empty gap between them.

    The noise of all steps counts a fault's own swings: one on in half the steps, at a level that
    varies, widened δ past every slow step ("healthy"). Two levels are the steps below and above
    the widest gap between successive sorted step times (at least TWO_LEVEL_MIN_STEPS and
    TWO_LEVEL_MIN_SHARE on each side), the upper δ or more above the lower and the gap
    TWO_LEVEL_SIGMAS of the lower level's noise wide: a healthy job's noise leaves no such gap
    inside it (tails are outside the share), however skewed, while a fault's steps above a
    tight normal level do, whatever their own spread."""
    full = step_noise(d)
    wide = max(delta, 1.0 + NOISE_SIGMAS * full)
    rest = d[1:] if len(d) > 4 else d  # (the first step holds the warm-up)
    rest = rest[np.isfinite(rest) & (rest > 0)]
    n = len(rest)
    m = max(TWO_LEVEL_MIN_STEPS, int(np.ceil(TWO_LEVEL_MIN_SHARE * n)))
    if n < 2 * m:
        return wide
    x = np.sort(np.log(rest))
    gaps = np.diff(x)[m - 1:n - m]  # gaps[i] lies after m + i steps
    cut = m + int(np.argmax(gaps))
    gap = float(gaps.max())
    noise = step_noise(rest[rest <= np.exp(x[cut - 1])])
    apart = float(np.median(x[cut:]) - np.median(x[:cut])) >= np.log(delta)
    # (a few steps of noise can sit close by chance: the gap must also dwarf their whole range)
    if (apart and gap >= TWO_LEVEL_SIGMAS * max(noise, 1e-6) and gap >= GAP_OVER_RANGE * (x[cut - 1] - x[0])
            and noise < full / 2):  # (noise the upper level did not swell is the job's own)
        return max(delta, 1.0 + NOISE_SIGMAS * noise)
    return wide


def settle(table: pd.DataFrame, warmup: bool = True) -> tuple[pd.DataFrame, list[int], int | None]:
    """The δ-irregular steps less warm-up and noise, and the onset (see the constants above).

    Returns the table (warm-up steps get pattern "warm-up", noise "noise", neither irregular),
    the warm-up steps, and the onset step (None when no irregular step is left). `warmup`:
    the table starts at the job's first step (a window from mid-job has no warm-up)."""
    t = table.copy()
    irr = t["irregular"].to_numpy(bool).copy()
    pattern = t["pattern"].to_numpy(object).copy()
    n = len(t)
    warm: list[int] = []
    if warmup and n and irr[0]:
        lead = int(np.argmin(irr)) if not irr.all() else n
        after = irr[lead:lead + WARMUP_NORMAL_AFTER]
        # (one step of noise just over δ among them does not make the warm-up a fault's first steps)
        ratios = t["ratio"].to_numpy(np.float64)
        blip = ratios[lead:lead + WARMUP_NORMAL_AFTER][after]
        calm = len(after) == WARMUP_NORMAL_AFTER and after.sum() <= 1 and not (blip >= SPIKE_RATIO).any()
        # (or a fault began soon after: the steps right after the warm-up ran normally, all but the last)
        calm = calm or (len(after) == WARMUP_NORMAL_AFTER and not after[:-1].any())
        limit = max(WARMUP_MAX_STEPS, int(WARMUP_MAX_SHARE * n))
        excess = ratios[:lead] - 1.0
        # (or one normal step, then a fault, the block at another level than the fault's: decayed to
        # a fraction of it -- every third step logged, a warm-up's tail, a normal step, a link from
        # step 9 -- or far above it -- every second step logged at random, a 1.9x warm-up, one
        # normal step, a link at 1.4x from step 22: one episode "since step 0")
        later = irr.copy()
        later[:lead] = False
        if len(after) > 0 and not after[0] and later.any():
            fault_excess = float(np.nanmedian(ratios[later] - 1.0))
            calm = calm or bool(excess[-1] <= WARMUP_TAIL * fault_excess) or bool(
                np.nanmin(excess) >= WARMUP_ABOVE * fault_excess)
        tail = lead == limit + 1 and bool(excess[-1] <= WARMUP_TAIL * np.nanmin(excess[:-1]))
        # (or a longer block that decays step by step to half its start: a loaded machine's warm-up
        # ran 2.0x, 1.31x, 1.26x, 1.15x, 1.15x; a fault from the start holds its level)
        fading = (lead <= WARMUP_FADE_STEPS and bool(np.all(excess[1:] <= (1 + WARMUP_FADE_SLACK) * excess[:-1]))
                  and bool(excess[-1] <= WARMUP_TAIL * excess[0]))
        if (lead <= limit or tail or fading) and calm:
            irr[:lead] = False
            pattern[:lead] = "warm-up"
            warm = [int(x) for x in t["step"].to_numpy()[:lead]]
    d = t["duration_s"].to_numpy(np.float64)
    base = t["baseline_s"].to_numpy(np.float64)
    counted = np.isfinite(d) & (pattern != "warm-up")
    ratio = t["ratio"].to_numpy(np.float64)
    noise = step_noise(d[counted])
    if noise > 0:
        above = ratio >= 1.0 + NOISE_SIGMAS * noise
        x, calm = t["step"].to_numpy(np.float64), counted & ~irr & ~above

        def over_drift(start: int) -> np.ndarray | None:
            # (over the job's noise, and over how far the steps before strayed from the line: steps
            # at two levels before a run, a busy machine's stalls among normal steps, follow none)
            drift = drift_level(x, d, calm & (np.arange(n) < start))
            return None if drift is None else d >= drift[0] + NOISE_SIGMAS * np.maximum(noise * drift[0], drift[1])
        irr |= sustained(irr, above, counted, over_drift)
    lost = np.where(irr, np.nan_to_num(np.maximum(d - base, 0.0)), 0.0)
    far = irr & (ratio >= 1.0 + SPIKE_SIGMAS * noise)
    if (irr.any() and lost.sum() < MIN_LOST_SHARE * np.nansum(d[counted]) and np.nanmax(ratio[irr]) < SPIKE_RATIO
            and not (far[1:] & far[:-1]).any()):
        lone_sigma = spread_of_normal_steps(ratio[counted & ~irr], noise)
        stands_out = irr & (ratio >= max(LONE_RATIO, 1.0 + LONE_SIGMAS * lone_sigma))
        pattern[irr & ~stands_out] = "noise"
        irr &= stands_out
    steps = t["step"].to_numpy(np.int64)
    kept = classify_patterns(steps, irr, ratio)
    pattern = np.where(irr, kept, np.where(np.isin(pattern, ("warm-up", "noise")), pattern, ""))
    t["irregular"] = irr
    t["pattern"] = pattern
    return t, warm, _onset(steps, irr, lost)


def warmup_note(warm: list[int]) -> str:
    """What a verdict says of the warm-up steps it left out."""
    which = f"step {warm[0]}" if len(warm) == 1 else f"steps {warm[0]}..{warm[-1]}"
    return f"{which} ran slow as the job warmed up (allocator, communicators, compilation): not counted as irregular"


def drift_level(x: np.ndarray, d: np.ndarray, normal: np.ndarray, points: int = 64) -> tuple[np.ndarray, float] | None:
    """Per step (`x`, its number): the level of a steady drift through the `normal` steps' times
    `d`, a Theil-Sen line (over up to `points` of them, evenly spread), and the robust σ of those
    steps around it (s); None with fewer than four."""
    at = np.flatnonzero(normal & np.isfinite(d) & (d > 0))
    if len(at) < 4:
        return None
    at = at[np.unique(np.linspace(0, len(at) - 1, min(points, len(at))).round().astype(int))]
    i, j = np.triu_indices(len(at), 1)
    # (a job does not steadily speed up: steps falling before a run are levels, never a drift to follow)
    slope = max(float(np.median((d[at][j] - d[at][i]) / (x[at][j] - x[at][i]))), 0.0)
    level = float(np.median(d[at] - slope * x[at])) + slope * x
    return level, robust_sigma(d[at] - level[at])


def sustained(irr: np.ndarray, above: np.ndarray, counted: np.ndarray,
              over_drift: Callable[[int], np.ndarray | None] | None = None) -> np.ndarray:
    """Steps of the runs of SUSTAINED_STEPS or more consecutive counted steps `above` their
    baseline that hold an irregular step. A link on for six steps at 1.05-1.14x over steps within
    0.5% put two of them over δ: alone, too little time lost to be more than noise; with the four
    between them, which noise does not hold up that long, it is one slowdown (a real blip is one
    step, and the next one runs short). `over_drift(start)`: per step, whether it stands over the
    drift of the normal steps before a run from `start` (`drift_level`; None where too few steps
    came before it to tell one); a run's steps must, and the run lasts while the steps after it
    stay there: a baseline that learned the new level (a 2.5x NIC's lasting 1.08x) takes them for
    normal, and the fault's later steps for history. A job that slows 0.2% a logged step sits 1-2%
    over the rolling median that trails it, beyond a tight noise, yet no slowdown: every step after
    a link's one slow step read as one with it. (A line through the normal steps on both sides of a
    run would take a lasting shift for a drift.)"""
    out = np.zeros(len(irr), dtype=bool)
    for start, end in _runs(above & counted):  # (one iteration per run)
        if end - start < SUSTAINED_STEPS or not irr[start:end].any():
            continue
        level = over_drift(start) if over_drift is not None else None
        over = np.ones(len(irr), dtype=bool) if level is None else level & counted
        for a, b in _runs(over[start:end]):  # (its parts over the drift)
            a, b = a + start, b + start
            if b - a >= SUSTAINED_STEPS and irr[a:b].any():
                if level is not None:
                    b += int(np.argmin(over[b:])) if not over[b:].all() else len(irr) - b
                out[a:b] = True
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The runs of True in `mask`, each as (first index, one past the last)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _onset(steps: np.ndarray, irr: np.ndarray, lost: np.ndarray) -> int | None:
    """First step of the first episode (irregular steps at most EPISODE_GAP logged steps apart:
    a sampling logger's steps are far apart in number) that lost a fair share of all the time
    lost, or whose every step lost about as much as the fault's typical step: isolated slow steps
    before a fault, slower than normal yet far less than it, are not its onset."""
    idx = np.flatnonzero(irr)
    if not idx.size:
        return None
    total = float(lost[idx].sum())
    typical = float(np.median(lost[idx]))
    for ep in np.split(idx, np.flatnonzero(np.diff(idx) > EPISODE_GAP) + 1):
        if total <= 0 or float(lost[ep].sum()) >= ONSET_SHARE * total or float(lost[ep].min()) >= ONSET_LIKE * typical:
            return int(steps[_episode_start(ep, lost)])
    return int(steps[idx[0]])


def _episode_start(ep: np.ndarray, lost: np.ndarray) -> int:
    """The episode's first step that lost at least ONSET_LEVEL of its typical step's loss: a few
    steps of noise just above δ, a gap or two before a lasting slowdown, are not its start."""
    typical = float(np.median(lost[ep]))
    first = np.flatnonzero(lost[ep] >= ONSET_LEVEL * typical)
    return int(ep[first[0]]) if first.size else int(ep[0])


def judge_from_fast_half(durations: pd.Series, delta: float = 1.1, window: int = FAST_HALF_WINDOW) -> pd.DataFrame:
    """δ-irregular steps: duration over delta x the median of the previous `window` normal steps.

    Until three normal steps are known, the baseline is the median of the faster half of all
    steps, so a fault in the first steps (or a short first step) cannot set the baseline.
    """
    d = durations.sort_index()
    vals = d.to_numpy(np.float64)
    base = np.full(len(vals), np.nan)
    irregular = np.zeros(len(vals), dtype=bool)
    fast = vals[vals <= np.median(vals)] if len(vals) else vals
    start = float(np.median(fast)) if len(fast) else 0.0
    normal: list[float] = []
    for i, v in enumerate(vals):  # one iteration per training step, not per operator
        base[i] = float(np.median(normal[-window:])) if len(normal) >= 3 else start
        irregular[i] = v > delta * base[i]
        if not irregular[i]:
            normal.append(float(v))
    if len(normal) >= 3:
        # the steps judged before three normal ones were known get their baseline too: when a
        # fault covers most steps, the faster half is the fault's level, and operators' normal
        # times scaled by it (`localize.ops.history.step_scale`) would halve
        early = np.isclose(base, start) & (np.arange(len(vals)) <= int(np.flatnonzero(~irregular)[2]))
        base[early] = float(np.median(normal[:3]))
    return pd.DataFrame({"step": d.index.to_numpy(np.int64), "duration_s": vals, "baseline_s": base,
                         "ratio": vals / base, "irregular": irregular, "pattern": ""})


def judge_window(durations: pd.Series, delta: float = 1.1, warmup: bool = True,
                 first_whole: bool = False) -> tuple[pd.DataFrame, list[int], int | None]:
    """The steps table of a window, as every path judges it: δ against recent normal steps
    (`judge_steps`), warm-up and noise left out (`settle`), then a fault over most steps judged
    against the steps it left alone (`widespread_fault`), and the onset taken back over the steps
    right before it that ran δ over their baseline (`_with_onset_from_delta`); the irregular steps'
    patterns are named last, the onset starting an episode. `first_whole`: the
    first step holds all its operators (`first_step_whole`). Returns the table, the warm-up steps
    and the onset step."""
    table = judge_steps(durations, delta, first_whole=first_whole)
    table, warm, onset = settle(table, warmup=warmup)
    if (again := widespread_fault(table, warmup=bool(warm) or warmup, delta=delta)) is not None:
        table, onset = again
    table, warm, onset = _with_onset_from_delta(table, warm, onset, delta)
    irr = table["irregular"].to_numpy(bool)
    kept = classify_patterns(table["step"].to_numpy(np.int64), irr, table["ratio"].to_numpy(np.float64), onset)
    return table.assign(pattern=np.where(irr, kept, table["pattern"].to_numpy(object))), warm, onset


def _with_onset_from_delta(table: pd.DataFrame, warm: list[int], onset: int | None,
                           delta: float) -> tuple[pd.DataFrame, list[int], int | None]:
    """The steps right before the onset that ran δ or more over their baseline, and by half the
    irregular steps' typical excess, neither warm-up nor noise, are the fault's first ones: δ
    widened for the job's noise (`calm_delta`, which a fault on in a third of the steps swells)
    left them normal. A NIC on at random from step 8 read "since step 10", its steps 8 and 9 at
    1.15x and 1.14x under a widened δ of 1.16."""
    irr = table["irregular"].to_numpy(bool).copy()
    if onset is None or not irr.any():
        return table, warm, onset
    steps = table["step"].to_numpy(np.int64)
    ratio = table["ratio"].to_numpy(np.float64)
    pattern = table["pattern"].to_numpy(object)
    first = int(np.flatnonzero(steps == onset)[0])
    # (as slow as the fault's steps are, by half their typical excess: a 1.1x blip of noise before a
    # 1.5x fault is not its start)
    floor = max(delta, 1.0 + ONSET_LEVEL * float(np.nanmedian(ratio[irr] - 1.0)))

    def quiet(j: int) -> bool:  # (normal: neither irregular, warm-up nor noise)
        return not irr[j] and pattern[j] == ""

    def slow(j: int) -> bool:
        return j >= 1 and quiet(j) and ratio[j] >= floor

    # a fault on and off from its onset (off in the step after it, on in the next) may be on
    # before it the same way: one normal step between two of its steps does not end it (a host in
    # every other step from 52014, its first step 1.23x under a δ the job's swings widened to
    # 1.23x, read "since 52016")
    rhythm = first + 2 < len(irr) and not irr[first + 1] and bool(irr[first + 2])
    joined: list[int] = []
    j = first - 1
    while j > 0:
        if slow(j):
            joined.append(j)
            j -= 1
        elif rhythm and quiet(j) and slow(j - 1):
            joined.append(j - 1)
            j -= 2
        else:
            break
    if not joined:
        return table, warm, onset
    irr[joined] = True
    return table.assign(irregular=irr, pattern=np.where(irr, "", pattern)), warm, int(steps[min(joined)])


def widespread_fault(table: pd.DataFrame, warmup: bool, delta: float = 1.1) -> tuple[pd.DataFrame, int | None] | None:
    """The steps judged again against the steps a fault over most of the window left alone, or
    None when that finds nothing more than `table` (a settled `judge_steps` table) does.

    Such a fault becomes its own baseline (the rolling median then sees nothing, or only a spike
    on top of it), so the steps are judged against the faster half (`judge_from_fast_half`).
    That is believed for a degradation that lasts to the end, and for one on and off whose slow
    steps sit at one level far above the others for their noise (`two_levels`); when the fast
    half's baseline learned such a fault, it is judged against the lower level instead. A drift
    slower at first than later must not make the first steps irregular, nor a noisy healthy job's
    slower half. Warm-up and noise are left out as `settle` leaves them out. Returns the table
    and onset.
    """
    if len(table) < 3:
        return None
    durations = table.set_index("step")["duration_s"].astype(float)
    again, _, onset = settle(judge_from_fast_half(durations, delta), warmup=warmup)
    flags = again["irregular"].to_numpy(bool)
    irr = set(again.loc[flags, "step"].astype(int))
    before = set(table.loc[table["irregular"].astype(bool), "step"].astype(int))
    lasting = bool(flags.any()) and bool(flags[int(np.argmax(flags)):].all())
    # two levels among the steps δ left normal: a fault it found already is no second level
    usable = ((table["pattern"] != "warm-up") & ~table["irregular"].astype(bool)).to_numpy()
    d = durations.to_numpy(np.float64)

    def adds(found: set[int]) -> bool:  # (finds more than `table` did, all of what it found too)
        return bool(found) and before <= found and len(found) > len(before)

    if adds(irr) and (lasting or two_levels(d[usable], delta)):
        return again, onset
    # otherwise the fast half's baseline learned the fault: a 1.34x GPU in every other step ran its
    # steps 1.08-1.10x, under δ of a baseline that rose to meet them, and the job read healthy.
    # Two levels from the fault's first step on (a real run's steps drifted 0.59 to 0.51 s before a
    # GPU on in every other step, which widened the lower level until the two read as one) are
    # judged against the lower level, where every step of the upper one is the fault's.
    since = usable & (durations.index.to_numpy() >= onset) if onset is not None else usable
    upper = upper_level(d[since], delta)
    if upper is None:
        return None
    base = float(np.median(d[usable & (d < upper)]))
    pattern = np.where(table["pattern"].to_numpy(object) == "warm-up", "warm-up", "")
    flagged = (since & (d >= upper)) | table["irregular"].to_numpy(bool)
    levels = table.assign(baseline_s=base, ratio=d / base, irregular=flagged, pattern=pattern)
    settled, _, at = settle(levels, warmup=False)
    on = set(settled.loc[settled["irregular"].astype(bool), "step"].astype(int))
    if adds(on):
        return settled, at
    return None


def two_levels(d: np.ndarray, delta: float = 1.1) -> bool:
    """Whether the step times sit at two levels (`upper_level`)."""
    return upper_level(d, delta) is not None


def upper_level(d: np.ndarray, delta: float = 1.1) -> float | None:
    """The step time between the two levels when the step times sit at two levels, the upper
    δ or more above the lower and TWO_LEVEL_SIGMAS of their own spread apart: a fault on in many
    steps, off in the others; None when they do not.

    The split is the best two-means split of the log step times; noise split so gives levels
    about 2.7 of its halves' spreads apart (healthy jobs of both generators and real gloo runs: at
    most 4.7, their levels under δ apart)."""
    y = np.log(d[np.isfinite(d) & (d > 0)])
    x = np.sort(y)
    n = len(x)
    m = max(TWO_LEVEL_MIN_STEPS, int(np.ceil(TWO_LEVEL_MIN_SHARE * n)))
    if n < 2 * m:
        return None
    k = np.arange(m, n - m + 1)
    cs, cs2 = np.r_[0.0, np.cumsum(x)], np.r_[0.0, np.cumsum(x * x)]
    sse = (cs2[k] - cs[k] ** 2 / k) + ((cs2[n] - cs2[k]) - (cs[n] - cs[k]) ** 2 / (n - k))
    split = int(k[np.argmin(sse)])
    lo, hi = x[:split], x[split:]
    gap = float(np.median(hi) - np.median(lo))
    spread = max(robust_sigma(part) for part in (lo, hi))
    upper = y >= x[split]
    runs = int(upper[0]) + int((upper[1:] & ~upper[:-1]).sum())  # on and off, not one block (a warm-up's tail)
    if gap >= np.log(delta) and gap >= TWO_LEVEL_SIGMAS * max(spread, 1e-6) and runs >= TWO_LEVEL_RUNS:
        return float(np.exp((x[split - 1] + x[split]) / 2))
    return None


def leading_slow(d: np.ndarray, delta: float) -> int:
    """How many of the first steps run δ or more above the median step: a warm-up's block, which
    would lift the level a later shift is measured from."""
    fin = d[np.isfinite(d)]
    if len(fin) == 0:
        return 0
    slow = ~(d < delta * float(np.median(fin)))  # (an unmeasured step is no normal one)
    return int(np.argmin(slow)) if not slow.all() else 0


def level_shift(d: np.ndarray, delta: float) -> int | None:
    """Index where the step time moves up to a new level that lasts to the end, or None.

    Holmes' δ-rule judges each step against its neighbours, so in a job whose steps are noisy
    (δ widened to several σ) a lasting slowdown of a few tens of percent is never one step's
    outlier; averaged over the steps on either side it is unmistakable. The split is the one
    with the largest t-statistic of the mean log step time (outliers clipped at 4 robust σ of
    the local median); it must be δ slower, significant, and a step rather than a steady drift."""
    x = np.log(d[np.isfinite(d) & (d > 0)])
    n = len(x)
    m = SHIFT_MIN_STEPS
    if n < 2 * m:
        return None
    # a spike stands out from its neighbours, a new level does not: outliers are clipped around
    # the local median (around the global one, a level over less than half the steps was clipped away)
    local = pd.Series(x).rolling(5, center=True, min_periods=1).median().to_numpy()
    mad = 1.4826 * float(np.median(np.abs(x - local))) or 1e-6
    x = np.clip(x, local - 4 * mad, local + 4 * mad)
    k = np.arange(m, n - m + 1)
    cs, cs2 = np.r_[0.0, np.cumsum(x)], np.r_[0.0, np.cumsum(x * x)]
    mean_a, mean_b = cs[k] / k, (cs[n] - cs[k]) / (n - k)
    ss = (cs2[k] - k * mean_a**2) + ((cs2[n] - cs2[k]) - (n - k) * mean_b**2)
    sd = np.sqrt(np.maximum(ss, 1e-12) / max(n - 2, 1))
    t = (mean_b - mean_a) / (sd * np.sqrt(1.0 / k + 1.0 / (n - k)))
    best = int(np.argmax(t))
    if t[best] < SHIFT_SIGMAS or mean_b[best] - mean_a[best] < np.log(delta):
        return None
    line = np.polyval(np.polyfit(np.arange(n), x, 1), np.arange(n))
    gradual = ss[best] >= SHIFT_OVER_TREND * float(np.sum((x - line) ** 2))
    if gradual and mean_b[best] - mean_a[best] < np.log(DRIFT_MAX):
        return None
    split = int(k[best])
    return int(np.flatnonzero(np.isfinite(d) & (d > 0))[split])


def step_noise(d: np.ndarray) -> float:
    """Relative step-to-step noise σ: from the lower quartile of differences between steps one
    and two apart (a spike, a level shift or a fault over most steps moves only the upper ones;
    a fault on in every other step makes every successive difference large, not those two apart)
    over the median step."""
    x = d[np.isfinite(d)]
    if len(x) < 4:
        return 0.0
    q1, q2 = (float(np.quantile(np.abs(x[lag:] - x[:-lag]), 0.25)) for lag in (1, 2))
    q = q2 if q1 > ALTERNATION * q2 else q1  # (noise moves both alike)
    return q / HALF_NORMAL_Q25 / float(np.median(x))


def spread_of_normal_steps(ratios: np.ndarray, fallback: float) -> float:
    """Robust σ of the normal steps' ratios to their baseline (MAD), what a lone slow step is held
    against: successive differences count each step boundary twice (a step's end measured late is
    the next step's start), and read a sampled job's noise 1.5-3x wider than the steps spread (a
    link's 1.23x step, 14σ of the other steps, passed for noise at 9σ). `fallback` when fewer than
    four normal steps."""
    r = ratios[np.isfinite(ratios)]
    return robust_sigma(r) if len(r) >= 4 else fallback


def robust_sigma(x: np.ndarray) -> float:
    """σ from the median absolute deviation: a few outliers (a fault's steps) do not widen it."""
    return 1.4826 * float(np.median(np.abs(x - np.median(x))))


def classify_patterns(steps: np.ndarray, irregular: np.ndarray, ratio: np.ndarray,
                      onset: int | None = None) -> np.ndarray:
    """Name each irregular step's pattern: spike, fluctuation or persistent ("" when normal).

    Irregular steps at most EPISODE_GAP logged steps apart form an episode, and the `onset` step
    starts one of its own: a real run's steps drifting 1.10-1.14x before a 1.65x fault made the
    fault's unbroken steps read "fluctuation". One or two irregular steps are spikes; an episode
    that is (almost) unbroken at a steady level is persistent degradation; anything else (normal
    steps in between, or a level that swings) is fluctuation.
    """
    out = np.full(len(steps), "", dtype=object)
    idx = np.flatnonzero(irregular)
    if idx.size == 0:
        return out
    at_onset = (steps[idx] == onset)[1:] if onset is not None else np.zeros(idx.size - 1, dtype=bool)
    breaks = np.flatnonzero((np.diff(idx) > EPISODE_GAP) | at_onset) + 1  # (in logged steps)
    for ep in np.split(np.arange(idx.size), breaks):  # one iteration per episode
        rows = idx[ep]
        density = ep.size / float(rows[-1] - rows[0] + 1)  # of the steps logged in its span (sampled steps)
        lo, hi = np.nanquantile(ratio[rows], [0.1, 0.9])
        if ep.size <= 2:
            out[rows] = "spike"
        elif density >= PERSISTENT_DENSITY and hi / lo <= PERSISTENT_SPREAD:
            out[rows] = "persistent"
        else:
            out[rows] = "fluctuation"
    return out


def slowdown(table: pd.DataFrame) -> float:
    """Median duration ratio over irregular steps; 1.0 when there are none."""
    r = table.loc[table["irregular"], "ratio"]
    return float(r.median()) if len(r) else 1.0


def _seed(d: np.ndarray, delta: float, window: int) -> np.ndarray:
    """Normal-looking steps of the first window: within δ of its fastest plausible step.

    Steps faster than half the window's median are ignored (a partial or mis-cut step), so one
    bogus short step cannot make every later step look slow. Nor is the step right after one δ
    over the median (past the leading warm-up) the fastest: it is short by what its start lent the
    slow one (a late end measured into it). A NIC's 1.45x step followed by a 0.84x one set the
    summaries' baseline at that one step, and every normal step after it read 1.2x ("since step
    1", a host named). Nor is a lone fastest step, none other within δ of it, when most of the
    window's steps lie within δ of the next and that is within δ² of it: a real MoE job's third
    step ran 0.85x the next fifteen, and all of those read 1.15-1.26x, "irregular" before the fault
    (a fault from the window's second step is further up; a warm-up's tail is one step, not most).
    """
    first = d[:window]
    first = first[np.isfinite(first)]
    if first.size == 0:
        return first
    median = np.median(first)
    plausible = first >= 0.5 * median
    slow = first >= delta * median
    slow &= ~np.logical_and.accumulate(slow)  # (the warm-up's block leads: what follows it is normal)
    after_slow = np.r_[False, slow[:-1]]
    anchors = np.sort(first[plausible & ~after_slow])
    kept = first[plausible]
    fastest = float(anchors[0]) if anchors.size else float(kept.min())
    if (anchors.size >= LONE_FAST_MIN_STEPS and delta * anchors[0] <= anchors[1] < delta * delta * anchors[0]
            and 2 * int((anchors < delta * anchors[1]).sum()) > anchors.size):
        fastest = float(anchors[1])  # (a lone fast step just under most steps' level is no level of its own)
    return kept[kept < delta * fastest]


def _anchor_groups(rank: np.ndarray, gcode: np.ndarray) -> np.ndarray:
    """Per rank, the group with the fewest rows among those with at least 3 (ties: lowest code)."""
    counts = pd.DataFrame({"rank": rank, "g": gcode}).value_counts().rename("n").reset_index()
    counts["rare"] = counts["n"] < 3
    counts = counts.sort_values(["rank", "rare", "n", "g"], kind="stable").drop_duplicates("rank")
    anchor = np.full(int(rank.max()) + 1, -1, dtype=np.int64)
    anchor[counts["rank"].to_numpy()] = counts["g"].to_numpy()
    return anchor


def _anchor_period(a_rank: np.ndarray, a_j: np.ndarray, tok: np.ndarray, since: np.ndarray,
                   a_first: np.ndarray, p2p_anchor: np.ndarray) -> np.ndarray:
    """Per rank, the anchor period c: anchor j matches anchor j+c for (almost) all j.

    Anchors match when op, size and peer agree and the counts of operators before them agree
    within 10% (a lost row changes a count by one; a step's worth of operators versus none
    is what tells equal-sized buckets of one step from the next step's). Anchors are found by
    number j, not position, so a lost anchor costs a comparison, not the alignment. The period
    is the smallest c within PERIOD_TOLERANCE (for point-to-point anchors, also within
    PERIOD_SLACK of the best c: lost rows are rare, pipeline warm-up is every step). Vectorized
    over all ranks, one pass per
    candidate c, stopping once every rank has a perfect match. The first anchor is not
    compared: the operators before it are the first step's head only.
    """
    size = int(a_rank.max()) + 1
    per_rank = np.bincount(a_rank, minlength=size)
    p2p = p2p_anchor[:size]
    top = max(min(MAX_CYCLE, int(per_rank.max()) // 2), 1)
    rate = np.full((top + 1, size), np.inf)
    span = int(a_j.max()) + MAX_CYCLE + 1
    keys = a_rank * span + a_j
    sorter = np.argsort(keys, kind="stable")
    sorted_keys = keys[sorter]
    perfect = np.zeros(size, dtype=bool)
    for c in range(1, top + 1):
        at = np.minimum(np.searchsorted(sorted_keys, keys + c), len(keys) - 1)
        src = np.flatnonzero((sorted_keys[at] == keys + c) & ~a_first)
        dst = sorter[at[src]]
        near = np.abs(since[dst] - since[src]) <= 1 + 0.1 * np.maximum(since[dst], since[src])
        bad = (tok[dst] != tok[src]) | ~near
        n_cmp = np.bincount(a_rank[src], minlength=size)
        n_bad = np.bincount(a_rank[src][bad], minlength=size)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate[c] = np.where(n_cmp > 0, n_bad / n_cmp, np.inf)
        perfect |= rate[c] == 0
        if perfect[per_rank > 0].all():
            break
    fits = rate <= PERIOD_TOLERANCE
    # pipeline anchors: a stage's microbatch pattern repeats within the step except in warm-up
    # and cool-down, so a shorter period must match almost as well as the best one
    fits[:, p2p] &= rate[:, p2p] <= rate[:, p2p].min(axis=0) + PERIOD_SLACK
    # no repetition found: the whole trace is one step
    return np.where(fits.any(axis=0), fits.argmax(axis=0), np.maximum(per_rank, 1)).astype(np.int64)


def _common_step_count(period: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """Stretch periods of ranks whose pattern repeats within a step to the job's step count.

    The last pipeline stage of a job without data parallelism does the same recv, compute,
    send for every microbatch: its own sequence repeats per microbatch. Every rank runs the same
    number of steps, and the better-structured ranks (the low 10th percentile of cycle counts)
    say how many; a rank with k times as many cycles gets a k times longer period.
    """
    period = period[: anchors.size].copy()
    has = anchors > 0
    cycles = np.where(has, anchors / np.maximum(period, 1), 0.0)
    repeating = has & (cycles >= 2)
    if not repeating.any():
        return period
    ref = float(np.quantile(cycles[repeating], 0.1))
    k = np.where(repeating, np.maximum(np.round(cycles / ref), 1), 1).astype(np.int64)
    return period * k
