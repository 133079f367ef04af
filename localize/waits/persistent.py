"""Slow from the first step: imbalance that no δ-irregular iteration reveals.

A fault present from the start (a GPU that was always slow, a pipeline stage with more layers)
makes every iteration equally long, so there is no normal iteration to compare with. Workers
of the same role do the same work, though: each rank's compute per step (the gaps between its
operators, on its own clock) is compared with its peers of the same pipeline stage in the same
step. One worker, or one host's workers, much slower than its stage peers is a device (gpu,
host); a whole stage slower than the other stages is the job's configuration; slowness that
moves between model replicas from step to step is the data (sequence-length imbalance).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta
from localize.ops.grouping import present, unique
from localize.ops.groupkinds import group_kinds, with_observed_groups
from localize.ops.lone import lone_copies, lone_time, unlogged_peers, wait_beside_peers
from localize.ops.table import Ops, prepare_ops, rank_step_compute
from localize.waits.ranking import COVERAGE, TURNS_MOST, RankUnit, explain_rank_blame, layout_units
from timeline.steps import EPISODE_GAP, ONSET_LEVEL, SHIFT_MIN_STEPS, first_step_whole, level_shift

StepsT = TypeVar("StepsT", np.ndarray, list[int])  # a table's steps, as an array or a list

MIN_EXCESS = 0.15  # a worker must compute at least this much longer than its stage peers
FOLLOW_STEPS = 4  # a first slow step is one the device stayed slow in, in half the slow steps from it
#: a stage must compute this much longer than the fastest stage: a fifth, over the few percent to
#: ~12% that the embedding and the loss add to a Megatron job's first and last stages in normal
#: operation (at a quarter, a stage given 1.31x the work beside a last stage 7% heavy read 1.22x: "healthy")
STAGE_EXCESS = 0.2
SLOW_REPLICA_STEPS = 0.3  # data: replicas slow in at least this share of the steps, all told
OWN_STEPS = 0.5  # ... while no replica is slow in more than this share (else it is a device)
QUIET_BEFORE = 0.1  # an on-and-off device began where it was slow in at most this share of the steps before
#: a worker at its peers' level in most steps is slow on and off where it computed MIN_EXCESS longer
#: than them in at least this share of the steps, while no other model replica was slow as a whole in
#: more than QUIET_BEFORE of them (replicas taking turns: the data)
ON_OFF_SHARE = 0.25
LEVEL_HELD = 0.8  # a level shift is "slow in every step since" when slow in this share of them (else: on and off)
MAX_ONSET_RANKS = 64  # ranks whose excess onset is looked for (beyond: a stage or the data, from the start)
ONSET_HELD = 0.6  # slow steps before a device's own onset are the fault's when this near its typical excess
LEAD_NORMAL_SHARE = 0.25  # a first step or two in which a device's excess (s) stayed under this share of it since were normal


def compute_table(ops: Ops, world: int, lone: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank × step compute (s, own clock), which ranks logged anything, and the steps of the
    columns. The first step holds the job's warm-up and is left out when there are more than two.
    `lone` (per row, `localize.ops.lone`): operators whose time is the rank's unlogged peers'
    compute as much as its own, counted with it."""
    comp, seen, steps = all_steps_compute(ops, world, lone)
    _, comp, steps = first_apart(comp, steps)
    return comp, seen, steps


def first_apart(comp: np.ndarray, steps: StepsT) -> tuple[np.ndarray | None, np.ndarray, StepsT]:
    """The first recorded step's column set apart when there are more than two steps (it may hold
    the job's warm-up): that column (None when kept), the other columns, their steps."""
    if len(steps) > 2:
        return comp[:, 0], comp[:, 1:], steps[1:]
    return None, comp, steps


