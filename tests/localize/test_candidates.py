"""Evidence sentences of `localize.candidates`: they say what the figures show, never the opposite."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest

from collector.trace.meta import JobMeta, RankInfo
from localize.candidates import rank_candidate
from localize.ops.table import Ops
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
