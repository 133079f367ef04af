"""The full path's compact frame (rows pre-sorted, strings as categoricals) analyses exactly as
the frame read from the trace does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collector.trace.traceio import Trace
from localize.commops import COLUMNS
from localize.ops import table
from localize.ops.table import RowTimes, prepare_ops, sorted_rows

TRACE = Path(__file__).resolve().parents[3] / "traces" / "gpu-straggler"
ROW_ARRAYS = ("elapsed", "inst", "wait", "gap", "group_code", "slot", "pair", "opcode", "step", "rank", "nbytes")
INST_ARRAYS = ("inst_size", "inst_min", "inst_mean", "inst_max", "late_row", "inst_group", "inst_step", "inst_p2p",
               "inst_src", "inst_dst", "inst_seq")


def test_sorted_categorical_frame_gives_the_same_ops() -> None:
    raw = Trace.open(TRACE).commops(columns=COLUMNS)
    shuffled = raw.sample(frac=1.0, random_state=3).reset_index(drop=True)  # rows out of (rank, time) order
    ref = prepare_ops(shuffled.copy())
    compact = sorted_rows(shuffled.copy())
    assert str(compact["group"].dtype) == "category" and str(compact["op"].dtype) == "category"
    got = prepare_ops(compact)
    assert got.order is None  # already in the analysis' order: the frame's columns are read as they are, no copy
    assert np.shares_memory(got.nbytes, got.source["nbytes"].to_numpy())
    for name in ROW_ARRAYS + INST_ARRAYS:
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
    assert list(got.groups) == list(ref.groups)
    every = np.ones(len(got.rank), dtype=bool)  # (group, op, peer, seq live as codes: rows_frame rebuilds them)
    got_all, ref_all = got.rows_frame(every), ref.rows_frame(every)
    collective = ~got.inst_p2p[got.inst]  # (a p2p row's seq is rebuilt as its transfer's number)
    for col in COLUMNS:
        np.testing.assert_array_equal(got_all[col].astype(str).to_numpy(), ref_all[col].astype(str).to_numpy(), err_msg=col)
        rows = collective if col == "seq" else every
        np.testing.assert_array_equal(got_all[col].astype(str).to_numpy()[rows], compact[col].astype(str).to_numpy()[rows],
                                      err_msg=col)


def test_sorted_rows_consumes_its_input() -> None:
    raw = Trace.open(TRACE).commops(columns=COLUMNS)
    n = len(raw)
    out = sorted_rows(raw)
    assert len(out) == n and list(out.columns) == COLUMNS
    assert raw.shape[1] == 0  # every column moved out: the sort never holds two whole frames


def test_step_codes_are_dense_codes_in_step_order() -> None:
    from localize.ops.grouping import dense_codes
    from localize.ops.table import _step_codes

    rng = np.random.default_rng(2)
    for step in (rng.integers(-3, 40, 500), rng.integers(0, 2**30, 50), np.array([7, 7, 7]), np.zeros(0)):
        step = step.astype(np.int32)
        got, k = _step_codes(step)
        want, k_want = dense_codes(step, by_first=False)
        assert k == k_want and got.tolist() == want.tolist()


def test_sorted_rows_narrows_int64_columns_only_where_every_value_fits() -> None:
    raw = Trace.open(TRACE).commops(columns=COLUMNS)
    raw["seq"], raw["nbytes"] = raw["seq"].astype(np.int64), raw["nbytes"].astype(np.int64)
    big = raw.copy()
    big.loc[3, "nbytes"] = 2**40  # a payload past int32: the column stays int64, the value intact
    out = sorted_rows(raw.copy())
    assert out["seq"].dtype == np.int32 and out["nbytes"].dtype == np.int32 and out["start_ns"].dtype == np.int64
    ops = prepare_ops(out)
    assert ops.nbytes.dtype == np.int32 and np.shares_memory(ops.nbytes, out["nbytes"].to_numpy())  # no copy
    np.testing.assert_array_equal(ops.nbytes, prepare_ops(raw.copy()).nbytes)
    wide = sorted_rows(big.copy())
    assert wide["nbytes"].dtype == np.int64 and int(wide["nbytes"].max()) == 2**40
    np.testing.assert_array_equal(prepare_ops(wide).nbytes, prepare_ops(big.copy()).nbytes)


def test_dictionary_read_frame_compacts_to_the_string_frame() -> None:
    """Group and op read dictionary-encoded (the dictionary in its own order, values no row uses
    among it) compact to the frame the string columns give: the same categories, sorted."""
    import pandas as pd

    from timeline.columns import read_commops

    trace = Trace.open(TRACE)
    want = sorted_rows(trace.commops(columns=COLUMNS))
    raw = read_commops(trace, COLUMNS)
    for c in ("group", "op"):
        cats = list(raw[c].cat.categories)
        raw[c] = raw[c].cat.set_categories([*reversed(cats), "unused-name"])
    got = sorted_rows(raw)
    pd.testing.assert_frame_equal(got, want)
    for c in ("group", "op"):
        assert got[c].dtype == want[c].dtype and list(got[c].cat.categories) == sorted(set(want[c].astype(str)))


def test_int32_frame_builds_the_keys_an_int64_frame_does() -> None:
    """Codes are held narrow but every key is built in int64: a p2p stream whose ends number
    apart (matched by order within the step, keyed by step x 1e6) in steps where that crosses 2**31
    gives the same instances, pairs and slots from int32 columns as from int64 ones."""
    import pandas as pd

    rows = []
    for i, step in enumerate(range(2145, 2149)):  # (step + 1) x 1e6 crosses 2**31
        t = step * 10_000_000
        rows.append({"rank": 0, "group": "pp-0", "op": "send", "seq": i, "peer": 1, "nbytes": 8, "start_ns": t,
                     "end_ns": t + 1000, "step": step})
        rows.append({"rank": 1, "group": "pp-0", "op": "recv", "seq": 100 + i, "peer": 0, "nbytes": 8,
                     "start_ns": t + 10, "end_ns": t + 1000, "step": step})
        for r in (0, 1):
            rows.append({"rank": r, "group": "dp-0", "op": "all_reduce", "seq": i, "peer": -1, "nbytes": 64,
                         "start_ns": t + 2000, "end_ns": t + 3000 + r, "step": step})
    wide = pd.DataFrame(rows).astype({c: np.int64 for c in ("rank", "seq", "peer", "nbytes", "step")})
    narrow = sorted_rows(wide.copy())
    narrow = narrow.astype({c: np.int32 for c in ("rank", "seq", "peer", "nbytes", "step")})
    got, ref = prepare_ops(narrow), prepare_ops(sorted_rows(wide.copy()).astype({"seq": np.int64, "step": np.int64}))
    assert got.step.dtype == np.int32 and got.rank.dtype == np.int32
    for name in ROW_ARRAYS + INST_ARRAYS:
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
    assert got.n_inst == 8 and (got.inst_size == 2).all()  # each send met its recv, by order within its step


def test_history_matrix_by_chunks_equals_the_sorted_codes_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slots x steps matrix filled chunk by chunk through a step table equals the one the
    widely-spread-steps path builds from sorted step codes, with a keep mask and a step subset,
    and at a chunk smaller than the rows."""
    import dataclasses

    from localize.ops import history, table

    ops = prepare_ops(sorted_rows(Trace.open(TRACE).commops(columns=COLUMNS)))
    rng = np.random.default_rng(5)
    e = rng.random(len(ops.step))
    keep = rng.random(len(ops.step)) > 0.2
    steps = np.unique(ops.step)
    use = table.in_steps(ops, steps[1::2])
    spread = dataclasses.replace(ops, step=ops.step.astype(np.int64) * 10_000_000)
    want = history._history_matrix(spread, e, use, keep)
    monkeypatch.setattr(history, "_CHUNK", 1000)
    got = history._history_matrix(ops, e, use, keep)
    assert got.shape == want.shape == (int(ops.slot.max()) + 1, len(steps[1::2]))
    np.testing.assert_array_equal(got, want)


