"""Operators no other logged copy shares: where a logger keeps one rank per group, the rest wait unseen.

Megatron jobs often log only tensor-parallel rank 0. That rank's TP all-reduces then have one
copy, and the time a slow unlogged peer makes the group wait shows only as that copy's length,
never as compute or as a wait measured across copies. Every method that weighs a rank's own time
(blame in slow steps, imbalance among peers from the first step) reads it from here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from localize.ops.features import Ops
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
    code = ops.group_code
    logged = np.bincount(membership(code, ops.rank)[0], minlength=len(names))
    return (~ops.inst_p2p[ops.inst] & (ops.inst_size[ops.inst] == 1)
            & (members[code] > 1) & (logged[code] == 1))


def lone_time(ops: Ops, lone: np.ndarray, world: int, steps: np.ndarray) -> np.ndarray:
    """Rank × step (`steps`: the ops' steps, sorted): time each rank spent in its lone copies."""
    out = np.zeros((world, len(steps)))
    col = np.searchsorted(steps, ops.step[lone])
    np.add.at(out, (ops.rank[lone].astype(np.int64), col), ops.elapsed[lone])
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

    The slowest member of a collective waits least. A logged rank slow alone arrives last at the
    collectives it shares with its unlogged peers, and its time in them falls to the transfer
    (well under 1); slowed with them (its host), it keeps waiting on the slowest of them, longer
    as all slow (over 1)."""
    out = np.full(waited.shape[0], np.nan)
    if not slow.any() or not normal.any():
        return out
    before = np.median(waited[:, normal], axis=1)
    known = before > 0
    out[known] = np.median(waited[known][:, slow], axis=1) / before[known]
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

