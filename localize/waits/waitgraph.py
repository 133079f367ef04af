"""Root cause on the operator graph (Holmes): who waited for whom, followed back to the origin.

The ops x ranks graph is compressed into instances of each group. For a prolonged instance:

- *normal while others wait*: the last arriver's copy is normal (it waited least) while the
  other copies are abnormal (they waited) -> the last arriver is the suspect, and the delay
  it imposed is the others' mean wait;
- *all copies abnormal*: even the last arriver's copy is slow -> the transfer itself is slow
  (a communication suspect, resolved to a device by `localize.network.devices`).

A suspect may be late only because it waited earlier on another group. Between its previous
operator of this group (where all copies ended together) and this one, the suspect spent its
own-clock time computing (gaps), waiting (in operators of other groups) or in transfers that
were slower than normal. If it computed more than its peers, the delay is its own: that rank
is the root. If it received more delay, follow the operator that delayed it most, to that
operator's suspect (or slow transfer), and repeat (TP -> PP p2p -> DP
and back, in any order). Everything is vectorized; the chain is resolved by pointer jumping.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from localize.ops.grouping import group_sum
from localize.ops.history import slot_median
from localize.ops.table import Ops, rank_bounds
from localize.waits.latecomers import recurrent_latecomers


@dataclass
class WaitGraph:
    """Per-instance resolution of the wait graph over the analysed steps."""

    suspect: np.ndarray  # bool per instance: one normal copy while the others waited
    comm: np.ndarray  # bool per instance: every copy slow (the transfer itself)
    orphan: np.ndarray  # bool per instance: a copy is missing and every present copy waited
    delay: np.ndarray  # per instance: the delay imposed (others' mean wait, or comm excess), s
    root_inst: np.ndarray  # per instance: the instance where its chain of waiting ends
    root_rank: np.ndarray  # per instance: root rank (-1 when the root is communication)
    missing_rank: np.ndarray  # per instance: the one expected rank absent from an orphan (-1 else)
    excess_compute: np.ndarray  # per instance: suspect's extra compute vs peers since last sync, s
    excess_wait: np.ndarray  # per instance: suspect's extra waiting vs peers since last sync, s
    excess_own: np.ndarray  # per instance: suspect's extra own-clock time vs peers since last sync, s
    measured: np.ndarray  # bool per instance: the excess figures were measured (else 0: unknown)


def _prev_same_pair(ops: Ops, rows: slice) -> np.ndarray:
    """Per row of `rows` (whole ranks): the previous row of the same rank and operator stream, as
    an index into `rows` (-1 if none)."""
    pair = ops.inst_pair[ops.inst[rows]]
    key = ops.rank[rows].astype(np.int64) * (int(pair.max(initial=0)) + 1)
    key += pair
    del pair
    order = np.argsort(key, kind="stable")  # rows are time-ordered per rank already
    key.sort(kind="stable")  # key[order], in place
    n = len(key)
    same = np.zeros(n, dtype=bool)
    np.equal(key[1:], key[:-1], out=same[1:])
    del key
    before = np.empty(n, dtype=np.int64)  # per sorted position: the row before it
    before[:1] = -1
    before[1:] = order[:-1]
    before[~same] = -1  # ... where it is of the same stream
    prev = np.empty_like(before)
    prev[order] = before
    return prev


def _row_index_type(n: int) -> type[np.signedinteger]:
    """The narrowest integer type that holds row indices 0..n-1 and -1 (half an int64's bytes
    for the per-row links of the wait graph)."""
    return np.int32 if n < 2**31 else np.int64


def _segment_starts(ops: Ops) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the row its own-clock segment starts after (-1: none), and whether no gap in
    between may hold a lost record (False where there is no segment start: such rows are never
    measured). Read a byte a row, rather than a running count's four held into the
    backtracking's first pass, its peak.

    The segment starts at the previous operator of the same stream. Where that one is in a step
    that was not logged before this one (sampled steps), or there is none, it starts at the
    rank's first operator of this step instead: every copy of an operator meets the same case,
    so the copies are still compared on one footing. A segment never leaves its rank, so the
    rows are taken a chunk of whole ranks at a time (no row-sized links, keys or orders
    beside the analysis's arrays: this runs near its peak)."""
    n = len(ops.rank)
    start = np.empty(n, dtype=_row_index_type(n))
    whole = np.empty(n, dtype=bool)
    for lo, hi in pairwise(rank_bounds(ops.rank)):  # (a collective copy's seq is its instance's)
        start[lo:hi], whole[lo:hi] = _ranks_segment_starts(ops, slice(lo, hi), ops.inst_seq[ops.inst[lo:hi]])
        start[lo:hi][start[lo:hi] >= 0] += lo
    return start, whole


