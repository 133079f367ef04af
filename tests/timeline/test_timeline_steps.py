"""Step durations on own and aligned clocks, step inference, δ-irregularity and patterns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collector.trace.meta import JobMeta, RankInfo
from tests.timeline.timeline_factory import make_trace
from timeline.build import COLUMNS
from timeline.columns import read_commops
from timeline.steps import (
    classify_patterns,
    infer_steps,
    job_step_durations,
    judge_from_fast_half,
    judge_steps,
    judge_window,
    settle,
    slowdown,
    step_durations_per_rank,
    two_levels,
    widespread_fault,
)

STEPS = [1.0, 1.0, 1.2, 1.0, 2.0, 1.0, 1.0, 1.5, 1.5, 1.5, 1.0, 1.0]
SKEW = {0: 0, 1: 4_000_000_000, 2: -30_000_000, 3: 77_000_000}


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, object]:
    trace = make_trace(tmp_path_factory.mktemp("skew"), {"tp": 2, "pp": 2, "dp": 2}, STEPS, offsets_ns=SKEW)
    return read_commops(trace, COLUMNS), trace.meta


def test_per_rank_durations_are_own_clock_and_ignore_skew(skewed) -> None:
    df, _ = skewed
    per_rank = step_durations_per_rank(df)
    assert per_rank.shape == (len(STEPS), 8)
    # every rank sees the same durations although its host clock is seconds off
    want = np.broadcast_to(np.array(STEPS[:-1])[:, None], (len(STEPS) - 1, 8))
    np.testing.assert_allclose(per_rank.iloc[:-1].to_numpy(), want, rtol=0.01)
    # the last step has no successor: estimated from the rank's usual end-to-next-start gap
    np.testing.assert_allclose(per_rank.iloc[-1].to_numpy(), STEPS[-1], rtol=0.05)


def test_job_durations_on_aligned_clocks(skewed) -> None:
    df, meta = skewed
    d = job_step_durations(df, meta)
    assert list(d.index) == list(range(len(STEPS)))
    np.testing.assert_allclose(d.to_numpy()[1:], STEPS[1:], rtol=0.01)


def test_missing_steps_are_nan_not_merged() -> None:
    df = pd.DataFrame({"rank": [0, 0, 0], "step": [0, 1, 3], "start_ns": [0, 10**9, 3 * 10**9],
                       "end_ns": [5 * 10**8, 15 * 10**8, 35 * 10**8]})
    per_rank = step_durations_per_rank(df)
    assert list(per_rank.index) == [0, 1, 2, 3]
    assert per_rank.loc[0, 0] == pytest.approx(1.0)
    rank0 = per_rank[0]
    assert np.isnan(rank0.loc[1]) and np.isnan(rank0.loc[2])


@pytest.mark.parametrize("dims", [
    {"tp": 2, "pp": 2, "dp": 2},
    {"tp": 2, "cp": 2, "dp": 2},
    {"tp": 4, "pp": 2},                # no data parallelism: the pipeline group anchors the step
    {"dp": 4, "ep": 2, "tp": 2},
    {"dp": 8},
])
def test_infer_steps_recovers_numbering(tmp_path: Path, dims: dict[str, int]) -> None:
    shown = make_trace(tmp_path / "a", dims, STEPS[:8], offsets_ns=SKEW)
    hidden = make_trace(tmp_path / "b", dims, STEPS[:8], offsets_ns=SKEW, hide_steps=True)
    want = read_commops(shown, COLUMNS)
    got = read_commops(hidden, COLUMNS)
    assert (got["step"] == -1).all()
    np.testing.assert_array_equal(infer_steps(got), want["step"].to_numpy())


def test_infer_steps_with_equal_dp_buckets(tmp_path: Path) -> None:
    """Four equal all_reduce buckets per step must not look like four steps."""
    shown = make_trace(tmp_path / "a", {"tp": 2, "dp": 2}, STEPS[:6], dp_buckets=4)
    hidden = make_trace(tmp_path / "b", {"tp": 2, "dp": 2}, STEPS[:6], dp_buckets=4, hide_steps=True)
    np.testing.assert_array_equal(infer_steps(read_commops(hidden, COLUMNS)),
                                  read_commops(shown, COLUMNS)["step"].to_numpy())


def _series(values: list[float]) -> pd.Series:
    return pd.Series(values, index=pd.RangeIndex(len(values), name="step"), name="duration_s")


def test_judge_flags_spike_and_persistent_and_recovers() -> None:
    d = [1.0] * 6 + [2.0] + [1.0] * 5 + [1.5] * 6 + [1.0] * 3
    t = judge_steps(_series(d), delta=1.1)
    assert t.loc[t["irregular"], "step"].tolist() == [6, *range(12, 18)]
    assert t.loc[6, "pattern"] == "spike"
    assert set(t.loc[12:17, "pattern"]) == {"persistent"}
    # the baseline never learned from the degraded steps
    assert t.loc[17, "baseline_s"] == pytest.approx(1.0)
    assert slowdown(t) == pytest.approx(1.5)


def test_judge_absorbs_slow_drift_but_not_a_jump() -> None:
    drift = list(np.linspace(1.0, 1.4, 40))  # +40% over the run, ~1% per step
    t = judge_steps(_series(drift), delta=1.1)
    assert not t["irregular"].any()
    jumped = drift[:30] + [x * 1.3 for x in drift[30:]]
    t = judge_steps(_series(jumped), delta=1.1)
    assert t.loc[t["irregular"], "step"].tolist() == list(range(30, 40))


def test_judge_catches_fault_from_the_second_step() -> None:
    d = [1.0, 1.0] + [1.6] * 10
    t = judge_steps(_series(d), delta=1.1)
    assert t.loc[t["irregular"], "step"].tolist() == list(range(2, 12))


def test_judge_ignores_noise_below_delta() -> None:
    rng = np.random.default_rng(7)
    d = list(1.0 + 0.02 * rng.standard_normal(50))
    assert not judge_steps(_series(d), delta=1.1)["irregular"].any()


def test_judge_handles_missing_steps() -> None:
    t = judge_steps(_series([1.0, 1.0, float("nan"), 1.0, 2.0]), delta=1.1)
    assert t["irregular"].tolist() == [False, False, False, False, True]


def test_patterns() -> None:
    steps = np.arange(30)
    irr = np.zeros(30, dtype=bool)
    ratio = np.ones(30)
    irr[[3]] = True                     # lone spike
    irr[10:16] = True                   # steady run: persistent
    ratio[10:16] = 1.5
    irr[[22, 24, 25, 28]] = True        # on and off: fluctuation
    ratio[[22, 24, 25, 28]] = [1.3, 2.0, 1.2, 1.6]
    p = classify_patterns(steps, irr, ratio)
    assert p[3] == "spike"
    assert set(p[10:16]) == {"persistent"}
    assert set(p[[22, 24, 25, 28]]) == {"fluctuation"}
    assert set(p[~irr]) == {""}


FAULT_OVER_MOST = pd.Series([0.121, 0.1315, 0.1315, 0.30, 0.296, 0.302, 0.302, 0.302, 0.296, 0.296, 0.301, 0.299, 0.2955, 0.2995],
                            index=np.arange(0, 28, 2))  # sampled steps; a fault of 2.3x from step 6 on


def test_a_fault_over_most_steps_leaves_the_first_steps_at_the_normal_baseline() -> None:
    """The faster half of all steps is the fault's level here; the first steps must not keep it
    as their baseline (operators' normal times are scaled by it: every healthy collective
    measured slow, and a NIC fault was blamed on the one switch)."""
    t = judge_from_fast_half(FAULT_OVER_MOST)
    assert t["irregular"].tolist() == [False] * 3 + [True] * 11
    np.testing.assert_allclose(t["baseline_s"], 0.1315)


def test_a_widespread_fault_over_most_steps_is_found_when_the_rolling_baseline_learns_it() -> None:
    """The rolling baseline's first window is the fault's level (the normal steps, under half its
    median, read as mis-cut): `widespread_fault` judges against the steps before it."""
    settled, _, _ = settle(judge_steps(FAULT_OVER_MOST))
    assert not settled["irregular"].any()
    again = widespread_fault(settled, warmup=True)
    assert again is not None
    table, onset = again
    assert table.loc[table["irregular"], "step"].tolist() == list(range(6, 28, 2)) and onset == 6
    assert widespread_fault(table, warmup=True) is None  # nothing more to find


def test_a_healthy_noisy_job_is_left_as_it_is() -> None:
    rng = np.random.default_rng(4)
    d = pd.Series(0.2 * (1 + 0.02 * rng.standard_normal(30)))
    settled, _, _ = settle(judge_steps(d))
    assert widespread_fault(settled, warmup=True) is None
    assert not judge_from_fast_half(d)["irregular"].any()


def test_a_persistent_fault_in_sampled_steps_is_persistent() -> None:
    """Every second step logged: an unbroken run of logged irregular steps is one level, not a
    fluctuation (the steps the logger skipped are not normal steps in between)."""
    steps = np.arange(0, 28, 2)
    irregular = np.r_[np.zeros(3, bool), np.ones(11, bool)]
    got = classify_patterns(steps, irregular, np.where(irregular, 2.28, 1.0))
    assert got[3:].tolist() == ["persistent"] * 11
    gaps = np.r_[np.zeros(3, bool), np.tile([True, False], 5), True]  # normal logged steps in between
    assert set(classify_patterns(steps, gaps, np.where(gaps, 2.28, 1.0))[gaps]) == {"fluctuation"}


# a real gloo run (bench.realjobs --seed 43, run 1): steps drift 1.10-1.14x, then rank 1 computes
# 2.35x from step 12 to the end
DRIFT_THEN_FAULT_MS = [817.2, 628.6, 630.7, 715.5, 691.4, 704.5, 716.3, 671.3, 692.0, 749.2, 739.9, 736.0,
                       1110, 1100, 1100, 1090, 1120, 1080, 1130, 1130, 1100, 1120, 1140, 1160, 1130, 1130,
                       1090, 1080, 1110, 1130, 1090, 1100, 1110, 1120, 1090, 1150]


def test_a_drift_before_a_lasting_fault_leaves_the_fault_persistent() -> None:
    """The onset starts an episode of its own: the drift's slow steps just before it made the
    whole run of the fault's unbroken steps read "fluctuation"."""
    d = pd.Series(np.array(DRIFT_THEN_FAULT_MS) / 1e3, index=np.arange(len(DRIFT_THEN_FAULT_MS)))
    table, _, onset = judge_window(d)
    assert onset == 12
    fault = table[table["step"] >= 12]
    assert fault["irregular"].all() and set(fault["pattern"]) == {"persistent"}
    steps = np.arange(10)
    irregular = np.r_[False, True, True, False, True, np.ones(5, bool)]
    assert classify_patterns(steps, irregular, np.where(irregular, 1.5, 1.0), onset=5)[5:].tolist() == ["persistent"] * 5
    assert set(classify_patterns(steps, irregular, np.where(irregular, 1.5, 1.0))[irregular]) == {"fluctuation"}


