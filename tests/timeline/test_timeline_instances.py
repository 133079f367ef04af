"""Instance matching across ranks and host clock offsets."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.timeline.timeline_factory import make_trace
from timeline.build import COLUMNS
from timeline.columns import read_commops
from timeline.instances import estimate_clock_offsets, instance_ids, match_instances

SKEW = {0: 0, 1: 5_000_000_000, 2: -3_000_000, 3: 77_000_000}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory):
    return make_trace(tmp_path_factory.mktemp("inst"), {"tp": 2, "pp": 2, "dp": 2, "cp": 2},
                      [1.0] * 4, offsets_ns=SKEW)


def test_collectives_match_by_group_and_seq(trace) -> None:
    df = read_commops(trace, COLUMNS)
    table, ids = match_instances(df, trace.meta)
    assert len(ids) == len(df)
    coll = table[~table["op"].isin(["send", "recv"])]
    sizes = coll["group"].astype(str).str.split("-").str[0].map({"tp": 2, "cp": 2, "dp": 2})
    assert (coll["participants"] == sizes).all()
    # copies of one instance share its step; collective copies share their op
    assert df.groupby(ids)["step"].nunique().max() == 1
    is_coll = ~df["op"].isin(["send", "recv"]).to_numpy()
    assert df[is_coll].groupby(ids[is_coll])["op"].nunique().max() == 1


def test_p2p_pairs_send_with_recv(trace) -> None:
    df = read_commops(trace, COLUMNS)
    p2p = df[df["op"].isin(["send", "recv"])]
    ids = instance_ids(p2p)
    # pandas-stubs allow agg only scalar results; a tuple per group is fine at runtime
    ops = p2p.groupby(ids)["op"].agg(lambda s: tuple(sorted(s.astype(str))))  # type: ignore[type-var]
    assert set(ops) == {("recv", "send")}


def test_p2p_fifo_fallback_when_sides_are_numbered_differently() -> None:
    """A producer that counts both sides of a pair on one counter: pair in FIFO order."""
    df = pd.DataFrame({
        "rank": [0, 1, 0, 1], "group": ["pp-0"] * 4, "op": ["send", "recv", "send", "recv"],
        "seq": [0, 1, 2, 3], "peer": [1, 0, 1, 0],
    })
    ids = instance_ids(df)
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]


def test_clock_offsets_recovered(trace) -> None:
    df = read_commops(trace, COLUMNS)
    off = estimate_clock_offsets(df, trace.meta)
    rel = (off - off["node-0"]).to_numpy()
    np.testing.assert_allclose(rel, [SKEW[h] for h in range(4)], atol=50_000)  # within 50 µs


def test_arrival_spread_only_after_alignment(trace) -> None:
    df = read_commops(trace, COLUMNS)
    raw, _ = match_instances(df, trace.meta)
    assert "spread_ns" not in raw
    aligned, _ = match_instances(df, trace.meta, estimate_clock_offsets(df, trace.meta))
    # the factory jitters arrivals by < 0.2% of a 1 s step; unaligned clocks would show seconds
    assert aligned["spread_ns"].max() < 5_000_000
    assert aligned["host_spread_ns"].max() < 5_000_000
