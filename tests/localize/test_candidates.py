"""Evidence sentences of `localize.candidates`: they say what the figures show, never the opposite."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import numpy as np
import pandas as pd
import pytest

from collector.trace.meta import JobMeta, RankInfo
from localize.candidates import few_irregular, lasting_over_few_steps, rank_candidate
from localize.ops.table import Ops
from localize.verdict import Candidate, Verdict
from localize.waits.ranking import RankUnit
from localize.waits.waitgraph import WaitGraph


def _graph(excess_compute_s: float) -> WaitGraph:
    """Two instances, each a prolonged operator whose one normal copy was rank 1."""
    n = 2
    return WaitGraph(suspect=np.ones(n, bool), comm=np.zeros(n, bool), orphan=np.zeros(n, bool),
                     delay=np.full(n, 0.05), root_inst=np.arange(n), root_rank=np.ones(n, int),
                     missing_rank=np.full(n, -1), excess_compute=np.full(n, excess_compute_s),
                     excess_wait=np.zeros(n), excess_own=np.zeros(n), measured=np.ones(n, bool))


@pytest.mark.parametrize(("excess_s", "says", "never"), [
    (0.056, "56.00 ms more compute than its peers", "no longer"),
    (-0.007, "computed no longer than its peers before them (-7.00 ms)", "more compute"),
])
def test_a_named_gpu_states_its_compute_excess_with_its_sign(excess_s: float, says: str, never: str) -> None:
    meta = JobMeta("j", 4, {r: RankInfo("vm", r) for r in range(4)})
    ops = cast(Ops, SimpleNamespace(groups=np.array(["pp-1"]), inst_group=np.zeros(2, int)))
    cand = rank_candidate(RankUnit("gpu", [1], 1.0, 1.0, "rank 1"), 1.0, _graph(excess_s), ops, meta)
    text = " ".join(cand.evidence)
    assert cand.rank == 1 and says in text and never not in text, text


def _verdict(steps: list[int], *cands: tuple[str, float]) -> Verdict:
    return Verdict("j", "irregular", steps, 1.1, [
        Candidate(kind, score, [], rank=1 if kind == "gpu" else None, host="node-0") for kind, score in cands])


def test_a_worker_slow_in_every_step_outweighs_one_irregular_steps_weak_answer() -> None:
    """One irregular step whose waits named a GPU at 0.54, beside a host that computed 2x its stage
    peers' in every step: the host, slow from the start; the step is said in the verdict."""
    one, lasting = _verdict([14], ("gpu", 0.54)), _verdict([], ("host", 1.0))
    got = lasting_over_few_steps(one, lasting)
    assert got is lasting and "step 14 ran irregular too" in got.extra["also"]
    assert lasting_over_few_steps(_verdict([14], ("gpu", 0.97)), _verdict([], ("host", 0.95))).candidates[0].kind == "gpu"
    assert lasting_over_few_steps(_verdict([14, 15], ("gpu", 0.54)), lasting).candidates[0].kind == "gpu"  # two steps, no table
    assert lasting_over_few_steps(one, _verdict([], ("config", 1.0))) is one  # a split of layers is no worker
    assert lasting_over_few_steps(one, _verdict([])) is one  # nobody slow throughout


def test_one_irregular_step_naming_the_worker_slow_throughout_leaves_it_slow_since_the_first_step() -> None:
    """The step's waits named the host as surely as the lasting analysis did: the same host, and its
    slowness began with the run, not at that step (matrix seed 4242, a sampled job's host at 2x)."""
    lasting = _verdict([], ("host", 1.0))
    assert lasting_over_few_steps(_verdict([14], ("host", 1.0)), lasting) is lasting
    assert lasting_over_few_steps(_verdict([14], ("gpu", 1.0)), _verdict([], ("host", 1.0))).candidates[0].kind == "gpu"


def test_a_device_slow_from_the_first_step_outweighs_a_few_steps_that_lost_less() -> None:
    """A real MoE job (`bench.realjobs --from-start --moe --seed 57`, run 1): GPU 2 computed 2.37x
    its stage peers' in every step, and steps 32 and 33 drifted 1.12-1.17x, whose waits named a link
    at 0.57. The GPU cost each of 36 steps more than those two lost: the GPU, slow from the start.
    Where the steps lost more, or were more than a tenth of the window, or the device began later,
    the steps' own answer stands."""
    def lasting() -> Verdict:
        return Verdict("j", "irregular", [], 2.37, [Candidate("gpu", 1.0, [], rank=2, host="node-1")],
                       {"persistent": True, "typical_compute_s": 0.1})

    steps = pd.DataFrame({"step": range(36), "duration_s": 0.78, "baseline_s": 0.78})
    steps.loc[steps["step"].isin([32, 33]), "duration_s"] = [0.87, 0.91]
    two = Verdict("j", "irregular", [32, 33], 1.15, [Candidate("link", 0.57, [], hosts=["node-0", "node-2"])])
    got = lasting_over_few_steps(two, lasting(), steps)
    assert got.candidates[0].rank == 2 and "steps 32, 33 ran irregular too" in got.extra["also"]
    long = steps.assign(duration_s=lambda t: np.where(t["step"].isin([32, 33]), 3.5, 0.78))
    assert lasting_over_few_steps(two, lasting(), long) is two  # (they lost 5.4 s; the GPU 4.9 s)
    assert lasting_over_few_steps(two, lasting(), steps.iloc[:18]) is two  # (two of 18 steps: over a tenth)
    many = Verdict("j", "irregular", list(range(30, 36)), 1.15, two.candidates)
    assert lasting_over_few_steps(many, lasting(), steps) is many  # six of 36 steps
    later = lasting()
    later.extra.pop("persistent")  # (slow since a later step: the steps' own analysis dates it)
    assert lasting_over_few_steps(two, later, steps) is two


def test_few_irregular_steps_are_one_or_up_to_a_tenth_of_the_window() -> None:
    """One step is few in any window; more only up to a tenth of a known window; none is not few
    (there is nothing for a lasting excess to outweigh)."""
    steps = pd.DataFrame({"step": range(36)})
    assert few_irregular([14], None) and few_irregular([14], steps)
    assert few_irregular([32, 33, 34], steps) and not few_irregular(list(range(30, 34)), steps)
    assert not few_irregular([32, 33], None)
    assert not few_irregular([], steps) and not few_irregular([], None)
    nothing = Verdict("j", "irregular", [], 1.0, [Candidate("link", 0.6, [], hosts=["node-0", "node-1"])])
    assert lasting_over_few_steps(nothing, _verdict([], ("host", 1.0)), steps) is nothing
