"""Reading only the CommOps columns a method needs, with strings as categoricals.

Tens of millions of rows at 16k GPUs: group and op names as Python strings would dominate
memory and time, so they stay dictionary-encoded and arrive in pandas as categoricals.
Parquet (file or shard directory) is scanned directly so that dictionary columns written by
the simulator or sidecar are never expanded to strings and re-encoded; other formats go
through the collector's reader.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from collector.inputs.errors import TraceError
from collector.trace.contract import commops_problems, hang_snapshot
from collector.trace.schema import COMMOPS_SCHEMA
from collector.trace.traceio import Trace, frame_of_columns, release_arrow_memory

STRING_COLUMNS = ("group", "op")


def read_commops(trace: Trace, columns: Sequence[str], expr: ds.Expression | None = None) -> pd.DataFrame:
    """The named CommOps columns, optionally only the rows matching a filter expression."""
    path = trace.evidence.get("commops")
    release_arrow_memory()  # (what an earlier stage freed, handed back before the read allocates)
    if path is not None and (path.is_dir() or path.suffix == ".parquet"):
        table = _scan_parquet(path, columns, expr)
        problems = commops_problems(table, trace.meta, str(path),  # the readers' one contract check
                                    pending=table.num_rows == 0 and hang_snapshot(trace.path))
        if problems and not (table.num_rows == 0 and expr is not None):
            raise TraceError(f"{problems[0].where}: {problems[0].what}", problems[0].fix)
    else:
        table = trace.table("commops", list(columns), expr)
    cols = {}
    for name in table.column_names:
        col = table.column(name)
        if name in STRING_COLUMNS and not pa.types.is_dictionary(col.type):
            col = col.dictionary_encode()
        cols[name] = col
    del table  # only `cols` holds the buffers: each is freed once converted
    return frame_of_columns(cols)


def codes(col: pd.Series) -> np.ndarray:
    """Integer codes of a string or categorical column (equal strings, equal codes)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy(np.int64)
    return pd.factorize(col)[0].astype(np.int64)


def _scan_parquet(path: object, columns: Sequence[str], expr: ds.Expression | None) -> pa.Table:
    """Scan Parquet keeping dictionary strings; numeric columns cast to the contract's types."""
    try:
        # string columns decoded straight into dictionary arrays, whatever schema the writer stored
        fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=set(STRING_COLUMNS)))
        dataset = ds.dataset(path, format=fmt)
        missing = [c for c in columns if c not in dataset.schema.names]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}",
                             f"expected columns: {', '.join(COMMOPS_SCHEMA.names)}")
        table = dataset.to_table(columns=list(columns), filter=expr)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceError(f"{path}: cannot be read ({first})", "check that the file is complete Parquet") from exc
    out = []
    for name in table.column_names:
        col = table.column(name)
        want = COMMOPS_SCHEMA.field(name).type
        if col.null_count:
            raise TraceError(f"{path}: column '{name}' has {col.null_count} null value(s)", "every cell is required")
        is_text = pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or (
            pa.types.is_dictionary(col.type) and pa.types.is_string(col.type.value_type))
        if name in STRING_COLUMNS and is_text:
            out.append(col)
            continue
        if col.type != want:
            try:
                col = pc.cast(col, want)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise TraceError(f"{path}: column '{name}' has type {col.type}, expected {want}",
                                 "fix the producer or convert the column") from exc
        out.append(col)
    return pa.table(dict(zip(table.column_names, out, strict=True)))