def test_a_sampled_step_without_its_predecessor_is_not_stretched_by_overlapping_stages() -> None:
    """No sync at a step's end: stage 1 posts step k's recv 20% of a step before stage 0 ends
    step k-1. A logged step whose predecessor was not logged lasts its span less that overlap,
    as the consecutive logged steps show, so every step reads one period."""
    period = 400_000_000
    rows = []
    for k in (0, 1, 2, 5, 8, 9, 12, 13):
        for rank, start, end in ((0, 0.0, 0.95), (1, -0.2, 0.9)):
            rows.append({"rank": rank, "group": "pp-0", "op": "send" if rank == 0 else "recv", "seq": k,
                         "peer": 1 - rank, "nbytes": 1 << 20, "start_ns": int((k + start) * period) + 10**12,
                         "end_ns": int((k + end) * period) + 10**12, "step": k})
    meta = JobMeta("j", 2, {0: RankInfo("node-0", 0), 1: RankInfo("node-0", 1)})
    d = job_step_durations(pd.DataFrame(rows), meta)
    later = d.drop(index=0)
    assert np.allclose(later.to_numpy(), period / 1e9, rtol=0.01), later.round(3).to_dict()


def test_a_sampled_step_is_not_charged_for_the_unlogged_step_before_it_but_for_its_own() -> None:
    """Every second step logged, no sync at a step's end. Unlogged step 3 held stage 1 half a
    step longer; stage 0 had posted step 4 and waited for it: step 4 itself ran at the normal
    pace, and reads so. In step 6 one rank finished half a step late: that step was slow."""
    period = 400_000_000
    rows = []
    for k in (0, 2, 4, 6, 8):
        for rank in range(4):  # ranks 0 and 2: stage 0 of two pipelines; 1 and 3: their stage 1
            start, end = (0.0, 0.95) if rank % 2 == 0 else (0.05, 0.9)
            held = 0.5 if k == 4 and rank % 2 else 0.0  # how late stage 1 began step 4
            end += 0.5 if k == 4 and rank % 2 == 0 else held  # stage 0 waited for it
            end += 0.5 if (k, rank) == (6, 2) else 0.0
            rows.append({"rank": rank, "group": f"pp-{rank // 2}", "op": "recv" if rank % 2 else "send",
                         "seq": k, "peer": rank ^ 1, "nbytes": 1 << 20,
                         "start_ns": int((k + start + held) * period) + 10**12,
                         "end_ns": int((k + end) * period) + 10**12, "step": k})
    meta = JobMeta("j", 4, {r: RankInfo("node-0", r) for r in range(4)})
    d = job_step_durations(pd.DataFrame(rows), meta)
    normal = d.drop(index=[4, 6]).median()
    assert abs(d[4] / normal - 1) < 0.05 and d[6] / normal > 1.4, d.round(3).to_dict()


