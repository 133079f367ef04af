"""Node-local detection and progressive fetching (Holmes' data-movement design), as wiring.

On each node, `summarize_node` reads only that node's CommOps shards (what collector.commops
wrote), window by window of steps, and runs the abnormal-operator detector of localize/summary
on them; the compact summary (`summary/<host>-w<first>-<last>.parquet`) is all that travels.
Centrally, `central_localize` checks for a hang, then localizes from the summaries, which plan
which ranks and steps to fetch in full; the nodes keep their logs and ship only those rows.
The bytes that moves (summaries plus the requested rows, compressed) are counted against
shipping every shard.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from collector.commops.layout import atomic_write_bytes, rank_shards
from collector.inputs.errors import TraceError
from collector.inputs.safeio import check_regular, read_json
from collector.trace.meta import JobMeta
from collector.trace.traceio import Trace
from localize.commops import COLUMNS
from localize.ops.steps import with_steps
from localize.summary import (
    Fetch,
    groups_within,
    localize_from_summary,
    localize_summary,
    read_summary,
    summarize,
    to_wire,
)
from localize.verdict import Verdict
from localize.waits.hang import find_hang

SUMMARY_DIR = "summary"


def commops_files(root: Path, ranks: list[int] | None = None) -> list[Path]:
    """Where the ranks' operators are: the logger's shards, else the job's one commops.parquet (an
    imported or simulated trace), which holds every rank's."""
    files = rank_shards(root, ranks)
    if not files and (root / "commops.parquet").exists():
        check_regular(root / "commops.parquet")
        files = [root / "commops.parquet"]
    return files


def summarize_node(root: Path, host: str, window: int = 20, final: bool = True) -> list[Path]:
    """Summarize this host's ranks for every complete window of steps not yet summarized.

    A window is complete once a later step has been logged (or `final`, when the job is over).
    Returns the summary files written.
    """
    meta = JobMeta.load(root / "meta.json")
    ranks = sorted(r for r, i in meta.ranks.items() if i.host == host)
    if not ranks:
        raise TraceError(f"{root}: no ranks on host {host}", f"hosts in meta.json: {', '.join(meta.hosts())}")
    mine = groups_within(meta.groups, ranks)
    outdir = root / SUMMARY_DIR
    state_path = outdir / f".{host}.state.json"  # dot: not read as part of the summary dataset
    state = read_json(state_path) if state_path.exists() else {"next_step": 0}
    files = commops_files(root, ranks)
    if not files:
        return []
    # a logger without step markers (step = -1) leaves every row to read, numbered on this node's
    # rows as `summarize` numbers them (`with_steps`): the windows then cut the numbered steps
    # (the ranks: one commops.parquet holds every host's)
    rows = ((ds.field("step") >= state["next_step"]) | (ds.field("step") < 0)) & ds.field("rank").isin(ranks)
    df = with_steps(ds.dataset(files, format="parquet").to_table(columns=list(COLUMNS), filter=rows).to_pandas())
    df = df[df["step"] >= state["next_step"]]
    if df.empty:
        return []
    last = int(df["step"].max())
    written = []
    for w0 in range(int(state["next_step"]), last + 1, window):
        w1 = min(w0 + window - 1, last)
        if not final and w0 + window - 1 >= last:
            break  # the window is not over yet (its last step may still be running)
        win = df[(df["step"] >= w0) & (df["step"] <= w1)]
        if win.empty:
            continue
        t0 = time.perf_counter()
        summary = summarize(win.reset_index(drop=True), meta.host_of, mine)
        path = outdir / f"{host}-w{w0:07d}-{w1:07d}.parquet"
        write_summary(summary, path)
        written.append(path)
        state.update(next_step=w1 + 1, detect_s=round(time.perf_counter() - t0, 4))
    atomic_write_bytes(state_path, json.dumps(state).encode())
    return written


#: what travels is what costs: times as integer microseconds (`summary.to_wire`), sorted
#: integers delta-encoded, no statistics and no schema copy in the footer.
_ENCODING = {"rank": "DELTA_BINARY_PACKED", "step": "DELTA_BINARY_PACKED", "abnormal": "DELTA_BINARY_PACKED",
             "abnormal_us": "DELTA_BINARY_PACKED", "compute_us": "DELTA_BINARY_PACKED",
             "step_end_us": "DELTA_BINARY_PACKED", "step_start_us": "DELTA_BINARY_PACKED"}


