"""Step judgement on noisy jobs, and clock offsets that a fault-time sample would mislead."""

from __future__ import annotations

import numpy as np
import pandas as pd

from timeline.steps import (
    calm_delta,
    consistent_samples,
    durations_from_bounds,
    first_step_whole,
    judge_steps,
    judge_window,
    level_shift,
    settle,
    step_noise,
)


def _durations(sigma: float, fault: slice, factor: float, n: int = 60, seed: int = 3) -> pd.Series:
    d = 0.05 * (1 + np.random.default_rng(seed).normal(0, sigma, n))
    d[fault] *= factor
    return pd.Series(d, index=pd.RangeIndex(n, name="step"))


def test_noise_is_not_irregular_but_a_fault_is() -> None:
    """A job whose steps vary by 15% (a busy shared host) with a 5x fault in steps 20-29."""
    table = judge_steps(_durations(0.15, slice(20, 30), 5.0))
    assert table.loc[table["irregular"], "step"].tolist() == list(range(20, 30))


def test_quiet_jobs_keep_holmes_delta() -> None:
    """At 1% noise, δ = 1.1 still decides: a 1.2x slowdown is irregular."""
    table = judge_steps(_durations(0.01, slice(20, 30), 1.2))
    assert table.loc[table["irregular"], "step"].tolist() == list(range(20, 30))


def test_onset_is_where_the_lasting_slowdown_starts_not_a_noisy_step_just_before_it() -> None:
    """The real gloo job from CI: steps 16-17 ran 1.13x (the host was busy), rank 5 computed 2x
    from step 20. Both are one episode (two normal steps apart); its onset is step 20."""
    d = np.array([0.55, 0.34, 0.32, 0.36, 0.32, 0.33, 0.35, 0.32, 0.34, 0.33, 0.32, 0.33, 0.36, 0.35, 0.34,
                  0.33, 0.38, 0.38, 0.34, 0.34] + [0.51, 0.52, 0.52, 0.52, 0.53, 0.52, 0.55, 0.53] * 2 + [0.53] * 4)
    table, _, onset = settle(judge_steps(pd.Series(d, index=pd.RangeIndex(len(d), name="step"))))
    assert table.loc[table["irregular"], "step"].min() <= 20
    assert onset == 20


def test_a_short_first_step_is_no_baseline() -> None:
    """The first logged step is measured from its own first operator (with sampled steps and an
    overlapped parameter all-gather it misses the gather launched before it): 10% short, it must
    not make every later step irregular."""
    d = np.r_[0.0818, np.full(10, 0.0910) + np.random.default_rng(5).normal(0, 0.0008, 10)]
    table = judge_steps(pd.Series(d, index=pd.RangeIndex(len(d), name="step")))
    assert not table["irregular"].any()


def test_a_whole_first_step_is_a_baseline_where_it_is_the_only_normal_one() -> None:
    """Every second or third step logged, a 2.15x switch from the second of them: the first held
    all its operators, 30% faster than every later step. Left out as a logger's partial step, it
    left every step normal; a first step short of operators still is no baseline."""
    d = np.r_[0.0825, np.full(10, 0.1155) + np.random.default_rng(7).normal(0, 0.0008, 10)]
    durations = pd.Series(d, index=pd.Index([3, 5, 8, 10, 12, 15, 17, 19, 21, 24, 26], name="step"))
    assert not judge_steps(durations)["irregular"].any()
    table = judge_steps(durations, first_whole=True)
    assert table.loc[table["irregular"], "step"].tolist() == durations.index[1:].tolist()
    # 4 ranks x 3 steps of 5 operators; a logger that started mid-step saw 2 of the first's
    rank = np.repeat(np.arange(4), 15)
    step = np.tile(np.repeat([3, 5, 8], 5), 4)
    assert first_step_whole(step, rank, 3, 3)
    cut = ~((step == 3) & (np.tile(np.arange(15), 4) < 3))
    assert not first_step_whole(step[cut], rank[cut], 3, 3)


def test_the_first_sampled_step_gets_the_pause_before_it_like_the_others() -> None:
    """Steps 3, 5, 8 logged, each 100 ms from its first operator to its last, with a 10 ms pause
    (an overlapped all-gather) before each step of a run of consecutive steps: every sampled one,
    the first too, lasts 110 ms."""
    steps = np.array([3, 5, 8, 9, 10])
    begin = np.array([[0.0, 300.0, 600.0, 710.0, 820.0]])
    end = begin + 100.0
    assert durations_from_bounds(steps, begin, end)[0].tolist() == [110.0] * 5


