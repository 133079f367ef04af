"""Imbalance against peers of the same role: from the first step, or from a later one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.trace.meta import JobMeta, RankInfo
from localize.waits.persistent import (
    first_slow_step,
    imbalance,
    intermittent_start,
    later_onset,
    worker_onset,
)

# 16 ranks, 2 per host: tp 2 within a host, pp 2, dp 4
META = JobMeta("t", 16, {r: RankInfo(f"node-{r // 2}", r % 2) for r in range(16)},
               {**{f"tp-{k}": [2 * k, 2 * k + 1] for k in range(8)},
                **{f"pp-{k}": [k, k + 8] for k in range(8)}})
KINDS = {**{f"tp-{k}": "tp" for k in range(8)}, **{f"pp-{k}": "pp" for k in range(8)}}
STEPS = np.arange(1, 41)


def table(rank: int, factor: float, since: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    comp = 0.2 * (1 + 0.03 * rng.standard_normal((16, len(STEPS))))
    comp *= 1 + 0.1 * rng.standard_normal(len(STEPS))  # the machine's load moves every rank's steps alike
    comp[rank, since <= STEPS] *= factor
    return comp


def test_a_worker_slowed_from_a_later_step_is_named_with_that_step() -> None:
    """The job's step times are too noisy to show a 1.5x rank (real gloo runs on a busy machine);
    its compute beside its peers' in the same steps shows it, and since when."""
    found = imbalance(table(5, 1.5, 21), np.ones(16, bool), STEPS, META, KINDS)
    assert found.units[0].kind == "gpu" and found.units[0].ranks == [5]
    assert found.since is not None and abs(found.since - 21) <= 1
    assert 1.4 < found.ratio[5] < 1.6  # judged on the steps since then


def test_a_worker_slow_from_the_first_step_has_no_later_onset() -> None:
    found = imbalance(table(5, 1.5, 0), np.ones(16, bool), STEPS, META, KINDS)
    assert found.units[0].ranks == [5] and found.since is None


def test_a_first_recorded_step_that_was_normal_dates_the_excess_from_the_next() -> None:
    """Sampled steps whose first logged one was the last normal step (the independent generator's
    seed 9898 job 2: a host 2x from 1007, steps 1005, 1007, 1010, ... logged): that step is left out
    as a possible warm-up, and the host read "from the first step (1005)". Where every stage computed
    there as in the later steps and the device like its peers, it is slow since the next one."""
    comp = table(5, 1.5, 0)
    normal = 0.2 * (1 + 0.03 * np.random.default_rng(8).standard_normal(16))
    assert imbalance(comp, np.ones(16, bool), STEPS, META, KINDS, before=normal).since == 1
    warm_up = normal * 2.0  # every worker longer: the job's warm-up says nothing of the device
    assert imbalance(comp, np.ones(16, bool), STEPS, META, KINDS, before=warm_up).since is None
    slow_there = normal.copy()
    slow_there[5] *= 1.5
    assert imbalance(comp, np.ones(16, bool), STEPS, META, KINDS, before=slow_there).since is None


def test_a_warm_up_logged_before_the_faults_first_step_leaves_it_the_onset() -> None:
    """A sampled log of the warm-up's steps and then the fault's (the independent generator's
    seed 14646 job 66: steps 0 and 1 logged, both warm-up, a host 1.7x from step 6, the next
    logged) read "from the first step": two normal columns are too few for a level shift. The
    warm-up lengthened every worker's compute; the host's ranks led their peers by nothing there."""
    comp = table(5, 1.5, int(STEPS[2]))
    comp[:, :2] *= 2.0
    assert imbalance(comp, np.ones(16, bool), STEPS, META, KINDS).since == STEPS[2]
    always = table(5, 1.5, 0)
    always[:, :2] *= 2.0  # slow in the warm-up too: from the start
    assert imbalance(always, np.ones(16, bool), STEPS, META, KINDS).since is None


