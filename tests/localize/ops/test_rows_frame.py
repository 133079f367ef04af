"""The columns `prepare_ops` keeps only as codes or per instance (group, op, peer, seq) are rebuilt
for the rows that need them (exactly, but a p2p row's seq: its transfer's number at both ends), and
the clock offsets estimated on those rows are the ones the whole frame gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from collector.trace.traceio import Trace
from localize.commops import COLUMNS
from localize.ops.table import CODED, in_steps, prepare_ops, sorted_rows
from simulator.config import SimConfig
from simulator.writer import simulate_trace
from timeline.columns import read_commops
from timeline.steps import clock_offsets_by_step, offset_samples


def test_rows_frame_rebuilds_coded_columns_and_offsets(tmp_path: Path) -> None:
    simulate_trace(SimConfig(gpus=32, tp=2, pp=4, steps=8, seed=11, clock_skew_ms=40.0), tmp_path / "t",
                   counterfactual=False)
    trace = Trace.open(tmp_path / "t")
    df = sorted_rows(read_commops(trace, COLUMNS))
    whole = df.copy()
    ops = prepare_ops(df[COLUMNS])
    assert not set(CODED) & set(ops.df.columns)
    mask = in_steps(ops, np.array([2, 5]))
    got, want = ops.rows_frame(mask), whole[mask].reset_index(drop=True)
    assert list(got.columns) == list(want.columns)
    p2p = want["op"].isin(["send", "recv"]).to_numpy()
    assert p2p.any()
    for c in want.columns:
        same = got[c].astype(str) if c in ("group", "op") else got[c]
        expect = want[c].astype(str) if c in ("group", "op") else want[c]
        if c == "seq":
            same, expect = same[~p2p], expect[~p2p]
        pd.testing.assert_series_equal(same, expect, check_dtype=c not in CODED)
    # a p2p row's seq: one number per transfer, the same at both ends, as the given seq pairs them
    send = (got["op"][p2p] == "send").to_numpy()
    ends = {"src": np.where(send, got["rank"][p2p], got["peer"][p2p]),
            "dst": np.where(send, got["peer"][p2p], got["rank"][p2p])}
    transfer, given = got[p2p].assign(**ends), want[p2p].assign(**ends)
    keys = ["group", "src", "dst", "seq"]
    assert (transfer.groupby(keys, observed=True).size() == 2).all()
    assert (pd.Series(transfer["seq"].to_numpy()).groupby(given.groupby(keys, observed=True).ngroup().to_numpy())
            .nunique() == 1).all()
    steps = np.unique(ops.step)
    ref = steps[steps < 6]
    rebuilt = clock_offsets_by_step(ops.rows_frame(in_steps(ops, offset_samples(steps, trusted=ref))), trace.meta,
                                    steps, trusted=ref)
    pd.testing.assert_frame_equal(rebuilt, clock_offsets_by_step(whole, trace.meta, trusted=ref), check_exact=True)
    assert float(np.abs(rebuilt.to_numpy()).max()) > 1e6  # (the hosts' clocks do disagree)