def test_step_noise_ignores_a_level_shift() -> None:
    quiet = _durations(0.01, slice(0, 0), 1.0).to_numpy()
    shifted = _durations(0.01, slice(30, 60), 3.0).to_numpy()
    assert abs(step_noise(shifted) - step_noise(quiet)) < 0.01


def test_a_misled_offset_sample_is_left_out() -> None:
    steps = np.array([0.0, 10, 20, 30, 40])
    drift = np.column_stack([np.zeros(5), 5e6 + 2e5 * steps])  # host 1: 5 ms ahead, drifting
    misled = drift.copy()
    misled[2, 1] += 55e6  # a fault step: host 1's copies ended early
    keep = consistent_samples(steps, misled)
    assert keep[:, 0].all() and keep[:, 1].tolist() == [True, True, False, True, True]
    assert consistent_samples(steps, drift).all()


def test_a_level_shift_over_the_last_third_survives_the_outlier_clipping() -> None:
    """A quiet series that moves up 1.58x for its last 15 of 39 steps (a rank's compute over its
    peers', slowed from step 25): clipped around the global median, the new level was clipped
    to a few percent and lost; a lone spike is still clipped."""
    rng = np.random.default_rng(3)
    x = 1 + 0.005 * rng.standard_normal(39)
    x[24:] *= 1.58
    x[6] *= 1.8  # a spike before the shift
    assert level_shift(x, 1.15) == 24
    y = 1 + 0.005 * rng.standard_normal(39)
    y[30] *= 3.0
    assert level_shift(y, 1.15) is None


def test_a_shift_just_over_delta_after_a_warm_up_is_one_fault() -> None:
    """An independent generator's NIC: three warm-up steps at 2.5x, then the steps move 1.11x up
    from step 17 to the end, in 1.5% noise. The warm-up lifted the level the shift was measured
    from, so only the δ-rule's scattered half of the new level's steps were irregular, the rest
    taught the localizer the fault as normal; every step of the new level is in it."""
    rng = np.random.default_rng(5)
    d = 0.246 * (1 + 0.015 * rng.standard_normal(38))
    d[:3] *= 2.5
    d[17:] *= 1.11
    table = settle(judge_steps(pd.Series(d, index=pd.RangeIndex(38, name="step"))))[0]
    flagged = table.loc[table["irregular"], "step"].tolist()
    assert flagged[0] == 17 and len(flagged) >= 19 and set(flagged) <= set(range(17, 38))


def test_a_fault_on_in_every_other_step_is_not_taken_for_noise() -> None:
    """On/off every other step to the end makes every successive difference large; the steps two
    apart stay as close as the job's noise, so δ is not widened and the slow steps are irregular."""
    rng = np.random.default_rng(7)
    d = 0.25 * np.exp(rng.normal(0, 0.02, 29))
    d[7::2] *= 1.55
    table, _, onset = settle(judge_steps(pd.Series(d, index=np.arange(29))))
    assert table["irregular"].to_numpy().nonzero()[0].tolist() == list(range(7, 29, 2))
    assert onset == 7
    assert step_noise(d) < 0.05


def test_a_real_gpu_on_and_off_from_half_way_is_told_from_noise() -> None:
    """A real HSDP job (ms), rank 2 on and off at 1.7x from step 14: its on-steps 1.1-1.2x, the
    steps after them short by what those overran, the calm steps before within ±4%. Successive
    steps differ 2.8x as much as steps two apart: that is the fault's swing, not noise (taken as
    noise, δ was 1.5 and the job "healthy", while the summaries' 3.9x named the GPU)."""
    d = np.array([302.0, 301.2, 292.4, 280.7, 287.3, 280.3, 257.9, 290.4, 281.8, 275.7, 271.9, 288.3, 304.2,
                  274.0, 319.2, 245.3, 328.9, 247.6, 309.4, 238.6, 302.9, 236.1, 300.4, 248.5, 330.0, 236.5,
                  311.3, 234.9, 306.9, 257.9, 312.5, 236.0, 310.3, 225.6, 289.6, 219.1]) * 1e-3
    table, _, _ = judge_window(pd.Series(d, index=pd.Index(range(len(d)), name="step")))
    flagged = set(table.loc[table["irregular"], "step"])
    assert {24, 26, 28, 30, 32} <= flagged <= set(range(14, len(d), 2))


