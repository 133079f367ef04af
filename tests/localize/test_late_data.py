"""Late data on a p2p stream: a transfer that took longer than the stream needs, not a late sender."""

from __future__ import annotations

import numpy as np

from collector.meta import JobMeta, RankInfo
from localize.commops import _late_data_excess, _p2p_rows
from localize.features import prepare_ops
from tests.localize.test_waitgraph import rows


def stream(last: list[tuple[float, float, float, float]]) -> np.ndarray:
    """pp-0: rank 0 sends to rank 1 once per step; normal steps 0..5, then the `last` steps.
    Each step is (send start, send end, recv start, recv end) in ms from the step's start.
    Returns the late-data excess of each step's transfer (s)."""
    normal = [(0, 1, 3, 3.01)] * 4 + [(0, 1, -1, 1.01)] * 2  # mostly the receiver comes late
    spec: list[tuple[int, str, str, int, int, float, float]] = []
    df_steps: list[int] = []
    for s, (a, b, c, d) in enumerate(normal + last):
        t = 100.0 * s
        spec += [(0, "pp-0", "send", s, 1, t + a, t + b), (1, "pp-0", "recv", s, 0, t + c, t + d)]
        df_steps += [s, s]
    df = rows(spec)
    df["step"] = df_steps
    ops = prepare_ops(df)
    meta = JobMeta("t", 2, {0: RankInfo("node-0", 0), 1: RankInfo("node-0", 1)}, {"pp-0": [0, 1]}, {}, {})
    abnormal = (ops.step >= 6) & (ops.df["op"].to_numpy() == "recv")  # the receiver waited
    send_row, recv_row = _p2p_rows(ops)
    ex = _late_data_excess(ops, meta, abnormal, np.arange(6), send_row, recv_row)
    return ex[np.argsort(ops.inst_step)]


def test_a_late_sender_is_not_late_data() -> None:
    # step 6: the receiver waits 2 ms because the sender started late; the data then took its
    # usual 1 ms from the send (a step where the receiver came late would read it longer)
    ex = stream([(4, 5, 3, 5.01)])
    assert ex[6] == 0.0


def test_data_that_arrives_late_from_an_on_time_sender_is_slow() -> None:
    # step 6: sent on time and done (handed to the transport), but it reached the receiver 9 ms later
    ex = stream([(0, 1, 0.5, 9.0)])
    assert ex[6] > 0.006