def test_idle_gaps_by_chunks_of_ranks_equal_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gaps computed a chunk of whole ranks at a time (chunks far smaller than the rows, ranks
    cut at their first row) are the one-pass gaps bit for bit."""

    df = sorted_rows(Trace.open(TRACE).commops(columns=COLUMNS))
    rank, start, end = (df[c].to_numpy(np.int64) for c in ("rank", "start_ns", "end_ns"))
    want = table._idle_gaps(rank, start, end)
    for chunk in (1, 97, 5000):
        monkeypatch.setattr(table, "_RANK_CHUNK", chunk)
        got = table.idle_gaps(rank, start, end)
        assert got.tobytes() == want.tobytes()


def test_rank_step_compute_by_chunks_of_ranks_is_bincount_over_every_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank x step compute summed a chunk of whole ranks at a time is the sum over all rows' gaps,
    bit for bit (each rank's rows are added in row order, as bincount adds them), and every
    operator's elapsed, computed on use from the frame's times, is end - start in seconds."""

    ops = prepare_ops(Trace.open(TRACE).commops(columns=COLUMNS))
    steps = np.unique(ops.step)
    world = int(ops.rank.max()) + 3  # (ranks that logged nothing: zero rows)
    cell = ops.rank.astype(np.int64) * len(steps) + np.searchsorted(steps, ops.step)
    want = np.bincount(cell, weights=ops.gap, minlength=world * len(steps)).reshape(world, len(steps))
    for chunk in (1, 97, 1 << 18):
        monkeypatch.setattr(table, "_RANK_CHUNK", chunk)
        got = table.rank_step_compute(ops, world, steps)
        assert got.tobytes() == want.tobytes()
    assert (want[:-2] > 0).any() and not want[-2:].any()
    raw = ops.df["end_ns"].to_numpy(np.int64) - ops.df["start_ns"].to_numpy(np.int64)
    assert ops.elapsed.tobytes() == (np.maximum(raw.astype(np.float64), 0) * 1e-9).tobytes()