def test_a_fault_on_at_random_at_a_varying_level_is_judged_against_the_quiet_steps() -> None:
    """A link at random on in half the sampled steps (a simulated batched job, logged steps 0, 2,
    4, 7, ...), its steps 1.37-1.77x at 82 ms: their swings are no noise of the job, whose normal
    steps agree within 1%, so δ stays tight and every slow step is irregular from the first."""
    steps = [0, 2, 4, 7, 9, 11, 17, 19, 21, 23, 26]
    d = np.array([82.2, 82.5, 81.8, 112.9, 82.7, 119.0, 125.8, 145.7, 101.6, 97.1, 135.1]) * 1e-3
    table, _, onset = judge_window(pd.Series(d, index=pd.Index(steps, name="step")))
    flagged = table.loc[table["irregular"], "step"].tolist()
    assert {7, 11, 17, 19, 26} <= set(flagged) and onset == 7
    assert calm_delta(d, 1.1) < 1.15 < 1.0 + 4 * step_noise(d)


def test_a_fault_on_and_off_to_the_end_stands_above_a_tight_level() -> None:
    """Every second step logged, a link on and off from step 8 (1.1-1.3x, one off-step at 24):
    before, all steps' noise widened δ to 1.52 and the job read healthy."""
    d = np.array([131.2, 140.8, 140.4, 140.8, 188.3, 194.8, 171.4, 205.6, 160.9, 190.1, 166.0, 194.6, 144.5,
                  158.9]) * 1e-3
    table, _, onset = judge_window(pd.Series(d, index=pd.Index(range(0, 28, 2), name="step")))
    assert {8, 10, 14, 18, 22} <= set(table.loc[table["irregular"], "step"]) and onset == 8


def test_a_healthy_jobs_noise_keeps_its_width() -> None:
    """Unimodal noise, symmetric or skewed, leaves no gap wide enough for two levels: δ is the
    one all steps give in all but a few draws in a hundred."""
    rng = np.random.default_rng(11)
    changed = 0
    for sigma in (0.03, 0.05, 0.1, 0.15):
        for _ in range(100):
            x = rng.normal(0, sigma, 30)
            for d in (0.1 * (1 + x), 0.1 * np.exp(x)):
                changed += calm_delta(d, 1.1) != max(1.1, 1.0 + 4 * step_noise(d))
    assert changed <= 4


def test_episodes_are_counted_in_logged_steps_when_steps_are_sampled() -> None:
    """A sampling logger wrote steps 0, 4, 5, ... 45; a fault from step 13 shows first at 14 and
    17, which are the next logged steps after 10 although more than EPISODE_GAP numbers apart."""
    steps = [0, 4, 5, 6, 7, 8, 10, 14, 17, 24, 25, 27, 31, 33, 35, 36, 41, 43, 45]
    rng = np.random.default_rng(5)
    d = 0.355 * np.exp(rng.normal(0, 0.015, len(steps)))
    d[0] = 0.78  # warm-up
    slow = np.asarray(steps) >= 13
    d[slow] *= 1.47
    table, _, onset = settle(judge_steps(pd.Series(d, index=pd.Index(steps, name="step"))))
    assert onset == 14
    assert set(table.loc[table["irregular"], "pattern"]) == {"persistent"}


def test_two_steps_far_beyond_a_quiet_jobs_noise_are_irregular_one_is_a_blip() -> None:
    """Steps that repeat within 2%: two steps in a row at 1.19x are a spike; one alone (as a real
    healthy gloo run's last step at 1.15x) stays noise."""
    rng = np.random.default_rng(11)
    d = 0.125 * np.exp(rng.normal(0, 0.02, 33))
    pair, blip = d.copy(), d.copy()
    pair[14:16] *= 1.19
    blip[32] *= 1.19
    table, _, onset = settle(judge_steps(pd.Series(pair, index=np.arange(33))))
    assert table["irregular"].to_numpy().nonzero()[0].tolist() == [14, 15] and onset == 14
    table, _, onset = settle(judge_steps(pd.Series(blip, index=np.arange(33))))
    assert not table["irregular"].any() and onset is None


