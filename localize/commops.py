"""Localize from CommOps: detector -> wait graph -> cross-iteration ranking -> verdict.

`localize_commops(trace, timeline, steps, top)` reads the records of the window, and
`analyse_ops` does the work on a DataFrame, so the summary path (`localize.summary`) can run
the same analysis on the few ranks and steps it fetched.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

from collector.meta import JobMeta
from collector.schema import OPS
from collector.traceio import Trace
from localize.detect.detector import rule_detect
from localize.detect.model_store import load_detector
from localize.network.devices import (
    NetCandidate,
    resolve_network,
    slow_units,
    split_slow,
    tie_note,
    tied_best,
)
from localize.network.transfers import MIN_EXCESS_S, SLOW_EXCESS, slow_transfer_excess
from localize.ops.grouping import dense_codes, group_quantiles, group_sum, present, unique
from localize.ops.groupkinds import group_kinds, observed_members, with_observed_groups
from localize.ops.history import slot_stats, step_scale
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
    Imbalance,
    compute_table,
    first_slow_step,
    persistent_imbalance,
    worker_onset,
)
from localize.waits.ranking import RankUnit, explain_rank_blame
from localize.waits.waitgraph import WaitGraph, build_waitgraph
from timeline.columns import read_commops

COLUMNS = ["rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step"]
#: a unit whose messages are all smaller than this (a barrier, a scalar) clears no network device by
#: running normally: no loss of bandwidth shows on it. (A real job's 8 KiB activations through a NIC
#: throttled to 1 Mbit/s did slow down, and their on-time peers cleared the other hosts.)
CLEARING_BYTES = 1 << 10


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


def _instance_layout(ops: Ops, meta: JobMeta) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray, dict[str, list[int]], set[str]]:
    """Per instance: expected copies, sum of expected member ranks, unit code; unit names,
    members, and the units whose operator is all-to-all."""
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
    a2a = ops.opcode[ops.late_row] == OPS.index("all_to_all")
    mesh = {names[u] for u in unique(ucode[a2a])}
    return expected, members_sum, names, ucode.astype(np.int32 if ops.n_inst < 2**31 else np.int64), members, mesh


def _late_history(ops: Ops, view: StepView, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per instance: its last arriver's normal time and interquartile range over the reference
    steps, drift-scaled back to the step at hand: `slot_history` read at the last arrivers' rows
    only (its three per-row arrays, 24 bytes a row, were this stage's peak)."""
    scale = step_scale(ops, view.steps)
    med, q1, q3 = slot_stats(ops, ops.elapsed / scale, ref)
    late = ops.late_row
    s = scale[late]
    del scale
    slot = ops.slot[late]
    med, q1, q3 = med[slot], q1[slot], q3[slot]
    miss = np.isnan(med)
    if miss.any():  # slots never seen in reference steps: the instance minimum (transfer time)
        fb = ops.inst_min[ops.inst[late]] / s
        med, q1, q3 = np.where(miss, fb, med), np.where(miss, fb, q1), np.where(miss, fb, q3)
    return med * s, (q3 - q1) * s


