"""Localize from CommOps: detector -> wait graph -> cross-iteration ranking -> verdict.

`localize_commops(trace, timeline, steps, top)` reads the records of the window, and
`analyse_ops` does the work on a DataFrame, so the summary path (`localize.summary`) can run
the same analysis on the few ranks and steps it fetched. The candidates the verdict names, and
the evidence sentences that say why, are made by `localize.candidates` from what it finds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

from collector.trace.meta import JobMeta
from collector.trace.schema import OPS
from collector.trace.traceio import Trace
from localize.candidates import (
    few_irregular,
    imbalance_verdict,
    lasting_over_few_steps,
    lost_seconds,
    merge,
    net_candidate,
    rank_candidate,
    step_times_past_warmup,
    with_ties,
)
from localize.detect.detector import rule_detect
from localize.detect.model_store import load_detector
from localize.network.devices import (
    NetCandidate,
    beyond_common_mode,
    discount_collateral,
    resolve_network,
    slow_units,
    slowing_per_byte,
    split_slow,
    tie_note,
    tied_best,
)
from localize.network.transfers import MIN_EXCESS_S, SLOW_EXCESS, slow_transfer_excess
from localize.ops.grouping import dense_codes, group_quantiles, group_sum, present, unique
from localize.ops.groupkinds import group_kinds, observed_members, with_observed_groups
from localize.ops.history import per_row, scale_table, scaled_elapsed, slot_stats, step_scale
from localize.ops.lone import (
    lone_copies,
    lone_time,
    own_slow_steps,
    share_among,
    silent_ranks,
    unlogged_members,
    unlogged_peers,
    wait_change,
)
from localize.ops.steps import StepView, with_steps
from localize.ops.table import CODED, TIMED, Ops, prepare_ops, rank_step_compute, sorted_rows
from localize.verdict import Candidate, Verdict
from localize.waits.persistent import (
    compute_table,
    first_slow_step,
    later_onset,
    persistent_imbalance,
    worker_onset,
)
from localize.waits.ranking import MIN_SHARE, RankUnit, explain_rank_blame, host_index, none_longer
from localize.waits.waitgraph import WaitGraph, build_waitgraph
from timeline.columns import read_commops
from timeline.instances import host_codes
from timeline.steps import robust_sigma

COLUMNS = ["rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step"]
#: a unit whose messages are all smaller than this (a barrier, a scalar) clears no network device by
#: running normally: no loss of bandwidth shows on it. (A real job's 8 KiB activations through a NIC
#: throttled to 1 Mbit/s did slow down, and their on-time peers cleared the other hosts.)
CLEARING_BYTES = 1 << 10
SHADOW_SHARE = 0.9  # a data unit's blame this much on the ranks whose transfers the best device slowed is its shadow (`network_shadow`)
NEAR_BEST = 0.9  # a host's transfers explained this nearly as well as the best device's: its ranks' blame may tip it (`host_on_both`)
GROWTH_SIGMAS = 3.0  # a host's ranks computed longer: beyond this many robust σ of the other ranks' growth (`computed_longer`)
BIG_HOST_SHARE = 8  # ... measured against the others' growth where the host holds 1/8 of the logged ranks or more
#: ... and by at least this share of a normal step: among four ranks the robust σ is tiny, and a real HSDP
#: host's 0.5 ms more compute (0.2% of its 270 ms steps) beside its throttled NIC named the host; real
#: hosts under a CPU quota computed 70-330 ms a step longer than their peers (40-130% of a normal step)
MATERIAL_GROWTH = 0.03


@dataclass
class Analysis:
    """Everything the verdict was built from (kept for evidence, benchmarks and tests)."""

    ops: Ops
    abnormal: np.ndarray  # per row, the detector's call (its scores are dropped once thresholded)
    graph: WaitGraph
    rank_blame: np.ndarray
    rank_units: list[RankUnit]
    net: list[NetCandidate]
    comm_blame: float
    unit_names: list[str]


def _instance_layout(ops: Ops, meta: JobMeta) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray,
                                                      dict[str, list[int]], set[str], dict[str, str]]:
    """Per instance: expected copies, sum of expected member ranks, unit code; unit names,
    members, the units whose operator is all-to-all, and each unit's group."""
    gnames = ops.groups
    sizes = np.array([len(meta.groups.get(str(g), [])) for g in gnames], dtype=np.int64)
    msum = np.array([float(sum(meta.groups.get(str(g), []))) for g in gnames])
    obs_max = pd.Series(ops.inst_size).groupby(ops.inst_group).max().reindex(range(len(gnames))).fillna(0).to_numpy()
    g_size = np.where(sizes > 0, sizes, obs_max).astype(np.int32)  # (a group's size: int32, as its per-instance copy)
    p2p = ops.inst_p2p
    expected = np.where(p2p, 2, g_size[ops.inst_group])
    members_sum = np.where(p2p, ops.inst_src + ops.inst_dst, msum[ops.inst_group])
    # units: a collective group, or one p2p stream (group, src, dst)
    ukey = np.where(p2p, (ops.inst_group.astype(np.int64) * 65_536 + ops.inst_src) * 65_536 + ops.inst_dst, ops.inst_group)
    ucode, _ = pd.factorize(ukey)
    names: list[str] = []
    members: dict[str, list[int]] = {}
    group_of: dict[str, str] = {}
    seen = observed_members(ops) if any(not meta.groups.get(str(g)) for g in gnames) else {}
    first_inst = pd.Series(np.arange(ops.n_inst)).groupby(ucode).first().to_numpy()
    for i in first_inst:
        g = str(gnames[ops.inst_group[i]])
        if p2p[i]:
            name = f"{g}:{ops.inst_src[i]}->{ops.inst_dst[i]}"
            members[name] = [int(ops.inst_src[i]), int(ops.inst_dst[i])]
        else:
            name = g
            members[name] = list(meta.groups.get(g, [])) or seen.get(int(ops.inst_group[i]), [])
        names.append(name)
        group_of[name] = g
    a2a = ops.opcode[ops.late_row] == OPS.index("all_to_all")
    mesh = {names[u] for u in unique(ucode[a2a])}
    return expected, members_sum, names, ucode.astype(np.int32 if ops.n_inst < 2**31 else np.int64), members, mesh, group_of


