"""Point-to-point transfers judged by physics, whatever the transport's send semantics.

A send may complete when its data is handed to the transport (eager, small messages) or only
once its receiver has posted too (rendezvous: NCCL and gloo for large messages; Megatron's
batched send+recv), so a long send is as often a late receiver as a slow path: the send copy
is no evidence about the network. What is evidence is how long the data took once both sides
were ready: from the later of the two posts to the recv's end, on clocks aligned across hosts.
That is exact under rendezvous and a lower bound under eager sends (the data may have left
before the receiver posted), so it never overstates a transfer. It is judged against the time
the same stream (or, lacking history, the same size on the same path class) needs in normal
steps, measured only where the measurement is exact: the receiver waited for the sender, or
both ends completed together. A rank that posted late is a suspect of the wait graph, never
evidence against the network.
"""

from __future__ import annotations

import numpy as np

from collector.trace.meta import JobMeta
from collector.trace.schema import OPS
from localize.ops.grouping import dense_codes, group_quantile
from localize.ops.table import Ops, rank_bounds
from timeline.instances import host_codes
from timeline.steps import clock_offsets_of

#: a transfer is slow when its data took this much longer than the path needs (0.5 missed a NIC
#: at 1.39x and a switch at 1.40x whose transfers ran 1.33-1.4x: their normal ones cleared them)
SLOW_EXCESS = 0.3
#: ... and at least this long beyond it (s): scheduling noise of a healthy host
MIN_EXCESS_S = 50e-6
#: rows per chunk of `aligned_times`' passes
_CHUNK = 1 << 18
#: two clock readings agree within this share of the transfer, or this many seconds
TOLERANCE = 0.1
TOLERANCE_S = 50e-6
#: a stream's sends wait for their receiver when this share of late receivers ended with the send
HELD_SHARE = 0.9


def p2p_rows(ops: Ops) -> tuple[np.ndarray, np.ndarray]:
    """Per instance: the row of its send and of its recv (-1 where absent or a collective), int32
    where the rows are fewer than 2**31 (these are held through the transfers' passes, which peak)."""
    rows = []
    for op in ("send", "recv"):
        mine = ops.opcode == OPS.index(op)
        r = np.full(ops.n_inst, -1, dtype=np.int32 if len(mine) < 2**31 else np.int64)
        r[ops.inst[mine]] = np.flatnonzero(mine)
        rows.append(r)
    return rows[0], rows[1]


def aligned_times(ops: Ops, meta: JobMeta, ref: np.ndarray | None, rows: np.ndarray) -> tuple[
        np.ndarray, np.ndarray, tuple[float, float]]:
    """Per row, its start, and the end of `rows` (indices) only, in seconds on one clock (each
    host's offset removed, as the timeline estimates it step by step, from the normal steps
    `ref` where there are some); and `time_line` of every row's start and end (the ends of the
    other rows are read a chunk at a time, never held)."""
    step = ops.step
    steps = np.unique(step[step >= 0])
    # (only the sampled steps' rows, one step at a time, with the columns the frame no longer holds: `Ops.rows_frame`)
    offsets = clock_offsets_of(lambda s: ops.rows_frame(step == s), meta, steps, trusted=ref)
    index, table = offsets.index.to_numpy(), offsets.to_numpy()
    host_of = host_codes(meta, np.arange(max(max(meta.ranks, default=0), int(ops.rank.max(initial=0))) + 1))[0]

    def off(at: slice | np.ndarray) -> np.ndarray:
        """Per row of `at`: its host's offset at its step (read where it is used, by chunks: this
        runs near the analysis's peak)."""
        return table[np.clip(np.searchsorted(index, step[at]), 0, len(offsets) - 1), host_of[ops.rank[at]]]

    def aligned(t: np.ndarray, at: slice | np.ndarray) -> np.ndarray:
        """`t` (int64 ns, of the rows `at`) on the one clock, in seconds."""
        out = t.astype(np.float64)
        out -= off(at)
        out *= 1e-9
        return out

    n = len(step)
    start = np.empty(n)
    lo, hi = np.inf, -np.inf
    for c in range(0, n, _CHUNK):
        at = slice(c, c + _CHUNK)
        part, end = ops.times.bounds(at)
        start[at] = aligned(part, at)
        end = aligned(end, at)
        lo, hi = min(lo, float(end.min())), max(hi, float(end.max()))
    lo, hi = min(lo, float(start.min(initial=np.inf))), max(hi, float(start.max(initial=-np.inf)))
    return start, aligned(ops.times.end(rows), rows), (lo, hi - lo + 1.0)