def _transfer_history(ops: Ops, scale: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per instance: the median and interquartile range, over the normal steps `ref`, of the time
    the last arriver's copy took (`inst_min`: the transfer alone, no wait in it) in the same
    operator stream at the same place in its step; drift-scaled (`scale`: per instance). NaN
    where never seen in a normal step.

    A slot's history mixes copies that waited with ones that did not: on a wide all-to-all its
    spread hid a NIC at 2.8x (seed 8686 job 37). Last arrivers' copies alone are the path's time."""
    seq = ops.column("seq")[ops.late_row].astype(np.int64)
    stream_step, _ = dense_codes(ops.inst_pair.astype(np.int64) * (1 << 32) + (ops.inst_step.astype(np.int64) - int(ops.inst_step.min())))
    first = np.full(int(stream_step.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(first, stream_step, seq)
    place, k = dense_codes(ops.inst_pair.astype(np.int64) * (1 << 32) + (seq - first[stream_step]))
    del seq, stream_step, first
    took = ops.inst_min / scale
    normal = np.isin(ops.inst_step, ref) & np.isfinite(took)
    q1, med, q3 = group_quantiles(place[normal], k, took[normal], (0.25, 0.5, 0.75))
    return med[place] * scale, (q3 - q1)[place] * scale


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
    b, spread = _transfer_history(ops, step_scale(ops, view.steps, late), ref)
    own = ops.inst_min - b
    alone = (own > np.maximum(SLOW_EXCESS * b, MIN_EXCESS_S)) & (own > 5 * spread) & ~(flagged | beyond)
    del b, spread
    ex = np.where(alone, own, ex)
    collective = np.where(~ops.inst_p2p & (ops.inst_size >= 2) & (flagged | beyond | alone), ex, 0.0)
    del ex, own, flagged, beyond, alone
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


def normal_steps(steps: np.ndarray, irregular: np.ndarray, table: pd.DataFrame | None) -> np.ndarray:
    """The steps operators' normal times are learned from: neither irregular, nor the first
    (partial: a logger starting mid-step) when there are four or more, nor warm-up, whose
    collectives all run slow and would cancel a slow ring's evidence, nor a step `table` marks
    as no history. All but the irregular ones when nothing else is left."""
    odd = list(irregular)
    if len(steps) >= 4:
        odd.append(int(steps.min()))
    if table is not None and "pattern" in table:
        odd += table.loc[table["pattern"] == "warm-up", "step"].astype(int).tolist()
    if table is not None and "irregular" in table:
        # (the summary path judges a few irregular steps; the others it fetched, before them, are context)
        odd += table.loc[table["irregular"].astype(bool), "step"].astype(int).tolist()
    if table is not None and "history" in table:  # (the summary path: which fetched steps are history)
        odd += table.loc[~table["history"].astype(bool), "step"].astype(int).tolist()
    ref = np.setdiff1d(steps, np.asarray(odd, dtype=np.int64))
    return ref if len(ref) else np.setdiff1d(steps, irregular)


def analyse_ops(df: pd.DataFrame, meta: JobMeta, view: StepView, top: int = 5,
                partial: set[str] | None = None, forest: bool = True,
                unlisted: bool | None = None, quiet: np.ndarray | None = None) -> tuple[Verdict, Analysis | None]:
    """Run detection, the wait graph and the ranking on CommOps rows of the window.

    Consumes `df`'s group, op, peer and time columns (`localize.ops.table.CODED`, `TIMED`).
    `partial`: groups whose members were not all fetched (summary path); their operators
    keep their place in each rank's timeline but are never judged. `forest=False` judges
    operators with the robust rule, as the sidecars do (the fast path). `unlisted`: a group
    meta.json does not list, logged by one rank only, had members that did not log (default:
    when every rank's records are here, no `partial`; the summary path knows it from one step
    of every rank). `quiet`: per rank, known to have logged nothing (default: the ranks absent here).
    """
    unlisted = not partial if unlisted is None else unlisted
    irr = np.sort(np.asarray(view.irregular_steps, dtype=np.int64))
    if len(df):  # the first recorded step is partial (warm-up, a logger starting mid-step)
        first = int(df["step"].min())
        if len(unique(df["step"].to_numpy())) >= 4:
            irr = irr[irr != first]
    if len(df) == 0 or len(irr) == 0:
        return persistent_verdict(df, meta, top, view.group_kind, _durations(view)), None
    ops = prepare_ops(df[COLUMNS])
    for name in (*CODED, *TIMED):  # (`ops` holds them as codes and `RowTimes`: the caller's frame lets its copies go)
        del df[name]
    all_steps = unique(ops.step)
    ref = normal_steps(all_steps, irr, view.steps)
    detector = load_detector() if forest else None
    detection = detector.detect(ops, view.steps, ref) if detector is not None else rule_detect(ops, view.steps, ref)
    abnormal, method = detection.abnormal, detection.method
    del detection  # (its per-row scores are read by nothing past the threshold: 8 bytes a row off the peak)
    comm_excess, transfer_seen = _comm_excess(ops, meta, abnormal, view, ref)
    expected, members_sum, unit_names, unit_of_inst, members, mesh = _instance_layout(ops, meta)
    if partial:
        skip = np.isin(ops.groups.astype(str), sorted(partial))[ops.inst_group] & ~ops.inst_p2p
        expected = np.where(skip, np.iinfo(np.int64).max // 2, expected.astype(np.int64))
    in_irr = np.isin(ops.inst_step, irr)
    # which units' own transfers were slow in the irregular steps (resolved to devices below)
    judge = _judgeable(ops, expected, unit_of_inst) & transfer_seen
    slow_transfer = judge & (comm_excess > 0)
    in_ref = np.isin(ops.inst_step, ref)
    slow, partly = split_slow(slow_units(unit_of_inst, unit_names, slow_transfer, judge & in_irr, min_frac=0.0,
                                         normal=judge & in_ref))
    slow_unit = np.isin(np.asarray(unit_names, dtype=object), np.asarray(list(slow), dtype=object))
    short_comm = slow_transfer & (ops.inst_size < expected) & slow_unit[unit_of_inst]
    world = max(meta.world_size, int(ops.rank.max()) + 1)
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
    unseen_blame = rank_blame * unseen_share(ops, lone_more, world, all_steps, ref, irr)
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
        slow, partly = split_slow(slow_units(unit_of_inst, unit_names, slow_transfer | late_data, judge & in_irr,
                                             min_frac=0.0, normal=judge & in_ref))
    comm_like = graph.comm | late_data
    comm_w = np.where(comm_like & in_irr, graph.delay, 0.0)
    comm_total = max(float(comm_w.sum()) - norm * float(graph.delay[comm_like & in_ref].sum()), 0.0)
    # only units with a judged instance are evidence: one never seen says nothing of health; nor
    # does a unit of tiny messages that ran normally (a barrier, a scalar's all-reduce: a link that
    # lost bandwidth passes them on time, yet they would clear it of the slow rings it carries)
    seen = np.bincount(unit_of_inst[judge & in_irr], minlength=len(unit_names))
    size = np.zeros(len(unit_names))
    np.maximum.at(size, unit_of_inst, ops.nbytes[ops.late_row].astype(np.float64))
    judged = {n: members[n] for n, k, b in zip(unit_names, seen, size, strict=True)
              if k > 0 and (b >= CLEARING_BYTES or n in slow)}
    net = resolve_network(judged, slow, meta, top=1 << 30, mesh=mesh, partly=partly)  # all of them, to count ties
    kinds = group_kinds(ops, view.group_kind)
    tab = view.steps
    ran_normally = bool(((~tab["irregular"].astype(bool)) & (tab["pattern"] != "warm-up")
                         & (tab["step"].to_numpy() < irr.min())).any())
    layout = with_observed_groups(meta, ops)  # (a meta.json without groups: the ranks that logged in each)
    logged = present(ops.rank, world)
    units = explain_rank_blame(rank_blame, layout, kinds, top=top, logged=logged, static=not ran_normally,
                               unseen=unseen_blame, peers=unlogged_peers(ops, meta.groups, lone, world), by_step=by_step,
                               peer_wait=wait_change(waited, own_slow_steps(by_step, np.isin(all_steps, irr)),
                                                     np.isin(all_steps, ref)),
                               quiet=silent)
    rank_total = float(rank_blame.sum())
    total = rank_total + comm_total
    lost = _lost_seconds(view.steps, irr)
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
    primaries = [c for u in units for c in with_ties(_rank_candidate(u, rank_total / total, graph, ops, meta, lone), u, meta)]
    alternates: list[Candidate] = []
    if net and comm_total > 0:
        # devices that explain the slow transfers equally well cannot be told apart: each is
        # listed with the finding's score and says so, and other evidence (flows) can decide
        tie = tied_best(net)
        share = comm_total / total
        note = tie_note(tie) if len(tie) > 1 else None
        for c in tie[:top]:
            cand = _net_candidate(c, share * c.score, meta, logged)
            cand.evidence += [note] if note else []
            cand.tie = len(tie) if len(tie) > 1 else None
            primaries.append(cand)
        alternates = [_net_candidate(c, share * c.score * 0.5 / len(tie), meta, logged) for c in net[len(tie):len(tie) + top]]
        # a second network fault: slow units the best device does not carry, explained apart
        rest = {u: w for u, w in slow.items() if u not in set(tie[0].carried)}
        if sum(rest.values()) >= 0.25 * sum(slow.values()):
            second = resolve_network(judged, rest, meta, top=1, mesh=mesh)
            if second:
                frac = sum(rest.values()) / sum(slow.values())
                primaries.append(_net_candidate(second[0], comm_total / total * frac * second[0].score, meta, logged))
    candidates = _merge(primaries, alternates, top)
    analysis = Analysis(ops, abnormal, graph, rank_blame, units, net, comm_total, unit_names)
    extra: dict[str, object] = {"source": "commops", "detector": method, "abnormal_ops": int(abnormal.sum()),
                                "operators": len(ops.rank)}
    if net and comm_total > 0 and len(tied_best(net)) > 1:
        extra["network_tie"] = len(tied_best(net))  # devices CommOps cannot tell apart
    onset = view.onset_step if view.onset_step in set(irr.tolist()) else int(irr.min())
    if candidates and candidates[0].kind in ("gpu", "host"):
        comp, logged, steps_of = compute_table(ops, world, lone)
        ranks = _logged_stand_ins(candidate_ranks(candidates[0], meta), logged, meta)
        own = worker_onset(comp, logged, steps_of, layout, kinds, ranks)
        onset = own if own in set(irr.tolist()) else onset  # (a level its on-and-off steps merely average to is none)
        began = first_slow_step(comp, logged, steps_of, layout, kinds, ranks, irr.tolist())
        if began is not None and (onset is None or began < onset):
            onset = began  # (on and off: its first slow step)
    return Verdict(meta.job, "irregular", [int(s) for s in irr], float(view.slowdown), candidates, extra,
                   onset_step=onset), analysis


def _lost_seconds(steps: pd.DataFrame, irr: np.ndarray) -> float:
    """Time the irregular steps took beyond their baseline."""
    if steps is None or steps.empty or not {"duration_s", "baseline_s"} <= set(steps.columns):
        return 0.0
    t = steps[steps["step"].isin(irr)]
    return float(np.nansum(np.maximum(t["duration_s"].to_numpy(float) - t["baseline_s"].to_numpy(float), 0.0)))


def _merge(primaries: list[Candidate], alternates: list[Candidate], top: int) -> list[Candidate]:
    """Independent findings first (one per fault), then other devices that could explain the
    slow transfers, each scored below every finding."""
    primaries = sorted(primaries, key=lambda c: -c.score)
    floor = min((c.score for c in primaries), default=1.0)
    for c in alternates:
        c.score = min(c.score, floor)
    ranked = _dedupe(primaries + sorted(alternates, key=lambda c: -c.score))
    # candidates that explain under 1% of the delay are noise, not suspects
    return [c for i, c in enumerate(ranked) if i == 0 or c.score >= 0.01 * ranked[0].score][:top]


def _dedupe(cands: list[Candidate]) -> list[Candidate]:
    seen: set[tuple[object, ...]] = set()
    out = []
    for c in cands:
        key = (c.kind, c.rank, c.host, tuple(c.hosts or ()), c.switch)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def with_ties(cand: Candidate, u: RankUnit, meta: JobMeta) -> list[Candidate]:
    """`cand` and the devices its unit's records cannot tell from it, at its score, marked a tie."""
    if not u.also:
        return [cand]
    others = [_bare_candidate(a, cand.score, meta) for a in u.also]
    for c in [cand, *others]:
        c.tie = 1 + len(u.also)
        c.evidence = c.evidence or cand.evidence
    return [cand, *others]


def _rank_candidate(u: RankUnit, rank_frac: float, g: WaitGraph | None, ops: Ops | None, meta: JobMeta,
                    lone: np.ndarray | None = None) -> Candidate:
    score = u.share * rank_frac
    ranks = np.asarray(u.witnesses)
    if g is None or ops is None:
        return _bare_candidate(u, score, meta)
    hit = (g.suspect | g.orphan) & np.isin(g.root_rank, ranks)
    direct = hit & (g.root_inst == np.arange(len(hit)))
    groups = Counter(str(ops.groups[x]) for x in ops.inst_group[direct][:5000])
    top_groups = ", ".join(f"{n} ({c})" for n, c in groups.most_common(3))
    waited = float(g.delay[hit].sum())
    ev = []
    if u.via is not None:
        ev.append(f"rank {u.via} was the last copy while its peers waited in {int(direct.sum())} prolonged operators "
                  f"({top_groups}), yet computed no longer than before: it waited in collectives whose other members "
                  "logged nothing (one rank per group logged)")
        ev.append(f"one of {u.tie_names()} was slow; the records cannot tell which; {waited:.3f} s of waiting caused")
        cand = _bare_candidate(u, score, meta)
        cand.evidence = ev
        return cand
    if "quiet_host" in u.detail:
        return _quiet_host_candidate(u, score, g, ops, meta)
    if u.kind == "gpu":
        r = int(ranks[0])
        info = meta.ranks.get(r)
        n_direct = int(direct.sum())
        ev.append(f"rank {r} was the normal copy while its peers waited in {n_direct} prolonged operators ({top_groups})")
        exc = g.excess_compute[direct]
        if u.also:
            ev.append(f"it is the only rank of {u.also[0].label} that logged: a slow GPU there and the whole host "
                      "slowed show the same records")
        if "peer_wait" in u.detail:
            ev.append(f"it is the only rank of {info.host if info else 'its host'} that logged, and in the slow steps "
                      f"it waited {cast(float, u.detail['peer_wait']):.2f}x its normal time in the collectives it shares "
                      "with its unlogged peers: it arrived last and they waited on it, so they were not slow (the "
                      "GPU, not the host)")
        if exc.size and lone is not None and (lone & (ops.rank == r)).any() and np.median(exc) < 0.5 * np.median(g.delay[direct]):
            ev.append("its delay is its own or an unlogged peer's: it spent longer in operators of groups whose other "
                      "members were not logged (one rank per group logged), not in compute")
        elif exc.size:
            ev.append(f"its delay is its own: {np.median(exc) * 1e3:.2f} ms more compute than its peers before each of them")
        if g.orphan[hit].any():
            ev.append(f"rank {r} logged no record of {int(g.orphan[hit].sum())} operators its peers waited in")
        ev.append(f"{int((hit & ~direct).sum())} more delays elsewhere trace back to it through waiting; {waited:.3f} s of waiting caused")
        return Candidate("gpu", score, ev, rank=r, host=info.host if info else None, gpu=info.gpu if info else None, source="commops")
    if u.kind == "host" and "peer_wait" in u.detail:
        r = cast(int, u.detail["logged_rank"])
        ev.append(f"rank {r}, the only rank of {u.label} that logged, delayed its peers ({top_groups}) computing "
                  f"longer, and in the slow steps it also waited {cast(float, u.detail['peer_wait']):.2f}x its normal time "
                  "in the collectives it shares with its unlogged peers on the host: they were slow too (the "
                  "host, not one GPU)")
        ev.append(f"{waited:.3f} s of waiting caused; the delay is compute on the host, not the network")
        return Candidate("host", score, ev, host=u.label, source="commops")
    if u.kind == "host":
        if "replicas" in u.detail:
            ev.append(f"the {u.detail['replicas']} model replicas {u.label} holds were each slow whole, and no replica "
                      f"elsewhere was ({top_groups})")
            ev.append("data taking turns would move between hosts: one host slows every replica it holds, the last of "
                      "them collecting the waits")
        else:
            ev.append(f"{int(u.coverage * len(ranks))} of {len(ranks)} GPUs of {u.label} each delayed their peers ({top_groups})")
        ev.append(f"{waited:.3f} s of waiting caused; the delay is compute on the host, not the network")
        return Candidate("host", score, ev, host=u.label, source="commops")
    if u.kind == "config":
        ev.append(f"{u.label}: {int(u.coverage * len(ranks))} of {len(ranks)} GPUs compute longer than the other stages; the next stages wait on them")
        ev.append("every data-parallel replica shows the same stage lagging: the split of layers, not a device")
        return Candidate("config", score, ev, source="commops", stage=_stage(u))
    if u.detail.get("replicas") == 1:
        hosts = sorted({meta.host_of(r) for r in ranks})
        if len(hosts) > 1:
            ev.append(f"one model replica, all its GPUs on {len(hosts)} hosts, computed longer in the slow steps")
            ev.append("no one device slows hosts it does not share: the replica's batch did (sequence-length imbalance)")
        else:
            ev.append(f"one model replica, {len(ranks)} GPUs of {hosts[0]}, computed longer in the slow steps; "
                      "the host's other GPUs did not")
            ev.append("no one GPU slows its peers' compute, and a slow host slows all its GPUs: the replica's batch did "
                      "(sequence-length imbalance)")
        return Candidate("data", score, ev, source="commops")
    ev.append(f"{u.label} take turns delaying their peers: whole replicas (all their GPUs) compute longer in different steps")
    ev.append("the delay moves with the data each replica gets, not with a device: sequence-length imbalance")
    return Candidate("data", score, ev, source="commops")


def _quiet_host_candidate(u: RankUnit, score: float, g: WaitGraph, ops: Ops, meta: JobMeta) -> Candidate:
    """A GPU or host that logged nothing, shown by its peers' waits in collectives short of its copies."""
    mine = set(u.ranks)
    names = np.array([bool(mine & set(meta.groups.get(str(n), ()))) for n in ops.groups])
    hit = g.orphan & (g.missing_rank < 0) & (g.root_inst == np.arange(ops.n_inst)) & names[ops.inst_group]
    groups = Counter(str(ops.groups[x]) for x in ops.inst_group[hit][:5000])
    top_groups = ", ".join(f"{n} ({c})" for n, c in groups.most_common(3))
    host = cast(str, u.detail["quiet_host"])
    ev = [f"{host} logged nothing; in {int(hit.sum())} prolonged collectives ({top_groups}) every logged copy "
          f"waited on members there, {float(g.delay[hit].sum()):.3f} s of waiting"]
    if u.kind == "gpu":
        ev.append(f"rank {u.ranks[0]} is the member most of those waits were on: that GPU, not the whole host")
    else:
        ev.append("its GPUs were waited on alike: the host's compute and its NIC's transfers look the same from "
                  "its peers' records (a logger there, or flows, would tell them apart)")
        if quiet := sorted({a.label for a in u.also if a.kind == "host"}):
            ev.append(f"{', '.join(quiet)} logged nothing either and share a group with it that no logged rank is in, "
                      "or were waited on nearly as long: the collectives that miss them both cannot say which was slow")
    cand = _bare_candidate(u, score, meta)
    cand.evidence = ev
    return cand


def _bare_candidate(u: RankUnit, score: float, meta: JobMeta) -> Candidate:
    if u.kind == "gpu":
        info = meta.ranks.get(u.ranks[0])
        return Candidate("gpu", score, [], rank=u.ranks[0], host=info.host if info else None,
                         gpu=info.gpu if info else None, source="commops")
    if u.kind in ("host", "nic"):
        return Candidate(u.kind, score, [], host=u.label, source="commops")
    if u.kind == "link":
        pair = u.detail.get("hosts")
        return Candidate("link", score, [], hosts=[str(h) for h in pair] if isinstance(pair, list) else None, source="commops")
    return Candidate(u.kind, score, [], source="commops", stage=_stage(u) if u.kind == "config" else None)


def _stage(u: RankUnit) -> int | None:
    st = u.detail.get("stage")
    return int(st) if isinstance(st, int) else None


def _net_candidate(c: NetCandidate, score: float, meta: JobMeta, logged: np.ndarray) -> Candidate:
    """`logged`: per rank, whether it logged any record (a GPU's path is told from its host's NIC
    only by the host's other GPUs)."""
    ex = ", ".join(c.examples)
    common = f"transfers slow in {c.slow_units} of the {c.carried_units} groups it carries (e.g. {ex}): every copy of a collective was slow, or a transfer's data arrived late while its sender was on time"
    if c.kind == "gpu":
        r = int(c.key)  # type: ignore[arg-type]
        info = meta.ranks.get(r)
        host = info.host if info else None
        others = [x for x, i in meta.ranks.items() if i.host == host and x != r and x < len(logged) and logged[x]]
        beside = ("other GPUs of the same host communicate normally" if others else
                  f"no other GPU of {host} logged: this GPU's own path and the host's NIC show the same records")
        return Candidate("gpu", score, [f"communication path of rank {r} (PCIe/NIC port of this GPU): {common}", beside],
                         rank=r, host=host, gpu=info.gpu if info else None, source="commops")
    key = c.key if isinstance(c.key, tuple) else (str(c.key),)
    if c.kind == "nic":
        return Candidate("nic", score, [f"NIC of {key[0]}: {common}"], host=key[0], source="commops")
    if c.kind == "link":
        return Candidate("link", score, [f"link {key[0]}<->{key[1]}: {common}"], hosts=list(key), source="commops")
    return Candidate("switch", score, [f"switch {key[0]}: {common}"], switch=key[0], source="commops")


def localize_commops(trace: Trace, timeline: StepView, steps: tuple[int, int] | None = None, top: int = 5) -> Verdict:
    """The CommOps localizer of docs/design.md: full records of the window (see summary.py for the
    path that starts from abnormal-operator summaries)."""
    # in the analysis' order (no second, sorted copy of every row), strings read as categoricals
    # (dictionary-encoded from Parquet: never expanded to one string a row)
    expr = None if steps is None else (ds.field("step") >= steps[0]) & (ds.field("step") <= steps[1])
    df = sorted_rows(with_steps(read_commops(trace, COLUMNS, expr)))
    if timeline.status != "irregular" or not timeline.irregular_steps:
        return persistent_verdict(df, trace.meta, top, timeline.group_kind, _durations(timeline))
    verdict, _ = analyse_ops(df, trace.meta, timeline, top)
    return verdict


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


def unseen_share(ops: Ops, lone_more: np.ndarray, world: int, steps: np.ndarray, ref: np.ndarray,
                 slow: np.ndarray) -> np.ndarray:
    """Per rank: of what its time per step grew by in the `slow` steps over its normal ones `ref`,
    the share spent waiting in its lone copies (`lone_more`, `lone_excess`) rather than computing.
    A slow unlogged peer grows the one; the rank itself, or its whole host, the other."""
    own = rank_step_compute(ops, world, steps)
    normal, hit = np.isin(steps, ref), np.isin(steps, slow)
    if normal.any():
        own -= np.median(own[:, normal], axis=1, keepdims=True)
    waited = np.maximum(lone_more[:, hit], 0.0).sum(axis=1)
    return waited / np.maximum(np.maximum(own[:, hit], 0.0).sum(axis=1) + waited, 1e-12)


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


def _durations(view: StepView) -> pd.Series | None:
    t = view.steps
    if t is None or t.empty or "duration_s" not in t:
        return None
    return t.set_index("step")["duration_s"].astype(float)


def imbalance_verdict(meta: JobMeta, found: Imbalance, first_step: int | None, extra: dict[str, object] | None = None,
                      steps: np.ndarray | None = None, durations: pd.Series | None = None) -> Verdict:
    """The verdict of a job slow from `first_step`, or from `found.since`, by `found.units` (none:
    healthy). `steps`: the logged steps; `durations`: step times (s) by step."""
    more = dict(extra or {})
    units, x = found.units, found.ratio
    if not units:
        return Verdict(meta.job, "healthy", [], 1.0, [], {"source": "commops", **more})
    cands = []
    for u in units:
        cand = _bare_candidate(u, u.share, meta)
        cand.evidence = _persistent_evidence(u, x, found.since, found.on_off)
        cands += with_ties(cand, u, meta)
    workers = [float(np.median(x[np.asarray(u.witnesses)])) for u in units if u.kind in ("gpu", "host")]
    stages = [float(cast(float, u.detail["over"])) for u in units if u.kind == "config" and "over" in u.detail]
    slow = max(workers + stages[:1], default=1.0)  # (a stage: its compute over the fastest stage's)
    if found.since is not None and steps is not None:
        later = found.on_off or [int(s) for s in steps if s >= found.since]
        if durations is not None and len(durations):
            d = durations.dropna()
            before, after = d[d.index < found.since].iloc[1:], d[d.index.isin(later)]  # (the first holds warm-up)
            if len(before) and len(after):
                slow = float(after.median() / before.median())
        return Verdict(meta.job, "irregular", later, slow, cands,
                       {"source": "commops", "typical_compute_s": round(found.typical, 6), **more},
                       onset_step=found.since)
    return Verdict(meta.job, "irregular", [], slow, cands, {"source": "commops", "persistent": True,
                                                            "typical_compute_s": round(found.typical, 6), **more},
                   onset_step=first_step)


def _persistent_evidence(u: RankUnit, x: np.ndarray, began: int | None = None, on_off: list[int] | None = None) -> list[str]:
    since = "in every step since the first: the job has been slow from the start, so no iteration is irregular against its neighbours"
    if u.kind in ("gpu", "host"):
        slower = float(np.median(x[np.asarray(u.witnesses)]) - 1)
        if began is not None:
            when = f"on and off ({len(on_off)} steps) since step {began}" if on_off else f"in every step since step {began}"
            since = (f"{when}, and not before: the step times are too noisy to show it, "
                     "its compute beside its peers' in the same steps does")
        if u.via is not None:
            return [f"rank {u.via} spent {slower:.0%} longer per step than its stage peers, waiting in collectives whose "
                    f"other members logged nothing (one rank per group logged): one of {u.tie_names()} is slow, and its "
                    "records cannot tell which", since]
        if "peer_wait" in u.detail:
            r, change = cast(int, u.detail["logged_rank"]), cast(float, u.detail["peer_wait"])
            told = ("it arrived last and they waited on it, so they are not slow (the GPU, not the host)" if u.kind == "gpu"
                    else "they are slow too (the host, not one GPU)")
            return [f"rank {r}, the only rank of its host that logged, computes {slower:.0%} longer per step than its "
                    f"peers of the same pipeline stage, and waits {change:.2f}x as long as they do in the collectives "
                    f"it shares with its unlogged peers: {told}", since]
        return [f"{u.label}: {slower:.0%} more compute per step than its peers of the same pipeline stage", since]
    if u.kind == "config":
        return [f"{u.label} computes longer than the fastest stage on every worker of the stage: the split of layers, not a device",
                since]
    return [f"{u.label} take turns computing longer than their stage peers: the delay moves with the data each replica gets "
            "(sequence-length imbalance), not with a device"]
