"""Read and write trace directories (docs/traces.md).

Parquet is native; `.jsonl` and `.csv` with the same columns are accepted wherever Parquet
is. An evidence kind may also be a directory of Parquet shards (`commops/rank-00012.parquet`),
which is what the sidecar writes; it is read as one table.
"""

from __future__ import annotations

import ctypes
import functools
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from collector.inputs.errors import TraceError
from collector.inputs.safeio import check_log_file, check_regular, read_json
from collector.trace.contract import commops_problems, flows_problems, hang_snapshot, meta_problems
from collector.trace.meta import JobMeta
from collector.trace.schema import EVIDENCE

FORMATS = (".parquet", ".jsonl", ".csv")
#: stem of an evidence kind's shard directory entries that dataset discovery skips
_HIDDEN = (".", "_")


def find_evidence(trace: Path, kind: str) -> Path | None:
    """The file (or shard directory) holding one evidence kind, or None if the trace lacks it."""
    stem = EVIDENCE[kind][0]
    for ext in FORMATS:
        p = trace / f"{stem}{ext}"
        if p.exists() and not p.is_dir():
            return p
    shard_dir = trace / stem
    if shard_dir.is_dir() and any(shard_dir.glob("*.parquet")):
        return shard_dir
    return None


def _conform(table: pa.Table, schema: pa.Schema, source: Path, dictionary: bool = False) -> pa.Table:
    """Select and cast the contract's columns; raise a one-line error naming what is wrong.
    `dictionary`: string columns are kept (or made) dictionary-encoded, a code a row."""
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise TraceError(
            f"{source}: missing column(s) {', '.join(missing)}",
            f"expected columns: {', '.join(schema.names)}",
        )
    cols = []
    for f in schema:
        col = table.column(f.name)
        coded = dictionary and pa.types.is_string(f.type)
        if coded and pa.types.is_dictionary(col.type) and pa.types.is_string(col.type.value_type):
            pass
        elif col.type != f.type:
            try:
                col = pc.cast(col, f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise TraceError(
                    f"{source}: column '{f.name}' has type {col.type}, expected {f.type}",
                    "fix the producer or convert the column",
                ) from exc
        if coded and not pa.types.is_dictionary(col.type):
            col = pc.dictionary_encode(col)
        if col.null_count:
            raise TraceError(f"{source}: column '{f.name}' has {col.null_count} null value(s)", "every cell is required")
        cols.append(col)
    if dictionary:
        schema = pa.schema([f.with_type(c.type) for f, c in zip(schema, cols, strict=True)])
    return pa.Table.from_arrays(cols, schema=schema)


def read_table(
    path: Path,
    schema: pa.Schema,
    columns: Sequence[str] | None = None,
    filter_expr: ds.Expression | None = None,
    dictionary: bool = False,
) -> pa.Table:
    """Read one evidence file or shard directory into an Arrow table with the contract's types.
    `dictionary`: string columns arrive dictionary-encoded (Parquet's own dictionaries, never
    expanded to a string a row), for readers that only compare or count them."""
    for f in sorted(path.glob("*.parquet")) if path.is_dir() else [path]:
        check_regular(f)  # a FIFO or device would block the reader
    try:
        if path.is_dir() or path.suffix == ".parquet":
            text = {f.name for f in schema if pa.types.is_string(f.type)} if dictionary else set()
            fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=text))
            dataset = ds.dataset(path, format=fmt)
            want = list(columns) if columns else None
            # read columns needed by the filter too, then conform the full schema only if asked
            table = dataset.to_table(columns=want, filter=filter_expr)
            if columns:
                sub = pa.schema([schema.field(c) for c in columns])
                return _conform(table, sub, path, dictionary)
            return _conform(table, schema, path, dictionary)
        if path.suffix == ".jsonl":
            table = pajson.read_json(path)
        elif path.suffix == ".csv":
            table = pacsv.read_csv(path)
        else:
            raise TraceError(f"{path}: unknown format", f"use one of {', '.join(FORMATS)}")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowKeyError, OSError,
            ValueError, IndexError) as exc:
        if isinstance(exc, TraceError):
            raise
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise TraceError(f"{path}: cannot be read ({first})", "check that the file is complete and in the format its name says") from exc
    table = _conform(table, schema, path, dictionary)
    if filter_expr is not None:
        table = table.filter(filter_expr)
    if columns:
        table = table.select(list(columns))
    return table


