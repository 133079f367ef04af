"""The one check of the trace contract, shared by `laggard validate` and every reader.

What it accepts, no verb crashes on; what it refuses, no verb analyses: Trace.open runs the meta
checks, Trace.table the checks of the rows it read, validate all of them plus logs/. Each
problem is one line: where, what is wrong, what to do. Checks are vectorized over the columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collector.inputs.errors import TraceError
from collector.inputs.limits import ENV, limits
from collector.inputs.names import host_problem, nic_problem
from collector.trace.meta import JobMeta
from collector.trace.schema import FLOW_PROTOS, OPS

#: latest plausible timestamp (year ~2262 is int64's end; anything past 2200 is a broken clock)
MAX_NS = 7_258_118_400 * 10**9


@dataclass(frozen=True)
class Problem:
    where: str
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.where}: {self.what} — {self.fix}"


def meta_problems(meta: JobMeta, where: str) -> list[Problem]:
    out: list[Problem] = []
    if meta.ranks and set(meta.ranks) != set(range(meta.world_size)):
        out.append(Problem(where, f"ranks cover {len(meta.ranks)} of world_size {meta.world_size}",
                           "list ranks 0..world_size-1"))
    for g, members in meta.groups.items():
        bad = [m for m in members if m not in meta.ranks]
        if bad:
            out.append(Problem(where, f"group '{g[:40]}' names unknown rank(s) {bad[:5]}",
                               "groups may only hold ranks listed in 'ranks'"))
    for host in sorted({r.host for r in meta.ranks.values()}):
        if why := host_problem(host):
            out.append(Problem(where, why, "name each rank's host as the scheduler does (one host, no user@ or ranges)"))
    for host, topo in meta.topology.items():
        if not isinstance(topo, dict):
            out.append(Problem(where, f"topology of {str(host)[:40]!r} is not an object", 'give {"switch": ..., "nics": [...]}'))
            continue
        nics = topo.get("nics")
        if nics is not None and not isinstance(nics, list):
            out.append(Problem(where, f"topology nics of {str(host)[:40]!r} is not a list", "list interface names"))
        for n in nics if isinstance(nics, list) else []:
            if why := nic_problem(n):
                out.append(Problem(where, why, "list the kernel interface names, e.g. \"nics\": [\"ens1np0\"]"))
    return out


def _np(t: pa.Table, col: str) -> np.ndarray | None:
    return t.column(col).to_numpy() if col in t.column_names else None


def hang_snapshot(root: Path) -> bool:
    """Whether the trace holds operators entered and never completed (pending.parquet or pending/):
    with them, a CommOps file without a completed row is a hang snapshot, not an empty trace."""
    from collector.commops.layout import read_pending

    try:
        pending = read_pending(root)
    except (OSError, ValueError):  # unreadable pending files: the trace is judged without them
        return False
    return pending is not None and pending.num_rows > 0


def commops_problems(t: pa.Table, meta: JobMeta, where: str, full: bool = False,
                     pending: bool = False) -> list[Problem]:
    """Row checks of CommOps columns present in `t` (a reader may have selected a subset); linear
    passes only. `full` adds the duplicate-row check (a hash aggregation: validate runs it; the
    analysis tolerates duplicates, so readers skip its cost, ~3x the read itself on 5 M rows by
    `python -m bench.dupcheck`). `pending`: the trace is a hang
    snapshot (hang_snapshot), so no completed row is fine."""
    out: list[Problem] = []
    if t.num_rows == 0:
        return [] if pending else [Problem(where, "empty: no operator rows", "record at least one step, or drop the file")]
    # each column is a copy of the table's (its chunks combined): held only while checked
    rank = _np(t, "rank")
    if rank is not None:
        lo, hi = int(rank.min()), int(rank.max())
        if lo < 0 or hi >= meta.world_size:
            bad = np.unique(rank[(rank < 0) | (rank >= meta.world_size)])
            out.append(Problem(where, f"rank(s) {bad[:5].tolist()} not in meta.json ranks",
                               "add them to meta.json or drop their rows"))
        else:
            present = np.zeros(meta.world_size, bool)
            present[rank] = True
            known = np.zeros(meta.world_size, bool)
            known[np.fromiter(meta.ranks.keys(), dtype=np.int64, count=len(meta.ranks))] = True
            unknown = np.flatnonzero(present & ~known)
            if unknown.size:
                out.append(Problem(where, f"rank(s) {unknown[:5].tolist()} not in meta.json ranks",
                                   "add them to meta.json or drop their rows"))
    del rank
    peer = _np(t, "peer")
    if peer is not None and ((peer < -1) | (peer >= meta.world_size)).any():
        bad = peer[(peer < -1) | (peer >= meta.world_size)]
        out.append(Problem(where, f"peer(s) {np.unique(bad)[:5].tolist()} outside -1..world_size-1",
                           "peer is a global rank, or -1 for collectives"))
    del peer
    start, end = _np(t, "start_ns"), _np(t, "end_ns")
    for name, col in (("start_ns", start), ("end_ns", end)):
        if col is not None and ((col < 0) | (col > MAX_NS)).any():
            out.append(Problem(where, f"{name} outside 0..{MAX_NS} (ns since the epoch)", "fix the clock source"))
    if start is not None and end is not None:
        n_bad = int((end < start).sum())
        if n_bad:
            first = int(np.flatnonzero(end < start)[0])
            out.append(Problem(where, f"{n_bad} row(s) with end_ns < start_ns (first at row {first})",
                               "fix the clock source or drop those rows"))
    del start, end
    step = _np(t, "step")
    lim = limits()
    if step is not None and ((step < -1) | (step > lim.max_step)).any():
        bad = step[(step < -1) | (step > lim.max_step)]
        out.append(Problem(where, f"step(s) {np.unique(bad)[:3].tolist()} outside -1..{lim.max_step}",
                           f"steps are iteration numbers (-1 unknown); raise {ENV['max_step']} if genuine"))
    elif step is not None and "rank" in t.column_names and (step >= 0).any():
        known = step >= 0
        span = int(step[known].max()) - int(step[known].min()) + 1
        wide = span > lim.step_cells // max(meta.world_size, 1)
        ranks = int(np.unique(t.column("rank").to_numpy()[known]).size) if wide else 1
        if span * ranks > lim.step_cells:
            out.append(Problem(where, f"steps span {int(step[known].min())}..{int(step[known].max())} over {ranks} ranks, "
                                      f"more than {lim.step_cells} step-rank cells",
                               f"analyse a window with --steps A:B, or raise {ENV['step_cells']} if genuine"))
    del step
    seq = _np(t, "seq")
    if seq is not None and (seq < 0).any():
        out.append(Problem(where, "negative seq", "sequence numbers count up from 0 or 1 within a group"))
    del seq
    if "op" in t.column_names:
        bad_ops = sorted(set(pc.unique(t.column("op")).to_pylist()) - set(OPS))
        if bad_ops:
            out.append(Problem(where, f"unknown op(s) {[str(o)[:30] for o in bad_ops[:5]]}", f"op must be one of {', '.join(OPS)}"))
    nbytes = _np(t, "nbytes")
    if nbytes is not None and (nbytes < 0).any():
        out.append(Problem(where, "negative nbytes", "payload sizes are >= 0"))
    if full and all(k in t.column_names for k in DUP_KEYS):
        dup = duplicate_rows(t)
        if dup:
            out.append(Problem(where, f"{dup} duplicate row(s) (same rank, group, op, seq, peer)",
                               "deduplicate; each rank logs an operator once"))
    return out


#: the columns that name one operator copy: two rows equal in all of them are a duplicate
DUP_KEYS = ("rank", "group", "op", "seq", "peer")


def duplicate_rows(t: pa.Table) -> int:
    """Rows that repeat another row's DUP_KEYS. The keys are packed into one int64 per row
    (each column offset by its minimum, strings by their dictionary code) and sorted in place:
    8 bytes a row and one column's codes at a time, where a hash aggregation over the five
    columns held several times the table. Keys too wide to pack go to that aggregation."""
    n = t.num_rows
    spans = [_key_span(t.column(k)) for k in DUP_KEYS]
    bits = [max(int(hi - lo).bit_length(), 1) for lo, hi in spans]
    if sum(bits) > 63:
        cols = [t.column(k) for k in DUP_KEYS]
        plain = pa.table([c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in cols],
                         names=list(DUP_KEYS))
        return n - plain.group_by(list(DUP_KEYS)).aggregate([([], "count_all")]).num_rows
    key = np.zeros(n, dtype=np.int64)
    for k, (lo, _), b in zip(DUP_KEYS, spans, bits, strict=True):
        key <<= b
        at = 0
        for chunk in _key_chunks(t.column(k)):
            part = key[at:at + len(chunk)]
            part |= chunk.astype(np.int64) - lo
            at += len(chunk)
    key.sort()
    return int(np.count_nonzero(key[1:] == key[:-1]))


def _key_span(col: pa.ChunkedArray) -> tuple[int, int]:
    """(min, max) of a key column's values, or of its codes for strings."""
    if _is_text(col.type):
        return 0, max(len(_unique_values(col)) - 1, 0)
    mm = pc.min_max(col)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return (0, 0) if lo is None else (int(lo), int(hi))


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_dictionary(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def _unique_values(col: pa.ChunkedArray) -> pa.Array:
    """The distinct strings of a string or dictionary column (a dictionary may list a value twice)."""
    u = pc.unique(col)
    return pc.unique(u.cast(u.type.value_type)) if pa.types.is_dictionary(u.type) else u


def _key_chunks(col: pa.ChunkedArray) -> Iterator[np.ndarray]:
    """A key column chunk by chunk as integers: strings as their index among the column's
    distinct values (equal strings, equal codes, whichever chunk's dictionary holds them)."""
    values = _unique_values(col) if _is_text(col.type) else None
    for c in col.chunks:
        if values is None:
            yield c.to_numpy(zero_copy_only=False)
        elif pa.types.is_dictionary(c.type):  # the chunk's dictionary mapped once, then its indices
            remap = pc.index_in(c.dictionary, value_set=values).to_numpy(zero_copy_only=False)
            yield remap[c.indices.to_numpy(zero_copy_only=False)]
        else:
            yield pc.index_in(c, value_set=values).to_numpy(zero_copy_only=False)


def _ip_pattern() -> str:
    """A whole IPv4 (dotted quad, no leading zeros) or IPv6 address (RFC 3986's grammar, an IPv4
    tail included; no zone), as one RE2 regex that pyarrow runs over a column at C speed."""
    octet = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
    v4 = rf"{octet}(?:\.{octet}){{3}}"
    h16 = r"[0-9A-Fa-f]{1,4}"
    ls32 = rf"(?:{h16}:{h16}|{v4})"

    def head(n: int) -> str:  # [ *n( h16 ":" ) h16 ]: up to n+1 groups before the "::"
        return f"(?:{h16}(?::{h16}){{0,{n}}})?" if n >= 0 else ""

    v6 = [rf"(?:{h16}:){{6}}{ls32}", rf"::(?:{h16}:){{5}}{ls32}"]
    v6 += [rf"{head(k - 1)}::(?:{h16}:){{{4 - k}}}{ls32}" for k in range(1, 5)]
    v6 += [rf"{head(4)}::{ls32}", rf"{head(5)}::{h16}", rf"{head(6)}::"]
    return rf"^(?:{v4}|{'|'.join(v6)})$"


IP_ADDRESS = _ip_pattern()


def ip_problem(col: pa.ChunkedArray, name: str) -> str | None:
    """What is wrong with an address column (the first value that is not an IPv4 or IPv6 address),
    or None. Checked on the distinct values, vectorized: a capture has few addresses, and a hostile
    file of distinct strings still costs one pass of C."""
    values = _unique_values(col)
    ok = pc.match_substring_regex(values, IP_ADDRESS)
    bad = pc.filter(values, pc.invert(pc.fill_null(ok, False)))
    if len(bad) == 0:
        return None
    first = bad[0].as_py()
    shown = "an empty value" if first is None else f"{first[:40]!r}"
    return f"{name} {shown} is not an IP address ({len(bad)} distinct such value(s))"


def flows_problems(t: pa.Table, where: str) -> list[Problem]:
    out: list[Problem] = []
    if t.num_rows == 0:
        return [Problem(where, "empty: no flow rows", "capture some traffic, or drop the file")]
    for name in ("src_ip", "dst_ip"):
        if name in t.column_names and (why := ip_problem(t.column(name), name)):
            out.append(Problem(where, why, "give each flow's addresses as IPv4 (10.0.0.1) or IPv6 (fd00::1)"))
    start, end = _np(t, "start_ns"), _np(t, "end_ns")
    for name, col in (("start_ns", start), ("end_ns", end)):
        if col is not None and ((col < 0) | (col > MAX_NS)).any():
            out.append(Problem(where, f"{name} outside 0..{MAX_NS} (ns since the epoch)", "fix the capture timestamps"))
    if start is not None and end is not None and (end < start).any():
        out.append(Problem(where, "row(s) with end_ns < start_ns", "fix the capture timestamps"))
    for port in ("src_port", "dst_port"):
        col = _np(t, port)
        if col is not None and ((col < 0) | (col > 65535)).any():
            out.append(Problem(where, f"{port} outside 0..65535", "ports are 16-bit"))
    for name in ("bytes", "packets"):
        col = _np(t, name)
        if col is not None and (col < 0).any():
            out.append(Problem(where, f"negative {name}", f"{name} are counts >= 0"))
    if "proto" in t.column_names:
        protos = set(pc.unique(t.column("proto")).to_pylist()) - set(FLOW_PROTOS)
        if protos:
            out.append(Problem(where, f"unknown proto(s) {sorted(str(p)[:20] for p in protos)[:5]}",
                               f"proto must be one of {', '.join(FLOW_PROTOS)}"))
    return out


def log_problems(paths: Sequence[Path]) -> list[Problem]:
    """Each log must be a regular, readable, bounded text file (the reader's own checks)."""
    if not paths:
        return []
    from collector.logs import read_log  # drain3 loads only when there are logs to check

    out: list[Problem] = []
    for p in paths:
        try:
            read_log(p)
        except TraceError as exc:
            out.append(Problem(str(p), exc.what.split(": ", 1)[-1], exc.fix))
    return out