def on_and_off(share: float, factor: float, noise: float, seed: int = 7) -> tuple[pd.Series, np.ndarray]:
    """Steps of 0.3 s with `noise` relative jitter; a fault of `factor` on in a random `share` of
    them after the first five (the step numbers it was on in)."""
    rng = np.random.default_rng(seed)
    on = np.r_[np.zeros(5, bool), rng.random(35) < share]
    d = 0.3 * np.where(on, factor, 1.0) * (1 + noise * rng.standard_normal(40))
    return pd.Series(d, index=np.arange(40)), np.flatnonzero(on)


def test_a_fault_on_in_half_the_steps_is_found_though_the_rolling_baseline_learns_it() -> None:
    """On and off at 1.2x with 2.5% jitter: steps at the fault's level just under δ × a baseline
    already lifted are learned as normal, and δ widened by the on/off noise finds nothing."""
    d, on = on_and_off(0.5, 1.2, 0.025)
    settled, _, _ = settle(judge_steps(d))
    assert settled["irregular"].sum() < len(on) // 2
    assert two_levels(d.to_numpy())
    table, _, onset = judge_window(d)
    assert table.loc[table["irregular"], "step"].tolist() == on.tolist() and onset == on[0]


def test_a_fault_in_every_other_step_just_at_delta_is_judged_against_the_lower_level() -> None:
    """A 1.34x GPU in every other step from step 20 ran those steps 1.08-1.10x (the independent
    generator's "alternate" pattern): the rolling baseline and the fast half's both rose to meet
    them, and the job read healthy. Against the lower level, each of them is the fault's."""
    rng = np.random.default_rng(11)
    on = np.r_[np.zeros(20, bool), np.tile([True, False], 10)]
    d = pd.Series(0.26 * np.where(on, 1.105, 1.0) * (1 + 0.012 * rng.standard_normal(40)), index=np.arange(40))
    table, _, onset = judge_window(d)
    assert table.loc[table["irregular"], "step"].tolist() == np.flatnonzero(on).tolist() and onset == 20
    steady = pd.Series(0.26 * (1 + 0.012 * rng.standard_normal(40)), index=np.arange(40))
    assert not judge_window(steady)[0]["irregular"].any()