def test_a_balanced_job_has_nothing() -> None:
    found = imbalance(table(5, 1.0, 0), np.ones(16, bool), STEPS, META, KINDS)
    assert not found.units and found.since is None


def test_a_devices_onset_comes_from_its_compute_beside_its_peers() -> None:
    """Onset from the device's own excess (the step times moved with the machine's load too)."""
    seen = np.ones(16, bool)
    assert worker_onset(table(5, 1.6, 25), seen, STEPS, META, KINDS, [5]) == 25
    assert worker_onset(table(5, 1.6, 0), seen, STEPS, META, KINDS, [5]) is None  # slow all along: no onset in it
    assert worker_onset(table(5, 1.6, 25), seen, STEPS, META, KINDS, [4]) is None  # a healthy peer has none


def test_a_lone_workers_onset_is_read_beside_the_other_stages_not_the_machines_busy_steps() -> None:
    """One logged rank per stage (one replica, one rank per TP group): against its own stage it
    never moves. The machine was busy in steps 14-19, every rank 1.25x, and the job's slow steps
    ran from 14; the worker's time beside the other stage's steps up at 20 only."""
    seen = np.zeros(16, bool)
    seen[[0, 8]] = True
    busy = table(0, 1.5, 20)
    busy[:, (STEPS >= 14) & (STEPS < 20)] *= 1.25
    assert worker_onset(busy, seen, STEPS, META, KINDS, [0]) == 20
    calm = table(0, 1.0, 0)
    calm[:, (STEPS >= 14) & (STEPS < 20)] *= 1.25
    assert worker_onset(calm, seen, STEPS, META, KINDS, [0]) is None


def test_a_stage_that_slows_mid_run_is_a_device_there_not_the_split_of_layers() -> None:
    """One replica logged one rank per TP group (a real tp4 pp2 dp1 gloo job): each stage has one
    logged worker, so no stage peer to compare with. Stage 0 stepping up at step 21 is no split of
    layers; its worker's growth is time waiting on its unlogged TP peers: those are named, tied."""
    seen = np.zeros(16, bool)
    seen[[0, 8]] = True
    comp = table(0, 1.0, 0)
    waited = np.full_like(comp, 0.01)
    waited[0, STEPS >= 21] += 0.12  # the slow unlogged peer shows as rank 0's lone TP time
    comp[0] += waited[0]
    found = imbalance(comp, seen, STEPS, META, KINDS, waited=waited, peers={0: [1]})
    top = found.units[0]
    assert (top.kind, top.ranks, top.via) == ("gpu", [1], 0), [(u.kind, u.label) for u in found.units]
    assert found.since is not None and abs(found.since - 21) <= 1
    stage = imbalance(comp, seen, STEPS, META, KINDS)  # without knowing the lone time: rank 0's own
    assert stage.units[0].kind == "gpu" and stage.units[0].witnesses == [0]
    comp[0, :] = comp[0, -1]  # slow from the first step: the split of layers
    assert imbalance(comp, seen, STEPS, META, KINDS).units[0].kind == "config"


def test_a_stage_with_more_layers_is_read_on_its_own_compute_not_its_waits_on_unlogged_peers() -> None:
    """One rank logged per TP group: each logged rank also waits in its TP collectives on peers that
    logged nothing, about as long in every stage. Stage 0's 1.45x own compute then reads 1.15x with
    that wait counted, under the bar (a 128-GPU matrix job, "healthy"): its own compute is the layers'.
    The same wait grown on one stage's logged ranks alone is no split of layers."""
    seen = np.zeros(16, bool)
    seen[[0, 2, 4, 6, 8, 10, 12, 14]] = True
    comp = table(0, 1.0, 0)
    comp[:8] *= 1.45
    waited = np.full_like(comp, 0.45)
    found = imbalance(comp + waited, seen, STEPS, META, KINDS, waited=waited, peers={r: [r + 1] for r in range(0, 16, 2)})
    assert found.units and found.units[0].kind == "config" and found.units[0].detail["stage"] == 0
    grown = table(0, 1.0, 0)
    waited_grown = np.full_like(grown, 0.05)
    waited_grown[:8] += 0.1  # stage 0's unlogged peers slower, its logged ranks' own compute as the others'
    found = imbalance(grown + waited_grown, seen, STEPS, META, KINDS, waited=waited_grown,
                      peers={r: [r + 1] for r in range(0, 16, 2)})
    assert not any(u.kind == "config" for u in found.units), [(u.kind, u.label) for u in found.units]


