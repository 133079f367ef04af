"""The summary-first localizer as map tasks and a reduce, for any executor.

A trace too big for one process is localized the way the sidecars do it (localize/summary):
per host, the abnormal-operator summary of that host's rows (map: `summarize_hosts`, which
calls `summary.summarize` for each host whose rows it read); centrally, the step table, the fetch plan and the analysis of the
few rows it asks for (reduce: `summary.localize_summary`), those rows read where they lie by
more map tasks (`fetch_rows`). The tasks run on whatever `Executor` is given: `Serial` (this
process) or a cluster engine's adapter (laggard/cluster.py). Either way the same functions see
the same rows in the same order, so the verdict is the same, byte for byte, as
`summary.write_summaries` then `summary.localize_from_summary` in one process.

Shards are read where they lie (a local directory, file://, or any fsspec URL) by their Parquet
row groups, one host's ranks at a time where the shards are split by rank (the sidecars' layout);
hosts whose rows share row groups (one file in rank or time order) are read together, up to
SUMMARY_ROWS rows a task, rather than the same row groups once per host. No task holds more (the
map) or more than the planned ranks' rows of the planned steps (the fetch), and the client only summaries.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from collector.inputs.errors import TraceError
from collector.trace.meta import JobMeta
from collector.trace.schema import COMMOPS_SCHEMA
from collector.trace.traceio import Piece, frame, list_pieces, open_filesystem, read_pieces
from localize.commops import COLUMNS
from localize.summary import (
    SUMMARY_SCHEMA,
    Fetch,
    FetchPlan,
    groups_within,
    host_rows,
    localize_summary,
    summarize,
)
from localize.verdict import Verdict

#: rows (before filtering) one fetch task reads at most, unless a single row group is larger
FETCH_ROWS = 1 << 22
#: rows (after filtering, estimated) of the hosts one summary task reads together from shared row groups
SUMMARY_ROWS = 1 << 20


class Executor(Protocol):
    """Runs `fn(*args)` for every args tuple; results in the order given."""

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]]) -> list[Any]: ...


class Serial:
    """Every task in this process, one after another (the reference the cluster must match)."""

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]]) -> list[Any]:
        return [fn(*args) for args in items]


@dataclass
class Source:
    """Where a trace lies, its metadata and the row groups of its CommOps shards."""

    location: str
    meta: JobMeta
    pieces: list[Piece]
    local: Path | None = None  # a local directory (hang evidence is read there)

    @classmethod
    def open(cls, location: str | Path) -> Source:
        loc = str(location)
        fs, root = open_filesystem(loc)
        try:
            with fs.open_input_stream(f"{root}/meta.json") as fh:
                raw = json.loads(fh.read())
        except (FileNotFoundError, OSError) as exc:
            raise TraceError(f"{loc}: no meta.json there", "pass the trace directory (or URL) that holds meta.json") from exc
        except json.JSONDecodeError as exc:
            raise TraceError(f"{loc}/meta.json: not valid JSON (line {exc.lineno})", "fix or regenerate meta.json") from exc
        meta = JobMeta.from_dict(raw, f"{loc}/meta.json")
        pieces = list_pieces(fs, root, "commops")
        if not pieces:
            raise TraceError(f"{loc}: no CommOps Parquet (commops.parquet or commops/*.parquet)",
                             "the cluster path reads Parquet shards; convert .jsonl/.csv first")
        local = Path(root) if "://" not in loc or loc.startswith("file://") else None
        return cls(loc, meta, pieces, local)


@dataclass
class Stats:
    """What the distributed run did: tasks, rows read, result bytes, per stage."""

    map_tasks: int = 0
    hosts: int = 0
    fetch_tasks: int = 0
    summary_rows: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def host_tasks(src: Source) -> list[tuple[str, str, list[int], list[Piece], dict[str, list[int]]]]:
    """(location, host, ranks, pieces, the groups within the host) per host, in the order the
    summary files sort."""
    by_host = src.meta.ranks_by_host()
    lo = np.array([p.rank_lo for p in src.pieces])
    hi = np.array([p.rank_hi for p in src.pieces])
    out = []
    for host in sorted(by_host, key=lambda h: Path(f"{h}.parquet")):
        ranks = sorted(by_host[host])
        arr = np.asarray(ranks)
        # a piece matters when some rank of the host lies within its statistics' range
        at = np.searchsorted(arr, lo)
        hit = (at < len(arr)) & (arr[np.minimum(at, len(arr) - 1)] <= hi)
        out.append((src.location, host, ranks, [p for p, h in zip(src.pieces, hit, strict=True) if h],
                    groups_within(src.meta.groups, ranks)))
    return out


#: one host of a summary task: its name, ranks and the groups read whole on it
HostPart = tuple[str, list[int], dict[str, list[int]]]


def summary_tasks(src: Source) -> list[tuple[str, list[Piece], list[HostPart]]]:
    """(location, pieces, hosts) per summary task: the hosts that read the same pieces, in the
    order the summary files sort, together while their rows (the pieces' rows, by their share of
    the ranks the pieces hold) stay within SUMMARY_ROWS; one host a task where shards are per rank."""
    by_pieces: dict[tuple[Piece, ...], list[HostPart]] = {}
    for _, host, ranks, pieces, groups in host_tasks(src):
        by_pieces.setdefault(tuple(pieces), []).append((host, ranks, groups))
    out: list[tuple[str, list[Piece], list[HostPart]]] = []
    for shared, hosts in by_pieces.items():
        per_rank = sum(p.rows for p in shared) / max(sum(len(r) for _, r, _ in hosts), 1)
        chunk: list[HostPart] = []
        for part in hosts:
            if chunk and (sum(len(r) for _, r, _ in chunk) + len(part[1])) * per_rank > SUMMARY_ROWS:
                out.append((src.location, list(shared), chunk))
                chunk = []
            chunk.append(part)
        out.append((src.location, list(shared), chunk))
    return out


def summarize_hosts(location: str, pieces: list[Piece], hosts: list[HostPart]) -> list[pd.DataFrame]:
    """Map: the abnormal-operator summary of each host's rows (what its sidecar would write),
    from one read of the pieces they share; each host's rows in their order in the pieces."""
    fs, _ = open_filesystem(location)
    ranks = sorted(r for _, rs, _ in hosts for r in rs)
    df = frame(read_pieces(fs, pieces, COMMOPS_SCHEMA, COLUMNS, ds.field("rank").isin(ranks)))
    if not len(df):
        return []
    return [summarize(rows, dict.fromkeys(rs, host).__getitem__, groups)
            for rows, (host, rs, groups) in zip(rows_by_host(df, [rs for _, rs, _ in hosts]), hosts, strict=True)
            if len(rows)]


