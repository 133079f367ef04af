"""p2p transfers judged by physics: slow only when the data took longer once both ends had posted,
under eager and rendezvous sends alike."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from collector.trace.meta import JobMeta, RankInfo
from localize.network.transfers import slow_transfer_excess
from localize.ops.grouping import group_quantile
from localize.ops.table import prepare_ops
from tests.localize.waits.test_waitgraph import rows

#: (send start, send end, recv start, recv end) in ms from the step's start
Step = tuple[float, float, float, float]


def stream(normal: Sequence[Step], last: Sequence[Step], hosts: tuple[str, str] = ("node-0", "node-0")) -> np.ndarray:
    """pp-0: rank 0 sends to rank 1 once per step; the `normal` steps, then the `last` ones.
    Returns the slow-transfer excess of each step's transfer (s)."""
    spec: list[tuple[int, str, str, int, int, float, float]] = []
    steps: list[int] = []
    for s, (a, b, c, d) in enumerate([*normal, *last]):
        t = 100.0 * s
        spec += [(0, "pp-0", "send", s, 1, t + a, t + b), (1, "pp-0", "recv", s, 0, t + c, t + d)]
        steps += [s, s]
    df = rows(spec)
    df["step"] = steps
    ops = prepare_ops(df)
    meta = JobMeta("t", 2, {0: RankInfo(hosts[0], 0), 1: RankInfo(hosts[1], 1)}, {"pp-0": [0, 1]}, {}, {})
    ex, _ = slow_transfer_excess(ops, meta, np.arange(len(normal)))
    return ex[np.argsort(ops.inst_step)]


EAGER_NORMAL = [(0, 1, 3, 3.01)] * 4 + [(0, 1, -1, 1.01)] * 2  # mostly the receiver comes late
RENDEZVOUS_NORMAL = [(0, 4, 3, 4.0)] * 4 + [(0, 1, -1, 1.0)] * 2  # a late receiver holds the send


def test_eager_late_sender_is_not_a_slow_transfer() -> None:
    # the receiver waits 2 ms because the sender started late; the data took its usual 1 ms
    assert stream(EAGER_NORMAL, [(4, 5, 3, 5.01)])[6] == 0.0


def test_eager_data_late_from_an_on_time_sender_is_slow() -> None:
    # sent on time and handed to the transport, but it reached the receiver 9 ms later
    assert stream(EAGER_NORMAL, [(0, 1, 0.5, 9.0)])[6] > 0.006


def test_rendezvous_send_held_by_a_late_receiver_is_not_a_slow_transfer() -> None:
    # the send lasts 20 ms because its receiver posted at 19 ms; the data then took 1 ms
    assert stream(RENDEZVOUS_NORMAL, [(0, 20, 19, 20.0)])[6] == 0.0


def test_rendezvous_slow_path_is_slow_whoever_posted_first() -> None:
    receiver_late = stream(RENDEZVOUS_NORMAL, [(0, 7, 3, 7.0)])[6]  # 4 ms once both were there
    sender_late = stream(RENDEZVOUS_NORMAL, [(5, 9, 0, 9.0)])[6]
    assert receiver_late == pytest.approx(0.003, abs=2e-4)
    assert sender_late == pytest.approx(0.003, abs=2e-4)


def test_a_stream_noisy_in_normal_steps_is_slow_only_beyond_its_usual_range() -> None:
    # a busy host (the real throttled-NIC gloo job's healthy pipeline): when the receiver waits the
    # data takes ~2 ms, when the sender posted first and went back to compute it takes 3-9 ms
    noisy = [(0, 2, -1, 2.0)] * 5 + [(0, 4 + k, 1, 4.0 + k) for k in range(6)]
    within = stream(noisy, [(0, 6, 0, 6.0), (0, 4, 2, 8.0)])
    assert within[-2:].tolist() == [0.0, 0.0]  # 3x its exact time, yet as slow as normal steps get
    beyond = stream(noisy, [(0, 30, 0, 30.0)])
    assert beyond[-1] > 0.02


def chain_excess(spec: list[tuple[int, str, str, int, int, float, float]], steps: list[int],
                 normal: int) -> tuple[float, bool]:
    """Ranks 0 -> 1 -> 2 on one host (pp-0, pp-1), steps 0..normal-1 normal: the slow-transfer
    excess of pp-0's transfer in step `normal`, and whether it was seen."""
    df = rows(spec)
    df["step"] = steps
    ops = prepare_ops(df)
    meta = JobMeta("t", 3, {r: RankInfo("node-0", r) for r in range(3)}, {"pp-0": [0, 1], "pp-1": [1, 2]}, {}, {})
    ex, seen = slow_transfer_excess(ops, meta, np.arange(normal))
    at = (ops.inst_step == normal) & (ops.groups[ops.inst_group] == "pp-0")
    return float(ex[at].item()), bool(seen[at].item())