def test_a_devices_first_slow_step_is_one_it_stayed_slow_after_not_a_noisy_warm_up_step() -> None:
    """The warm-up's steps 1-4 were irregular too, and the device was slow in step 1 alone: its
    first slow step is 20. Slow on and off (steps 8, 14, 20-22, 28), its first is still 8."""
    seen = np.ones(16, bool)
    comp = table(5, 2.0, 20)
    comp[5, STEPS == 1] *= 1.6
    assert first_slow_step(comp, seen, STEPS, META, KINDS, [5], [1, 2, 3, 4, *range(20, 41)]) == 20
    on = np.isin(STEPS, [8, 14, 20, 21, 22, 28])
    comp = table(5, 1.0, 0)
    comp[5, on] *= 2.0
    assert first_slow_step(comp, seen, STEPS, META, KINDS, [5], STEPS[on].tolist()) == 8
    assert first_slow_step(comp, seen, STEPS, META, KINDS, [5], [2, 5, 8, 9, 14, 20, 21, 22, 28]) == 8


def test_an_on_and_off_excess_begins_at_its_first_slow_step_after_normal_ones() -> None:
    """No lasting level (slow every other step) yet a clear start: the column, and the slow ones since."""
    rng = np.random.default_rng(0)
    ratio = 1 + 0.02 * rng.standard_normal(30)
    ratio[8::2] += 1.0
    began, slow = intermittent_start(ratio)
    assert began == 8
    assert slow.tolist() == list(range(8, 30, 2))


def test_an_on_and_off_excess_in_sampled_steps_begins_at_its_episode_first_slow_step() -> None:
    """Slow every other step from step 17, 40% of steps logged: the sampled steps right after its
    first slow one (19) were even, so normal. Its first slow step still starts the episode (it read
    "in every step since step 32", a normal step, on the independent generator's seed 8282 job 37)."""
    ratio = 1 + 0.03 * np.random.default_rng(1).standard_normal(16)
    ratio[[6, 10, 12, 13, 14]] += 0.75
    began, slow = intermittent_start(ratio)
    assert began == 6
    assert slow.tolist() == [6, 10, 12, 13, 14]


@pytest.mark.parametrize("first", [0, 1])
def test_an_excess_from_the_first_steps_has_no_later_start(first: int) -> None:
    ratio = np.ones(30)
    ratio[first::2] += 1.0
    assert intermittent_start(ratio)[0] == 0


def test_a_noisy_past_is_no_start() -> None:
    """Slow in a third of the steps before: the device was never normal, so no onset is claimed."""
    ratio = np.ones(30)
    ratio[[1, 4, 7]] += 1.0
    ratio[10::2] += 1.0
    assert intermittent_start(ratio)[0] == 0