def test_one_step_far_beyond_a_tight_jobs_noise_is_a_spike_not_a_blip() -> None:
    """A fault's spike seen in one sampled step (the independent generator's NIC at 1.25x, its
    steps within 0.5%) is irregular; the same step where steps vary by 3% (9σ) stays noise, and so
    does a real job's blip of 1.15x among steps within 0.5%."""
    rng = np.random.default_rng(5)
    tight, loose = (0.4 * np.exp(rng.normal(0, s, 20)) for s in (0.005, 0.03))
    blip = tight.copy()
    blip[6] *= 1.15
    table, _, onset = settle(judge_steps(pd.Series(blip, index=3 * np.arange(20))))
    assert not table["irregular"].any() and onset is None
    tight[6] *= 1.25
    loose[6] *= 1.25
    table, _, onset = settle(judge_steps(pd.Series(tight, index=3 * np.arange(20))))
    assert table["irregular"].to_numpy().nonzero()[0].tolist() == [6] and onset == 18
    assert table.loc[6, "pattern"] == "spike"
    table, _, onset = settle(judge_steps(pd.Series(loose, index=3 * np.arange(20))))
    assert not table["irregular"].any() and onset is None


def test_a_lone_step_is_held_against_the_other_steps_spread_not_their_differences() -> None:
    """Each step's end measured with 1% noise is the next step's start: successive differences
    then swing √3 times wider than the steps themselves spread, and a link's lone 1.23x step
    (14σ of the other steps, as on the independent generator with a sampling logger) read as
    noise at 9σ of those differences. A step at 1.15x stays a blip."""
    rng = np.random.default_rng(6)
    ends = np.cumsum(np.full(22, 0.29)) + rng.normal(0, 0.0029, 22)
    d = np.diff(ends)
    assert step_noise(d) > 1.5 * 1.4826 * np.median(np.abs(d / np.median(d) - 1))
    spike, blip = d.copy(), d.copy()
    spike[9] *= 1.23
    blip[9] *= 1.15
    table, _, onset = settle(judge_steps(pd.Series(spike, index=np.arange(21))))
    assert table["irregular"].to_numpy().nonzero()[0].tolist() == [9] and onset == 9
    table, _, onset = settle(judge_steps(pd.Series(blip, index=np.arange(21))))
    assert not table["irregular"].any() and onset is None


def test_one_step_of_noise_after_the_warm_up_leaves_it_warm_up() -> None:
    """A real overlapped gloo job (a GPU 2x from step 20): step 0 ran 1.37 s, step 2 1.10x its
    baseline. The blip made the warm-up a slow episode of steps 0-2, and the onset read 2."""
    d = np.array([1.37, 0.3375, 0.3686, 0.3134, 0.3307, 0.3249] + [0.335] * 14 + [0.51] * 20)
    d[6:20] *= np.exp(np.random.default_rng(3).normal(0, 0.015, 14))
    _, warm, onset = settle(judge_steps(pd.Series(d, index=np.arange(40))))
    assert warm == [0] and onset == 20


def test_a_fault_two_sampled_steps_after_the_warm_up_leaves_it_warm_up() -> None:
    """An independent generator's sampling logger (40% of steps): warm-up in steps 0-2 at 1.6x,
    steps 3 and 6 normal, then a data fault 2x from step 9. The fault's first step among the
    three after the warm-up made the warm-up part of it: "since step 0"."""
    steps = np.array([0, 1, 2, 3, 6, 9, 11, 12, 20, 23, 26, 30, 33, 34, 37, 40, 42, 43, 45, 46])
    d = 0.21 * np.exp(np.random.default_rng(7).normal(0, 0.01, len(steps)))
    d[:3] *= 1.62
    d[5:] *= 2.0
    _, warm, onset = settle(judge_steps(pd.Series(d, index=steps)))
    assert warm == [0, 1, 2] and onset == 9
    d[3] *= 2.0  # a fault right after the first steps: no warm-up to call them
    _, warm, onset = settle(judge_steps(pd.Series(d, index=steps)))
    assert warm == [] and onset == 0