def all_steps_compute(ops: Ops, world: int, lone: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`compute_table` with the first step kept."""
    steps = np.asarray(unique(ops.step), dtype=np.int64)
    comp = rank_step_compute(ops, world, steps)  # (a chunk of ranks at a time: this may run at the analysis' peak)
    if lone is not None and lone.any():
        comp += lone_time(ops, lone, world, steps)
    return comp, present(ops.rank, world), steps


def normal_first_step(before: np.ndarray, comp: np.ndarray, seen: np.ndarray, meta: JobMeta, kinds: dict[str, str],
                      mine: list[int]) -> bool:
    """Whether the first recorded step, left out of `comp` (`before`: its column), was a normal one
    for the ranks `mine`: every stage's workers computed as long as in the later steps (longer is
    warm-up, shorter a log that began mid-step) and `mine` computed like their stage peers. Then
    their excess began at the next recorded step."""
    both = np.c_[before, comp]
    ref = stage_ratio(both, seen, meta, kinds).ref
    later = row_nanmedian(ref[:, 1:])
    staged = np.isfinite(ref[:, 0]) & (later > 0)
    if not staged.any():
        return False
    change = ref[staged, 0] / later[staged]
    usual = bool(((change <= 1 + MIN_EXCESS) & (change >= 1 / (1 + MIN_EXCESS))).all())
    return usual and float(device_ratio(both, seen, meta, kinds, mine)[0]) <= 1 + MIN_EXCESS


def stage_reference(comp: np.ndarray, seen: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Stage × step: the low quartile of the stage's workers' compute (a slow worker or two
    cannot move it)."""
    n_stage = int(stage.max()) + 1 if stage.size else 1
    ref = np.full((n_stage, comp.shape[1]), np.nan)
    for s in range(n_stage):  # one iteration per pipeline stage
        mine = seen & (stage == s)
        if mine.any():
            ref[s] = np.quantile(comp[mine], 0.25, axis=0)
    return ref


def row_nanmedian(a: np.ndarray) -> np.ndarray:
    """Each row's median of its finite values; NaN for a row with none (a stage none of whose
    ranks logged), without numpy's all-NaN warning for it."""
    out = np.full(a.shape[0], np.nan)
    has = np.isfinite(a).any(axis=1)
    out[has] = np.nanmedian(a[has], axis=1)
    return out


@dataclass
class StageRatio:
    """Each rank's compute over its stage's reference (rank × step), with what it was built from."""

    ratio: np.ndarray
    ref: np.ndarray
    stage: np.ndarray
    replica: np.ndarray
    host: np.ndarray  # per rank, its index in `hosts` (-1: not placed)
    hosts: list[str]


def stage_ratio(comp: np.ndarray, seen: np.ndarray, meta: JobMeta, kinds: dict[str, str]) -> StageRatio:
    """Every rank's compute per step over its stage peers' low quartile: 1 is typical."""
    host, stage, replica, hosts = layout_units(meta, comp.shape[0], kinds)
    ref = stage_reference(comp, seen, stage)
    return StageRatio(comp / np.maximum(ref[stage], 1e-9), ref, stage, replica, host, hosts)


def _stage_units(ref: np.ndarray, sr: StageRatio, seen: np.ndarray) -> list[tuple[RankUnit, float]]:
    """Stages that compute clearly longer than the fastest stage, each with its blame (s/step) and,
    in its detail, the column its excess began at where that is not the first ("since"). A stage
    that is one host's, and the host nothing else, ties with that host (`_host_of_stage`)."""
    stage = sr.stage
    if ref.shape[0] < 2 or not np.isfinite(ref).any():
        return []
    over = ref / np.maximum(np.nanmin(ref, axis=0), 1e-9)
    y = row_nanmedian(over)
    out = []
    for s in np.flatnonzero(y > 1 + STAGE_EXCESS):
        ranks = np.flatnonzero(seen & (stage == s)).tolist()
        blame = float((y[s] - 1) * np.nanmedian(np.nanmin(ref, axis=0)))
        k = level_shift(over[s], 1 + STAGE_EXCESS)
        detail: dict[str, object] = {"stage": int(s), "over": float(y[s])}
        if k:
            detail["since"] = k
        alone = _host_of_stage(int(s), sr)
        out.append((RankUnit("config", ranks, 0.0, 1.0, f"pipeline stage {int(s)}", detail,
                             also=[alone] if alone is not None else []), blame))
    return out