def test_eager_data_late_into_a_batched_receive_is_slow() -> None:
    """An eager send ends once its data is handed over; a receive posted in a batch (with the
    rank's own send onwards) ends when the data lands. The send's end bounds nothing: the
    independent generator's eager NIC spike (seed 9797, job 17) read every such transfer as 0.02 ms,
    normal, which cleared the NIC and named the 8 links of the DP ring instead."""
    spec: list[tuple[int, str, str, int, int, float, float]] = []
    steps: list[int] = []
    # receiver on time (data takes 1 ms), receiver late (the data waited), then the data takes 9 ms
    recv_at = [(0.0, 1.0)] * 4 + [(3.0, 3.01)] * 2 + [(0.0, 9.0)]
    for s, (post, end) in enumerate(recv_at):
        t = 100.0 * s
        spec += [(0, "pp-0", "send", s, 1, t, t + 0.01),
                 (1, "pp-0", "recv", s, 0, t + post, t + end), (1, "pp-1", "send", s, 2, t + post, t + post + 0.01),
                 (2, "pp-1", "recv", s, 1, t + post, t + post + 1.0)]
        steps += [s] * 4
    ex, seen = chain_excess(spec, steps, normal=6)
    assert ex == pytest.approx(0.008, abs=5e-4) and seen


def test_an_irecv_waited_on_with_a_later_batch_measures_nothing_when_that_batch_waited() -> None:
    """Interleaved 1F1B overlaps p2p with compute: rank 1 posts its receive from rank 0 early and
    waits on it together with a later batch, whose send waits for rank 2. The receive's recorded
    end is that wait's, not its data's: when rank 2 came late it ended 9 ms after an eager send
    that had landed long before, which read as a slow path between ranks 0 and 1 (a batched
    256-GPU matrix job named the path of the slow GPU's pipeline peer, 0.47, and the GPU 0.03)."""
    spec: list[tuple[int, str, str, int, int, float, float]] = []
    steps: list[int] = []
    # 4 steps the receive waited on with the batch (rank 2 on time), 2 with the receiver waiting
    # alone (the data takes 1 ms), 2 with it late (the stream's sends do not wait: eager), then
    # rank 2 late by 6 ms
    patterns = ["overlapped"] * 4 + ["early receiver"] * 2 + ["late receiver"] * 2 + ["rank 2 late"]
    for s, pattern in enumerate(patterns):
        t, held = 100.0 * s, 9.0 if pattern == "rank 2 late" else 3.0
        spec.append((0, "pp-0", "send", s, 1, t, t + 0.01))
        if pattern.endswith("receiver"):
            spec.append((1, "pp-0", "recv", s, 0, t + (0.5 if pattern == "late receiver" else -0.5), t + 1.0))
            held = 1.5
        else:
            spec.append((1, "pp-0", "recv", s, 0, t - 5.0, t + held))
        spec += [(1, "pp-1", "send", s, 2, t + 1.2, t + held), (2, "pp-1", "recv", s, 1, t + held - 1.0, t + held)]
        steps += [s] * 4
    assert chain_excess(spec, steps, normal=8)[0] == 0.0


def test_clock_offsets_between_hosts_are_removed() -> None:
    # rank 1's host clock runs 50 ms ahead; a receiver-late rendezvous transfer of 1 ms
    shifted = [(a, b, c + 50, d + 50) for a, b, c, d in RENDEZVOUS_NORMAL]
    ex = stream(shifted, [(0, 20, 69, 70.0)], hosts=("node-0", "node-1"))
    assert ex[6] == 0.0


def test_group_quantile_matches_pandas() -> None:
    import pandas as pd

    rng = np.random.default_rng(3)
    codes = rng.integers(0, 7, 200)
    values = rng.random(200)
    for q in (0.1, 0.5, 0.9):
        got = group_quantile(codes, 8, values, q)
        want = pd.Series(values).groupby(codes).quantile(q).reindex(range(8)).to_numpy()
        np.testing.assert_allclose(got, want, equal_nan=True)


def test_last_activity_by_chunks_matches_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # three ranks with overlapping, batched (same start) and early-posted operators; chunks of
    # whole ranks, one rank each (the searches run a chunk at a time)
    from localize.network import transfers
    from localize.ops import table

    rng = np.random.default_rng(5)
    spec: list[tuple[int, str, str, int, int, float, float]] = []
    for r in range(3):
        t = 0.0
        for s in range(12):
            t += float(rng.choice([0.0, 0.5, 2.0]))  # 0: posted with the previous one
            spec.append((r, "dp-0", "all_reduce", s, -1, t, t + float(rng.uniform(0.1, 4.0))))
    ops = prepare_ops(rows(spec))
    start = ops.df["start_ns"].to_numpy(np.float64) * 1e-9
    end = ops.df["end_ns"].to_numpy(np.float64) * 1e-9
    whole = transfers.last_activity(ops, start, end)
    monkeypatch.setattr(table, "_RANK_CHUNK", 2)
    assert len(table.rank_bounds(ops.rank)) == 4
    chunked = transfers.last_activity(ops, start, end)
    assert np.array_equal(whole[0], chunked[0]) and np.array_equal(whole[1], chunked[1])
    assert not whole[1].all() and (whole[0] > start).any()  # both kinds of rows occur
    # some rows only (ends given for them alone, the line of every row's times): the same figures
    at = np.array([35, 0, 12, 13, 11, 24, 7, 7])
    some = transfers.last_activity(ops, start, end[at], at, transfers.time_line(start, end))
    assert some[0].tobytes() == whole[0][at].tobytes() and np.array_equal(some[1], whole[1][at])