def rows_by_host(df: pd.DataFrame, ranks: list[list[int]]) -> list[pd.DataFrame]:
    """`df`'s rows split by host (`ranks`: each host's ranks), each host's in their order: one
    stable sort and one take, not a filter of the whole frame per host."""
    code = np.full(max(r for rs in ranks for r in rs) + 1, -1, dtype=np.int64)
    for i, rs in enumerate(ranks):
        code[rs] = i
    of_row = code[df["rank"].to_numpy(np.int64)]
    order = np.argsort(of_row, kind="stable")
    df = df.iloc[order].reset_index(drop=True)
    bounds = np.searchsorted(of_row[order], np.arange(len(ranks) + 1))
    return [df.iloc[bounds[i]:bounds[i + 1]].reset_index(drop=True) for i in range(len(ranks))]


def combine_summaries(parts: Sequence[pd.DataFrame | None]) -> pd.DataFrame:
    """Reduce: the hosts' summaries as one table, typed as `summary.read_summary` returns them."""
    got = [p for p in parts if p is not None]
    if not got:
        return SUMMARY_SCHEMA.empty_table().to_pandas()
    df = pd.concat(got, ignore_index=True)[list(SUMMARY_SCHEMA.names)]
    return pa.Table.from_pandas(df, schema=SUMMARY_SCHEMA, preserve_index=False).to_pandas()


def fetch_tasks(src: Source, ranks: list[int], steps: tuple[int, int]) -> list[tuple[Any, ...]]:
    """(location, pieces, ranks, steps) per run of consecutive pieces that may hold the rows."""
    arr = np.asarray(sorted(ranks))
    want = []
    for p in src.pieces:
        at = int(np.searchsorted(arr, p.rank_lo))
        if at < len(arr) and arr[at] <= p.rank_hi and p.has_step(*steps):
            want.append(p)
    chunks: list[list[Piece]] = []
    size = 0
    for p in want:
        if not chunks or size + p.rows > FETCH_ROWS:
            chunks.append([])
            size = 0
        chunks[-1].append(p)
        size += p.rows
    return [(src.location, c, list(ranks), steps) for c in chunks]