def test_a_warm_up_decayed_then_one_normal_step_then_a_fault_is_warm_up() -> None:
    """Every third step logged (independent generator, seed 10): warm-up 1.85x then 1.12x, step 6
    normal, a link 1.3-1.55x from step 9. One normal step is too few to call the block warm-up by
    itself, but the block had decayed to a quarter of the fault's level: "since step 0" was wrong.
    A block at the fault's own level stays the fault's first steps."""
    steps = np.arange(0, 60, 3)
    d = np.array([231.1, 139.6, 125.1, 159.7, 192.8, 186.2, 193.4, 188.5, 191.4, 193.1, 188.4, 187.8, 193.0,
                  195.5, 189.6, 194.1, 192.6, 188.0, 188.6, 187.5]) * 1e-3
    _, warm, onset = settle(judge_steps(pd.Series(d, index=steps)))
    assert warm == [0, 3] and onset == 9
    d[1] = 190e-3  # the block at the fault's level
    _, warm, onset = settle(judge_steps(pd.Series(d, index=steps)))
    assert warm == [] and onset == 0


def test_a_short_step_right_after_a_slow_one_does_not_set_the_baseline() -> None:
    """The summaries of a NIC on at random (independent generator seed 13131, job 45): its 1.45x
    step 6 was followed by a 0.84x one, the rest of the first steps at 1.0x. Seeded from that one
    short step, the baseline never learned the normal level: every normal step read 1.2x, "since
    step 1", a host named. A fault from the first step after the warm-up is still caught."""
    d = np.array([0.386994, 0.414656, 0.192016, 0.186413, 0.183294, 0.184738, 0.226623, 0.155936, 0.187785,
                  0.184251, 0.187338, 0.180935, 0.229893, 0.193856, 0.154000, 0.188266, 0.186207, 0.188143,
                  0.228620, 0.153080, 0.227508, 0.152343, 0.190850, 0.187038, 0.183542])
    table = judge_steps(pd.Series(d, index=np.arange(25)))
    irregular = set(table.loc[table["irregular"], "step"].astype(int))
    assert irregular <= {0, 1, 6, 12, 18, 20} and {6, 12, 18, 20} <= irregular, sorted(irregular)
    d[2:] = np.where(np.arange(2, 25) >= 3, 1.5 * 0.186, 0.186)  # one normal step, then a fault
    table = judge_steps(pd.Series(d, index=np.arange(25)))
    assert table["irregular"].to_numpy()[3:].all()


def test_a_lone_fast_step_under_the_normal_level_does_not_set_the_baseline() -> None:
    """A real MoE job (bench.realjobs --moe --network --seed 2, run 1): its third step ran 0.85x the
    fifteen after it, the baseline was that one step, and every normal step read 1.15-1.26x, 33 of
    36 steps "fluctuation" before a rack uplink slowed the job 3x from step 18."""
    d = np.array([0.857, 0.4499, 0.3839, 0.4403, 0.4467, 0.4807, 0.4573, 0.4538, 0.4583, 0.4442, 0.4528, 0.4577,
                  0.467, 0.4847, 0.4824, 0.4465, 0.4376, 0.4517, 1.5957, 1.5034, 1.4385, 1.6454, 1.4199, 1.4759,
                  1.4378, 1.4078, 1.4424, 1.4013, 1.4798, 1.4339, 1.3955, 1.3562, 1.3965, 1.3758, 1.3655, 1.3773])
    table, _, onset = settle(judge_steps(pd.Series(d, index=np.arange(36))))
    assert onset == 18 and table.loc[table["irregular"], "step"].tolist() == list(range(18, 36))
    assert set(table.loc[table["irregular"], "pattern"]) == {"persistent"}


