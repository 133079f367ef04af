"""Reading only the CommOps columns a method needs, with strings as categoricals.

Tens of millions of rows at 16k GPUs: group and op names as Python strings would dominate
memory, so they are dictionary-encoded in Arrow and arrive in pandas as categoricals.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from collector.traceio import Trace

STRING_COLUMNS = ("group", "op")


def read_commops(trace: Trace, columns: Sequence[str], expr: ds.Expression | None = None) -> pd.DataFrame:
    """The named CommOps columns, optionally only the rows matching a filter expression."""
    table = trace.table("commops", list(columns), expr)
    cols = {}
    for name in table.column_names:
        col = table.column(name)
        if name in STRING_COLUMNS and not pa.types.is_dictionary(col.type):
            col = col.dictionary_encode()
        cols[name] = col
    return pa.table(cols).to_pandas()


def codes(col: pd.Series) -> np.ndarray:
    """Integer codes of a string or categorical column (equal strings, equal codes)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy(np.int64)
    return pd.factorize(col)[0].astype(np.int64)
