"""The wait graph on hand-built operator records: who waited for whom, and back to the root."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.trace.schema import OPS
from localize.ops.table import prepare_ops
from localize.waits import waitgraph
from localize.waits.waitgraph import _range_argmax, build_waitgraph

MS = 1_000_000


def rows(spec: list[tuple[int, str, str, int, int, float, float]], step: int = 1) -> pd.DataFrame:
    """(rank, group, op, seq, peer, start_ms, end_ms) -> CommOps rows (own clocks, ms)."""
    return pd.DataFrame(
        [{"rank": r, "group": g, "op": op, "seq": s, "peer": p, "nbytes": 1 << 20,
          "start_ns": int(a * MS), "end_ns": int(b * MS), "step": step} for r, g, op, s, p, a, b in spec]
    )


def graph(df: pd.DataFrame, abnormal_rows: set[tuple[int, str, int]]) -> tuple:
    ops = prepare_ops(df)
    key = list(zip(ops.rank.tolist(), ops.groups[ops.group_code].tolist(), pd.Series(ops.inst_seq[ops.inst]).tolist(), strict=True))
    abnormal = np.array([k in abnormal_rows for k in key])
    expected = np.where(ops.inst_p2p, 2, ops.inst_size)
    msum = np.bincount(ops.inst, weights=ops.rank.astype(float), minlength=ops.n_inst)
    g = build_waitgraph(ops, abnormal, np.array([1]), expected, np.zeros(ops.n_inst), msum)
    return ops, g


def test_last_arriver_is_the_suspect_and_its_own_compute_is_the_root() -> None:
    # tp-0 = ranks 0..3; seq 0 ends together; rank 2 computes 5 ms longer before seq 1
    spec = [(r, "tp-0", "all_reduce", 0, -1, 0.0, 1.0) for r in range(4)]
    spec += [(r, "tp-0", "all_reduce", 1, -1, 2.0 if r != 2 else 7.0, 8.0) for r in range(4)]
    ops, g = graph(rows(spec), {(r, "tp-0", 1) for r in (0, 1, 3)})
    i = int(ops.inst[(pd.Series(ops.inst_seq[ops.inst]) == 1).to_numpy()][0])
    assert g.suspect[i] and not g.comm[i]
    assert g.root_rank[i] == 2
    assert abs(g.delay[i] - 0.005) < 1e-6
    assert g.excess_compute[i] > 0.004


def test_backtracking_follows_waiting_across_groups() -> None:
    # rank 1 waits 6 ms in a recv from rank 9 (rank 9 sent late), then arrives late at tp-0;
    # rank 1's copy of tp-0 is the normal one, but its lateness is explained by the recv
    spec = [(r, "tp-0", "all_reduce", 0, -1, 0.0, 1.0) for r in range(4)]
    spec += [(1, "pp-0", "recv", 0, 9, -3.0, -2.0), (9, "pp-0", "send", 0, 1, -3.0, -2.5)]  # an earlier transfer
    spec += [(1, "pp-0", "recv", 1, 9, 1.5, 7.5), (9, "pp-0", "send", 1, 1, 7.0, 7.4)]
    spec += [(9, "tp-2", "all_reduce", 0, -1, 0.0, 1.0), (8, "tp-2", "all_reduce", 0, -1, 0.2, 1.0)]
    spec += [(r, "tp-0", "all_reduce", 1, -1, 2.0 if r != 1 else 8.0, 8.5) for r in range(4)]
    abnormal = {(r, "tp-0", 1) for r in (0, 2, 3)} | {(1, "pp-0", 1)}
    ops, g = graph(rows(spec), abnormal)
    tp1 = int(ops.inst[((pd.Series(ops.inst_seq[ops.inst]) == 1) & (ops.groups[ops.group_code] == "tp-0")).to_numpy()][0])
    recv = int(ops.inst[((ops.opcode == OPS.index("recv")) & (pd.Series(ops.inst_seq[ops.inst]) == 1)).to_numpy()][0])
    assert g.suspect[tp1] and g.suspect[recv]
    assert g.root_inst[tp1] == recv  # the chain ends at the late send
    assert g.root_rank[tp1] == 9


def test_every_copy_slow_is_communication() -> None:
    spec = [(r, "dp-0", "all_reduce", 0, -1, 0.0, 9.0) for r in range(4)]
    df = rows(spec)
    ops = prepare_ops(df)
    abnormal = np.ones(len(df), dtype=bool)
    g = build_waitgraph(ops, abnormal, np.array([1]), np.array([4]), np.array([0.006]), np.array([6.0]))
    assert g.comm[0] and not g.suspect[0] and g.root_rank[0] == -1


def test_missing_copy_names_the_missing_rank() -> None:
    # rank 3 logged nothing; every present copy waited
    spec = [(r, "tp-0", "all_reduce", 0, -1, 0.0, 6.0 + 0.01 * r) for r in range(3)]
    ops = prepare_ops(rows(spec))
    g = build_waitgraph(ops, np.ones(3, dtype=bool), np.array([1]), np.array([4]), np.zeros(1), np.array([6.0]))
    assert g.orphan[0] and g.root_rank[0] == 3


def test_range_argmax() -> None:
    v = np.array([0.1, 0.5, 0.2, 0.9, 0.3])
    got = _range_argmax(v, np.array([0, 2, 4, 3]), np.array([3, 5, 4, 3]))
    assert got.tolist() == [1, 3, -1, -1]


def test_range_argmax_in_place_chunks_match_a_direct_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    # chunks far smaller than the windows and than the rows: each pass reads rows no chunk wrote yet
    monkeypatch.setattr(waitgraph, "_CHUNK", 5)
    rng = np.random.default_rng(3)
    v = np.round(rng.random(200), 3)  # ties too: the later row wins
    lo = rng.integers(0, 200, 300)
    hi = np.minimum(lo + rng.integers(0, 90, 300), 200)
    want = [int(lo_ + np.flatnonzero(v[lo_:hi_] == v[lo_:hi_].max())[-1]) if hi_ > lo_ else -1
            for lo_, hi_ in zip(lo, hi, strict=True)]
    assert _range_argmax(v, lo, hi).tolist() == want


@pytest.mark.parametrize("shift", [0, 1])
def test_segment_differences_in_place_by_chunks_match_a_copy(monkeypatch: pytest.MonkeyPatch, shift: int) -> None:
    # chunks far smaller than the rows, links reaching back across many chunks and into their own
    monkeypatch.setattr(waitgraph, "_CHUNK", 7)
    rng = np.random.default_rng(11)
    c = np.cumsum(rng.random(300))
    row = np.arange(300)
    p = np.where(rng.random(300) < 0.2, 0, np.maximum(row - shift - rng.integers(0, 40, 300), 0))
    before = np.r_[0.0, c[:-1]] if shift else c
    want = before - c[p]
    got = c.copy()
    waitgraph._differences_in_place(got, p, shift)
    assert got.tobytes() == want.tobytes()


def test_segment_starts_by_chunks_of_whole_ranks_match_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # streams interleaved within ranks, a p2p stream, a lost record (seq 2 after 0) and a later step
    from localize.ops import table

    spec = [(r, g, "all_reduce", s, -1, 10.0 * s + k, 10.0 * s + k + 0.5)
            for r in range(4) for k, g in enumerate(("tp-0", "dp-0")) for s in range(4) if (r, s) != (2, 1)]
    spec += [(r, "pp-0", "send" if r % 2 == 0 else "recv", s, r ^ 1, 10.0 * s + 5, 10.0 * s + 6)
             for r in range(4) for s in range(4)]
    df = pd.concat([rows(spec), rows([(r, g, op, q + 4, p, a + 40, b + 40) for r, g, op, q, p, a, b in spec], step=3)])
    ops = prepare_ops(df.reset_index(drop=True))
    whole = waitgraph._segment_starts(ops)
    monkeypatch.setattr(table, "_RANK_CHUNK", 3)
    assert len(table.rank_bounds(ops.rank)) == 5
    chunked = waitgraph._segment_starts(ops)
    assert whole[0].tolist() == chunked[0].tolist() and whole[1].tolist() == chunked[1].tolist()
    assert (whole[0] >= 0).any() and (whole[0] < 0).any() and not whole[1][whole[0] >= 0].all()


def test_p2p_streams_numbered_per_end_are_matched_by_order() -> None:
    # each end numbers the stream on its own (send 0,1 / recv 5,6): matched 1st-1st, 2nd-2nd
    spec = [(0, "pp-0", "send", 0, 1, 0.0, 1.0), (0, "pp-0", "send", 1, 1, 2.0, 3.0),
            (1, "pp-0", "recv", 5, 0, 0.0, 1.1), (1, "pp-0", "recv", 6, 0, 2.5, 3.1)]
    ops = prepare_ops(rows(spec))
    assert ops.n_inst == 2 and (ops.inst_size == 2).all()


def test_steps_inferred_from_gradient_sync_bursts() -> None:
    from localize.ops.steps import infer_steps

    spec = []
    for s in range(3):
        t = s * 100.0
        for r in (0, 1):
            spec += [(r, "tp-0", "all_reduce", 2 * s, -1, t + 1, t + 2), (r, "tp-0", "all_reduce", 2 * s + 1, -1, t + 3, t + 4)]
            spec += [(r, "dp-0", "reduce_scatter", 2 * s, -1, t + 5, t + 9), (r, "dp-0", "all_gather", 2 * s + 1, -1, t + 10, t + 14)]
    df = rows(spec, step=-1)
    df.loc[df["group"] == "dp-0", "nbytes"] = 1 << 28
    df = df.sample(frac=1.0, random_state=0)  # any row order
    got = pd.Series(infer_steps(df), index=df.index).sort_index()
    want = [s for s in range(3) for _ in range(8)]
    assert got.tolist() == want


def test_a_last_arriver_held_up_by_a_longer_transfer_elsewhere_was_late_on_its_own_clock() -> None:
    # cp-0 = ranks 0, 1; between its two operators each takes part in a DP ring of its own, and
    # rank 1's ring takes 3 ms longer for every member (its transfer, not a wait): rank 1 reaches
    # cp-0 late by that much, with no extra compute and no extra waiting
    spec = [(r, "cp-0", "all_gather", 0, -1, 0.0, 1.0) for r in (0, 1)]
    spec += [(r, "dp-0", "reduce_scatter", 0, -1, 1.5, 5.5) for r in (0, 2)]
    spec += [(r, "dp-1", "reduce_scatter", 0, -1, 1.5, 8.5) for r in (1, 3)]
    spec += [(0, "cp-0", "all_gather", 1, -1, 6.0, 9.5), (1, "cp-0", "all_gather", 1, -1, 9.0, 9.5)]
    ops, g = graph(rows(spec), {(0, "cp-0", 1)})
    i = int(ops.inst[((ops.groups[ops.group_code] == "cp-0") & (pd.Series(ops.inst_seq[ops.inst]) == 1)).to_numpy()][0])
    assert g.suspect[i] and ops.rank[ops.late_row[i]] == 1
    assert abs(g.excess_compute[i]) < 1e-6 and abs(g.excess_wait[i]) < 1e-6
    assert abs(g.excess_own[i] - 0.003) < 1e-6
