"""Integer group-by primitives agree with pandas/numpy on keys of every shape they take."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from localize.ops.grouping import (
    argsort_stable,
    cumcount,
    dense_codes,
    first_order,
    group_median,
    group_sum,
    sort_keys,
    unique,
)


def keys(kind: str, n: int = 5000) -> np.ndarray:
    rng = np.random.default_rng(7)
    if kind == "narrow":  # radix path
        return rng.integers(-3, 300, n)
    if kind == "wide":  # packed sort path
        return rng.integers(0, 1 << 40, n) // 97 * 97
    if kind == "huge":  # span too wide to pack
        return rng.integers(-(1 << 62), 1 << 62, n)
    return np.sort(rng.integers(0, 50, n)) * 100_000 + rng.integers(0, 30, n)  # "runs": sorted blocks


@pytest.mark.parametrize("kind", ["narrow", "wide", "huge", "runs"])
def test_sorts_are_stable_and_hand_back_sorted_keys(kind: str) -> None:
    k = keys(kind)
    want = np.argsort(k, kind="stable")
    for runs in (False, True):
        order, sk = sort_keys(k, runs=runs)
        assert np.array_equal(order, want) and np.array_equal(sk, k[want])
        assert np.array_equal(argsort_stable(k, runs), want)
    assert np.array_equal(unique(k), np.unique(k))


@pytest.mark.parametrize("kind", ["narrow", "wide", "huge", "runs"])
def test_codes_match_factorize_and_cumcount(kind: str) -> None:
    k = keys(kind)
    codes, n = dense_codes(k)
    want, uniq = pd.factorize(k)
    assert n == len(uniq) and np.array_equal(codes, want)
    by_key, _ = dense_codes(k, by_first=False)
    assert np.array_equal(by_key, np.unique(k, return_inverse=True)[1])
    assert np.array_equal(first_order(by_key, n), want)
    assert np.array_equal(cumcount(k), pd.Series(k).groupby(k).cumcount().to_numpy())


def test_group_median_matches_pandas() -> None:
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 40, 3000)
    codes[:40] = np.arange(40)  # every code occurs
    values = rng.exponential(size=3000)
    want = pd.Series(values).groupby(codes).median().to_numpy()
    assert np.allclose(group_median(codes, 40, values), want, rtol=0, atol=0)


def test_empty_inputs() -> None:
    e = np.zeros(0, dtype=np.int64)
    codes, n = dense_codes(e)
    assert n == 0 and len(codes) == 0
    assert len(cumcount(e)) == 0 and len(argsort_stable(e)) == 0


def test_group_sum_is_bincount_bit_for_bit() -> None:
    """Sums in row order, as bincount adds them: the same float64 bits for float, bool and int
    values and int32 or int64 codes (codes left narrow; an absent code sums to 0)."""
    rng = np.random.default_rng(4)
    for dtype in (np.int32, np.int64):
        codes = rng.integers(0, 700, 50_000).astype(dtype)
        for values in (rng.normal(size=50_000) * 1e6, rng.random(50_000) > 0.5, rng.integers(0, 4096, 50_000).astype(np.int32)):
            want = np.bincount(codes, weights=values.astype(np.float64), minlength=800)
            got = group_sum(codes, 800, values)
            assert got.dtype == np.float64 and got.tobytes() == want.tobytes()