def test_a_fault_on_and_off_is_dated_from_its_first_step_under_a_swollen_delta() -> None:
    """A host in every other step from step 14 (the independent generator's "alternate"; these are
    the summaries' step times): the fault's swings widened δ to 1.23x, its first step ran 1.22x,
    and the onset read 16. One normal step between two of its steps does not end it."""
    ms = [208.7, 130.1, 137.6, 133.1, 133.8, 133.0, 129.6, 130.8, 131.3, 134.8, 131.2, 131.0, 131.9,
          134.0, 161.3, 133.2, 169.9, 133.2, 171.0, 131.3, 172.6, 133.1, 165.2, 126.5, 170.4, 138.7,
          169.8, 132.6, 179.1, 133.2, 168.1, 129.0]
    table, _, onset = judge_window(pd.Series(np.array(ms) / 1e3, index=np.arange(len(ms))))
    assert onset == 14
    assert table.loc[table["irregular"], "step"].tolist() == list(range(14, len(ms), 2))


@pytest.mark.parametrize("seed", range(5))
def test_noise_and_a_few_blips_are_not_two_levels(seed: int) -> None:
    rng = np.random.default_rng(seed)
    noisy = 0.3 * (1 + 0.06 * rng.standard_normal(40))
    assert not two_levels(noisy)
    blips = 0.3 * (1 + 0.01 * rng.standard_normal(40))
    blips[rng.choice(40, 4, replace=False)] *= 1.3  # a tenth of the steps: spikes, δ's to judge
    assert not two_levels(blips)
    d, _ = on_and_off(0.5, 1.05, 0.005, seed)  # two levels, but under δ apart
    assert not two_levels(d.to_numpy())
    tail = 0.35 * (1 + 0.01 * rng.standard_normal(20))
    tail[:6] *= 1.12  # a warm-up's slow tail: one block, not on and off (a real gloo run)
    assert not two_levels(tail)


def test_a_fault_the_rolling_baseline_found_is_no_second_level() -> None:
    """A NIC throttled 10x from step 16 (a real tc run): the δ-rule finds its steps; the steps it
    left normal are one level of noise, and judging them against their faster half would call the
    slower half of that noise irregular too."""
    rng = np.random.default_rng(3)
    d = 0.3 * (1 + 0.03 * rng.standard_normal(30))
    d[16:25] *= 10
    table, _, onset = judge_window(pd.Series(d, index=np.arange(30)))
    assert table.loc[table["irregular"], "step"].tolist() == list(range(16, 25)) and onset == 16