@pytest.mark.parametrize("spread", [1_000, 3 * 10**9])
@pytest.mark.parametrize("longest", [10**6, 3 * 10**9])
def test_row_times_give_back_every_start_and_end(spread: int, longest: int) -> None:
    """Starts held as int32 offsets within a rank's blocks of rows and ends as int32 durations,
    or in int64 where some block spans or some operator lasts 2 s or more: the same int64 times."""
    rng = np.random.default_rng(5)
    rank = np.repeat(np.arange(3, 10, dtype=np.int32), [1, 63, 64, 65, 200, 7, 130])
    start = np.concatenate([np.sort(rng.integers(10**15, 10**15 + spread * 200, size=k))
                            for k in np.bincount(rank - 3)])
    end = start + rng.integers(-5, longest, size=len(start))
    first = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    times = RowTimes.of(start, end, rank, first)
    assert (times.base is not None) == (spread == 1_000)
    assert times.dur.dtype == (np.int32 if longest < 2**31 else np.int64)
    np.testing.assert_array_equal(times.start(), start)
    np.testing.assert_array_equal(times.end(), end)
    rows = rng.permutation(len(start))[:100]
    np.testing.assert_array_equal(times.start(rows), start[rows])
    np.testing.assert_array_equal(times.bounds(slice(70, 300))[1], end[70:300])


def test_a_post_right_after_an_open_operator_ended_waited_for_it() -> None:
    """Rank 4 of a real gloo job (ms): a reduce-scatter posted at 442 and left open, a send at 443
    that ended at once, then the all-gather 0.06 ms after the reduce-scatter ended at 871 (its slow
    peer arrived late): the step's end waited on it, no compute before the all-gather (read as
    429 ms). A row left open whose end nothing waited on (an irecv posted ahead, ended 20 ms before
    the next post) holds the rank only until the next post: the rank went on working."""
    ms = 1_000_000
    start = np.array([442 * ms, 443 * ms, 871 * ms + 60_000, 900 * ms])
    end = np.array([871, 443, 885, 905]) * ms
    gap = table._idle_gaps(np.zeros(4, dtype=np.int64), start, end)
    assert gap[2] == pytest.approx(60e-6) and gap[3] == pytest.approx(0.015)
    start = np.array([0, 10, 500]) * ms
    end = np.array([480, 12, 510]) * ms
    gap = table._idle_gaps(np.zeros(3, dtype=np.int64), start, end)
    assert gap[2] == pytest.approx(0.488)
