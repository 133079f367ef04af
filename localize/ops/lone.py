"""Operators no other logged copy shares: where a logger keeps one rank per group, the rest wait unseen.

Megatron jobs often log only tensor-parallel rank 0. That rank's TP all-reduces then have one
copy, and the time a slow unlogged peer makes the group wait shows only as that copy's length,
never as compute or as a wait measured across copies. Every method that weighs a rank's own time
(blame in slow steps, imbalance among peers from the first step) reads it from here. A host on
which no logger ran is the same question one level up: its members are missing from collectives
whose other copies are here (`unlogged_members`, `silent_ranks`, `share_among`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta
from localize.ops.grouping import unique
from localize.ops.table import Ops
from timeline.groups import membership


def lone_copies(ops: Ops, groups: Mapping[str, Sequence[int]], skip: Collection[str] = (),
                unlisted: bool = False) -> np.ndarray:
    """Per row: a collective of a group with other members (per meta.json) of which the row's rank
    is the only one that logged anything. `skip`: groups not read whole (a partial fetch, one
    node's view), which cannot tell an unlogged member from one read elsewhere. `unlisted`: every
    rank's records are here, so a group meta.json does not list, collective yet logged by one rank
    only, had members that did not log (no job runs collectives over a group of one)."""
    names = [str(g) for g in ops.groups]
    members = np.array([0 if g in skip else len(groups.get(g, ())) if g in groups else 2 * unlisted
                        for g in names], dtype=np.int64)
    if not (members > 1).any():
        return np.zeros(len(ops.rank), dtype=bool)
    logged = np.bincount(membership(ops.group_code, ops.rank)[0], minlength=len(names))
    # judged per instance, then read per row (no row-sized gathers of sizes and counts)
    lone = ~ops.inst_p2p & (ops.inst_size == 1) & ((members > 1) & (logged == 1))[ops.inst_group]
    return lone[ops.inst]


def lone_time(ops: Ops, lone: np.ndarray, world: int, steps: np.ndarray) -> np.ndarray:
    """Rank × step (`steps`: the ops' steps, sorted): time each rank spent in its lone copies,
    beyond what a copy of the same operator and size took in that step where its peers logged too
    (their median). That much is the transfer any member pays; only the rest is waiting on the
    unlogged peers. (A host without a logger leaves its peers' all-to-alls across hosts lone: their
    transfer time read as compute made a healthy job's stage 1.6x slow, "config".)"""
    out = np.zeros((world, len(steps)))
    rows = np.flatnonzero(lone)
    if not rows.size:
        return out
    took = ops.elapsed[rows]
    shared = np.flatnonzero(~lone & ~ops.inst_p2p[ops.inst])
    if shared.size:
        key = ["op", "nbytes", "step"]
        typical = (pd.DataFrame({"op": ops.opcode[shared], "nbytes": ops.nbytes[shared], "step": ops.step[shared],
                                 "took": ops.elapsed[shared]}).groupby(key, sort=False)["took"].median())
        mine = pd.MultiIndex.from_arrays([ops.opcode[rows], ops.nbytes[rows], ops.step[rows]], names=key)
        took = np.maximum(took - np.nan_to_num(typical.reindex(mine).to_numpy(np.float64)), 0.0)
    col = np.searchsorted(steps, ops.step[rows])
    np.add.at(out, (ops.rank[rows].astype(np.int64), col), took)
    return out


def unlogged_peers(ops: Ops, groups: Mapping[str, Sequence[int]], lone: np.ndarray, world: int) -> dict[int, list[int]]:
    """Per rank with lone copies: the other members of those groups, none of whom logged them. When
    the rank waited in them, one of these was slow; its records cannot say which. A group meta.json
    does not list is taken as the ranks numbered after it up to the next that logged (tensor
    parallel ranks are numbered consecutively by Megatron, DeepSpeed and torch's device mesh)."""
    code = ops.group_code[lone]
    logged = np.zeros(world + 1, dtype=bool)
    logged[ops.rank] = True
    logged[world] = True
    out: dict[int, set[int]] = {}
    for c, r in zip(*membership(code, ops.rank[lone]), strict=True):  # one per lone group (a few per rank)
        name, r = str(ops.groups[c]), int(r)
        if name in groups:
            out.setdefault(r, set()).update(int(m) for m in groups[name] if m != r)
        else:
            nxt = r + 1 + int(np.argmax(logged[r + 1:]))
            out.setdefault(r, set()).update(range(r + 1, nxt))
    return {r: sorted(m) for r, m in out.items() if m}


def wait_change(waited: np.ndarray, slow: np.ndarray, normal: np.ndarray) -> np.ndarray:
    """Per rank: its time in lone copies per slow step over that per normal step (medians over
    the columns `slow` and `normal` of rank × step `waited`, `lone_time`); NaN where unknown.
    `slow` is one mask for every rank, or one per rank (rank × step): the steps it slowed.

    The slowest member of a collective waits least. A logged rank slow alone arrives last at the
    collectives it shares with its unlogged peers, and its time in them falls to the transfer
    (well under 1); slowed with them (its host), it keeps waiting on the slowest of them, longer
    as all slow (over 1)."""
    out = np.full(waited.shape[0], np.nan)
    per_rank = np.broadcast_to(slow, waited.shape)
    if not per_rank.any() or not normal.any():
        return out
    before = np.median(waited[:, normal], axis=1)
    during = np.where(per_rank, waited, np.nan)
    known = (before > 0) & per_rank.any(axis=1)
    out[known] = np.nanmedian(during[known], axis=1) / before[known]
    return out


def own_slow_steps(by_step: np.ndarray, slow: np.ndarray, share: float = 0.5) -> np.ndarray:
    """Rank × step: the slow steps (columns `slow` of the steps) in which each rank's own blame
    (`by_step`, rank × slow step) reached `share` of its largest; all slow steps for a rank
    never blamed. A spike's few steps among noisy slow ones are where its waits changed."""
    out = np.zeros((by_step.shape[0], slow.size), dtype=bool)
    peak = by_step.max(axis=1, initial=0.0)
    mine = (by_step >= share * peak[:, None]) & (by_step > 0)
    mine[peak <= 0] = True
    out[:, np.flatnonzero(slow)] = mine
    return out


def wait_beside_peers(waited: np.ndarray, seen: np.ndarray, peer_set: np.ndarray) -> np.ndarray:
    """Per rank: its median time in lone copies per step over that of the logged ranks of its
    `peer_set` (per rank, e.g. its pipeline stage) in the same steps; NaN where unknown. A job
    slow from its first step has no normal step to compare with (`wait_change`): its peers are."""
    out = np.full(waited.shape[0], np.nan)
    for s in np.unique(peer_set[seen]):  # one iteration per peer set (pipeline stage)
        mine = seen & (peer_set == s)
        typical = np.median(waited[mine], axis=0)
        if mine.sum() >= 3 and np.median(typical) > 0:
            out[mine] = np.median(waited[mine], axis=1) / np.median(typical)
    return out


def unlogged_members(ops: Ops, groups: Mapping[str, Sequence[int]], world: int, partial: Collection[str]) -> list[np.ndarray]:
    """Per group code of `ops`: its members (per meta.json) that logged nothing at all, as on a host
    without a logger; none for groups `partial` (not read whole here)."""
    logged = np.zeros(world, dtype=bool)
    logged[ops.rank] = True
    out = []
    for g in ops.groups:  # one per group, not per row
        members = np.asarray([m for m in groups.get(str(g), ()) if 0 <= m < world], dtype=np.int64)
        out.append(members[~logged[members]] if str(g) not in partial else members[:0])
    return out


def share_among(members: list[np.ndarray], group: np.ndarray, delay: np.ndarray, world: int) -> np.ndarray:
    """Per rank: each delay (of an instance of group code `group`) shared evenly among that group's
    `members`: which of them was late its peers' records cannot say, but one that was late in many
    groups collects the most."""
    per_group = np.bincount(group, weights=delay, minlength=len(members))
    out = np.zeros(world)
    for g in np.flatnonzero(per_group):  # one per group with such delay
        if len(members[g]):
            np.add.at(out, members[g], per_group[g] / len(members[g]))
    return out


def silent_ranks(ops: Ops, meta: JobMeta, world: int) -> np.ndarray:
    """Per rank: on a host none of whose ranks logged anything here."""
    host = pd.factorize(np.array([meta.ranks[r].host if r in meta.ranks else f"rank {r}" for r in range(world)]))[0]
    return ~np.isin(host, host[unique(ops.rank)])