def test_a_warm_up_far_above_a_fault_one_normal_step_later_is_warm_up() -> None:
    """A sampling logger (40% of steps, independent generator seed 13232 job 42): the first two
    logged steps ran 1.92x and 1.84x, step 7 normal, then a link at 1.4x from step 22. Neither the
    warm-up nor its tail had decayed, so it read as the fault's first episode, "since step 0", and
    the warm-up's operators were judged as the link's: a tie of two switches. A block twice as far
    above normal as every later slow step is no step of that fault; one at the fault's level is."""
    steps = np.array([0, 1, 7, 22, 25, 31, 32, 35, 38, 39, 42, 43, 45, 47, 48])
    d = np.array([368.8, 354.7, 192.3, 264.5, 271.4, 198.0, 268.9, 192.0, 267.9, 272.3, 278.5, 271.0,
                  271.3, 266.6, 193.8]) * 1e-3
    table, warm, onset = settle(judge_steps(pd.Series(d, index=steps)))
    assert warm == [0, 1] and onset == 22 and not table["irregular"].to_numpy()[:3].any()
    d[:2] = 270e-3  # the block at the fault's level
    _, warm, onset = settle(judge_steps(pd.Series(d, index=steps)))
    assert warm == [] and onset == 0


def test_a_warm_up_fading_over_five_steps_is_warm_up_a_block_holding_its_level_is_not() -> None:
    """A real gloo run on a loaded machine (CI): its first steps ran 2.0x, 1.31x, 1.26x, 1.15x, 1.15x
    of the rest, five slow steps where the rule allows four, and the summary path read them as a
    fault since step 1. They fade step by step to a fraction of where they began: warm-up. Five
    steps that hold one level are a fault's first steps."""
    rng = np.random.default_rng(13)
    d = 0.54 * np.exp(rng.normal(0, 0.01, 40))
    d[:5] = [1.09, 0.71, 0.68, 0.62, 0.62]
    table, warm, onset = settle(judge_steps(pd.Series(d, index=np.arange(40))))
    assert warm == [0, 1, 2, 3, 4] and not table["irregular"].any() and onset is None
    d[:5] = 0.54 * 1.3
    table, warm, onset = settle(judge_steps(pd.Series(d, index=np.arange(40))))
    assert warm == [] and onset == 0


def test_a_warm_ups_decaying_tail_step_is_warm_up_a_fourth_full_slow_step_is_not() -> None:
    """An independent generator's job as its hosts' clocks measured it: steps 0-2 at 2.3-2.5x and
    step 3 at 1.33x (the warm-up's spill into the next step), five normal steps, then a data fault
    at 1.43x from step 9 to the end. The four-step block was no warm-up, and the onset read 0."""
    d = np.r_[[2.30, 2.45, 2.54, 1.33], 1.0 + 0.02 * np.sin(np.arange(5)), [1.43] * 30] * 0.2
    _, warm, onset = judge_window(pd.Series(d, index=pd.RangeIndex(len(d), name="step")))
    assert warm == [0, 1, 2, 3] and onset == 9
    d[3] = 0.2 * 2.2  # a fourth step as slow as the others is more than a warm-up's tail
    _, warm, onset = judge_window(pd.Series(d, index=pd.RangeIndex(len(d), name="step")))
    assert warm == [] and onset == 0


def test_a_fault_on_and_off_starts_at_its_first_slow_step_however_short_the_first_episode() -> None:
    """Every third step logged, a NIC slow now and then from step 27: its first slow logged step
    stands alone, four normal logged steps before the next (42). Alone it lost a sixth of
    the time lost, and was taken for a blip before the fault: onset 42. It lost as much as the
    fault's other steps each; a blip of noise loses far less (the test above)."""
    steps = np.arange(0, 60, 3)
    d = 0.575 * (1 + 0.01 * np.sin(steps))
    d[0] = 1.41
    slow = np.isin(steps, [27, 42, 48, 51, 54, 57])
    d[slow] *= 1.18
    _, _, onset = settle(judge_steps(pd.Series(d, index=pd.Index(steps, name="step"))))
    assert onset == 27


def test_steps_just_before_the_onset_over_delta_are_the_faults_first() -> None:
    """The independent generator's seed 9494 job 49: a NIC on at random from step 8 (1.15x, 1.14x,
    then 1.16-1.23x in most steps). The fault's own swings widened δ to 1.16, so steps 8 and 9
    were left normal and the onset read 10."""
    d = [0.5427, 0.5408, 0.2982, 0.2906, 0.2837, 0.2959, 0.2957, 0.2917, 0.3367, 0.3359, 0.3436, 0.3426, 0.349,
         0.289, 0.3451, 0.3492, 0.2831, 0.3422, 0.2903, 0.3438, 0.3497, 0.3574, 0.3417, 0.2974, 0.3521, 0.2904, 0.2964]
    table, warm, onset = judge_window(pd.Series(d, index=np.arange(len(d))))
    assert warm == [0, 1] and onset == 8
    assert table.loc[table["step"].isin([8, 9]), "irregular"].all()


