"""The node summary: what each host reports of its ranks' compute."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from collector.traceio import Trace
from localize.commops import COLUMNS
from localize.ops.features import prepare_ops
from localize.summary import summarize

TRACE = Path(__file__).resolve().parents[2] / "traces" / "gpu-straggler"


def test_a_hosts_typical_compute_is_its_fast_ranks_own_not_lifted_by_a_slow_peer() -> None:
    """On hosts of two ranks, the host's row is the faster rank's compute: interpolated, a GPU
    slow from the first step lifted its peer by a quarter, and the stage looked misconfigured."""
    df = Trace.open(TRACE).commops(columns=COLUMNS)
    ops = prepare_ops(df.copy())
    own = pd.DataFrame({"pair": ops.rank // 2, "step": ops.step, "rank": ops.rank, "c": ops.gap})
    per_rank = own.groupby(["pair", "step", "rank"])["c"].sum()
    fastest = per_rank.groupby(["pair", "step"]).min()
    summary = summarize(df, host_of=lambda r: f"pair-{r // 2}")
    hosts = summary[(summary["group"] == "*") & (summary["rank"] < 0)]
    pair = hosts["host"].str.removeprefix("pair-").astype(int).to_numpy()
    want = fastest.loc[list(zip(pair, hosts["step"].to_numpy(), strict=True))].to_numpy()
    np.testing.assert_allclose(hosts["compute_s"].to_numpy(), want, rtol=1e-9)
    slowest = per_rank.groupby(["pair", "step"]).max()
    assert (slowest / fastest).max() > 1.5  # the trace's slow GPU shares a pair: the case is exercised
