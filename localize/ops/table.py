"""The operator table: CommOps rows as the analysis holds them, computed once, vectorized.

`prepare_ops` sorts the rows by rank and own clock, matches the copies of each operator into
instances and codes every row's slot; `Ops` holds that table narrow (codes, `RowTimes`), since
every CommOps method reads it and its bytes are the analysis's floor.

Every quantity compares durations, never start times across hosts: clocks of different
hosts are not synchronized, so only a rank's own clock orders its own operators.

- *instance*: one execution of a collective (group, seq) or of a p2p transfer
  (group, src, dst, seq); its copies are the rows of the ranks that took part.
- *wait*: elapsed minus the smallest elapsed of the instance — the time this copy spent
  waiting for the last participant to arrive (the last arriver's copy waits least).
- *gap*: time on the rank's own clock between the end of its previous operator and the
  start of this one — compute, not communication.
- *slot*: (rank, group, op, nbytes, ordinal within step) — the same operator of the same
  rank in every step; its history across steps is the operator's own baseline.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from collector.trace.schema import COLLECTIVE_OPS, OPS
from collector.trace.traceio import release_arrow_memory
from localize.ops.grouping import (
    argsort_stable,
    cumcount,
    dense_codes,
    group_min,
    sort_keys,
    unique,
)

_OPS_ARRAY = pa.array(list(OPS))
#: rows per chunk of scatters and gathers whose indices numpy would widen all at once (a quarter of
#: 2**20 rows: their chunk-sized scratch stands beside the row-sized arrays at the analysis's peaks)
_CHUNK = 1 << 18
#: rows per chunk of whole ranks (`rank_bounds`): a gap pass holds about eight int64 arrays of its chunk
_RANK_CHUNK = 1 << 18
#: a post this soon after an open operator ended waited for it (a real gloo job's posts after the
#: reduce-scatters its step's end waited on came 0.03-0.06 ms after them; the others, 2-43 ms)
GATED_NS = 1_000_000

#: CommOps columns `prepare_ops` holds as codes or per instance only (`Ops.rows_frame` rebuilds them)
CODED = ("group", "op", "peer", "seq")
#: CommOps columns `prepare_ops` holds as `RowTimes` only (`Ops.rows_frame` and `Ops.df` rebuild them)
TIMED = ("start_ns", "end_ns")
#: log2 of the rows per block of a rank's start times held as offsets from the block's first (`RowTimes`)
_TIME_BLOCK_BITS = 6
#: the contract's column order
COLUMN_ORDER = ("rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step")


@dataclass
class RowTimes:
    """Every row's start and end (int64 ns, rows by rank then start), held in 8 bytes a row where
    that is exact instead of the frame's 16: each start as an int32 offset from the first start
    of its block (a rank's rows cut into blocks of 2**_TIME_BLOCK_BITS), each end as an int32
    duration. Either falls back to int64 (the start itself, the duration) when some value does
    not fit: a block of a rank's operators spanning 2 s or more, an operator of 2 s or more."""

    rank: np.ndarray  # per row: its rank (`Ops.rank`: rows sorted by rank)
    rank_lo: int  # the smallest rank
    shift: np.ndarray  # per rank - rank_lo: row + shift is the row's place with each rank's blocks whole
    base: np.ndarray | None  # per block: the start of its first row (None: `start_off` holds the starts)
    start_off: np.ndarray  # per row: start - its block's base (int32), or the start (int64)
    dur: np.ndarray  # per row: end - start (int32 where every value fits, else int64)

    @classmethod
    def of(cls, start: np.ndarray, end: np.ndarray, rank: np.ndarray, first: np.ndarray) -> RowTimes:
        """`start`, `end`: int64 per row (not kept); `rank`: per row (kept); `first`: each rank's
        first row, ascending. Built a chunk at a time (no row-sized int64 scratch beside them)."""
        n = len(start)
        counts = np.diff(np.r_[first, n]).astype(np.int64)
        per_rank = (counts + (1 << _TIME_BLOCK_BITS) - 1) >> _TIME_BLOCK_BITS
        block0 = np.cumsum(per_rank) - per_rank
        lo = int(rank.min()) if n else 0
        shift = np.zeros(int(rank.max()) - lo + 1 if n else 0, dtype=np.int64)
        shift[rank[first] - lo] = (block0 << _TIME_BLOCK_BITS) - first
        # each block's first row: its rank's first row + k blocks of rows
        k = np.arange(int(per_rank.sum())) - np.repeat(block0, per_rank)
        base = start[np.repeat(first, per_rank) + (k << _TIME_BLOCK_BITS)]
        times = cls(rank, lo, shift, base, np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32))
        for c in range(0, n, _CHUNK):
            at = slice(c, c + _CHUNK)
            off = start[at] - base[times.blocks(at)]
            dur = np.subtract(end[at], start[at])
            if not _fits(off):
                times.base, times.start_off = None, start.copy()
            if not _fits(dur):
                times.dur = np.subtract(end, start)
            if times.base is not None:
                times.start_off[at] = off
            if times.dur.dtype == np.int32:
                times.dur[at] = dur
        return times

    def blocks(self, rows: slice | np.ndarray) -> np.ndarray:
        """Per row (a slice or indices): its block, through its rank's shift (a table, no search)."""
        idx = np.arange(*rows.indices(len(self.rank))) if isinstance(rows, slice) else np.array(rows, dtype=np.int64)
        idx += self.shift[self.rank[rows] - self.rank_lo]
        idx >>= _TIME_BLOCK_BITS
        return idx

    def start(self, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """The starts (int64 ns) of some rows (a slice or indices; all rows when None): a fresh array."""
        at = slice(None) if rows is None else rows
        if self.base is None:
            return self.start_off[at].copy() if isinstance(at, slice) else self.start_off[at]
        out = self.base[self.blocks(at)]
        out += self.start_off[at]
        return out

    def end(self, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """The ends (int64 ns) of some rows, as `start`: a fresh array."""
        return self.bounds(rows)[1]

    def bounds(self, rows: slice | np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The starts and ends of some rows, as `start`: fresh arrays."""
        start = self.start(rows)
        return start, start + self.dur[slice(None) if rows is None else rows]


@dataclass
class Ops:
    """CommOps rows sorted by (rank, own start time), with derived per-row arrays."""

    source: pd.DataFrame  # the rows as given, index 0..n-1
    order: np.ndarray | None  # per sorted row: its row in `source` (None: given already sorted)
    inst: np.ndarray  # instance id per row (int32: widen before building keys from it)
    n_inst: int
    inst_size: np.ndarray  # copies per instance (int32 where it fits)
    inst_min: np.ndarray  # smallest elapsed per instance
    late_row: np.ndarray  # per instance: row of the last arriver (smallest elapsed)
    groups: np.ndarray  # group names
    inst_group: np.ndarray  # per instance: group code
    inst_step: np.ndarray  # per instance: step
    inst_p2p: np.ndarray  # per instance: bool
    inst_src: np.ndarray  # per instance: p2p source rank (-1 for collectives)
    inst_dst: np.ndarray  # per instance: p2p destination rank (-1 for collectives)
    slot: np.ndarray  # per row: slot code
    inst_pair: np.ndarray  # per instance: (group, src, dst) code — same for every seq of one operator stream
    inst_seq: np.ndarray  # per instance: its last arriver's seq (every copy of a collective has its seq)
    opcode: np.ndarray  # per row: index into collector.trace.schema.OPS (int8)
    step: np.ndarray  # per row: step (int32, the frame's column where it can be)
    rank: np.ndarray  # per row: rank (int32, the frame's column where it can be)
    rank_start: np.ndarray  # per rank value: first row index (ranks contiguous), via `rank_pos`
    nbytes: np.ndarray  # per row: payload bytes (int32 where every value fits: the frame's own column)
    times: RowTimes  # per row: start and end (the frame's columns, held narrow: `RowTimes`)

    @property
    def wait(self) -> np.ndarray:
        """Per row: elapsed - instance min, computed on each use (a fresh array: it is read in a
        few places, and not holding it keeps 8 bytes a row off the analysis's peak)."""
        out = self.elapsed
        for c in range(0, len(out), _CHUNK):  # (by chunks: no row-sized gather of the minima beside it)
            out[c:c + _CHUNK] -= self.inst_min[self.inst[c:c + _CHUNK]]
        return out

    @property
    def pair(self) -> np.ndarray:
        """Per row: its operator stream's code (`inst_pair` of its instance: a fresh array, not 4
        bytes a row held through the analysis)."""
        return self.inst_pair[self.inst]

    @property
    def elapsed(self) -> np.ndarray:
        """Per row: seconds the operator took, float64, computed on each use from the rows'
        durations (a fresh array: not holding it keeps 8 bytes a row off every peak of the
        analysis that does not read it), as `seconds` computes it."""
        return self.elapsed_at(slice(None))

    def elapsed_at(self, rows: slice | np.ndarray) -> np.ndarray:
        """`elapsed` of some rows (a slice, indices or a mask) alone: no row-sized array for a few."""
        return seconds(self.times.dur[rows])

    @property
    def gap(self) -> np.ndarray:
        """Per row: compute time before it on its own clock (0 for a rank's first row, and after
        steps that were not logged); computed on each use, a fresh array (each analysis reads it
        once: not holding it keeps 8 bytes a row off the detection's and transfers' peaks)."""
        gap = np.empty(len(self.rank))
        for rows, part in self.gap_chunks():
            gap[rows] = part
        return gap

    def gap_chunks(self) -> Iterator[tuple[slice, np.ndarray]]:
        """`gap` a chunk of whole ranks at a time, in row order: (the chunk's rows, their gaps).
        A rank's gaps never span chunks, so per-rank sums added chunk by chunk are the sums over
        all rows, bit for bit, without a row-sized array of gaps (`rank_step_compute`)."""
        for lo, hi in pairwise(rank_bounds(self.rank)):
            at = slice(lo, hi)
            rank, step = self.rank[at], self.step[at]
            gap = _idle_gaps(rank, *self.times.bounds(at))
            later_step = np.subtract(step[1:], step[:-1], dtype=np.int64) > 1
            later_step &= rank[1:] == rank[:-1]
            gap[1:][later_step] = 0.0  # steps between were not logged
            yield at, gap

    @property
    def inst_mean(self) -> np.ndarray:
        """Mean elapsed per instance (computed on use, like `wait`: only the detector's features
        read it, and the analysis's later peaks are spared its bytes; summed a chunk of rows at a
        time, in row order: `group_sum`'s float64 sums without a row-sized `elapsed`)."""
        out = np.zeros(self.n_inst)
        for c in range(0, len(self.inst), _CHUNK):
            np.add.at(out, self.inst[c:c + _CHUNK], self.elapsed_at(slice(c, c + _CHUNK)))
        return out / np.maximum(self.inst_size, 1)

    @property
    def inst_max(self) -> np.ndarray:
        """Largest elapsed per instance (computed on use, as `inst_mean`: `group_max` by chunks)."""
        out = np.full(self.n_inst, -np.inf)
        for c in range(0, len(self.inst), _CHUNK):
            np.maximum.at(out, self.inst[c:c + _CHUNK], self.elapsed_at(slice(c, c + _CHUNK)))
        return out

    @property
    def group_code(self) -> np.ndarray:
        """Per row: code into `groups` (every row of an instance is of its group: a fresh array from
        the per-instance codes, not 4 bytes a row held through the analysis)."""
        return self.inst_group[self.inst]

    @cached_property
    def df(self) -> pd.DataFrame:
        """The original columns in sorted order, index 0..n-1 (built on first use: the analysis
        itself reads only the arrays above), with the times (TIMED) rebuilt from `times`, but
        those held as codes or per instance above (CODED: group, op, peer, seq), which
        `rows_frame` rebuilds for the rows that need them."""
        out = self.source if self.order is None else self.source.take(self.order).reset_index(drop=True)
        return self._with_times(out.copy(deep=False), None)

    def _with_times(self, out: pd.DataFrame, idx: np.ndarray | None) -> pd.DataFrame:
        """`out` (the rows `idx`, or all) with its start_ns and end_ns from `times`."""
        out["start_ns"], out["end_ns"] = self.times.bounds(idx)
        return out[[c for c in self.columns if c in out.columns]]

    def rows_frame(self, rows: np.ndarray) -> pd.DataFrame:
        """Some rows (a mask or indices, in the analysis' order) with every original column:
        group and op rebuilt from their codes as categoricals, a p2p row's peer from its
        instance's ends (collectives read -1, as the contract writes them), the times from `times`.
        A collective's seq is its own; a p2p row's is its transfer's number, the same at both ends
        (producers that number the two ends apart are paired here, not by seq)."""
        idx = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows)
        out = self.source.take(idx if self.order is None else self.order[idx]).reset_index(drop=True)
        code = self.opcode[idx].astype(np.int64)
        out["group"] = pd.Categorical.from_codes(self.inst_group[self.inst[idx]].astype(np.int64),
                                                 categories=pd.Index(self.groups, dtype=object))
        out["op"] = pd.Categorical.from_codes(np.where(code < len(OPS), code, -1), categories=pd.Index(list(OPS), dtype=object))
        inst = self.inst[idx]
        send = code == OPS.index("send")
        peer = np.where(send, self.inst_dst[inst], np.where(self.inst_p2p[inst], self.inst_src[inst], -1))
        out["peer"] = _narrow(peer.astype(np.int64))
        out["seq"] = np.where(self.inst_p2p[inst], inst, self.inst_seq[inst])
        return self._with_times(out, idx)

    @property
    def columns(self) -> list[str]:
        """The frame's columns as given to `prepare_ops`, the coded and timed ones included."""
        return [c for c in COLUMN_ORDER if c in (*self.source.columns, *CODED, *TIMED)] + [
            c for c in self.source.columns if c not in COLUMN_ORDER]


def _codes(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes of a string column without materializing Python strings per row, numbered
    by first appearance (a categorical column too, whatever the order of its categories)."""
    if isinstance(values, pd.Series) and isinstance(values.dtype, pd.CategoricalDtype):
        codes, used = pd.factorize(values.cat.codes.to_numpy())
        names = values.cat.categories.to_numpy(dtype=object)[used]
        return _narrow(codes), np.asarray([str(x) for x in names], dtype=object)
    arr = pa.array(values) if not isinstance(values, pa.ChunkedArray) else values
    enc = pc.dictionary_encode(arr)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks() if enc.num_chunks != 1 else enc.chunk(0)
    return _narrow(np.asarray(enc.indices, dtype=np.int64)), np.asarray(enc.dictionary.to_pylist(), dtype=object)


def op_codes(values: pd.Series) -> np.ndarray:
    """Per row: index of the op into OPS (unknown ops get len(OPS)), int8."""
    if isinstance(values, pd.Series) and isinstance(values.dtype, pd.CategoricalDtype):
        per_name = op_codes(pd.Series(values.cat.categories.to_numpy(dtype=object), dtype=object))
        return per_name[values.cat.codes.to_numpy()]
    arr = pa.array(values) if not isinstance(values, pa.ChunkedArray) else values
    idx = pc.fill_null(pc.index_in(arr, value_set=_OPS_ARRAY), len(OPS))
    if isinstance(idx, pa.ChunkedArray):
        idx = idx.combine_chunks()
    return np.asarray(idx).astype(np.int8)


def _p2p_match_key(pair: np.ndarray, is_p2p: np.ndarray, is_send: np.ndarray, seq: np.ndarray,
                   step: np.ndarray) -> np.ndarray:
    """The key that pairs a send with its recv in each (group, src, dst) stream.

    Producers that number both ends alike are matched by seq. A stream whose send and recv
    numbers disagree (each end counting on its own) is matched by order within each step —
    p2p is FIFO per pair — and a step of such a stream with a lost record (sends and recvs do
    not pair up) is left unmatched rather than paired wrongly.
    """
    idx = np.flatnonzero(is_p2p)
    if idx.size == 0:
        return seq
    s, snd, q = pair[idx].astype(np.int64), is_send[idx], seq[idx]
    qc, nq = dense_codes(q, by_first=False)
    n_s = int(s.max()) + 1
    key = s * nq + qc
    k_send, k_recv = unique(key[snd]), unique(key[~snd])
    shared = np.bincount(np.intersect1d(k_send, k_recv, assume_unique=True) // nq, minlength=n_s)
    n_min = np.minimum(np.bincount(k_send // nq, minlength=n_s), np.bincount(k_recv // nq, minlength=n_s))
    agree = (shared >= 0.5 * n_min) & (n_min > 0)
    if agree[s].all():
        return seq
    # streams matched by order: the ordinal of each end within (stream, step), in seq order
    own = ~agree[s]
    j = idx[own]
    s, snd, qc, st = s[own], snd[own], qc[own], step[j].astype(np.int64)
    sstep, _ = dense_codes(s * (int(st.max()) - int(st.min()) + 1) + (st - st.min()), by_first=False)
    by_seq = argsort_stable(qc)
    o = by_seq[argsort_stable((sstep * 2 + snd)[by_seq])]
    ordinal = np.empty(len(j), dtype=np.int64)
    ordinal[o] = cumcount((sstep * 2 + snd)[o])
    n_send = np.bincount(sstep, weights=snd.astype(np.float64))
    n_all = np.bincount(sstep)
    paired = (2 * n_send == n_all)[sstep]
    out = seq.astype(np.int64)  # (a copy, wide enough for the order keys)
    out[j] = np.where(paired, (st + 1) * 1_000_000 + ordinal, -(j + 1))
    return out


def _pair_codes(gcode: np.ndarray, n_groups: int, p2p_rows: np.ndarray, src: np.ndarray, dst: np.ndarray,
                w: int) -> np.ndarray:
    """Per row: code of its operator stream — the group for a collective, (group, src, dst)
    for p2p. `src`, `dst`: of the p2p rows `p2p_rows` only (int64)."""
    key = gcode.astype(np.int64)
    if p2p_rows.size:
        sub, _ = dense_codes((key[p2p_rows] * w + src + 1) * w + dst + 1, by_first=False)
        key[p2p_rows] = n_groups + sub
    return dense_codes(key, by_first=False)[0]


def _slot_codes(pair: np.ndarray, opcode: np.ndarray, rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Per row: its slot, (rank, stream, op, ordinal of that operator within the step).

    One sort by (rank, stream, op, step, row) yields both the ordinal (position within its
    run) and the operator code (runs of equal (rank, stream, op))."""
    n = len(pair)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    key = pair.astype(np.int64)  # (keys are built in int64 whatever the codes' width)
    key *= 16
    key += opcode
    op_of, n_op = dense_codes(key, by_first=False)
    del key  # (before the next key is built)
    scode, n_step = _step_codes(step)
    key = rank.astype(np.int64)
    key -= int(rank.min())
    key *= n_op
    key += op_of
    del op_of
    key *= n_step
    key += scode
    del scode
    order, k_sorted = sort_keys(key, runs=True)  # rows come by rank
    del key
    new_run = np.empty(n, dtype=bool)
    new_run[0] = True
    np.not_equal(k_sorted[1:], k_sorted[:-1], out=new_run[1:])
    k_sorted //= n_step  # (rank, stream, op)
    new_op = np.empty(n, dtype=bool)
    new_op[0] = True
    np.not_equal(k_sorted[1:], k_sorted[:-1], out=new_op[1:])
    del k_sorted
    index = _index_type(n)  # (positions, ordinals and slots, fewer than rows: held in its width beside the order)
    start = np.where(new_run, np.arange(n, dtype=index), 0)
    del new_run
    np.maximum.accumulate(start, out=start)
    pos = np.subtract(np.arange(n, dtype=index), start, out=start)  # ordinal within the step
    # every ordinal below a run's largest occurs (a step's ordinals count from 0), so the slots
    # of operator b are offset[b] + 0..width[b]-1: dense codes in key order, without a sort
    op_start = np.flatnonzero(new_op)
    width = np.maximum.reduceat(pos, op_start).astype(np.int64) + 1
    offset = (np.cumsum(width) - width).astype(index)
    code = np.repeat(offset, np.diff(np.r_[op_start, n]))
    code += pos
    del pos
    out = np.empty(n, dtype=index)
    out[order] = code
    return out


def _row_order(rank: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The order that sorts rows by (rank, own start time), stably, with rank and start in
    that order; None when already sorted."""
    order = _sort_order(rank, start)
    return None if order is None else (order, rank[order], start[order])


def _sort_order(rank: np.ndarray, start: np.ndarray) -> np.ndarray | None:
    """`_row_order`'s order alone (no gathered copies of the rows' ranks and starts)."""
    if len(rank) < 2 or _ordered(rank, start):
        return None
    order = _rank_order(rank)  # rows usually arrive in time order: sorting by rank suffices
    if not _ordered(rank, start, order):
        rmin = pd.Series(start).groupby(rank).transform("min").to_numpy()
        order = np.argsort((rank.astype(np.int64) << 42) + np.minimum(start - rmin, (1 << 42) - 1), kind="stable")
    return order


def _ordered(rank: np.ndarray, start: np.ndarray, order: np.ndarray | None = None) -> bool:
    """Whether rows (taken in `order`, if given) are sorted by (rank, start), checked a chunk at
    a time (no row-sized differences or gathers)."""
    n = len(rank)
    for lo in range(0, n - 1, _CHUNK):
        hi = min(lo + _CHUNK, n - 1)
        at = slice(lo, hi + 1) if order is None else order[lo:hi + 1]
        r, t = rank[at], start[at]
        if ((r[1:] < r[:-1]) | ((r[1:] == r[:-1]) & (t[1:] < t[:-1]))).any():
            return False
    return True


def _rank_order(rank: np.ndarray) -> np.ndarray:
    """`sort_keys(rank)`'s order (a stable argsort), by a 16-bit radix sort without int64 copies
    of the ranks when they span under 65,536."""
    lo, hi = int(rank.min()), int(rank.max())
    if hi - lo >= 1 << 16:
        return sort_keys(rank)[0]
    return np.argsort(np.subtract(rank, lo, dtype=np.int64 if rank.dtype.itemsize > 4 else np.int32)
                      .astype(np.uint16), kind="stable").astype(np.int64, copy=False)


def sorted_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows in the order `prepare_ops` analyses them (by rank, then own start time), index
    0..n-1, so that its `Ops.df` is the frame itself rather than a sorted copy; string columns
    become categoricals (with sorted categories, however they were read), int64 columns whose
    values fit int32 int32. Consumes `df` (its columns are moved out one at a time, so the sort
    never holds two whole frames)."""
    order = _sort_order(_int_column(df, "rank"), df["start_ns"].to_numpy(np.int64))
    cols = {}
    for c in list(df.columns):
        col = _compact(df.pop(c))
        cols[c] = (col if order is None else col.take(order)).reset_index(drop=True)
    release_arrow_memory()  # the string columns' buffers
    return pd.DataFrame(cols, copy=False)  # (one block per column: no consolidating copy)


def _compact(col: pd.Series) -> pd.Series:
    """A string column as a categorical (categories sorted, as groupby sorts strings): a code of
    a byte or two per row instead of an offset and the characters; an int64 column whose values
    fit int32 (seq, nbytes) in int32, half its bytes (readers widen where they build keys)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return _sorted_categories(col)
    if col.dtype.kind in "ufb":
        return col
    if col.dtype.kind == "i":
        return col if col.dtype != np.int64 else pd.Series(_narrow(col.to_numpy()), index=col.index, name=col.name,
                                                           copy=False)
    return col.astype("category")


def _sorted_categories(col: pd.Series) -> pd.Series:
    """A categorical column with the categories `astype("category")` gives its values: those
    present, sorted (a column read dictionary-encoded lists its dictionary's order, unused
    values too). Unchanged (no copy) when they are already."""
    cats = col.cat.categories
    codes = col.cat.codes.to_numpy()
    seen = np.zeros(len(cats), dtype=bool)
    for c in range(0, len(codes), _CHUNK):  # (by chunks: the codes are a byte or two a row, an index intp)
        part = codes[c:c + _CHUNK]
        seen[part[part >= 0]] = True  # (-1: a missing value, no category)
    keep = cats[seen].sort_values()
    return col if keep.equals(cats) else col.cat.set_categories(keep)


def idle_gaps(rank: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per row (sorted by rank, then start): seconds the rank computed before it, on its own clock.

    Operators may overlap. Rows posted together (a batch: one start) hold the rank until the last
    of them that ends before the rank's next post; a row still open at the next post was posted
    ahead (an irecv, prefetched) and the rank went on working: it holds the rank only until then.
    But a post within GATED_NS of an open row's end waited for it (an overlapped gradient
    reduce-scatter that the step's end waits on): the rank computed before that post only from then.
    The rank computes from the moment nothing holds it to its next post. Ranks are independent:
    they are taken a chunk of whole ranks at a time (the pass holds several row-sized arrays)."""
    gap = np.empty(len(rank))
    for lo, hi in pairwise(rank_bounds(rank)):
        gap[lo:hi] = _idle_gaps(rank[lo:hi], start[lo:hi], end[lo:hi])
    return gap


def rank_bounds(rank: np.ndarray) -> list[int]:
    """Rows (sorted by rank) cut into chunks of about `_RANK_CHUNK` rows, each ending where a
    rank begins: [0, ..., n], one chunk when the rows are few."""
    n = len(rank)
    if n <= _RANK_CHUNK:
        return [0, n]
    firsts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    at = np.searchsorted(firsts, np.arange(_RANK_CHUNK, n, _RANK_CHUNK))  # each chunk ends where a rank begins
    return [0, *unique(firsts[at[at < len(firsts)]]).tolist(), n]


def rank_step_compute(ops: Ops, world: int, steps: np.ndarray) -> np.ndarray:
    """Rank × step (`steps`: the ops' steps, sorted) sum of `Ops.gap`, added in row order as
    `np.bincount` adds them (the same float64 sums), a chunk of whole ranks at a time: neither
    the gaps nor the cells' keys are held for every row."""
    n = len(steps)
    width = max(world, int(ops.rank.max(initial=-1)) + 1)
    out = np.zeros(width * n)
    for rows, gap in ops.gap_chunks():
        cell = ops.rank[rows].astype(np.int64)
        cell *= n
        cell += np.searchsorted(steps, ops.step[rows])
        np.add.at(out, cell, gap)
    return out[: world * n].reshape(world, n)


def _idle_gaps(rank: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """`idle_gaps` of some whole ranks in one pass."""
    n = len(rank)
    gap = np.zeros(n)
    if n < 2:
        return gap
    first = np.r_[True, rank[1:] != rank[:-1]]
    seg = np.cumsum(first) - 1
    base = int(min(start.min(), end.min()))
    t_start = np.subtract(start, base).astype(np.int64, copy=False)
    t_end = np.subtract(end, base).astype(np.int64, copy=False)
    span = int(max(t_start.max(), t_end.max())) + 2
    if (int(seg[-1]) + 1) * span >= 2**62:  # too long to lift every rank apart: one rank at a time
        cut = np.flatnonzero(first)[1:]
        return np.concatenate([_idle_gaps(r, s_, e_) for r, s_, e_ in
                               zip(np.split(rank, cut), np.split(start, cut), np.split(end, cut), strict=True)])
    # (each step below reuses the arrays of the one before: a few row-sized arrays at a time)
    lifted = seg * span
    lifted += t_start  # sorted, since rows are by (rank, start)
    nxt = np.searchsorted(lifted, lifted, side="right")  # the rank's next later post
    gated = np.searchsorted(lifted, seg * span + t_end, side="left")  # its first post once the row ended
    del lifted
    has_next = nxt < n
    np.minimum(nxt, n - 1, out=nxt)
    has_next &= seg[nxt] == seg
    holds = t_start[nxt]  # the next post, or (none) never
    del nxt
    holds[~has_next] = np.iinfo(np.int64).max // 4
    del has_next
    has_gate = gated < n
    np.minimum(gated, n - 1, out=gated)
    has_gate &= seg[gated] == seg
    has_gate &= t_start[gated] - t_end <= GATED_NS
    waited = np.zeros(n, dtype=np.int64)  # per post: the end of the open rows it waited for
    np.maximum.at(waited, gated[has_gate], t_end[has_gate])
    del gated, has_gate
    np.minimum(t_end, holds, out=holds)  # a row holds the rank until it ends or the next post
    del t_end
    lift = seg * span
    del seg
    holds += lift
    np.maximum.accumulate(holds, out=holds)
    holds -= lift  # running, within each rank: when nothing holds the rank any more
    del lift
    prev_busy = np.empty_like(holds)
    prev_busy[0] = 0
    prev_busy[1:] = holds[:-1]
    del holds
    np.maximum(prev_busy, waited, out=prev_busy)
    del waited
    np.subtract(t_start, prev_busy, out=prev_busy)
    np.maximum(prev_busy, 0, out=prev_busy)
    later = ~first
    gap[later] = prev_busy[later] * 1e-9
    return gap


def prepare_ops(df: pd.DataFrame) -> Ops:
    """Sort rows by rank and own clock, match copies into instances, derive wait and gap.

    The rows' times are held as `RowTimes` as soon as the order is known, and leave `df` then:
    a caller that passes a frame no one else holds (`localize.commops.analyse_ops`) has its
    int64 times freed before the instances and slots are coded, the peak of this stage."""
    df = df.reset_index(drop=True)
    start = df["start_ns"].to_numpy(np.int64)
    sort = _row_order(_int_column(df, "rank"), start)
    order = None if sort is None else sort[0]

    def column(name: str) -> np.ndarray:
        """The column in the analysis' order, int32 where the frame's is (a view when sorted
        already), else int64: every key built from it widens first."""
        a = _int_column(df, name)
        return a if order is None else a[order]

    gcode, groups = _codes(df["group"])
    opcode = op_codes(df["op"])
    if sort is not None:
        _, rank, start = sort
        gcode, opcode = gcode[order], opcode[order]
        first_of = np.full(len(groups), len(gcode), dtype=np.int64)  # number groups as met in sorted order
        np.minimum.at(first_of, gcode, np.arange(len(gcode)))
        by_first = np.argsort(first_of, kind="stable")[: int((first_of < len(gcode)).sum())]
        remap = np.full(len(groups), -1, dtype=np.int64)
        remap[by_first] = np.arange(len(by_first), dtype=np.int64)
        gcode, groups = _narrow(remap[gcode]), groups[by_first]
    else:
        rank = column("rank")
    del sort
    rank = _narrow(rank)
    first = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]]) if len(df) else np.zeros(0, np.int64)
    times = RowTimes.of(start, column("end_ns"), rank, first)
    del start
    df = df.drop(columns=list(TIMED))
    is_p2p = opcode >= len(COLLECTIVE_OPS)
    is_send = opcode == OPS.index("send")
    # (row-sized scratch is dropped as soon as it is used, and held narrow: the peak is the sum)
    p2p_rows = np.flatnonzero(is_p2p)
    peer = column("peer")
    snd = is_send[p2p_rows]
    src = np.where(snd, rank[p2p_rows], peer[p2p_rows]).astype(np.int64)  # (of the p2p rows only)
    dst = np.where(snd, peer[p2p_rows], rank[p2p_rows]).astype(np.int64)
    w = int(max(rank.max(initial=0), peer.max(initial=0))) + 2
    del peer, snd
    pair = _narrow(_pair_codes(gcode, len(groups), p2p_rows, src, dst, w))
    del src, dst, p2p_rows
    step = column("step")
    seq = _p2p_match_key(pair, is_p2p, is_send, column("seq"), step)
    del is_send
    qc, nq = dense_codes(seq, by_first=False)
    del seq
    key = pair.astype(np.int64)
    key *= nq
    key += qc
    del qc
    inst, n_inst = dense_codes(key, by_first=False)
    del key
    inst = _narrow(inst)
    # slot: same operator of the same rank in every step (ordinal of (rank, pair, op) within the step)
    slot = _slot_codes(pair, opcode, rank, step)
    # per-row codes are held narrow (ranks and codes fit int32, ops int8; consumers widen where
    # they build keys), rank and step the frame's own int32 columns where it is sorted already
    step, gcode, slot = (_narrow(a) for a in (step, gcode, slot))
    last = np.zeros(n_inst, dtype=np.int64)
    for c in range(0, len(inst), _CHUNK):  # per instance: its last row speaks for it (by chunks, in row
        last[inst[c:c + _CHUNK]] = np.arange(c, min(c + _CHUNK, len(inst)))  # order: no row-sized int64 indices)
    inst_group, inst_step, inst_p2p, inst_pair = gcode[last], step[last], is_p2p[last], pair[last]
    del gcode, is_p2p, pair  # (Ops.group_code is inst_group[inst], Ops.pair inst_pair[inst], on use)
    inst_src, inst_dst = _inst_ends(last[inst_p2p], inst_p2p, rank, opcode, column("peer"))
    del last
    size = np.zeros(n_inst, dtype=np.int64)
    np.add.at(size, inst, 1)  # (copies per instance: `np.bincount`'s counts without its intp copy of the codes)
    size = _narrow(size)
    wait = seconds(times.dur)  # elapsed (held by no one: `Ops.elapsed` computes it again on use)
    imin = group_min(inst, n_inst, wait)
    for c in range(0, len(wait), _CHUNK):  # ... less its instance's minimum, in place (no row-sized gather beside it)
        wait[c:c + _CHUNK] -= imin[inst[c:c + _CHUNK]]
    late_row = np.full(n_inst, -1, dtype=np.int64)
    cand = np.flatnonzero(wait <= 0)
    del wait
    late_row[inst[cand[::-1]]] = cand[::-1]  # first row of each instance wins
    del cand
    inst_seq = _narrow(column("seq")[np.maximum(late_row, 0)])
    # (the coded columns leave the frame: their codes and per-instance values are what the analysis reads)
    df = df.drop(columns=[c for c in CODED if c in df.columns])
    return Ops(df, order, inst, n_inst, size, imin, _narrow(late_row), groups,
               _narrow(inst_group), _narrow(inst_step), inst_p2p, _narrow(inst_src), _narrow(inst_dst), slot, inst_pair,
               inst_seq, opcode, step, rank, first, column("nbytes"), times)


def seconds(dur: np.ndarray) -> np.ndarray:
    """Durations (int ns: `RowTimes.dur`) in seconds, float64, 0 where negative: how long each
    operator took."""
    out = dur.astype(np.float64)
    np.maximum(out, 0, out=out)
    out *= 1e-9
    return out


def _inst_ends(rows: np.ndarray, inst_p2p: np.ndarray, rank: np.ndarray, opcode: np.ndarray,
               peer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per instance: p2p source and destination ranks (-1 for collectives), from `rows`, the
    row speaking for each p2p instance (a send's rank is the source, a recv's peer)."""
    src = np.full(len(inst_p2p), -1, dtype=np.int64)
    dst = src.copy()
    snd = opcode[rows] == OPS.index("send")
    src[inst_p2p] = np.where(snd, rank[rows], peer[rows])
    dst[inst_p2p] = np.where(snd, peer[rows], rank[rows])
    return src, dst


def _int_column(df: pd.DataFrame, name: str) -> np.ndarray:
    """A frame's integer column as it is when int32 (no copy), else in int64."""
    a = df[name].to_numpy()
    return a if a.dtype == np.int32 else df[name].to_numpy(np.int64)


def _fits(a: np.ndarray) -> bool:
    """Whether every value of an integer array fits int32."""
    info = np.iinfo(np.int32)
    return not len(a) or (int(a.min()) >= info.min and int(a.max()) <= info.max)


def _index_type(n: int) -> type[np.signedinteger]:
    """The narrowest integer type that holds 0..n-1 and -1."""
    return np.int32 if n < 2**31 else np.int64


def _narrow(a: np.ndarray, dtype: type[np.signedinteger] = np.int32) -> np.ndarray:
    """`a` in the narrower integer type when every value fits it (else as it is)."""
    info = np.iinfo(dtype)
    if a.dtype.itemsize <= info.bits // 8 or (len(a) and (int(a.min()) < info.min or int(a.max()) > info.max)):
        return a
    return a.astype(dtype)


def in_steps(ops: Ops, steps: np.ndarray | None) -> np.ndarray:
    """Per row: whether its step is one of `steps` (all rows when None or empty), by a table."""
    if steps is None or len(steps) == 0:
        return np.ones(len(ops.step), dtype=bool)
    lo = min(int(ops.step.min(initial=0)), int(np.min(steps)))
    hi = max(int(ops.step.max(initial=0)), int(np.max(steps)))
    lut = np.zeros(hi - lo + 1, dtype=bool)
    lut[np.asarray(steps, dtype=np.int64) - lo] = True
    out = np.empty(len(ops.step), dtype=bool)
    for c in range(0, len(out), _CHUNK):  # (by chunks: no row-sized offsets, nor their intp copy, beside it)
        out[c:c + _CHUNK] = lut[ops.step[c:c + _CHUNK] - lo]
    return out


def _step_codes(step: np.ndarray) -> tuple[np.ndarray, int]:
    """`dense_codes(step, by_first=False)` in int32, by a table over the steps' range (a few
    steps: no int64 copies of the rows), falling back on it for widely spread step numbers."""
    if len(step) == 0 or step.dtype != np.int32:
        return dense_codes(step, by_first=False)
    lo = int(step.min())
    span = int(step.max()) - lo + 1
    if span > 4 * len(step) + 4096:
        return dense_codes(step, by_first=False)
    present = np.zeros(span, dtype=bool)
    present[step - lo] = True
    lut = np.cumsum(present, dtype=np.int32)
    lut -= 1
    return lut[step - lo], int(present.sum())