def time_line(start: np.ndarray, end: np.ndarray) -> tuple[float, float]:
    """The origin and the length of each rank's segment of the one line `last_activity` lifts
    the ranks' times onto: the earliest time, and the span of all of them plus 1 s."""
    t0 = float(min(start.min(), end.min()))
    return t0, float(max(start.max(), end.max()) - t0) + 1.0


def last_activity(ops: Ops, start: np.ndarray, end: np.ndarray, rows: np.ndarray | None = None,
                  line: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: when its rank last started anything before the row ended (its own start at the
    earliest), whether the row was blocking (nothing else of its rank started while it ran,
    nor with it: its end is what it waited for, not a batch's or a later wait's), and that last
    started row (the row itself when blocking). `rows`
    (indices): only those rows', `end` then given for them alone and `line` (`time_line` of
    every row's start and end) with it; `start` is every row's.

    An irecv posted early and waited on later, or an operator of a batch, ends when the rank's
    wait returned; the rank was certainly inside the operator only after its last other start."""
    n = len(ops.rank)
    at: np.ndarray = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64) if rows is None else rows
    if n < 2:
        return start[at], np.ones(len(at), dtype=bool), at.copy()
    first = np.r_[True, ops.rank[1:] != ops.rank[:-1]]
    t0, span = time_line(start, end) if line is None else line
    # each rank lifted to its own segment of one line, a chunk of whole ranks at a time (a search
    # never leaves its rank's segment, so a chunk's rows are all it can land on: the same
    # positions as in the whole line, without a row-sized lifted copy of the starts)
    by_row = np.argsort(at, kind="stable")
    bounds = rank_bounds(ops.rank)
    cut = np.searchsorted(at[by_row], bounds)
    j = np.empty(len(at), dtype=at.dtype)
    seg0 = 0
    for lo, hi, a, b in zip(bounds[:-1], bounds[1:], cut[:-1], cut[1:], strict=True):
        seg = np.cumsum(first[lo:hi], dtype=np.int64)
        seg += seg0 - 1
        seg0 = int(seg[-1]) + 1
        lifted_start = np.subtract(start[lo:hi], t0)
        lifted_start += np.multiply(seg, span)  # rows are sorted by (rank, start): so is this
        mine = by_row[a:b]
        idx = at[mine]
        lifted_end = np.subtract(end[idx] if rows is None else end[mine], t0)
        lifted_end += np.multiply(seg[idx - lo], span)
        j[mine] = np.searchsorted(lifted_start, lifted_end, side="left") + lo
    del by_row
    np.subtract(j, 1, out=j)
    np.maximum(j, at, out=j)
    ready = start[j]
    np.maximum(start[at], ready, out=ready)
    # posted with the row before or after it, of the same rank (a batch)
    after, before = np.minimum(at + 1, n - 1), np.maximum(at - 1, 0)
    same_start = (at < n - 1) & ~first[after] & (start[after] == start[at])
    same_start |= ~first[at] & (start[before] == start[at])
    blocking = (j == at) & ~same_start
    return ready, blocking, j


def flights(ops: Ops, meta: JobMeta, ref: np.ndarray | None, send_row: np.ndarray,
            recv_row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per instance: how long the data took once both sides were certainly in the transfer (s,
    NaN when one end is missing); whether the receiver was there first (then that is the
    transfer's whole time under any semantics); whether both ends completed together (the whole
    time under rendezvous, a lower bound under an eager send that completes when its data lands);
    and the time to the receive's own end (what bounds the transfer when the send did not wait).

    A blocking recv ends when its data arrived. Otherwise (a batch, an irecv waited on later)
    the recv ends when the rank's wait returned, which may have waited on something else: the
    data was there by the earlier of the two ends, if the send waited for its receiver. An eager
    send ends once its data is handed over, before it lands: then only the receive's own end
    bounds it (`slow_transfer_excess` chooses, by whether the stream's sends wait); a receive whose
    rank's wait also returned another operator ended for either (NaN: not measured)."""
    both = ops.inst_p2p & (send_row >= 0) & (recv_row >= 0)
    flight = np.full(ops.n_inst, np.nan)
    by_recv = np.full(ops.n_inst, np.nan)
    waited = np.zeros(ops.n_inst, dtype=bool)
    together = np.zeros(ops.n_inst, dtype=bool)
    # (times on one clock of the two ends' rows only, but every row's start: other rows of their ranks count)
    ends = np.concatenate([send_row[both], recv_row[both]])
    k = int(both.sum())
    start, end, line = aligned_times(ops, meta, ref, ends)
    ready, blocking, last = last_activity(ops, start, end, ends, line)
    del start
    (end_s, end_r), (ready_s, ready_r), blocking_r = (end[:k], end[k:]), (ready[:k], ready[k:]), blocking[k:]
    # a receive that is not blocking ended when its rank's wait returned: its own data's arrival
    # where no later-started operator of the rank ended with it (a batch whose send went long
    # before), else whichever of them the wait was for (an irecv waited on with a later batch)
    recvs, last_r = ends[k:], last[k:]
    alone = _ends_alone(ops, recvs, last_r)
    both_in = np.maximum(ready_s, ready_r)
    arrived = np.where(blocking_r, end_r, np.minimum(end_s, end_r))
    took = np.maximum(arrived - both_in, 0.0)
    tol = np.maximum(TOLERANCE * took, TOLERANCE_S)
    flight[both] = took
    by_recv[both] = np.where(blocking_r | alone, np.maximum(end_r - both_in, 0.0), np.nan)
    waited[both] = ready_r <= ready_s + tol
    together[both] = np.abs(end_s - end_r) <= tol
    return flight, waited, together, by_recv


def _ends_alone(ops: Ops, rows: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per row: whether no other operator of the batch its rank last started before the row ended
    (`last`, and the operator posted with it) ended with it, on the rank's own clock."""
    end = ops.times.end(rows)

    def ended_with(other: np.ndarray) -> np.ndarray:
        return (other != rows) & (np.abs(ops.times.end(other) - end) <= TOLERANCE_S * 1e9)

    before = np.maximum(last - 1, 0)
    batch = (ops.rank[before] == ops.rank[last]) & (ops.times.start(before) == ops.times.start(last))
    return ~(ended_with(last) | (batch & ended_with(before)))


def path_needs(ops: Ops, meta: JobMeta, flight: np.ndarray, waited: np.ndarray, together: np.ndarray,
               send_row: np.ndarray, recv_row: np.ndarray, stream: np.ndarray,
               in_ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per instance: the time its transfer needs, from normal steps, NaN where never measured;
    and how long its stream's transfers usually took at most (the 90th percentile of every
    normal measurement, NaN where never measured).

    Exact measurements first (the receiver waited): the median of the stream's own, else of the
    same payload on the same path class (within a host, or across hosts). A stream whose
    receivers never waited falls back on its ends completing together, at their 90th percentile:
    exact under rendezvous, and under eager sends the highest of lower bounds. The usual range
    covers the measurements that are not exact (a receiver that came late, a sender already
    back at compute): a stream on a busy host spreads widely even when its path is healthy.
    """
    p2p = ops.inst_p2p & (send_row >= 0) & (recv_row >= 0)
    normal = p2p & in_ref & np.isfinite(flight)
    # (the ends' hosts alone: no row-sized table of every row's host held through the quantiles)
    hs = host_codes(meta, ops.rank[np.maximum(send_row, 0)])[0]
    hr = host_codes(meta, ops.rank[np.maximum(recv_row, 0)])[0]
    path = ((hs != hr) | (hs < 0)).astype(np.int64)  # 0: within a host, 1: across the network
    payload = path * (1 << 40) + ops.nbytes[np.maximum(send_row, 0)]

    def per(key: np.ndarray, mask: np.ndarray, q: float) -> np.ndarray:
        """The quantile over `mask` of each instance's key (NaN with fewer than 2 measurements)."""
        code, k = dense_codes(key, by_first=False)
        n = np.bincount(code[mask], minlength=k)
        at = group_quantile(code[mask], k, flight[mask], q) if mask.any() else np.full(k, np.nan)
        return np.where(n >= 2, at, np.nan)[code]

    needs = per(stream, normal & waited, 0.5)
    for alt in (per(payload, normal & waited, 0.5), per(stream, normal & together, 0.9)):
        needs = np.where(np.isfinite(needs), needs, alt)
    usual = per(stream, normal, 0.9)
    usual = np.where(np.isfinite(usual), usual, per(payload, normal, 0.9))
    return np.where(p2p, needs, np.nan), np.where(p2p, usual, np.nan)


def slow_transfer_excess(ops: Ops, meta: JobMeta, ref: np.ndarray,
                         rows: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per instance: how much longer a p2p transfer's data took than its path needs (s), 0 unless
    clearly slow -- `SLOW_EXCESS` longer than it needs, and beyond its stream's usual range -- 0 for
    collectives; and whether its transfer time was seen at all (a receiver that came after the
    data arrived under an eager send says nothing of the path; collectives are all True here)."""
    out = np.zeros(ops.n_inst)
    seen = ~ops.inst_p2p
    send_row, recv_row = rows if rows is not None else p2p_rows(ops)
    if not ((send_row >= 0) & (recv_row >= 0)).any():
        return out, seen
    flight, waited, together, by_recv = flights(ops, meta, ref, send_row, recv_row)
    # each instance's stream (the send's pair: -1 for collectives and lost sends), and which ran normally
    stream = np.where(ops.inst_p2p & (send_row >= 0), ops.inst_pair[ops.inst[np.maximum(send_row, 0)]], -1)
    in_ref = np.isin(ops.inst_step, ref)
    held = held_sends(ops, send_row, waited, together, stream, in_ref)
    # an eager stream's send ended before its data landed: the receive's own end bounds the transfer
    # (`flights`: NaN where the rank's wait that ended it also returned another operator)
    flight = np.where(held, flight, by_recv)
    needs, usual = path_needs(ops, meta, flight, waited, together, send_row, recv_row, stream, in_ref)
    ex = flight - needs
    slow = np.isfinite(ex) & (ex > np.maximum(SLOW_EXCESS * needs, MIN_EXCESS_S)) & ~(flight <= usual)
    out[slow] = ex[slow]
    return out, seen | (np.isfinite(flight) & (waited | (together & held))) | slow


def held_sends(ops: Ops, send_row: np.ndarray, waited: np.ndarray, together: np.ndarray,
               stream: np.ndarray, in_ref: np.ndarray) -> np.ndarray:
    """Per instance: whether its stream's sends wait for their receiver (rendezvous), as its
    normal steps show: nearly every send whose receiver came later ended with the receive.
    Only then does a transfer that ended together measure its whole time; under an eager send
    it is a lower bound, which clears nothing when it is short. A stream whose receivers never
    came late in normal steps is taken as held (nothing says otherwise)."""
    code, k = dense_codes(stream, by_first=False)
    late = (stream >= 0) & in_ref & ~waited
    n_late = np.bincount(code[late], minlength=k)
    n_held = np.bincount(code[late & together], minlength=k)
    held = (n_late < 2) | (n_held >= HELD_SHARE * np.maximum(n_late, 1))
    return held[code]