def test_a_slowdown_mostly_under_delta_is_one_episode_with_its_steps_over_delta() -> None:
    """A link on for six steps at 1.05-1.14x over steps within 0.5% (the matrix's batched link,
    seed 3737): two steps over δ lost too little to be more than noise alone; with the four between
    them, each far beyond the noise, it is one slowdown from its first step. A blip over δ and one
    step after it over the noise is not."""
    rng = np.random.default_rng(8)
    d = 0.27 * np.exp(rng.normal(0, 0.005, 16))
    run = d.copy()
    run[6:12] *= np.array([1.12, 1.05, 1.06, 1.05, 1.08, 1.14])
    table, _, onset = settle(judge_steps(pd.Series(run, index=np.arange(16))))
    assert table["irregular"].to_numpy().nonzero()[0].tolist() == list(range(6, 12)) and onset == 6
    blip = d.copy()
    blip[6:8] *= np.array([1.14, 1.05])
    table, _, onset = settle(judge_steps(pd.Series(blip, index=np.arange(16))))
    assert not table["irregular"].any() and onset is None


def test_a_steady_drift_after_one_slow_step_is_not_a_sustained_slowdown() -> None:
    """Every second step logged, the job 0.2% slower each logged step, a link slow in one of them
    (1.21x): the steps after it sat 1-1.6% over the rolling median that trails the drift, beyond
    the steps' noise, and the whole drift read as one slowdown with the spike. Over the drift's own
    level they are normal; a real run of mild slow steps on top of it still is one."""
    steps = np.arange(1, 29, 2)
    d = np.array([0.187361, 0.187781, 0.188641, 0.189086, 0.189253, 0.191231, 0.230887, 0.192110, 0.191719,
                  0.192569, 0.192622, 0.193380, 0.193450, 0.193465])  # (the matrix's eager link, seed 3838)
    table, _, onset = settle(judge_steps(pd.Series(d, index=pd.Index(steps, name="step"))))
    assert table.loc[table["irregular"], "step"].tolist() == [13] and onset == 13
    d[7:10] *= np.array([1.06, 1.05, 1.07])
    table, _, onset = settle(judge_steps(pd.Series(d, index=pd.Index(steps, name="step"))))
    assert table.loc[table["irregular"], "step"].tolist() == [13, 15, 17, 19] and onset == 13


def test_a_lasting_shift_under_delta_is_no_drift() -> None:
    """A 2.5x NIC from step 4 that slowed the steps 1.08x for good (matrix seed 3939, eager sends):
    a line through the normal steps on both sides of its first, slowest steps reads the shift as a
    drift, and left them noise. The drift is taken from the steps before a run; and the run lasts
    while the steps stay over it, where the rolling baseline had learned the new level as normal."""
    d = np.array([0.164807, 0.165842, 0.165980, 0.165063, 0.187123, 0.179030, 0.183914, 0.180640, 0.180504,
                  0.183946, 0.180895, 0.178369, 0.181168, 0.180294, 0.177356, 0.178580])
    table, _, onset = settle(judge_steps(pd.Series(d, index=pd.RangeIndex(len(d), name="step"))))
    assert table.loc[table["irregular"], "step"].tolist() == list(range(4, 16)) and onset == 4


def test_steps_before_a_shift_that_fills_the_first_window_keep_their_own_baseline() -> None:
    """A 2.15x NIC from the fifth of 14 logged steps: the seed window holds three normal steps
    and seven slow ones, and takes the normal ones for bogus short steps. The shift is found; the
    steps before it are measured against their own level (their baseline had read 235 ms for 110 ms
    steps, and the localizer scaled every operator's normal time by it)."""
    rng = np.random.default_rng(4)
    d = 0.11 * np.exp(rng.normal(0, 0.01, 14))
    d[4:] *= 2.15
    table = judge_steps(pd.Series(d, index=2 * np.arange(14)))
    assert table["irregular"].to_numpy().nonzero()[0].tolist() == list(range(4, 14))
    np.testing.assert_allclose(table["ratio"].to_numpy()[:4], 1.0, atol=0.05)