def write_summary(summary: pd.DataFrame, path: Path) -> None:
    """One window's summary, compactly encoded, written atomically (dot-prefixed temp file)."""
    # step rows first and then each group's: consecutive rows differ by a step, which delta-encodes small
    # the file is one host's and named by it (<host>-w<first>-<last>): the host column stays home
    table = pa.Table.from_pandas(to_wire(summary.sort_values(["group", "rank", "step"]).drop(columns="host")),
                                 preserve_index=False).replace_schema_metadata(None)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd", compression_level=19, write_statistics=False,
                   use_dictionary=["group"], column_encoding=_ENCODING, store_schema=False)
    tmp.replace(path)


def wait_for_meta(root: Path, wait_s: float, poll_s: float) -> None:
    """Wait for the logger's meta.json (a job that has not flushed yet); a UserError after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while not (root / "meta.json").exists():
        if time.monotonic() > deadline:
            raise TraceError(f"{root}: no meta.json appeared within {wait_s:.0f} s",
                             "check that the job's LAGGARD_COMMOPS_DIR is this directory")
        time.sleep(poll_s)


def follow_node(root: Path, host: str, window: int, poll_s: float, stop_after_idle_s: float) -> int:
    """The sidecar loop: summarize new windows while the job runs; stop once no shard changed for a while."""
    written, idle, seen = 0, 0.0, -1
    while idle < stop_after_idle_s:
        n = sum(p.stat().st_mtime_ns for p in (root / "commops").glob("*.parquet"))
        written += len(summarize_node(root, host, window, final=False))
        idle = idle + poll_s if n == seen else 0.0
        seen = n
        time.sleep(poll_s)
    return written + len(summarize_node(root, host, window, final=True))


@dataclass
class Movement:
    """Bytes the central localizer moved, against shipping every shard."""

    summary_bytes: int = 0
    fetched_bytes: int = 0
    fetched_rows: int = 0
    full_bytes: int = 0

    @property
    def moved(self) -> int:
        return self.summary_bytes + self.fetched_bytes

    def to_dict(self) -> dict[str, Any]:
        saved = 1 - self.moved / self.full_bytes if self.full_bytes else 0.0
        return {"summary_bytes": self.summary_bytes, "fetched_bytes": self.fetched_bytes,
                "moved_bytes": self.moved, "full_bytes": self.full_bytes,
                "reduction": round(saved, 5), "fetched_rows": self.fetched_rows}


def shipped_bytes(table: pa.Table) -> int:
    """Size of rows as a node would ship them: one zstd Parquet payload."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return int(sink.getvalue().size)


def central_localize(root: Path, top: int = 5, fetch: Fetch | None = None) -> tuple[Verdict, Movement]:
    """A hang first (pending operators); else the summaries, then only the shards they ask for
    (read here, or through `fetch`: a cluster's tasks reading them where they lie)."""
    trace = Trace.open(root)
    mv = Movement(full_bytes=sum(p.stat().st_size for p in commops_files(root)))
    hang = find_hang(trace)
    if hang is not None:
        return hang, mv
    summaries = sorted((root / SUMMARY_DIR).glob("*.parquet"))
    if not summaries:
        raise TraceError(f"{root}: no node summaries", "run `laggard sidecar run TRACE` on every node first")
    mv.summary_bytes = sum(p.stat().st_size for p in summaries)
    if fetch is None:
        verdict, plan = localize_from_summary(trace, top)
    else:
        verdict, plan = localize_summary(read_summary(trace), trace.meta, fetch, top)
    if plan.ranks and plan.fetch_steps:
        # what the nodes ship on request: the planned ranks' rows of the planned steps, compressed
        lo, hi = min(plan.fetch_steps), max(plan.fetch_steps)
        rows = trace.table("commops", filter_expr=ds.field("rank").isin(plan.ranks) & (ds.field("step") >= lo)
                           & (ds.field("step") <= hi))
        rows = rows.filter(pc.is_in(rows["step"], pa.array(plan.fetch_steps, pa.int32())))
        mv.fetched_bytes = shipped_bytes(rows)
        mv.fetched_rows = rows.num_rows
    verdict.extra["data_movement"] = mv.to_dict()
    return verdict, mv
