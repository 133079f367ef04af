"""The duplicate-row check counts what a hash aggregation over the five key columns counts,
whatever the columns' encoding (strings, dictionaries differing by chunk) and widths."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from collector.trace.contract import DUP_KEYS, duplicate_rows


def _reference(t: pa.Table) -> int:
    plain = pa.table({k: t.column(k).cast(pa.string()) if pa.types.is_dictionary(t.column(k).type) else t.column(k)
                      for k in DUP_KEYS})
    return t.num_rows - plain.group_by(list(DUP_KEYS)).aggregate([([], "count_all")]).num_rows


def _table(rng: np.random.Generator, n: int, seq_hi: int, dictionary: bool) -> pa.Table:
    cols = {"rank": pa.array(rng.integers(0, 6, n), pa.int32()),
            "group": pa.array(rng.choice(["tp-0", "dp-1", "pp-2"], n)),
            "op": pa.array(rng.choice(["all_reduce", "send", "recv"], n)),
            "seq": pa.array(rng.integers(-2, seq_hi, n), pa.int64()),
            "peer": pa.array(rng.integers(-1, 6, n), pa.int32())}
    t = pa.table(cols)
    if dictionary:  # chunks whose dictionaries list different values in different orders
        parts = [t.slice(0, n // 3), t.slice(n // 3)]
        t = pa.concat_tables([pa.table({k: (p.column(k).dictionary_encode() if k in ("group", "op") else p.column(k))
                                        for k in DUP_KEYS}) for p in parts])
    return t


@pytest.mark.parametrize("dictionary", [False, True])
@pytest.mark.parametrize("seq_hi", [5, 1 << 62])  # the second cannot be packed: the aggregation counts
def test_duplicate_rows_match_a_hash_aggregation(dictionary: bool, seq_hi: int) -> None:
    rng = np.random.default_rng(3)
    t = _table(rng, 3000, seq_hi, dictionary)
    expect = _reference(t)
    assert duplicate_rows(t) == expect
    assert (expect > 0) == (seq_hi == 5)


def test_no_duplicates_in_distinct_rows() -> None:
    n = 1000
    t = pa.table({"rank": pa.array(np.zeros(n), pa.int32()), "group": pa.array(["g"] * n),
                  "op": pa.array(["all_reduce"] * n), "seq": pa.array(np.arange(n), pa.int64()),
                  "peer": pa.array(np.full(n, -1), pa.int32())})
    assert duplicate_rows(t) == 0
    assert duplicate_rows(pa.concat_tables([t, t.slice(7, 2)])) == 2