def _host_of_stage(s: int, sr: StageRatio) -> RankUnit | None:
    """The host that holds every rank of stage `s` and no other rank, if one does: more layers on
    that stage and a slow host computing it read alike (a real tp2 pp4 dp1 job, a host of two GPUs
    a stage, its host 1.5x slow from the first step, read "config")."""
    mine = np.flatnonzero(sr.stage == s)
    h = np.unique(sr.host[mine])
    if h.size != 1 or h[0] < 0 or not np.array_equal(np.flatnonzero(sr.host == h[0]), mine):
        return None
    return RankUnit("host", mine.tolist(), 0.0, 1.0, sr.hosts[int(h[0])], {"stage": s})


def _stage_devices(unit: RankUnit, comp: np.ndarray, seen: np.ndarray, meta: JobMeta, kinds: dict[str, str],
                   waited: np.ndarray | None, peers: dict[int, list[int]] | None) -> list[RankUnit]:
    """A stage whose compute stepped up mid-run is no split of layers: the devices of the stage
    whose own time grew from that column on (where the stage has no peers to compare with, as
    with one model replica logged one rank per TP group), each against its own earlier steps."""
    k, ranks = int(unit.detail["since"]), np.asarray(unit.ranks, dtype=np.int64)  # type: ignore[call-overload]
    grow = np.zeros(comp.shape[0])
    grow[ranks] = np.maximum(np.median(comp[ranks, k:], axis=1) - np.median(comp[ranks, :k], axis=1), 0.0)
    unseen = None
    if waited is not None:
        more = np.median(waited[ranks, k:], axis=1) - np.median(waited[ranks, :k], axis=1)
        unseen = np.zeros_like(grow)
        unseen[ranks] = grow[ranks] * np.clip(more / np.maximum(grow[ranks], 1e-12), 0.0, 1.0)
    units = explain_rank_blame(grow, meta, kinds, logged=seen, static=False, unseen=unseen, peers=peers)
    for u in units:
        u.detail["against"] = "its own steps before"
    return [u for u in units if u.kind in ("gpu", "host")]


def replicas_slow(ratio: np.ndarray, seen: np.ndarray, replica: np.ndarray) -> np.ndarray:
    """Replica × step: whether most of the replica's workers (COVERAGE) computed MIN_EXCESS longer
    than their stage peers."""
    n_rep = int(replica.max()) + 1 if replica.size else 0
    slow = (ratio > 1 + MIN_EXCESS) & seen[:, None]
    members = np.bincount(replica[seen], minlength=n_rep)
    hits = np.zeros((n_rep, ratio.shape[1]))
    np.add.at(hits, replica[seen], slow[seen].astype(np.float64))
    return (hits >= COVERAGE * np.maximum(members, 1)[:, None]) & (members[:, None] > 0)