def _ranks_segment_starts(ops: Ops, rows: slice, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_segment_starts` of `rows` (whole ranks; `seq`: their seq), as indices into `rows`."""
    prev = _prev_same_pair(ops, rows)
    step = ops.step[rows]
    far = (prev < 0) | (step[np.maximum(prev, 0)] < step - 1)
    near = np.where(far, -1, prev)
    counts = np.cumsum(_unreliable_gaps(ops, rows, seq, near))
    del near
    row = np.arange(len(step))
    rank = ops.rank[rows]
    first = np.where(np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])], row, 0)
    np.maximum.accumulate(first, out=first)
    start = np.where(first < row, first, -1)
    np.copyto(start, prev, where=~far)
    whole = (start >= 0) & np.equal(counts, counts[np.maximum(start, 0)])
    return start, whole


def _unreliable_gaps(ops: Ops, rows: slice, seq: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """Per row of `rows` (whole ranks; `seq`: their seq, `prev`: each one's previous row of its
    stream, an index into `rows`, -1 if none): its gap may hold a lost record (so it is not pure
    compute).

    A collective stream numbers its operators consecutively; a jump in seq between two rows of
    one rank's stream means records in between were lost, and every gap of that rank between
    the two rows may contain a lost operator's time.
    """
    has = (prev >= 0) & ~ops.inst_p2p[ops.inst[rows]]
    hole = np.zeros(len(seq), dtype=bool)
    hole[has] = np.subtract(seq[has], seq[prev[has]], dtype=np.int64) > 1
    mark = np.zeros(len(seq) + 1, dtype=np.int64)
    idx = np.flatnonzero(hole)
    np.add.at(mark, prev[idx] + 1, 1)
    np.add.at(mark, idx + 1, -1)
    return np.cumsum(mark, out=mark)[:-1] > 0


def _typical_wait(ops: Ops, ref_steps: np.ndarray | None) -> np.ndarray | None:
    """Per slot: the typical wait of the operator over the reference steps (NaN: never seen
    there); None without reference steps."""
    if ref_steps is None or not len(ref_steps):
        return None
    return slot_median(ops, ops.wait, ref_steps)


def _excess_wait(ops: Ops, typical: np.ndarray | None) -> np.ndarray:
    """Per row, a fresh array: its wait beyond its slot's `typical` wait (`_typical_wait`): only
    waiting beyond what the operator normally waits (pipeline bubbles) is a delay."""
    wait = ops.wait
    if typical is None:
        return wait
    for c in range(0, len(wait), _CHUNK):  # (by chunks: no row-sized gather of the typical waits beside it)
        usual = typical[ops.slot[c:c + _CHUNK]]
        np.nan_to_num(usual, copy=False)
        np.subtract(wait[c:c + _CHUNK], usual, out=wait[c:c + _CHUNK])
    return np.maximum(wait, 0.0, out=wait)


def _received(ops: Ops, typical: np.ndarray | None, comm_excess: np.ndarray) -> np.ndarray:
    """Per row, a fresh array: the delay it received, waiting for others (`_excess_wait`) or a
    transfer slower than normal (built where it is read: 8 bytes a row not held in between)."""
    out = _excess_wait(ops, typical)
    for c in range(0, len(out), _CHUNK):
        out[c:c + _CHUNK] += comm_excess[ops.inst[c:c + _CHUNK]]
    return out


def _segment_totals(ops: Ops, what: str, values: np.ndarray | None, p: np.ndarray) -> np.ndarray:
    """Per row: the rank's compute, delay received or own-clock time between row `p` (its
    segment start, an earlier row: p[i] < i, or -1 where it has none: read as row 0) and itself, as float64
    (rows without a start: any value). `values`: per row, the compute before it (`Ops.gap`)
    or the delay it received, consumed: its running sum, then the totals, are built in its
    place; the own-clock time reads the frame's times instead (None)."""
    if what in ("compute", "wait"):
        assert values is not None
        c = np.cumsum(values, out=values)
        # received before this row (wait): the running sum up to the previous row, c[i - 1]
        _differences_in_place(c, p, shift=1 if what == "wait" else 0)
        return c
    # all of it: from the end of the previous operator of the stream to this one's start
    out = np.empty(len(p))
    for i in range(0, len(p), _CHUNK):  # (by chunks: no row-sized int64 scratch beside the result)
        out[i:i + _CHUNK] = (ops.times.start(slice(i, i + _CHUNK)) - ops.times.end(np.maximum(p[i:i + _CHUNK], 0))) * 1e-9
    return out


#: rows per chunk of the wait graph's passes (`_range_argmax`, `_differences_in_place`, the delay
#: received): each holds a few chunk-sized gathers beside the row-sized arrays at the analysis's
#: peak, so a quarter of 2**20 rows takes ~20 MB off it at no cost in time
_CHUNK = 1 << 18


def _differences_in_place(c: np.ndarray, p: np.ndarray, shift: int) -> None:
    """c[i] becomes c[i - shift] - c[p[i]] (c[-1] reads 0; p[i] -1 reads row 0), for p[i] <= i - shift (and row 0),
    a chunk at a time from the back: a chunk reads only rows no later chunk wrote, so there is
    no second row-sized array (the same float64 differences as computed from a copy)."""
    n = len(c)
    for lo in range(((n - 1) // _CHUNK) * _CHUNK, -1, -_CHUNK):
        hi = min(lo + _CHUNK, n)
        if shift:
            before = np.empty(hi - lo)
            before[1:] = c[lo:hi - 1]
            before[0] = c[lo - 1] if lo else 0.0
        else:
            before = c[lo:hi]
        c[lo:hi] = before - c[np.maximum(p[lo:hi], 0)]


def _range_argmax(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Index of the max of values[lo:hi] for each (lo, hi) with lo < hi (-1 for empty ranges).

    A sparse table built level by level: level j holds the max of each window of 2**j rows,
    and a range of length L is the max of two (overlapping) windows of 2**floor(log2 L).
    O(rows x log(longest range) + ranges), whatever the order or overlap of the ranges.
    """
    return _range_argmax_packed(_packed(values), lo, hi)


def _packed(values: np.ndarray, consume: bool = False) -> np.ndarray:
    """(value in microseconds, row index) packed into one int64 per row, so that a max yields
    the argmax (ties: the later row). Built chunk by chunk: one row-sized array, `values`' own
    buffer when `consume` (float64 values: each chunk is read before it is overwritten)."""
    table = values.view(np.int64) if consume else np.empty(len(values), dtype=np.int64)
    for c in range(0, len(values), _CHUNK):
        e = min(c + _CHUNK, len(values))
        q = values[c:e] * 1e6
        np.clip(q, 0, 2**35 - 1, out=q)
        t = table[c:e]
        t[:] = q.astype(np.int64)
        t <<= 27
        t |= np.arange(c, e)
    return table


def _range_argmax_packed(table: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """`_range_argmax` over a `_packed` table, which it overwrites (each level in place)."""
    out = np.full(len(lo), -1, dtype=np.int64)
    ok = np.flatnonzero(hi > lo)
    if not ok.size or len(table) == 0:
        return out
    a, b = lo[ok], hi[ok]
    level = np.frexp((b - a).astype(np.float64))[1] - 1  # floor(log2(length)), exact for ints
    best = np.zeros(len(ok), dtype=np.int64)
    for j in range(int(level.max()) + 1):
        if j:
            h = 1 << (j - 1)
            m = len(table) - h  # windows of 2**j starting at each row: in place, front to back
            for c in range(0, m, _CHUNK):  # (a chunk reads only rows no earlier chunk wrote)
                e = min(c + _CHUNK, m)
                np.maximum(table[c:e], table[c + h:e + h], out=table[c:e])
            table = table[:m]
        at = np.flatnonzero(level == j)
        if at.size:
            best[at] = np.maximum(table[a[at]], table[b[at] - (1 << j)])
    out[ok] = best & ((1 << 27) - 1)
    return out


def build_waitgraph(ops: Ops, abnormal: np.ndarray, steps: np.ndarray, expected_size: np.ndarray,
                    comm_excess: np.ndarray, members_sum: np.ndarray, ref_steps: np.ndarray | None = None,
                    short_comm: np.ndarray | None = None,
                    latecomers: tuple[np.ndarray, np.ndarray] | None = None,
                    unlogged: np.ndarray | None = None) -> WaitGraph:
    """Resolve every prolonged instance of `steps` to a root rank or a communication instance.

    `abnormal`: per row, from the detector. `expected_size`, `members_sum`: per instance, the
    group's size and sum of member ranks (for naming the one missing rank). `comm_excess`: per
    instance, how much longer its smallest copy took than its normal transfer time (s).
    `short_comm`: per instance, a collective short of copies (lost rows) whose transfer is known
    slow from its group's whole instances: a slow transfer, not a missing rank that was late.
    `latecomers`: (unit of each instance, irregular steps): an instance whose last arriver kept
    its peers waiting in step after step (`localize.waits.latecomers`) is a suspect even where the
    detector flagged no waiting copy. `unlogged`: per instance, how many of its group's members
    logged nothing at all (a host without a logger): an instance short of exactly those, whose
    two or more present copies all waited, waited on one of them (an orphan with no one missing
    rank: `missing_rank` -1, `localize.commops` shares its delay among them).
    """
    n = ops.n_inst
    inst = ops.inst
    size = ops.inst_size
    in_steps = np.isin(ops.inst_step, steps)
    late = ops.late_row
    late_abn = abnormal[late]
    n_abn = group_sum(inst, n, abnormal)
    others = np.maximum(size - 1, 1)
    frac_others = (n_abn - late_abn) / others
    typical = _typical_wait(ops, ref_steps)
    wait_x = _excess_wait(ops, typical)
    sum_wait = group_sum(inst, n, wait_x)
    del wait_x  # (rebuilt where it is read below: not held through the backtracking's row-sized passes)
    delay_wait = sum_wait / others
    del sum_wait, others  # (per-instance scratch is dropped once used: the row-sized work below peaks)
    complete = size >= expected_size
    multi = size >= 2
    whole = complete if short_comm is None else complete | short_comm
    comm = in_steps & whole & multi & (comm_excess > 0)
    waited = frac_others >= 0.5
    del frac_others
    if latecomers is not None and ref_steps is not None:
        waited |= recurrent_latecomers(ops, delay_wait, latecomers[0], latecomers[1], ref_steps, complete)
    suspect = in_steps & complete & multi & ~comm & ~late_abn & waited
    one_missing = expected_size - size == 1
    short = one_missing if unlogged is None else one_missing | ((size >= 2) & (expected_size - size == unlogged))
    orphan = in_steps & ~complete & ~comm & ~ops.inst_p2p & (n_abn >= size) & short
    del n_abn, whole, complete, late_abn, in_steps, short, multi, waited
    rank = ops.rank
    present_sum = group_sum(inst, n, rank)
    missing_rank = np.full(n, -1, dtype=rank.dtype)  # (a rank: int32 where ranks are)
    one = orphan & one_missing
    missing_rank[one] = np.rint(members_sum[one] - present_sum[one])
    del present_sum, one, one_missing

    # backtracking: what the suspect did since its previous operator of the same stream.
    # Per row: compute, delay received and own-clock time since that operator (NaN: none),
    # each reduced to per-instance figures before the next is built (rows x 8 bytes apiece)
    prev, valid = _segment_starts(ops)
    p = prev  # (-1 where none: each pass reads it as row 0, a chunk at a time, and marks the row unmeasured)
    prev_late = prev[late]  # (what the chains below read of it: the row-sized links go now)
    del prev
    p2p = np.flatnonzero(ops.inst_p2p).astype(inst.dtype)  # (instance indices: in the codes' width)
    hist = ref_steps is not None and len(ref_steps) > 0 and len(p2p) > 0
    lv = measured = np.zeros(0, dtype=bool)
    peers_n = np.zeros(0)
    # per instance, for compute, waiting and own-clock time: the late arriver's excess over its
    # peers (0 where unmeasured), and over its own history with whether that history exists
    # (one row-sized array of figures at a time: the delay received is built for its own pass)
    excess: dict[str, np.ndarray] = {}
    own: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for what in ("compute", "own", "wait"):
        values = ops.gap if what == "compute" else _received(ops, typical, comm_excess) if what == "wait" else None
        seg = _segment_totals(ops, what, values, p)
        del values
        for c in range(0, len(seg), _CHUNK):  # (by chunks: no row-sized mask beside it)
            seg[c:c + _CHUNK][p[c:c + _CHUNK] < 0] = np.nan
        if what == "wait":
            del p  # (its last read: the row-sized links are not held through the last pass's medians)
        if what == "compute":
            valid &= np.isfinite(seg)
            n_valid = group_sum(inst, n, valid)
            lv = valid[late]
            peers_n = np.maximum(n_valid - lv, 1).astype(np.int32)  # (a count: the same quotients as in float64)
            measured = lv & (n_valid >= 2)
            del n_valid
        # the two ends of a p2p transfer do different work: the sender is judged against its
        # own history too (the same operator in normal steps), below: the p2p instances' alone
        # (only they read it; their slots' history matrix is a fraction of every slot's)
        h = slot_median(ops, seg, ref_steps, keep=valid, slots=ops.slot[late[p2p]]) if hist else None
        for c in range(0, len(seg), _CHUNK):  # (by chunks: nan_to_num's row-sized masks would stand beside it)
            np.nan_to_num(seg[c:c + _CHUNK], copy=False)
        at_late = seg[late]
        # (in place, the instances' sums once the rows' figures go: the same float64 operations as
        # at_late - (sum - at_late) / peers_n, without its per-instance temporaries)
        peers = group_sum(inst, n, seg)
        del seg
        peers -= at_late
        peers /= peers_n
        np.subtract(at_late, peers, out=peers)
        peers[~measured] = 0.0
        excess[what] = peers
        del peers
        if h is not None:
            own[what] = (at_late[p2p] - h, np.isfinite(h))
        del at_late, h
    del valid, peers_n
    # a suspect whose own compute cannot be measured (a lost record in between) is not blamed
    suspect &= lv | (size < 2)
    excess_compute, excess_wait, excess_own = excess["compute"], excess["wait"], excess["own"]
    if own:
        (own_c, seen_c), (own_w, seen_w), (own_o, seen_o) = own["compute"], own["wait"], own["own"]
        ok = lv[p2p] & seen_c & seen_w & seen_o
        at = p2p[ok]
        excess_compute[at], excess_wait[at], excess_own[at] = own_c[ok], own_w[ok], own_o[ok]
        measured[at] = True
        del own_c, seen_c, own_w, seen_w, own_o, seen_o, ok, at  # (not held through the chains' range maxima)
    del excess, own, lv

    # an orphan's present copies all waited on the absent one, together: beyond waiting on each
    # other, their delay is how much longer even the shortest of them took than normal
    delay = np.where(comm, comm_excess, np.where(suspect, delay_wait,
                                                 np.where(orphan, np.maximum(delay_wait, comm_excess), 0.0)))
    # every instance points back along waiting, flagged or not: chains pass through operators
    # whose copies looked ordinary (a short wait) on their way to the root
    follow = ~comm & (excess_wait > excess_compute) & (excess_wait > 0.25 * delay_wait) & (size >= 2)
    del delay_wait
    lrow = late[follow]
    prev_l = prev_late[follow]
    table = _packed(_received(ops, typical, comm_excess), consume=True)
    target_row = _range_argmax_packed(table, np.maximum(prev_l, -1) + 1, lrow)
    del table
    target_row = np.where(prev_l >= 0, target_row, -1)
    nxt = np.arange(n, dtype=np.int64)
    ok = target_row >= 0
    nxt[np.flatnonzero(follow)[ok]] = inst[target_row[ok]]
    # pointer jumping; chains point back in time, so they end. Only the instances not yet at
    # their root move (most chains are short: each round touches fewer of them)
    active = np.flatnonzero(nxt[nxt] != nxt)
    for _ in range(64):
        if not active.size:
            break
        nxt[active] = nxt[nxt[active]]
        active = active[nxt[nxt[active]] != nxt[active]]
    root_rank = np.where(comm[nxt], -1, rank[late[nxt]])
    root_rank = np.where(orphan, missing_rank, root_rank)
    return WaitGraph(suspect, comm, orphan, delay, nxt, root_rank, missing_rank, excess_compute, excess_wait,
                     excess_own, measured)