def _late_history(ops: Ops, view: StepView, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per instance: its last arriver's normal time and interquartile range over the reference
    steps, drift-scaled back to the step at hand: `slot_history` read at the last arrivers' rows
    only (its three per-row arrays, 24 bytes a row, were this stage's peak)."""
    scales = scale_table(ops, view.steps)
    med, q1, q3 = slot_stats(ops, scaled_elapsed(ops, scales), ref)
    late = ops.late_row
    s = per_row(scales, ops, late)
    slot = ops.slot[late]
    med, q1, q3 = med[slot], q1[slot], q3[slot]
    miss = np.isnan(med)
    if miss.any():  # slots never seen in reference steps: the instance minimum (transfer time)
        fb = ops.inst_min[ops.inst[late]] / s
        med, q1, q3 = np.where(miss, fb, med), np.where(miss, fb, q1), np.where(miss, fb, q3)
    return med * s, (q3 - q1) * s


#: a slot's 90th percentile bounds its normal copies where this many normal steps measured it
USUAL_MIN_NORMAL = 15
#: ... and their largest copy bounds them where this many did (a normal copy passes it one time in ten or less)
FEW_NORMAL = 9


def _transfer_history(ops: Ops, scale: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per instance: the median, interquartile range, lower quartile and 90th percentile, over the normal steps
    `ref`, of the time the last arriver's copy took (`inst_min`: the transfer alone, no wait in
    it) in the same operator stream at the same place in its step; drift-scaled (`scale`: per
    instance). NaN where never seen in a normal step.

    A slot's history mixes copies that waited with ones that did not: on a wide all-to-all its
    spread hid a NIC at 2.8x (seed 8686 job 37). Last arrivers' copies alone are the path's time."""
    seq = ops.inst_seq.astype(np.int64)
    stream_step, _ = dense_codes(ops.inst_pair.astype(np.int64) * (1 << 32) + (ops.inst_step.astype(np.int64) - int(ops.inst_step.min())))
    first = np.full(int(stream_step.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(first, stream_step, seq)
    place, k = dense_codes(ops.inst_pair.astype(np.int64) * (1 << 32) + (seq - first[stream_step]))
    del seq, stream_step, first
    took = ops.inst_min / scale
    normal = np.isin(ops.inst_step, ref) & np.isfinite(took)
    q1, med, q3, q9, top = group_quantiles(place[normal], k, took[normal], (0.25, 0.5, 0.75, 0.9, 1.0))
    # (a 90th percentile of a few copies is their noisiest: from twelve normal steps of history the summary path
    # put a third of a host's DP copies past it in the judged steps, a real link's end named its NIC); from
    # fewer, their largest, which a normal copy passes about as rarely (one in n + 1)
    seen = np.bincount(place[normal], minlength=k)
    q9 = np.where(seen >= USUAL_MIN_NORMAL, q9, np.where(seen >= FEW_NORMAL, top, np.inf))
    return med[place] * scale, (q3 - q1)[place] * scale, q1[place] * scale, q9[place] * scale


#: a path class's normal time is learned from at least this many of its groups
CLASS_MIN_GROUPS = 3


def _class_history(ops: Ops, meta: JobMeta, scale: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per collective instance: the median and interquartile range, over the normal steps `ref`,
    of the transfer time (`inst_min`) of its path class -- the same operator on the same payload
    among as many members on as many hosts -- NaN where fewer than `CLASS_MIN_GROUPS` groups of
    the class were seen. A fault on in many steps it did not make irregular (a link under an
    overlapped DP ring, on in half the steps) is half of its own stream's history; the other
    groups of its class ran normally."""
    late = ops.late_row
    host_of = host_codes(meta, np.arange(max(meta.world_size, int(ops.rank.max(initial=0)) + 1)))[0]
    hosts = np.full(len(ops.groups), -1, dtype=np.int64)
    for g, name in enumerate(ops.groups):  # (one entry per group, not per row)
        members = meta.groups.get(str(name))
        if members:
            hosts[g] = len(np.unique(host_of[np.asarray(members, dtype=np.int64)]))
    key = np.stack([ops.opcode[late].astype(np.int64), ops.nbytes[late].astype(np.int64),
                    ops.inst_size.astype(np.int64), hosts[ops.inst_group]], axis=1)
    _, cls = np.unique(key, axis=0, return_inverse=True)
    cls = cls.ravel()
    k = int(cls.max(initial=-1)) + 1
    took = ops.inst_min / scale
    normal = ~ops.inst_p2p & (ops.inst_size >= 2) & np.isin(ops.inst_step, ref) & np.isfinite(took)
    q1, med, q3 = group_quantiles(cls[normal], k, took[normal], (0.25, 0.5, 0.75))
    pairs = np.unique(cls[normal].astype(np.int64) * (1 << 32) + ops.inst_group[normal].astype(np.int64))
    groups = np.bincount((pairs >> 32).astype(np.int64), minlength=k)
    known = groups >= CLASS_MIN_GROUPS
    return np.where(known, med, np.nan)[cls] * scale, np.where(known, q3 - q1, np.nan)[cls] * scale


def _comm_excess(ops: Ops, meta: JobMeta, abnormal: np.ndarray, view: StepView,
                 ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per instance: how much longer the transfer took than normal, 0 unless it is clearly slow;
    and whether the transfer's time could be seen at all. Each instance's last arriver's normal
    time and the interquartile range of its slot are `_late_history`'s, over the normal steps
    `ref` (the collectives' figures, and their scratch, are dropped before the p2p transfers'
    passes, which peak).

    A collective's transfer is its last arriver's copy (it did not wait): slow when that copy,
    and so every copy, is abnormal; or, whatever the detector says, when that copy alone took
    `SLOW_EXCESS` longer than its own normal time and far outside its normal spread (`spread`: the
    slot's interquartile range). A p2p transfer is judged by how long its data took once both
    ends had posted (`localize.network.transfers`): a long send is often a late receiver.
    """
    b, spread = _late_history(ops, view, ref)
    late = ops.late_row
    n_abn = group_sum(ops.inst, ops.n_inst, abnormal)
    ex = ops.elapsed_at(late) - b
    flagged = abnormal[late] & (ex > 0.2 * b) & (n_abn >= ops.inst_size)
    beyond = (ex > np.maximum(SLOW_EXCESS * b, MIN_EXCESS_S)) & (ex > 5 * np.nan_to_num(spread))
    del b, spread, n_abn
    # the same test against the last arrivers' own history: the transfer's time, waits left out
    scale = step_scale(ops, view.steps, late)
    b, spread, fast, usual = _transfer_history(ops, scale, ref)
    own = ops.inst_min - b
    alone = (own > np.maximum(SLOW_EXCESS * b, MIN_EXCESS_S)) & ((own > 5 * spread) | (ops.inst_min > usual)) & ~(flagged | beyond)
    del b, spread, usual
    # and, in the steps judged, against its path class, where its own history holds the fault
    # too: slower than the class needs and than its own stream's fast steps
    b, spread = _class_history(ops, meta, scale, ref)
    vs_class = ops.inst_min - b
    by_class = ((vs_class > np.maximum(SLOW_EXCESS * b, MIN_EXCESS_S)) & (vs_class > 5 * spread)
                & (ops.inst_min > (1 + SLOW_EXCESS) * fast) & ~(flagged | beyond | alone)
                & ~np.isin(ops.inst_step, ref))
    del b, spread, fast, scale
    ex = np.where(alone, own, np.where(by_class, vs_class, ex))
    collective = np.where(~ops.inst_p2p & (ops.inst_size >= 2) & (flagged | beyond | alone | by_class), ex, 0.0)
    del ex, own, vs_class, flagged, beyond, alone, by_class
    p2p_excess, seen = slow_transfer_excess(ops, meta, ref)
    return np.maximum(collective, p2p_excess), seen


def _judgeable(ops: Ops, expected: np.ndarray, unit_of_inst: np.ndarray) -> np.ndarray:
    """Per instance: its copies tell whether the transfer itself was slow.

    Every expected copy is there; or a collective is short of a few copies (the logger lost
    rows) in a unit that was seen whole elsewhere. A transfer is slow for every member, so the
    copies present show it; in a unit never seen whole a rank may be lost outright, and its
    short instances say nothing (the lost rank may have been the late one).
    """
    size = ops.inst_size
    unit_max = pd.Series(size).groupby(unit_of_inst).max()
    seen_whole = unit_max.reindex(unit_of_inst).to_numpy() >= expected
    short = expected - size
    lossy = ~ops.inst_p2p & seen_whole & (short <= np.maximum(1, 0.05 * expected))
    return ((size >= expected) | lossy) & (size >= 2)


#: with this many recorded steps or more, the first is partial (warm-up, a logger starting mid-step)
PARTIAL_FIRST_STEPS = 4


def partial_first(steps: np.ndarray) -> int | None:
    """The first of the recorded `steps` (unique) when it is partial: never judged, never history."""
    return int(steps.min()) if len(steps) >= PARTIAL_FIRST_STEPS else None


def normal_steps(steps: np.ndarray, irregular: np.ndarray, table: pd.DataFrame | None) -> np.ndarray:
    """The steps operators' normal times are learned from: neither irregular, nor the first
    (partial: a logger starting mid-step) when there are four or more, nor warm-up, whose
    collectives all run slow and would cancel a slow ring's evidence, nor a step `table` marks
    as no history. All but the irregular ones when nothing else is left."""
    odd = list(irregular)
    fetched = table is not None and "history" in table  # (the summary path: the run's partial first already left out)
    if not fetched and (first := partial_first(steps)) is not None:
        odd.append(first)
    if table is not None and "pattern" in table:
        odd += table.loc[table["pattern"] == "warm-up", "step"].astype(int).tolist()
    if table is not None and "irregular" in table:
        # (the summary path judges a few irregular steps; the others it fetched, before them, are context)
        odd += table.loc[table["irregular"].astype(bool), "step"].astype(int).tolist()
    if fetched and table is not None:  # (which fetched steps are history)
        odd += table.loc[~table["history"].astype(bool), "step"].astype(int).tolist()
    ref = np.setdiff1d(steps, np.asarray(odd, dtype=np.int64))
    return ref if len(ref) else np.setdiff1d(steps, irregular)


def analyse_ops(df: pd.DataFrame, meta: JobMeta, view: StepView, top: int = 5,
                partial: set[str] | None = None, forest: bool = True,
                unlisted: bool | None = None, quiet: np.ndarray | None = None,
                some_unlogged: bool | None = None) -> tuple[Verdict, Analysis | None]:
    """Run detection, the wait graph and the ranking on CommOps rows of the window.

    Consumes `df`'s group, op, peer, seq and time columns (`localize.ops.table.CODED`, `TIMED`).
    `partial`: groups whose members were not all fetched (summary path); their operators
    keep their place in each rank's timeline but are never judged. `forest=False` judges
    operators with the robust rule, as the sidecars do (the fast path). `unlisted`: a group
    meta.json does not list, logged by one rank only, had members that did not log (default:
    when every rank's records are here, no `partial`; the summary path knows it from one step
    of every rank). `quiet`: per rank, known to have logged nothing (default: the ranks absent here).
    `some_unlogged`: some rank of the job logged nothing (one rank logged per TP group, a host
    without a logger); default: a rank of the world absent here.
    """
    unlisted = not partial if unlisted is None else unlisted
    irr = np.sort(np.asarray(view.irregular_steps, dtype=np.int64))
    if len(df):
        logged = unique(df["step"].to_numpy())
        # (a step with no rows here cannot be judged: a live fetch may come back without one)
        irr = irr[np.isin(irr, logged)]
        if (first := partial_first(logged)) is not None:
            irr = irr[irr != first]
    if len(df) == 0 or len(irr) == 0:
        return persistent_verdict(df, meta, top, view.group_kind, step_times_past_warmup(view.steps)), None
    ops = prepare_ops(_moved_rows(df))
    all_steps = unique(ops.step)
    ref = normal_steps(all_steps, irr, view.steps)
    detector = load_detector() if forest else None
    detection = detector.detect(ops, view.steps, ref) if detector is not None else rule_detect(ops, view.steps, ref)
    abnormal, method = detection.abnormal, detection.method
    del detection  # (its per-row scores are read by nothing past the threshold: 8 bytes a row off the peak)
    comm_excess, transfer_seen = _comm_excess(ops, meta, abnormal, view, ref)
    expected, members_sum, unit_names, unit_of_inst, members, mesh, group_of = _instance_layout(ops, meta)
    kinds = group_kinds(ops, view.group_kind)
    unit_kind = {u: kinds.get(g, "") for u, g in group_of.items()}
    if partial:
        skip = np.isin(ops.groups.astype(str), sorted(partial))[ops.inst_group] & ~ops.inst_p2p
        expected = np.where(skip, np.iinfo(np.int64).max // 2, expected.astype(np.int64))
    in_irr = np.isin(ops.inst_step, irr)
    world = max(meta.world_size, int(ops.rank.max()) + 1)
    size = np.zeros(len(unit_names))
    np.maximum.at(size, unit_of_inst, ops.nbytes[ops.late_row].astype(np.float64))
    # which units' own transfers were slow in the irregular steps (resolved to devices below)
    judge = _judgeable(ops, expected, unit_of_inst) & transfer_seen
    any_unlogged = not present(ops.rank, world).all() if some_unlogged is None else some_unlogged
    if any_unlogged:
        # a collective of a few bytes (a grad-norm all-reduce, a barrier) moves no data: where some
        # ranks logged nothing, its time past its logged members' later post is the wait on members
        # that did not log (an unlogged TP peer whose own ring ran long), never a transfer
        judge &= (size >= CLEARING_BYTES)[unit_of_inst]
    slow_transfer = judge & (comm_excess > 0)
    in_ref = np.isin(ops.inst_step, ref)
    per_byte = slowing_per_byte(unit_of_inst, len(unit_names), comm_excess, slow_transfer & in_irr, size)
    p2p_per_byte = {unit_names[u]: float(per_byte[u]) for u in unique(unit_of_inst[ops.inst_p2p])}
    excess = discount_collateral(slow_units(unit_of_inst, unit_names, slow_transfer, judge & in_irr, min_frac=0.0,
                                            normal=judge & in_ref), p2p_per_byte)
    slow_unit = np.isin(np.asarray(unit_names, dtype=object), np.asarray(list(split_slow(excess)[0]), dtype=object))
    slow, partly = split_slow(beyond_common_mode(excess, members, meta, unit_kind))
    slowing = sum(excess.values())  # (what every host's inside shares is slowing too, explained by no device)
    short_comm = slow_transfer & (ops.inst_size < expected) & slow_unit[unit_of_inst]
    # members that logged nothing on hosts where nothing was logged (no logger ran there): a
    # collective short of exactly those waited on them. (Where a host's other ranks logged, as
    # with one rank per TP group, the logged ones show their waits: `localize.ops.lone`.)
    silent = silent_ranks(ops, meta, world) if quiet is None else np.asarray(quiet[:world], dtype=bool)
    unlogged = [m if silent[m].all() else m[:0] for m in unlogged_members(ops, meta.groups, world, partial or ())]
    short_of = np.array([len(m) or -1 for m in unlogged], dtype=np.int32)[ops.inst_group]
    graph = build_waitgraph(ops, abnormal, all_steps, expected, comm_excess, members_sum, ref, short_comm,
                            (unit_of_inst, irr), short_of)

    # cross-iteration blame: each root is charged the delay it imposed where it originated
    # (the instance its chain ends at; delays further down a chain are its propagation), in
    # the irregular steps beyond what the same root costs in an average normal step
    origin = graph.root_inst == np.arange(ops.n_inst)
    norm = len(irr) / max(len(ref), 1)
    # a root must explain the delay with its own compute; lateness nothing explains is not blamed.
    # Where a rank's group peers were not logged (one rank per TP group), the time it spent in
    # their operators beyond what waiting shows is theirs: a slow peer there, named by this rank
    lone = lone_copies(ops, meta.groups, partial or (), unlisted=unlisted)
    waited = lone_time(ops, lone, world, all_steps)
    lone_more = lone_excess(waited, ops.rank[lone], all_steps, ref)
    unseen_wait = lone_more[graph.root_rank.clip(0), np.searchsorted(all_steps, ops.inst_step)]
    explained = graph.orphan | (np.maximum(graph.excess_compute, unseen_wait) >= 0.5 * graph.delay)
    to_rank = (graph.suspect | graph.orphan) & origin & explained & (graph.root_rank >= 0)

    # an instance that waited on members that logged nothing: its delay is theirs, shared among them
    shared = graph.orphan & (graph.missing_rank < 0) & origin

    def per_rank(mask: np.ndarray) -> np.ndarray:
        one = mask & to_rank
        out = np.bincount(graph.root_rank[one], weights=graph.delay[one], minlength=world)[:world]
        return out + share_among(unlogged, ops.inst_group[mask & shared], graph.delay[mask & shared], world)

    normal_blame = per_rank((to_rank | shared) & in_ref)
    rank_blame = np.maximum(per_rank((to_rank | shared) & in_irr) - norm * normal_blame, 0.0)
    # per slow step: each step's blame beyond a normal step's
    col = np.searchsorted(irr, ops.inst_step)
    at = to_rank & in_irr
    by_step = np.zeros((world, len(irr)))
    np.add.at(by_step, (graph.root_rank[at], col[at]), graph.delay[at])
    by_step = np.maximum(by_step - normal_blame[:, None] / max(len(ref), 1), 0.0)
    grown = compute_growth(ops, world, all_steps, ref)
    in_slow = np.isin(all_steps, irr)
    unseen_blame = rank_blame * unseen_share(grown, lone_more, in_slow)
    # a last arriver that was not late on its own clock (since the copies last ended together it
    # spent no more time than its peers computing, waiting or in other transfers) did not hold
    # them up: its data reached them late, so the transfer between them was slow -- e.g. a
    # throttled egress, where the sender hands its data to the NIC and is done first. Such
    # instances are network evidence for their unit, like all-copies-slow ones. One that did
    # spend longer (a transfer elsewhere within its noise, say a wide DP ring) was simply late;
    # one whose time cannot be measured (a lost record in between) is evidence of nothing.
    on_time = graph.measured & (graph.excess_own < 0.5 * graph.delay)
    # (a p2p transfer's data is measured directly, `localize.network.transfers`: never inferred this way)
    late_data = graph.suspect & origin & ~explained & on_time & (graph.root_rank >= 0) & judge & ~graph.comm & ~ops.inst_p2p
    if late_data[in_irr].any():
        excess = discount_collateral(slow_units(unit_of_inst, unit_names, slow_transfer | late_data, judge & in_irr,
                                                min_frac=0.0, normal=judge & in_ref), p2p_per_byte)
        slow, partly = split_slow(beyond_common_mode(excess, members, meta, unit_kind))
        slowing = sum(excess.values())
    comm_like = graph.comm | late_data
    comm_w = np.where(comm_like & in_irr, graph.delay, 0.0)
    comm_total = max(float(comm_w.sum()) - norm * float(graph.delay[comm_like & in_ref].sum()), 0.0)
    # only units with a judged instance are evidence: one never seen says nothing of health; nor
    # does a unit of tiny messages that ran normally (a barrier, a scalar's all-reduce: a link that
    # lost bandwidth passes them on time, yet they would clear it of the slow rings it carries)
    seen = np.bincount(unit_of_inst[judge & in_irr], minlength=len(unit_names))
    judged = {n: members[n] for n, k, b in zip(unit_names, seen, size, strict=True)
              if k > 0 and (b >= CLEARING_BYTES or n in slow)}
    net = resolve_network(judged, slow, meta, top=1 << 30, mesh=mesh, partly=partly, total=slowing)  # all, to count ties
    tab = view.steps
    ran_normally = bool(((~tab["irregular"].astype(bool)) & (tab["pattern"] != "warm-up")
                         & (tab["step"].to_numpy() < irr.min())).any())
    layout = with_observed_groups(meta, ops)  # (a meta.json without groups: the ranks that logged in each)
    logged = present(ops.rank, world)
    grew = np.median(grown[:, in_slow], axis=1)
    host_of = host_index(layout, world)
    longer = computed_longer(grew, logged, host_of, MATERIAL_GROWTH * _normal_step_s(view.steps, irr))
    units = explain_rank_blame(rank_blame, layout, kinds, top=top, logged=logged, static=not ran_normally,
                               unseen=unseen_blame, peers=unlogged_peers(ops, meta.groups, lone, world), by_step=by_step,
                               peer_wait=wait_change(waited, own_slow_steps(by_step, in_slow), np.isin(all_steps, ref)),
                               quiet=silent, grew=grew, computed=longer)
    hosts = layout.hosts()
    net = [c for c in net if not collateral_inside(c, hosts, host_of, longer)]
    rank_total = float(rank_blame.sum())
    if net and comm_total > 0:
        units, shadow = network_shadow(units, net[0], slow, members, rank_blame, meta)
        rank_total, comm_total = rank_total - shadow, comm_total + shadow
    total = rank_total + comm_total
    lost = lost_seconds(view.steps, irr.tolist())
    if total <= 0 or (lost > 0 and total < 0.05 * lost):
        # the steps are slow beyond their noise (`timeline.steps.settle`): said, with why no device is named
        unseen = world - len(unique(ops.rank))
        what = ("whose records were not read here (`laggard localize` reads them all)" if partial else
                "that logged nothing (log every rank, or capture flows with `laggard capture`)")
        where = f"to the {unseen} ranks {what} or " if unseen > 0 else ""
        return Verdict(meta.job, "irregular", [int(s) for s in irr], float(view.slowdown), [],
                       {"source": "commops", "note": f"steps {[int(s) for s in irr]} ran {view.slowdown:.2f}x their "
                        f"normal time, but no logged operator's delay explains it: the time went {where}outside "
                        "communication (data loading, checkpointing, the host)"}, onset_step=view.onset_step), None
    alternates: list[Candidate] = []
    both = host_on_both(units, net, meta, rank_total / total, comm_total / total, longer) if net and comm_total > 0 else None
    tipped = host_breaks_tie(net, host_of, hosts, longer) if both is None and net and comm_total > 0 else None
    if both is not None:
        # one host explains the two together: its ranks' compute and its transfers, one finding
        unit, host_net, joint = both
        units = [u for u in units if u is not unit]
        host = net_candidate(host_net, joint, meta, logged)
        host.evidence += rank_candidate(unit, rank_total / total, graph, ops, meta, lone).evidence
        alternates = [net_candidate(c, comm_total / total * c.score * 0.5, meta, logged) for c in net[:top] if c is not host_net]
    elif tipped is not None:
        host = net_candidate(tipped, comm_total / total * tipped.score, meta, logged)
        mine = (host_of == hosts.index(str(host.host))) & logged[:world]
        more = float(np.median(grew[mine]) - np.median(grew[logged[:world] & ~mine])) * 1e3
        host.evidence.append(f"its {int(mine.sum())} logged GPUs, and no other host's, computed longer in the slow steps "
                             f"({more:.0f} ms a step more than the GPUs elsewhere): a NIC slows the transfers, not its "
                             "host's compute; a starved host slows both (its CPUs move the data: gloo, NCCL's proxy threads)")
        alternates = [net_candidate(c, comm_total / total * c.score * 0.5, meta, logged) for c in net[:top]
                      if c.key != tipped.key]
    primaries = [c for u in units for c in with_ties(rank_candidate(u, rank_total / total, graph, ops, meta, lone), u, meta)]
    if both is not None or tipped is not None:
        primaries.append(host)
    elif net and comm_total > 0:
        # devices that explain the slow transfers equally well cannot be told apart: each is
        # listed with the finding's score and says so, and other evidence (flows) can decide
        tie = tied_best(net)
        share = comm_total / total
        note = tie_note(tie) if len(tie) > 1 else None
        for c in tie[:top]:
            cand = net_candidate(c, share * c.score, meta, logged)
            cand.evidence += [note] if note else []
            cand.tie = len(tie) if len(tie) > 1 else None
            primaries.append(cand)
        alternates = [net_candidate(c, share * c.score * 0.5 / len(tie), meta, logged) for c in net[len(tie):len(tie) + top]]
        # a second network fault: slow units the best device does not carry, explained apart
        rest = {u: w for u, w in slow.items() if u not in set(tie[0].carried)}
        found = sum(split_slow(excess)[0].values())  # (before the common mode: never less than `slow`'s)
        if sum(rest.values()) >= 0.25 * found:
            second = resolve_network(judged, rest, meta, top=1, mesh=mesh)
            if second:
                frac = sum(rest.values()) / found
                primaries.append(net_candidate(second[0], comm_total / total * frac * second[0].score, meta, logged))
    candidates = merge(primaries, alternates, top)
    analysis = Analysis(ops, abnormal, graph, rank_blame, units, net, comm_total, unit_names)
    extra: dict[str, object] = {"source": "commops", "detector": method, "abnormal_ops": int(abnormal.sum()),
                                "operators": len(ops.rank)}
    if both is None and net and comm_total > 0 and len(tied_best(net)) > 1:
        extra["network_tie"] = len(tied_best(net))  # devices CommOps cannot tell apart
    onset = view.onset_step if view.onset_step is not None and view.onset_step in set(irr.tolist()) else int(irr.min())
    if candidates and candidates[0].kind in ("gpu", "host"):
        comp, logged, steps_of = compute_table(ops, world, lone)
        ranks = _logged_stand_ins(candidate_ranks(candidates[0], meta), logged, meta)
        # (a level its on-and-off steps merely average to is none)
        onset = later_onset(worker_onset(comp, logged, steps_of, layout, kinds, ranks), onset, irr.tolist(), view.steps)
        began = first_slow_step(comp, logged, steps_of, layout, kinds, ranks, irr.tolist())
        if began is not None and began < onset:
            onset = began  # (on and off: its first slow step)
    return Verdict(meta.job, "irregular", [int(s) for s in irr], float(view.slowdown), candidates, extra,
                   onset_step=onset), analysis


def computed_longer(grew: np.ndarray, logged: np.ndarray, host: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Per rank: 1 where its own compute grew in the slow steps (`grew`, s) beyond the logged ranks'
    common growth by more than GROWTH_SIGMAS robust σ of it and `floor` (s), else 0; NaN where it
    logged nothing.
    A starved host computes longer; ranks late only because their data arrived late (an eager
    send through a slow NIC) do not, however the waits on them fell. A host holding a large share
    of the logged ranks (`host`: host index per rank) is measured against the ranks elsewhere: its
    own would set the common growth (a real DDP job on two hosts, one under a CPU quota, had the
    median between the hosts and neither computing longer)."""
    seen = np.flatnonzero(np.asarray(logged[:len(grew)], dtype=bool))
    out = np.full(len(grew), np.nan)
    if len(seen) < 3:
        out[seen] = 1.0  # (too few ranks to know what is common: nothing is ruled out)
        return out
    base = np.full(len(grew), float(np.median(grew[seen])))
    spread = np.full(len(grew), robust_sigma(grew[seen]))
    where, count = np.unique(host[seen], return_counts=True)
    for h in where[count * BIG_HOST_SHARE >= len(seen)]:
        mine, others = seen[host[seen] == h], seen[host[seen] != h]
        if h >= 0 and len(others) >= 2:
            base[mine], spread[mine] = float(np.median(grew[others])), robust_sigma(grew[others])
    out[seen] = grew[seen] - base[seen] > np.maximum(GROWTH_SIGMAS * spread[seen], floor)
    return out


def collateral_inside(c: NetCandidate, hosts: list[str], host: np.ndarray, computed: np.ndarray) -> bool:
    """A host's inside that the slow transfers name, though none of its logged ranks computed
    longer: its transfers among its own GPUs slowed beside the ones through its network, as they do
    where the same CPUs move the data for both (gloo; NCCL's proxy threads). A starved host
    stretches its ranks' compute too (`computed_longer`); a host that logged nothing cannot say,
    and stays a candidate. On real expert-parallel jobs (tp1 pp4 dp2, each host one stage of both
    replicas) a throttled NIC made its host's in-host all-gathers run 7x, and the host was named."""
    if c.kind != "host" or not c.inside or not isinstance(c.key, tuple) or c.key[0] not in hosts:
        return False
    return none_longer(computed[host == hosts.index(c.key[0])])


def host_on_both(units: list[RankUnit], net: list[NetCandidate], meta: JobMeta, rank_frac: float,
                 comm_frac: float, computed: np.ndarray) -> tuple[RankUnit, NetCandidate, float] | None:
    """A host named by both kinds of evidence, where together they explain more than the best
    network device does alone: its ranks were late by their own compute (a unit of the rank blame
    on it, at least half of whose logged ranks `computed` longer) and its transfers were slow (a network
    candidate that explains them nearly as well as the best device). A starved host slows its
    ranks and, where its CPUs move the data (gloo), all its transfers; a NIC only the transfers
    through it, and its ranks late only as their data arrives late (a real host at 12% of its CPU
    lost to its NIC on the transfers alone, 0.85 against 0.83; a 4x NIC under eager sends, its
    ranks waiting on their unlogged TP peers' late data, read as its host). A host that explains
    the slow transfers only as the one end of a slow link does is that link's end, its ranks'
    lateness the link's (a 4.6x link under batched p2p read as its host, 0.64 against the link's 1.0).
    One GPU's blame counts for its host only where the transfers hold most of the delay: a slow
    GPU is named for its own.
    A host with no group inside it carries what its NIC carries (the resolver keeps the NIC for
    both): its ranks' lateness is then all that tells it from the NIC (a real host at 10% of its
    CPU in a tp1 job was its NIC 0.66, the host 0.22). A unit holding under MIN_SHARE of the rank
    blame is one of many ranks late alike (every member of a slow DP ring, its forward waiting on
    the ring's all-gather): it tips nothing (a 256-GPU link fault read as one of the ring's hosts)."""
    best = net[0].score * comm_frac
    hosts = as_hosts(net)
    for u in units:
        grown = computed[[r for r in u.ranks if r < len(computed)]]
        grown = grown[~np.isnan(grown)]
        if u.share < MIN_SHARE or not grown.size or grown.mean() < 0.5:
            continue
        if u.kind == "host":
            on = u.label
        elif (u.kind == "gpu" and u.via is None and len(u.ranks) == 1 and u.ranks[0] in meta.ranks
              and comm_frac > rank_frac and net[0].kind != "gpu"):
            on = meta.host_of(u.ranks[0])
        else:
            continue
        for c in hosts:
            if c.kind == "host" and c.key == (on,) and c.score >= NEAR_BEST * net[0].score:
                joint = comm_frac * c.score + rank_frac * u.share
                if joint > best:
                    return u, c, joint
    return None


def host_breaks_tie(net: list[NetCandidate], host: np.ndarray, hosts: list[str], computed: np.ndarray) -> NetCandidate | None:
    """The host whose NIC is in the network tie where that host's logged GPUs (two or more) all
    `computed` longer and no other logged GPU did (`host`: host index per rank, into `hosts`): one
    finding, as in `host_on_both`, where no rank took the blame (a real DDP job, node-1 under a CPU
    quota: the one ring's all-reduces ran on its CPUs and every copy ended together, 9x slow; its
    ranks' compute grew 100-150 ms a step, the other node's shrank 50 ms, and nobody was waited
    on). A NIC slows transfers, not its host's compute."""
    longer = computed == 1
    on = np.unique(host[longer])
    if len(on) != 1 or on[0] < 0 or longer.sum() < 2 or (host[computed == 0] == on[0]).any():
        return None
    key = (hosts[int(on[0])],)
    return next((c for c in tied_best(as_hosts(net)) if c.kind == "host" and c.key == key), None)


def as_hosts(net: list[NetCandidate]) -> list[NetCandidate]:
    """`net` with each NIC whose host is not itself a candidate read as that host: what a host's
    transfers show where the resolver kept its NIC for both (a host with no group inside it)."""
    listed = {(c.kind, c.key) for c in net}
    return [replace(c, kind="host") if c.kind == "nic" and ("host", c.key) not in listed else c for c in net]


def network_shadow(units: list[RankUnit], best: NetCandidate, slow: dict[str, float], members: dict[str, list[int]],
                   rank_blame: np.ndarray, meta: JobMeta) -> tuple[list[RankUnit], float]:
    """Rank units of "data" that are the best network device's shadow, removed, and the blame they
    held (which is the device's). A transfer's data that arrives late makes its receiver late to
    everything after (an eager send hands it to the network and is done): where the ranks blamed
    are those on the device's hosts whose own transfers crossed it and were slow, in turn as its
    groups' traffic varies step to step, the device explains them; no batch of data slows just the
    two ends of one link. (A 3.8x link on the pipeline edges of four replicas, with eager sends and spikes, read
    "data" 0.48 against the link's 0.47.)"""
    key = best.key if isinstance(best.key, tuple) else (meta.host_of(best.key),)
    on_device = set(key) if best.kind != "switch" else {
        h for h in meta.hosts() if meta.switch_of(h) == key[0]}
    crossed = {r for u in best.carried if u in slow for r in members.get(u, ()) if meta.host_of(r) in on_device}
    if not crossed:
        return units, 0.0
    kept, moved = [], 0.0
    for u in units:
        ranks = [r for r in u.ranks if r < rank_blame.size]
        blame = float(rank_blame[ranks].sum())
        on = float(rank_blame[[r for r in ranks if r in crossed]].sum())
        if u.kind == "data" and blame > 0 and on >= SHADOW_SHARE * blame:
            moved += blame
        else:
            kept.append(u)
    return kept, moved


def _moved_rows(df: pd.DataFrame) -> pd.DataFrame:
    """`df`'s COLUMNS as a frame of their own, for `prepare_ops` alone to hold: the coded and timed
    columns leave `df` (`ops` holds them as codes and `RowTimes`), so their arrays are freed once
    it has read them (the int64 times, 16 bytes a row, while it codes the instances and slots)."""
    rows = df[COLUMNS]
    for name in (*CODED, *TIMED):
        del df[name]
    return rows


def _normal_step_s(steps: pd.DataFrame, irr: np.ndarray) -> float:
    """The irregular steps' typical baseline: how long a step takes when nothing is wrong (0 unknown)."""
    if steps is None or "baseline_s" not in steps:
        return 0.0
    base = steps.loc[steps["step"].isin(irr), "baseline_s"].to_numpy(float)
    return float(np.nanmedian(base)) if np.isfinite(base).any() else 0.0


def localize_commops(trace: Trace, timeline: StepView, steps: tuple[int, int] | None = None, top: int = 5) -> Verdict:
    """The CommOps localizer of docs/design.md: full records of the window (see summary.py for the
    path that starts from abnormal-operator summaries)."""
    # in the analysis' order (no second, sorted copy of every row), strings read as categoricals
    # (dictionary-encoded from Parquet: never expanded to one string a row)
    expr = None if steps is None else (ds.field("step") >= steps[0]) & (ds.field("step") <= steps[1])
    df = sorted_rows(with_steps(read_commops(trace, COLUMNS, expr)))
    if timeline.status != "irregular" or not timeline.irregular_steps:
        return persistent_verdict(df, trace.meta, top, timeline.group_kind, step_times_past_warmup(timeline.steps))
    # (before the analysis, which hands the rows' columns over to its own tables)
    few = few_irregular(timeline.irregular_steps, timeline.steps)
    lasting = persistent_verdict(df, trace.meta, top, timeline.group_kind, step_times_past_warmup(timeline.steps)) \
        if few else None
    verdict, _ = analyse_ops(df, trace.meta, timeline, top)
    return verdict if lasting is None else lasting_over_few_steps(verdict, lasting, timeline.steps)


def persistent_verdict(df: pd.DataFrame, meta: JobMeta, top: int = 5, hint: dict[str, str] | None = None,
                       durations: pd.Series | None = None) -> Verdict:
    """No δ-irregular step: healthy, unless some workers, a stage or the data made the job slow
    from its first step, or some workers from a later one that the step times were too noisy
    to show (judged against peers of the same role, `localize.waits.persistent`). `durations`: the
    job's step times, for the slowdown since that step."""
    found = persistent_imbalance(df, meta, top, hint)
    return imbalance_verdict(meta, found, int(df["step"].min()) if len(df) else None,
                             steps=np.unique(df["step"].to_numpy()) if len(df) else None, durations=durations)


def lone_excess(waited: np.ndarray, lone_ranks: np.ndarray, steps: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Rank × step (`steps`: the ops' steps, sorted): the time a rank spent in its lone copies
    (`waited`, `lone_time`), beyond its median over the normal steps `ref`; 0 for ranks without
    lone copies (`lone_ranks` are those with). Only that time is its unlogged peers' delay: a
    transfer it waited on elsewhere (a slow NIC) is not."""
    out = waited.copy()
    normal = np.isin(steps, ref)
    if normal.any():
        out -= np.median(out[:, normal], axis=1, keepdims=True)
    has = np.zeros(len(waited), dtype=bool)
    has[lone_ranks] = True
    return np.where(has[:, None], out, 0.0)


def compute_growth(ops: Ops, world: int, steps: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Rank × step (`steps`: the ops' steps, sorted): each rank's own compute beyond its median
    over the normal steps `ref`."""
    own = rank_step_compute(ops, world, steps)
    normal = np.isin(steps, ref)
    if normal.any():
        own -= np.median(own[:, normal], axis=1, keepdims=True)
    return own


def unseen_share(grown: np.ndarray, lone_more: np.ndarray, hit: np.ndarray) -> np.ndarray:
    """Per rank: of what its time per step grew by in the slow steps (`hit`: per column of `grown`)
    over its normal ones (its compute, `grown`: `compute_growth`), the share spent waiting in its
    lone copies (`lone_more`, `lone_excess`) rather than computing. A slow unlogged peer grows the
    one; the rank itself, or its whole host, the other."""
    waited = np.maximum(lone_more[:, hit], 0.0).sum(axis=1)
    return waited / np.maximum(np.maximum(grown[:, hit], 0.0).sum(axis=1) + waited, 1e-12)


def candidate_ranks(c: Candidate, meta: JobMeta) -> list[int]:
    """The ranks a gpu or host candidate stands for."""
    if c.kind == "gpu":
        return [int(c.rank)] if c.rank is not None else []
    return [r for r in sorted(meta.ranks) if meta.host_of(r) == c.host]


def _logged_stand_ins(ranks: list[int], logged: np.ndarray, meta: JobMeta) -> list[int]:
    """`ranks`, or where none of them logged, the ranks of their hosts that did: with one rank per TP
    group logged, its time in lone copies is its unlogged peers' compute (`compute_table`), as a
    host's summary stands for its unlogged ranks on the summary path."""
    if any(0 <= r < len(logged) and logged[r] for r in ranks):
        return ranks
    hosts = {meta.host_of(r) for r in ranks if r in meta.ranks}
    return [r for r in sorted(meta.ranks) if r < len(logged) and logged[r] and meta.host_of(r) in hosts]
