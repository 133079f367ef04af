"""Each (step, rank)'s first start and last end, by a table of cells, equal pandas' groupby."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from timeline.steps import step_rank_extent


@pytest.mark.parametrize("spread", [1, 10**6])  # the second: step numbers too far apart for a table
def test_extent_matches_groupby(spread: int) -> None:
    rng = np.random.default_rng(5)
    n = 4000
    df = pd.DataFrame({"step": (rng.integers(0, 7, n) * spread).astype(np.int32),
                       "rank": rng.choice([0, 3, 4, 9], n).astype(np.int32),
                       "start_ns": rng.integers(10**12, 2 * 10**12, n)})
    df["end_ns"] = df["start_ns"] + rng.integers(0, 10**6, n)
    df = df[~((df["step"] == 2 * spread) & (df["rank"] == 3))]  # a cell with no row
    agg = df.groupby(["step", "rank"], sort=True).agg(first=("start_ns", "min"), last=("end_ns", "max"))
    steps, ranks, first, last = step_rank_extent(df)
    assert steps.tolist() == agg.index.get_level_values("step").tolist()
    assert ranks.tolist() == agg.index.get_level_values("rank").tolist()
    assert first.tolist() == agg["first"].tolist()
    assert last.tolist() == agg["last"].tolist()
    assert len(steps) == 7 * 4 - 1