def on_and_off(ratio: np.ndarray, seen: np.ndarray, replica: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, the share of the steps it was slow in (since its on-and-off excess began, where it
    began after a quiet lead: `intermittent_start`) and its median compute over its peers' in them,
    for workers slow on and off (ON_OFF_SHARE, SHIFT_MIN_STEPS steps or more); share 0 for the rest.
    `x`: each rank's typical ratio (at its peers' level: no more than MIN_EXCESS over). A real HSDP
    GPU at 1.7x every other step and a host at 1.4x (the independent generator's seed 49100 job 27)
    cost their jobs' steps under δ, and their median over every step is their peers': each read
    "healthy"; so did a real GPU at 1.42x every other step from step 24 of 36 (`python -m
    bench.realjobs --mild --seed 65`, run 2), slow in a sixth of all the steps."""
    over = (ratio > 1 + MIN_EXCESS) & seen[:, None]
    n_over = over.sum(axis=1)
    share = np.zeros(len(x))
    maybe = np.flatnonzero(seen & (x <= 1 + MIN_EXCESS) & (n_over >= SHIFT_MIN_STEPS))
    for r in maybe[np.argsort(-n_over[maybe], kind="stable")][:MAX_ONSET_RANKS]:  # (a bounded number of ranks)
        share[r] = over[r, intermittent_start(ratio[r])[0]:].mean()  # (since it began, where it began later)
    share[share < ON_OFF_SHARE] = 0.0
    level = row_nanmedian(np.where(over, ratio, np.nan))
    if share.any() and ratio.shape[1]:
        rep = replicas_slow(ratio, seen, replica)
        for k in np.unique(replica[share > 0]):  # one iteration per model replica holding such a worker
            others = np.delete(rep, k, axis=0) if 0 <= k < len(rep) else rep
            if others.size and others.any(axis=0).mean() > QUIET_BEFORE:
                share[replica == k] = 0.0  # (others took turns too: the data)
    return share, np.where(share > 0, level, 1.0)


def _data_unit(ratio: np.ndarray, seen: np.ndarray, replica: np.ndarray, typical: float) -> list[tuple[RankUnit, float]]:
    """Model replicas that take turns being slow (most of their workers at once, in different
    steps), with the blame of the slowest replica per step (s/step)."""
    n_rep = int(replica.max()) + 1 if replica.size else 0
    if n_rep < 2 or ratio.shape[1] < 3:
        return []
    slow = (ratio > 1 + MIN_EXCESS) & seen[:, None]
    rep_slow = replicas_slow(ratio, seen, replica)
    share = rep_slow.mean(axis=1)
    turns = np.flatnonzero(share > 0)
    if len(turns) < 2 or rep_slow.any(axis=0).mean() < SLOW_REPLICA_STEPS:
        return []
    # one replica slow in most steps is a device, unless another held turns too and it held no more
    # than TURNS_MOST of them: two replicas taking one turn a step share the steps about evenly, and
    # one holds just over half about every other draw (a real gloo job with dp 2 drew 20 to 19 from
    # its first step, and read "healthy")
    counts = rep_slow.sum(axis=1)
    if share.max() > OWN_STEPS and not (np.sort(counts)[-2] >= 2 and counts.max() <= TURNS_MOST * counts.sum()):
        return []
    excess = np.where(slow, ratio - 1, 0.0).max(axis=0)
    ranks = np.flatnonzero(np.isin(replica, turns) & seen).tolist()
    unit = RankUnit("data", ranks, 0.0, float(share[turns].mean()), f"{len(turns)} model replicas", {"replicas": len(turns)})
    return [(unit, float(excess.mean() * typical))]


@dataclass
class Imbalance:
    """Units that compute longer than their peers, best explained first (each `share` of all the
    excess); per rank its compute over its stage peers' (1 = typical) while slow; the typical
    compute per step (s); the step the first unit's excess began, None when from the first."""

    units: list[RankUnit]
    ratio: np.ndarray
    typical: float
    since: int | None = None
    on_off: list[int] | None = None  # since `since`, the steps the first unit was slow in, when not every one


def grown_devices(df: pd.DataFrame, meta: JobMeta, kinds: dict[str, str], since: int,
                  groups: Mapping[str, Sequence[int]]) -> list[RankUnit]:
    """The devices among the ranks of `df` (a few ranks' records, all steps) whose own time grew
    from step `since` on, each judged against its own earlier steps as `_stage_devices` judges a
    stage; `groups`: those read whole in `df`, whose lone copies are its ranks' waiting."""
    if len(df) == 0:
        return []
    world = max(meta.world_size, int(df["rank"].max()) + 1)
    ops = prepare_ops(df)
    lone = lone_copies(ops, groups)
    comp, seen, steps = compute_table(ops, world, lone)
    k = int(np.searchsorted(steps, since))
    if not 0 < k < len(steps):
        return []
    waited = lone_time(ops, lone, world, unique(ops.step))[:, -comp.shape[1]:] if lone.any() else None
    unit = RankUnit("config", np.flatnonzero(seen).tolist(), 0.0, 1.0, "", {"since": k})
    return _stage_devices(unit, comp, seen, meta, kinds, waited, unlogged_peers(ops, groups, lone, world))


def persistent_imbalance(df: pd.DataFrame, meta: JobMeta, top: int = 5,
                         hint: dict[str, str] | None = None) -> Imbalance:
    """Units that compute clearly longer than their peers in most steps, or in every step since
    one (`Imbalance`). Empty when balanced."""
    world = max(meta.world_size, int(df["rank"].max()) + 1) if len(df) else meta.world_size
    if len(df) == 0:
        return Imbalance([], np.ones(world), 0.0)
    ops = prepare_ops(df)
    lone = lone_copies(ops, meta.groups, unlisted=True)
    comp, seen, all_steps = all_steps_compute(ops, world, lone)
    first, comp, steps = first_apart(comp, all_steps)
    before = first if first is not None and first_step_whole(ops.step, ops.rank, int(all_steps[0]), len(all_steps)) else None
    waited = lone_time(ops, lone, world, unique(ops.step))[:, -comp.shape[1]:] if lone.any() else None
    return imbalance(comp, seen, steps, with_observed_groups(meta, ops), group_kinds(ops, hint), top,
                     waited, unlogged_peers(ops, meta.groups, lone, world), before)


def excess_onsets(ratio: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Per rank, the column its compute excess over its stage peers began at (0: from the first).

    A worker slowed from step N (a throttled GPU, a noisy neighbour) while the step times are too
    noisy to show it has a level shift in its own ratio to its peers, which the load of the rest
    of the machine does not move. Judged for the few ranks slow in the last third of the steps
    (a whole stage is a configuration, slow from the start)."""
    since = np.zeros(ratio.shape[0], dtype=np.int64)
    tail = ratio[:, -max(SHIFT_MIN_STEPS, ratio.shape[1] // 3):]
    late = np.flatnonzero(seen & (np.median(tail, axis=1) > 1 + MIN_EXCESS))
    if len(late) > MAX_ONSET_RANKS:
        return since
    for r in late:  # one iteration per slow rank (a host's at most)
        k = level_shift(ratio[r], 1 + MIN_EXCESS)
        since[r] = 0 if k is None else k
    return since


def worker_onset(comp: np.ndarray, seen: np.ndarray, steps: np.ndarray, meta: JobMeta, kinds: dict[str, str],
                 ranks: list[int]) -> int | None:
    """The step from which `ranks` (a GPU, a host's GPUs) have computed longer than their stage
    peers to the end, or None when their excess did not start at one step that lasts.

    A device's own compute beside its peers' in the same steps is cleaner than the job's step
    times, which the machine's load moves too: on a real gloo job a 1.6x GPU from step 25 went
    with a load blip at step 21, and the step times put the onset there."""
    mine = [r for r in ranks if 0 <= r < comp.shape[0] and seen[r]]
    if not mine or comp.shape[1] < 2 * SHIFT_MIN_STEPS:
        return None
    k = level_shift(device_ratio(comp, seen, meta, kinds, mine), 1 + MIN_EXCESS)
    return int(steps[k]) if k is not None and k > 0 else None


def later_onset(own: int | None, onset: int, irregular: Sequence[int], table: pd.DataFrame) -> int:
    """The onset from a device's own level shift (`worker_onset`) where it is one of the slow steps,
    unless the job ran slow in every logged step from its own onset to it, each nearly as much as
    in the steps since (ONSET_HELD of their typical excess): that is the fault's start. A host the
    kernel throttles is stopped in its transfers first, and its compute beside its peers' rose two
    steps later (a real tp1 job throttled at step 20: 3.7x and 4.3x steps, then 4.5x, "since
    step 22"); a busy machine before a fault slows every step by far less than the fault does.
    `table`: the job's steps (step, ratio to baseline, irregular)."""
    slow = set(irregular)
    if own is None or own not in slow:
        return onset
    step = table["step"].to_numpy(np.int64)
    excess = table["ratio"].to_numpy(np.float64) - 1.0
    held = table["irregular"].to_numpy(bool)
    between, since = (step >= onset) & (step < own), held & (step >= own)
    if onset < own and between.any() and since.any() and held[between].all() and (
            excess[between] >= ONSET_HELD * float(np.median(excess[since]))).all():
        return onset
    return own


def device_ratio(comp: np.ndarray, seen: np.ndarray, meta: JobMeta, kinds: dict[str, str], mine: list[int]) -> np.ndarray:
    """Per column, the compute of the logged ranks `mine` over their stage peers' (1 = typical).

    Where the stage has no other worker that logged (a host that is its whole pipeline stage), it
    is read beside every logged rank's low quartile instead: against itself it never moves."""
    sr = stage_ratio(comp, seen, meta, kinds)
    peers = seen & np.isin(sr.stage, sr.stage[mine]) & ~np.isin(np.arange(comp.shape[0]), mine)
    if peers.any():
        return np.asarray(np.median(sr.ratio[mine], axis=0))
    return np.asarray(np.median(comp[mine], axis=0) / np.maximum(np.quantile(comp[seen], 0.25, axis=0), 1e-9))


def held_ahead(over: np.ndarray) -> np.ndarray:
    """Per step, whether the device was slow in at least half of the FOLLOW_STEPS steps from it
    (fewer at the end): one noisy step is no start."""
    ahead = np.lib.stride_tricks.sliding_window_view(np.r_[over, np.full(FOLLOW_STEPS - 1, np.nan)], FOLLOW_STEPS)
    return np.asarray(np.nanmean(ahead, axis=1) >= 0.5)


def first_slow_step(comp: np.ndarray, seen: np.ndarray, steps: np.ndarray, meta: JobMeta, kinds: dict[str, str],
                    ranks: list[int], slow_steps: list[int]) -> int | None:
    """The first of `slow_steps` in which `ranks` computed beyond their stage peers, by half their
    typical excess in those steps or more, and did in at least half of the FOLLOW_STEPS slow steps
    from it; None when they never did.

    A device slow on and off has slow steps far apart, and the step times alone cannot tell its
    first one from an unrelated blip: its own compute beside its peers' in that step can. One
    noisy step is no start: in CI a real GPU slowed at step 20 read "since step 1" from summaries,
    the warm-up's steps 1-4 irregular too (most likely the device's one noisy step among them)."""
    mine = [r for r in ranks if 0 <= r < comp.shape[0] and seen[r]]
    if not mine:
        return None
    ratio = device_ratio(comp, seen, meta, kinds, mine)
    at = np.flatnonzero(np.isin(steps, slow_steps))
    excess = ratio[at] - 1
    over = excess > MIN_EXCESS
    if not over.any():
        return None
    strong = over & (excess >= ONSET_LEVEL * np.median(excess[over]))
    first = np.flatnonzero(strong & held_ahead(over))
    return int(steps[at[first[0]]]) if first.size else None


def imbalance(comp: np.ndarray, seen: np.ndarray, steps: np.ndarray, meta: JobMeta, kinds: dict[str, str],
              top: int = 5, waited: np.ndarray | None = None, peers: dict[int, list[int]] | None = None,
              before: np.ndarray | None = None) -> Imbalance:
    """`persistent_imbalance` on a rank × step compute table (full records, or the summaries'
    per-host and outlier-rank compute) whose columns are `steps`. `waited` (same shape): the part
    of it spent in lone copies, waiting on `peers` that logged nothing (`localize.ops.lone`).
    `before`: each rank's compute in the first recorded step, left out of `comp` (it may hold the
    warm-up), when it was logged whole: a device normal there is slow since `steps[0]`, not from
    the start (a log of sampled steps whose first is the one normal step)."""
    sr = stage_ratio(comp, seen, meta, kinds)
    ratio, ref, stage, replica = sr.ratio, sr.ref, sr.stage, sr.replica
    onset = excess_onsets(ratio, seen)
    cols = np.arange(ratio.shape[1])
    since = cols >= onset[:, None]
    # a rank slow since some step is judged on the steps since then
    x = np.where(seen, row_nanmedian(np.where(since, ratio, np.nan)), 1.0)
    typical = float(np.nanmedian(ref))
    own = row_nanmedian(ref[stage])
    worker_blame = np.where(seen, np.maximum(x - 1 - MIN_EXCESS, 0.0) * own, 0.0)
    share, level = on_and_off(ratio, seen, replica, x)
    x = np.where(share > 0, level, x)
    worker_blame = np.where(share > 0, share * np.maximum(level - 1 - MIN_EXCESS, 0.0) * own, worker_blame)
    unseen = None
    if waited is not None:
        # the excess that is time in lone copies beyond the stage peers': the unlogged peers' delay
        extra = (waited - stage_reference(waited, seen, stage)[stage]) / np.maximum(ref[stage], 1e-9)
        xw = np.where(seen, row_nanmedian(np.where(since, extra, np.nan)), 0.0)
        unseen = worker_blame * np.clip(xw / np.maximum(x - 1, 1e-9), 0.0, 1.0)
    beside = wait_beside_peers(waited, seen, stage) if waited is not None else None
    workers = [u for u in explain_rank_blame(worker_blame, meta, kinds, top=top, logged=seen, unseen=unseen, peers=peers,
                                             peer_wait=beside) if u.kind in ("gpu", "host")]
    found = [(u, u.share * float(worker_blame.sum())) for u in workers]
    # more layers is more of the stage's own compute: where its logged ranks also wait on unlogged
    # TP peers (lone copies, as long in every stage), that wait only dilutes the stage's excess, and a
    # stage whose excess is that wait has no more layers (a slow unlogged peer: found as it grew)
    stages = _stage_units(ref, sr, seen)
    layers = stages if waited is None else _stage_units(stage_reference(comp - waited, seen, stage), sr, seen)
    found += [(unit, blame) for unit, blame in layers if "since" not in unit.detail]
    for unit, blame in stages:
        if "since" not in unit.detail:
            continue
        for u in _stage_devices(unit, comp, seen, meta, kinds, waited, peers):
            found.append((u, u.share * blame))
            onset[u.witnesses] = int(unit.detail["since"])  # type: ignore[call-overload]
            x[u.witnesses] = 1 + blame / max(typical, 1e-9)
    found += _data_unit(ratio, seen, replica, typical)
    total = sum(b for _, b in found)
    if total <= 0:
        return Imbalance([], x, typical)
    for u, b in found:
        u.share = b / total
    units = sorted((u for u, _ in found), key=lambda u: -u.share)[:top]
    first = units[0]
    began = int(onset[np.asarray(first.witnesses)].min()) if first.kind in ("gpu", "host") else 0
    on_off = None
    mine = [r for r in first.witnesses if 0 <= r < len(seen) and seen[r]]
    if first.kind in ("gpu", "host", "data") and mine:
        own = device_ratio(comp, seen, meta, kinds, mine) if first.kind != "data" else slowest_replica(ratio, seen, replica)
        # a shift in how often it was slow is no level: on and off, it began at its episode's first slow step
        if began == 0 or (own[began:] > 1 + MIN_EXCESS).mean() < LEVEL_HELD:
            start, slow_cols = intermittent_start(own)
            if start > 0:
                began = start
                on_off = [int(steps[c]) for c in slow_cols] if len(slow_cols) < len(steps) - began else None
        if began == 0 and first.kind != "data":
            began = normal_lead(own, np.median(comp[mine], axis=0))
    if (began == 0 and before is not None and first.kind in ("gpu", "host") and mine
            and normal_first_step(before, comp, seen, meta, kinds, mine)):
        return Imbalance(units, x, typical, int(steps[0]), on_off)
    return Imbalance(units, x, typical, int(steps[began]) if began > 0 else None, on_off)


def normal_lead(own: np.ndarray, comp: np.ndarray) -> int:
    """The first column of a device's lasting excess when only a step or two before it were
    normal (too few for `level_shift`), else 0. `own`: per column its compute over its peers'
    (`device_ratio`); `comp`: its compute (s).

    A sampled log may hold the warm-up and then the fault's first step (steps 0 and 1 logged, a
    host slow from step 6, the next logged). A warm-up lengthens every worker's compute, so the
    device's ratio to its peers shrinks there, but its lead over them in seconds does not: a
    device at no lead at all in those steps was normal in them."""
    over = own > 1 + MIN_EXCESS
    k = int(np.argmax(over))
    if not over.any() or k == 0 or k >= SHIFT_MIN_STEPS or over[k:].mean() < LEVEL_HELD:
        return 0
    lead = comp * (1 - 1 / np.maximum(own, 1e-9))  # (its compute beyond its peers', s)
    since = float(np.median(lead[k:][over[k:]]))
    return k if bool((lead[:k] <= LEAD_NORMAL_SHARE * since).all()) else 0


def slowest_replica(ratio: np.ndarray, seen: np.ndarray, replica: np.ndarray) -> np.ndarray:
    """Per column, the slowest model replica's compute over its stage peers' (its workers' median):
    data taking turns, step by step, whichever replica's turn it was."""
    out = np.ones(ratio.shape[1])
    for k in np.unique(replica[seen]):  # one iteration per model replica
        out = np.maximum(out, np.median(ratio[seen & (replica == k)], axis=0))
    return out


def intermittent_start(ratio: np.ndarray) -> tuple[int, np.ndarray]:
    """The column a device's on-and-off excess began at (0: from the first, or none) and the
    columns it was slow in since.

    A device slow every other step has no level that lasts (`level_shift`), and its median excess
    over every step says "slow from the start"; its first slow step, after a run of normal ones,
    says when it began."""
    over = ratio > 1 + MIN_EXCESS
    held = np.flatnonzero(over & held_ahead(over))
    if not held.size:
        return 0, np.zeros(0, dtype=np.int64)
    k = episode_start(over, int(held[0]))
    if k < SHIFT_MIN_STEPS:
        return 0, np.zeros(0, dtype=np.int64)
    before = ratio[:k]
    if over[:k].mean() > QUIET_BEFORE or np.median(before) > 1 + MIN_EXCESS / 2:
        return 0, np.zeros(0, dtype=np.int64)
    return k, k + np.flatnonzero(over[k:])


def episode_start(over: np.ndarray, k: int) -> int:
    """The first slow column of the episode that holds slow column `k`: slow columns at most
    EPISODE_GAP apart belong to one, as the timeline's irregular steps do. A device slow every
    other step, logged in a sample of the steps, may have sampled normal steps right after its
    first slow one; that first slow step is still its start."""
    slow = np.flatnonzero(over[:k + 1])
    apart = np.flatnonzero(np.diff(slow) > EPISODE_GAP)
    return int(slow[apart[-1] + 1]) if apart.size else int(slow[0])