def write_table(table: pa.Table | pd.DataFrame, path: Path, schema: pa.Schema) -> None:
    """Write a table in the format its suffix names, atomically (write, then rename)."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, schema=schema, preserve_index=False)
    table = _conform(table, schema, path)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".parquet":
        pq.write_table(table, tmp, row_group_size=1 << 20, compression="zstd")
    elif path.suffix == ".jsonl":
        with tmp.open("w") as fh:
            for row in table.to_pylist():
                fh.write(json.dumps(row) + "\n")
    elif path.suffix == ".csv":
        pacsv.write_csv(table, tmp)
    else:
        raise TraceError(f"{path}: unknown format", f"use one of {', '.join(FORMATS)}")
    tmp.replace(path)


@dataclass(frozen=True)
class Piece:
    """Some row groups of one Parquet file of a trace, with the rank and step ranges their
    statistics promise (a reader may skip a piece whose ranges miss what it wants)."""

    path: str
    row_groups: tuple[int, ...]
    rows: int
    rank_lo: int
    rank_hi: int
    step_lo: int
    step_hi: int

    def has_rank(self, lo: int, hi: int) -> bool:
        return self.rank_lo <= hi and lo <= self.rank_hi

    def has_step(self, lo: int, hi: int) -> bool:
        return self.step_lo <= hi and lo <= self.step_hi


def open_filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path on it: a local directory, a file:// URL, or any URL
    fsspec knows (memory://, s3://, gs://, ... with that filesystem's package installed)."""
    if "://" not in location:
        return pafs.LocalFileSystem(), str(Path(location).resolve())
    if location.startswith("file://"):
        return pafs.LocalFileSystem(), location[len("file://"):]
    import fsspec
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    try:
        fs, path = fsspec.core.url_to_fs(location)
    except (ImportError, ValueError) as exc:
        raise TraceError(f"{location}: no filesystem for this URL ({exc})",
                         "use a local directory, file://, or install the fsspec filesystem for the scheme") from exc
    return PyFileSystem(FSSpecHandler(fs)), path


def list_pieces(fs: pafs.FileSystem, root: str, kind: str = "commops") -> list[Piece]:
    """The row groups of one evidence kind's Parquet file or shard directory under `root`, in
    the order a dataset read returns them (files sorted by path), with footer statistics."""
    stem = EVIDENCE[kind][0]
    single = f"{root}/{stem}.parquet"
    if fs.get_file_info(single).type == pafs.FileType.File:
        files = [single]
    else:
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/{stem}", allow_not_found=True))
        files = sorted(i.path for i in infos if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                       and not i.base_name.startswith(_HIDDEN))
    out = []
    for path in files:
        try:
            with fs.open_input_file(path) as fh:
                md = pq.ParquetFile(fh).metadata
        except (pa.ArrowInvalid, OSError) as exc:
            raise TraceError(f"{path}: cannot be read ({str(exc).splitlines()[0]})",
                             "check that the file is complete Parquet") from exc
        names = md.schema.to_arrow_schema().names
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            rank = _stat_range(rg, names, "rank")
            step = _stat_range(rg, names, "step")
            out.append(Piece(path, (g,), rg.num_rows, *rank, *step))
    return out


def _stat_range(rg: pq.RowGroupMetaData, names: list[str], col: str) -> tuple[int, int]:
    """A column's (min, max) in a row group, or the widest range when it has no statistics."""
    wide = (-(1 << 62), 1 << 62)
    if col not in names:
        return wide
    st = rg.column(names.index(col)).statistics
    if st is None or not st.has_min_max:
        return wide
    return int(st.min), int(st.max)