def test_data_taking_turns_from_a_later_step_is_timed_from_it() -> None:
    """Replicas take turns computing longer in three steps of four from step 17, none before: the
    data, since 17 and in those steps (it read "slow from the first step", ~1.00x)."""
    comp = table(0, 1.0, 0)
    replicas = [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    turns = [int(s) for s in STEPS if s >= 17 and s % 4 != 0]
    for i, s in enumerate(turns):
        comp[replicas[i % 4], s - 1] *= 1.6
    found = imbalance(comp, np.ones(16, bool), STEPS, META, KINDS)
    assert found.units[0].kind == "data"
    assert found.since == 17 and found.on_off == turns


def test_two_replicas_taking_one_turn_a_step_from_the_first_step_are_the_data() -> None:
    """dp 2 (replicas 0-3 and 4-7 here, laid out by their TP and PP groups): one replica a step draws
    the long batches, 21 turns to 19, from the first step. Each replica slow in about half the steps,
    one just over it, read "healthy" on a real gloo job; one replica alone slow in most steps, the
    other never, stays no data."""
    meta = JobMeta("t", 8, {r: RankInfo(f"node-{r // 2}", r % 2) for r in range(8)},
                   {**{f"tp-{k}": [2 * k, 2 * k + 1] for k in range(4)},
                    **{f"pp-{k}": [k, k + 4] for k in range(4)}})
    kinds = {**{f"tp-{k}": "tp" for k in range(4)}, **{f"pp-{k}": "pp" for k in range(4)}}
    rng = np.random.default_rng(5)
    comp = 0.2 * (1 + 0.03 * rng.standard_normal((8, len(STEPS))))
    draws = np.r_[np.zeros(21, int), np.ones(19, int)]
    rng.shuffle(draws)
    replicas = [[0, 1, 4, 5], [2, 3, 6, 7]]
    for col, rep in enumerate(draws):
        comp[replicas[rep], col] *= 1.8
    found = imbalance(comp, np.ones(8, bool), STEPS, meta, kinds)
    assert found.units and found.units[0].kind == "data" and found.since is None
    comp = 0.2 * (1 + 0.03 * rng.standard_normal((8, len(STEPS))))
    comp[replicas[0], :24] *= 1.8  # replica 0's every rank, in 24 of 40 steps: no turns
    found = imbalance(comp, np.ones(8, bool), STEPS, meta, kinds)
    assert not found.units or found.units[0].kind != "data"


def _steps(ratios: dict[int, float]) -> pd.DataFrame:
    """Steps 1..40 at their baseline but `ratios`; irregular from 1.1x."""
    ratio = np.array([ratios.get(int(s), 1.0) for s in STEPS])
    return pd.DataFrame({"step": STEPS, "ratio": ratio, "irregular": ratio >= 1.1})


def test_a_devices_later_onset_wins_over_a_busy_machines_milder_steps_before_it() -> None:
    """Every step slow from the job's onset to the device's, nearly as slow as the fault's own: the
    fault began at the job's onset (a throttled host, stopped in its transfers first). Slowed far
    less (a busy machine), or with a normal step between (a blip), they are not the fault's."""
    throttled = _steps({20: 3.7, 21: 4.3, **{s: 4.5 for s in range(22, 41)}})
    irregular = list(range(20, 41))
    assert later_onset(22, 20, irregular, throttled) == 20
    busy = _steps({**{s: 1.25 for s in range(14, 20)}, **{s: 1.5 for s in range(20, 41)}})
    assert later_onset(20, 14, list(range(14, 41)), busy) == 20
    blip = _steps({21: 1.6, **{s: 1.6 for s in range(25, 41)}})
    assert later_onset(25, 21, [21, *range(25, 41)], blip) == 25
    assert later_onset(None, 20, irregular, throttled) == 20
    assert later_onset(19, 20, irregular, throttled) == 20  # not a slow step: no onset of the fault's


def test_a_stage_that_is_one_hosts_alone_ties_with_that_host() -> None:
    """tp2 pp4 dp1 on hosts of two GPUs (a real gloo job's layout): each stage is one host, and
    the host holds nothing else. A slow host and more layers on its stage read alike: a tie of two.
    Where the stage spans two hosts, or its host also holds another stage's rank (computing as
    usual), it is the split of layers."""
    meta = JobMeta("t", 8, {r: RankInfo(f"node-{r // 2}", r % 2) for r in range(8)},
                   {**{f"tp-{k}": [2 * k, 2 * k + 1] for k in range(4)}, "pp-0": [0, 2, 4, 6], "pp-1": [1, 3, 5, 7]})
    kinds = {**{f"tp-{k}": "tp" for k in range(4)}, "pp-0": "pp", "pp-1": "pp"}
    comp = 0.2 * (1 + 0.03 * np.random.default_rng(7).standard_normal((8, len(STEPS))))
    comp[[2, 3]] *= 1.5
    first = imbalance(comp, np.ones(8, bool), STEPS, meta, kinds).units[0]
    assert first.kind == "config" and first.detail["stage"] == 1
    assert [(u.kind, u.label, u.ranks) for u in first.also] == [("host", "node-1", [2, 3])]
    shared = JobMeta("t", 8, {r: RankInfo(f"node-{[0, 0, 1, 2, 2, 3, 3, 3][r]}", r % 2) for r in range(8)}, meta.groups)
    first = imbalance(comp, np.ones(8, bool), STEPS, shared, kinds).units[0]  # (stage 1 on node-1 and node-2)
    assert first.kind == "config" and not first.also
    shared = JobMeta("t", 8, {r: RankInfo(f"node-{[0, 1, 1, 1, 2, 2, 3, 3][r]}", r % 2) for r in range(8)}, meta.groups)
    first = imbalance(comp, np.ones(8, bool), STEPS, shared, kinds).units[0]  # (node-1: stage 0's rank 1 too)
    assert first.kind == "config" and not first.also


def test_a_stage_a_fifth_over_the_fastest_is_the_split_of_layers_and_a_tenth_is_normal() -> None:
    """The independent generator's seed 49100 job 46: stage 0 given 1.31x the work, beside a last
    stage that the loss makes 7% heavy, computed 1.22x the fastest stage: the split of layers. A
    last stage 10% heavy, as the loss makes it in normal operation, is no finding."""
    comp = 0.2 * (1 + 0.03 * np.random.default_rng(7).standard_normal((16, len(STEPS))))
    comp[8:] *= 1.07
    comp[:8] *= 1.07 * 1.22
    first = imbalance(comp, np.ones(16, bool), STEPS, META, KINDS).units[0]
    assert first.kind == "config" and first.detail["stage"] == 0
    comp[:8] /= 1.07 * 1.22
    comp[8:] *= 1.10 / 1.07
    assert not imbalance(comp, np.ones(16, bool), STEPS, META, KINDS).units


def test_a_worker_slow_every_other_step_is_named_on_and_off_though_its_median_step_is_normal() -> None:
    """The independent generator's seed 49100 job 27: a host at 1.4x every other step from step 6
    cost the job's steps under δ (1.06x), and its median over every step was its peers': "healthy".
    Slow in half the steps, while no other replica was slow as a whole, it is a device on and off,
    since its first slow step."""
    comp = table(5, 1.0, 0)
    on = (STEPS >= 6) & ((STEPS - 6) % 2 == 0)
    comp[5, on] *= 1.4
    found = imbalance(comp, np.ones(16, bool), STEPS, META, KINDS)
    assert found.units[0].kind == "gpu" and found.units[0].ranks == [5]
    assert found.since == 6 and found.on_off is not None and set(found.on_off) == set(STEPS[on].tolist())
    assert 1.3 < found.ratio[5] < 1.5  # its level while slow
    rare = table(5, 1.0, 0)
    rare[5, STEPS % 5 == 0] *= 1.4  # (a fifth of the steps: under ON_OFF_SHARE)
    assert not imbalance(rare, np.ones(16, bool), STEPS, META, KINDS).units
    late = table(5, 1.0, 0)  # (a real GPU at 1.42x every other step from step 24 of 36: a sixth of all)
    late[5, (STEPS >= 30) & (STEPS % 2 == 0)] *= 1.4
    found = imbalance(late, np.ones(16, bool), STEPS, META, KINDS)
    assert found.units[0].ranks == [5] and found.since == 30
