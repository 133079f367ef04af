"""Evidence sentences of `localize.candidates`: they say what the figures show, never the opposite."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest

from collector.trace.meta import JobMeta, RankInfo
from localize.candidates import lasting_over_lone_step, rank_candidate
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
    got = lasting_over_lone_step(one, lasting)
    assert got is lasting and "step 14 ran irregular too" in got.extra["also"]
    assert lasting_over_lone_step(_verdict([14], ("gpu", 0.97)), _verdict([], ("host", 0.95))).candidates[0].kind == "gpu"
    assert lasting_over_lone_step(_verdict([14, 15], ("gpu", 0.54)), lasting).candidates[0].kind == "gpu"  # two steps
    assert lasting_over_lone_step(one, _verdict([], ("config", 1.0))) is one  # a split of layers is no worker
    assert lasting_over_lone_step(one, _verdict([])) is one  # nobody slow throughout


def test_one_irregular_step_naming_the_worker_slow_throughout_leaves_it_slow_since_the_first_step() -> None:
    """The step's waits named the host as surely as the lasting analysis did: the same host, and its
    slowness began with the run, not at that step (matrix seed 4242, a sampled job's host at 2x)."""
    lasting = _verdict([], ("host", 1.0))
    assert lasting_over_lone_step(_verdict([14], ("host", 1.0)), lasting) is lasting
    assert lasting_over_lone_step(_verdict([14], ("gpu", 1.0)), _verdict([], ("host", 1.0))).candidates[0].kind == "gpu"