def read_pieces(fs: pafs.FileSystem, pieces: Sequence[Piece], schema: pa.Schema,
                columns: Sequence[str] | None = None, filter_expr: ds.Expression | None = None) -> pa.Table:
    """Read pieces into one table with the contract's types, rows in piece order: the same
    table `read_table` gives for their files, restricted to their row groups."""
    fmt = ds.ParquetFileFormat()
    frags = [fmt.make_fragment(p.path, filesystem=fs, row_groups=list(p.row_groups)) for p in pieces]
    want = list(columns) if columns else None
    sub = pa.schema([schema.field(c) for c in columns]) if columns else schema
    if not frags:
        return sub.empty_table()
    try:
        dataset = ds.FileSystemDataset(frags, frags[0].physical_schema, fmt, fs)
        # one thread: a reader of pieces is one task among many (a cluster's worker runs one per core)
        table = dataset.to_table(columns=want, filter=filter_expr, use_threads=False)
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceError(f"{pieces[0].path}: cannot be read ({str(exc).splitlines()[0]})",
                         "check that the file is complete and in the format its name says") from exc
    return _conform(table, sub, Path(pieces[0].path))


def frame(table: pa.Table) -> pd.DataFrame:
    """A table as a DataFrame, each column's Arrow buffers released as it is converted (the
    table is unusable after): the read's peak is the frame, not the frame plus the table."""
    df = table.to_pandas(split_blocks=True, self_destruct=True)
    release_arrow_memory()
    return df


def frame_of_columns(cols: dict[str, pa.ChunkedArray]) -> pd.DataFrame:
    """Columns as a DataFrame, emptying `cols` as it goes: each column is converted, dropped (the
    dict held its only reference) and its Arrow buffers handed back before the next, so the
    peak is the frame plus one column, whatever Arrow's allocator keeps for reuse."""
    out = {}
    for name in list(cols):
        out[name] = cols.pop(name).to_pandas()
        release_arrow_memory()
    return pd.DataFrame(out, copy=False)


def release_arrow_memory() -> None:
    """Hand the Arrow pool's freed buffers back to the system: its allocator keeps them for
    reuse, so a process that read a large table stays that large while pandas and numpy,
    which allocate elsewhere, grow on top of it. The C heap's free pages too (numpy's arrays
    live there): Arrow's allocator cannot reuse them, so a read after an analysis would stand
    on what the analysis freed."""
    pa.default_memory_pool().release_unused()
    _trim_c_heap()


def _trim_c_heap() -> None:
    """glibc's malloc_trim(0): free pages anywhere in the heap go back to the system (a no-op
    where the C library has no such call)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


class ChunkedParquetWriter:
    """Streams record batches into one Parquet file in row groups, keeping memory bounded."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self._tmp = path.with_name(path.name + ".tmp")
        self._writer = pq.ParquetWriter(self._tmp, schema, compression="zstd")
        self.rows = 0

    def write(self, columns: dict[str, object]) -> None:
        batch = pa.RecordBatch.from_pydict(columns, schema=self.schema)
        self._writer.write_batch(batch, row_group_size=1 << 20)
        self.rows += batch.num_rows

    def close(self) -> None:
        self._writer.close()
        self._tmp.replace(self.path)

    def __enter__(self) -> ChunkedParquetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._writer.close()
            self._tmp.unlink(missing_ok=True)