def fetch_rows(location: str, pieces: list[Piece], ranks: list[int], steps: tuple[int, int]) -> pd.DataFrame:
    """Map: the full rows of `ranks` within `steps` (inclusive) held by `pieces`, in their order."""
    fs, _ = open_filesystem(location)
    expr = ds.field("rank").isin(list(ranks)) & (ds.field("step") >= steps[0]) & (ds.field("step") <= steps[1])
    return frame(read_pieces(fs, pieces, COMMOPS_SCHEMA, COLUMNS, expr))


#: one host of a fetch task where the logger wrote no step numbers: its place among the hosts,
#: all its ranks (to number its steps) and the ranks wanted of it
FetchHost = tuple[int, list[int], list[int]]


def fetch_host_rows(location: str, pieces: list[Piece], hosts: list[FetchHost],
                    steps: tuple[int, int]) -> list[tuple[int, pd.DataFrame]]:
    """Map, for rows logged without step numbers: from one read of the pieces they share, each
    host's rows numbered as its summary numbered them (`summary.host_rows`), cut to its wanted
    ranks within `steps`; with each host's place, so the reduce keeps the hosts' order. (A read
    per host cost a pass over a whole shared file each: 256 passes, 114 s, on 128 hosts.)"""
    fs, _ = open_filesystem(location)
    every = sorted(r for _, rs, _ in hosts for r in rs)
    df = frame(read_pieces(fs, pieces, COMMOPS_SCHEMA, COLUMNS, ds.field("rank").isin(every)))
    return [(place, host_rows(rows, want, steps))
            for rows, (place, _, want) in zip(rows_by_host(df, [rs for _, rs, _ in hosts]), hosts, strict=True)]


def localize_distributed(src: Source, run: Executor, top: int = 5, stats: Stats | None = None,
                         check_hang: bool = True) -> tuple[Verdict, FetchPlan | None]:
    """A hang first (local traces: the pending operators; `check_hang` False: the caller has
    looked); else the summary-first localizer with the map tasks on `run`. Returns the verdict
    and the fetch plan (None for a hang)."""
    st = stats if stats is not None else Stats()
    if check_hang and src.local is not None:
        from collector.trace.traceio import Trace
        from localize.waits.hang import find_hang

        hang = find_hang(Trace.open(src.local))
        if hang is not None:
            return hang, None
    tasks = summary_tasks(src)
    st.map_tasks = len(tasks)
    st.hosts = sum(len(hosts) for _, _, hosts in tasks)
    summary = combine_summaries([part for parts in run.map(summarize_hosts, tasks) for part in parts])
    st.summary_rows = len(summary)

    if summary.empty:
        raise TraceError(f"{src.location}: no CommOps rows of the ranks in meta.json", "check the trace's shards")
    return localize_summary(summary, src.meta, fetcher(src, run, st), top)


def fetcher(src: Source, run: Executor, stats: Stats | None = None) -> Fetch:
    """`summary.Fetch` with its reads as map tasks on `run`: rows in trace order, as
    `Trace.commops(columns=COLUMNS, ranks=..., steps=...)` returns them; where the logger wrote
    no step numbers, one task per host reads its rows and numbers them as its summary did."""

    numbered = any(p.step_hi >= 0 for p in src.pieces)
    place = {} if numbered else {host: i for i, (_, host, _, _, _) in enumerate(host_tasks(src))}
    shared = summary_tasks(src) if not numbered else []  # hosts that read the same pieces, read together

    def fetch(ranks: list[int], steps: tuple[int, int]) -> pd.DataFrame:
        want = set(ranks)
        if numbered:
            ft: list[tuple[Any, ...]] = fetch_tasks(src, ranks, steps)
        else:
            ft = [(loc, pieces, wanted, steps) for loc, pieces, parts in shared
                  if (wanted := [(place[h], rs, sorted(want.intersection(rs))) for h, rs, _ in parts if want.intersection(rs)])]
        if stats is not None:
            stats.fetch_tasks += len(ft)
        if numbered:
            parts = run.map(fetch_rows, ft)
        else:
            parts = [df for _, df in sorted((x for got in run.map(fetch_host_rows, ft) for x in got), key=lambda x: x[0])]
        if not parts:
            return COMMOPS_SCHEMA.empty_table().select(COLUMNS).to_pandas()
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]

    return fetch
