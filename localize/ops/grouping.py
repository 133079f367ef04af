"""Group-by on integer keys without hashing: the primitives the detector's hot path is built from.

pandas' factorize and groupby hash every key and go through general machinery; on the
millions of operator rows a node logs per minute that is most of the detection time. Keys
here are non-negative int64, so a key packed with its row index sorts in one `np.sort`
(a vectorized sort, no indirection, and stable by construction), small key ranges map
through a lookup table, and per-group reductions are `ufunc.at` scatters.
"""

from __future__ import annotations

import numpy as np


def argsort_stable(key: np.ndarray, runs: bool = False) -> np.ndarray:
    """Stable argsort of integer keys (see `sort_keys`)."""
    return sort_keys(key, runs)[0]


def sort_keys(key: np.ndarray, runs: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Stable argsort of integer keys, and the keys in that order: a radix sort for keys
    spanning 16 bits, else one sort of key<<b | row as int64 — by merging when `runs` (the
    keys come in long ascending runs, which timsort exploits), by quicksort otherwise."""
    n = len(key)
    if n == 0:
        return np.zeros(0, dtype=np.int64), key.astype(np.int64)
    key = key.astype(np.int64, copy=False)
    kmin = int(key.min())
    span = int(key.max()) - kmin
    bits = max(int(n - 1).bit_length(), 1)
    if span < 1 << 16 or span >= 1 << (62 - bits):
        narrow = span < 1 << 16
        order = np.argsort((key - kmin).astype(np.uint16) if narrow else key, kind="stable").astype(np.int64, copy=False)
        return order, key[order]
    packed = ((key - kmin) << bits) if kmin else key << bits
    packed |= np.arange(n)
    packed.sort(kind="stable" if runs else None)
    order = packed & ((1 << bits) - 1)
    packed >>= bits
    if kmin:
        packed += kmin
    return order, packed


#: rows per chunk of the presence tables (`unique`, `present`): numpy widens their indices to intp
_CHUNK = 1 << 18


def unique(key: np.ndarray) -> np.ndarray:
    """Sorted distinct values (`np.unique` without its hashing pass, several times faster); of
    integers within a narrow range, read off a table of the values present, a chunk at a time
    (no sorted copy of a row-sized array beside the analysis's: steps, ranks)."""
    if key.dtype.kind in "iu" and len(key):
        lo, hi = int(key.min()), int(key.max())
        if hi - lo <= 4 * len(key) + 4096:
            seen = np.zeros(hi - lo + 1, dtype=bool)
            for c in range(0, len(key), _CHUNK):
                seen[np.subtract(key[c:c + _CHUNK], lo, dtype=np.int64)] = True
            return (np.flatnonzero(seen) + lo).astype(key.dtype)
    k = np.sort(key)
    return k[np.r_[True, k[1:] != k[:-1]]] if len(k) else k


def first_order(codes: np.ndarray, k: int) -> np.ndarray:
    """Renumber codes in [0, k), each occurring, by first appearance (as `pd.factorize` does)."""
    n = len(codes)
    first = np.full(k, n, dtype=np.int64)
    np.minimum.at(first, codes, np.arange(n))
    return _by_position(codes, first, n)


def _by_position(codes: np.ndarray, first: np.ndarray, n: int) -> np.ndarray:
    """Renumber codes by their (distinct) first row, ordering rows through a table, not a sort."""
    at_row = np.full(n, -1, dtype=np.int64)
    at_row[first] = np.arange(len(first))
    remap = np.empty(len(first), dtype=np.int64)
    remap[at_row[at_row >= 0]] = np.arange(len(first))
    return remap[codes]


def dense_codes(key: np.ndarray, by_first: bool = True) -> tuple[np.ndarray, int]:
    """Codes 0..k-1 of integer keys (first-appearance order, or key order when `by_first` is
    False) and k: a lookup table when the key range is small, one packed sort otherwise."""
    n = len(key)
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0
    key = key.astype(np.int64, copy=False)
    kmin = int(key.min())
    span = int(key.max()) - kmin + 1
    if span <= 4 * n + 4096:
        rel = key - kmin if kmin else key
        present = np.zeros(span, dtype=bool)
        present[rel] = True
        lut = np.cumsum(present, dtype=np.int64)
        k = int(lut[-1])
        lut -= 1
        codes = lut[rel]
        return (first_order(codes, k) if by_first else codes), k
    order, sk = sort_keys(key)
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(sk[1:], sk[:-1], out=new[1:])
    c = np.cumsum(new, dtype=np.int64)
    c -= 1
    k = int(c[-1]) + 1
    codes = np.empty(n, dtype=np.int64)
    codes[order] = c
    if by_first:  # the first row of each group in a stable sort is its first appearance
        codes = _by_position(codes, order[new], n)
    return codes, k


def cumcount(codes: np.ndarray) -> np.ndarray:
    """Per row: how many earlier rows share its code (`groupby(...).cumcount()`)."""
    n = len(codes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order, sc = sort_keys(codes)
    pos = np.arange(n)
    start = np.where(np.r_[True, sc[1:] != sc[:-1]], pos, 0)
    np.maximum.accumulate(start, out=start)
    out = np.empty(n, dtype=np.int64)
    out[order] = pos - start
    return out


def present(codes: np.ndarray, k: int) -> np.ndarray:
    """Per code in [0, k): whether some row holds it, as `np.bincount(codes, minlength=k)[:k] > 0`
    reads it (codes >= k ignored), without bincount's intp copy of narrow codes and its counts."""
    out = np.zeros(k, dtype=bool)
    for c in range(0, len(codes), _CHUNK):
        part = codes[c:c + _CHUNK]
        out[part[part < k]] = True
    return out


def group_sum(codes: np.ndarray, k: int, values: np.ndarray) -> np.ndarray:
    """Sum of values per code in [0, k), added in row order as `np.bincount(codes, weights=values)`
    adds them (the same float64 sums), without bincount's intp copy of narrow codes."""
    out = np.zeros(k)
    np.add.at(out, codes, values)
    return out


def group_min(codes: np.ndarray, k: int, values: np.ndarray) -> np.ndarray:
    """Smallest of finite values per code (inf for codes with no rows)."""
    out = np.full(k, np.inf)
    np.minimum.at(out, codes, values)
    return out


def group_max(codes: np.ndarray, k: int, values: np.ndarray) -> np.ndarray:
    """Largest of finite values per code (-inf for codes with no rows)."""
    out = np.full(k, -np.inf)
    np.maximum.at(out, codes, values)
    return out


def group_median(codes: np.ndarray, k: int, values: np.ndarray) -> np.ndarray:
    """Median of finite values per code in [0, k), each occurring (`groupby(...).median()`)."""
    return group_quantile(codes, k, values, 0.5)


def group_quantile(codes: np.ndarray, k: int, values: np.ndarray, q: float) -> np.ndarray:
    """Quantile q of finite values per code in [0, k), linear between ranks like pandas'
    `groupby(...).quantile(q)`; NaN for a code that does not occur."""
    return group_quantiles(codes, k, values, (q,))[0]


def group_quantiles(codes: np.ndarray, k: int, values: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
    """`group_quantile` for each of `qs`, from one sort of the values."""
    order = np.argsort(values)  # which of equal values comes first cannot change a quantile
    order = order[argsort_stable(codes[order])]
    v = values[order]
    count = np.bincount(codes, minlength=k)
    first = np.cumsum(count) - count
    out = []
    for q in qs:  # (a few quantiles: no loop over rows)
        pos = q * np.maximum(count - 1, 0)
        lo = np.floor(pos).astype(np.int64)
        hi = np.ceil(pos).astype(np.int64)
        with np.errstate(invalid="ignore"):
            at_lo = v[np.minimum(first + lo, len(v) - 1)] if len(v) else np.zeros(k)
            at_hi = v[np.minimum(first + hi, len(v) - 1)] if len(v) else np.zeros(k)
            out.append(np.where(count > 0, at_lo + (at_hi - at_lo) * (pos - lo), np.nan))
    return out