@dataclass
class Trace:
    """A trace directory: meta plus lazily read evidence."""

    path: Path
    meta: JobMeta
    evidence: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | Path) -> Trace:
        p = Path(path)
        if not p.exists():
            raise TraceError(f"{p}: no such trace directory", "pass a directory made by `laggard simulate`, `import` or `capture`")
        if not p.is_dir():
            raise TraceError(f"{p}: a trace is a directory, not a file", "pass the directory that holds meta.json")
        meta = JobMeta.load(p / "meta.json")
        problems = meta_problems(meta, str(p / "meta.json"))
        if problems:
            raise TraceError(f"{problems[0].where}: {problems[0].what}", problems[0].fix)
        for log in log_paths(p):
            check_log_file(log)  # a FIFO would block every verb that reads logs; a bomb fill its memory
        evidence = {k: f for k in EVIDENCE if (f := find_evidence(p, k)) is not None}
        for f in evidence.values():
            for part in sorted(f.glob("*.parquet")) if f.is_dir() else [f]:
                check_regular(part)
        if not evidence and not log_paths(p):
            raise TraceError(
                f"{p}: no evidence file",
                "add commops.parquet, flows.parquet or logs/<host>.log (see docs/traces.md)",
            )
        return cls(p, meta, evidence)

    def has(self, kind: str) -> bool:
        if kind == "logs":
            return bool(log_paths(self.path))
        return kind in self.evidence

    def table(
        self,
        kind: str,
        columns: Sequence[str] | None = None,
        filter_expr: ds.Expression | None = None,
    ) -> pa.Table:
        if kind not in self.evidence:
            raise TraceError(f"{self.path}: trace has no {kind} evidence", f"add {EVIDENCE[kind][0]}.parquet")
        table = read_table(self.evidence[kind], EVIDENCE[kind][1], columns, filter_expr)
        where = str(self.evidence[kind])
        if kind == "commops":
            problems = commops_problems(table, self.meta, where, pending=table.num_rows == 0 and hang_snapshot(self.path))
        else:
            problems = flows_problems(table, where)
        if problems and not (table.num_rows == 0 and filter_expr is not None):
            raise TraceError(f"{problems[0].where}: {problems[0].what}", problems[0].fix)
        return table

    def parquet_rows(self, kind: str) -> int | None:
        """Rows of an evidence kind held as Parquet, from its footers (nothing read); None when the
        trace lacks it or holds it as JSON lines or CSV (counted only by reading them). (`open`
        has checked its files are regular: a FIFO never reaches the dataset.)"""
        path = self.evidence.get(kind)
        if path is None or not (path.is_dir() or path.suffix == ".parquet"):
            return None
        try:
            return int(ds.dataset(path, format="parquet").count_rows())
        except (pa.ArrowInvalid, OSError) as exc:
            raise TraceError(f"{path}: not readable Parquet ({exc})", "regenerate or convert the file") from exc

    def commops(self, columns: Sequence[str] | None = None, ranks: Iterable[int] | None = None,
                steps: tuple[int, int] | None = None) -> pd.DataFrame:
        """CommOps as a DataFrame, optionally only some ranks or an inclusive step range."""
        expr = None
        if ranks is not None:
            expr = ds.field("rank").isin(list(ranks))
        if steps is not None:
            s = (ds.field("step") >= steps[0]) & (ds.field("step") <= steps[1])
            expr = s if expr is None else expr & s
        return frame(self.table("commops", columns, expr))

    def flows(self) -> pd.DataFrame:
        return self.table("flows").to_pandas()

    def log_files(self) -> list[Path]:
        return log_paths(self.path)

    def truth(self) -> dict | None:
        """Ground truth, for tests and evaluation only (docs/traces.md: nothing else reads it)."""
        p = self.path / "truth.json"
        return read_json(p) if p.exists() else None


def log_paths(trace: Path) -> list[Path]:
    """Text logs under trace/logs: per-host `<host>.log[.gz]`, and aggregated outputs such as Slurm's
    `slurm-<jobid>.out` (whose lines name their node), sorted; what they are (FIFOs too) is checked
    when read."""
    logs = trace / "logs"
    if not logs.is_dir():
        return []
    found = {*logs.glob("*.log*"), *logs.glob("*.out"), *logs.glob("*.out.gz")}
    return sorted(p for p in found if not p.is_dir())
