"""Units from rank blame: which stage a rank is in, and replicas taking turns."""

from __future__ import annotations

import numpy as np
import pytest

from collector.meta import JobMeta, RankInfo
from localize.waits.ranking import pipeline_stages, replica_turns


def test_a_pipeline_group_of_unknown_kind_takes_its_ranks_stage_from_their_tp_peers() -> None:
    """tp2 x pp2: the pipeline group of TP index 1 has no kind (none of it logged); ranks 1 and 3
    share TP groups with ranks 0 and 2, whose pipeline group says their stages."""
    meta = JobMeta(job="j", world_size=4, ranks={r: RankInfo("h0", r) for r in range(4)},
                   groups={"pp-a": [0, 2], "pp-b": [1, 3], "tp-0": [0, 1], "tp-1": [2, 3]})
    kinds = {"pp-a": "pp", "tp-0": "tp", "tp-1": "tp"}
    stage, known = pipeline_stages(meta, 4, kinds)
    assert stage.tolist() == [0, 0, 1, 1] and known.all()
    stage, known = pipeline_stages(meta, 4, {"pp-a": "pp"})
    assert known.tolist() == [True, False, True, False]
    assert pipeline_stages(meta, 4, {"tp-0": "tp"})[1].all()  # no pipeline: every rank is stage 0


def _turns(owners: list[int], n_rep: int = 2) -> np.ndarray:
    """Rank x step blame: two ranks per replica, each step's blame on the replica `owners` names."""
    replica = np.repeat(np.arange(n_rep), 2)
    by_step = np.zeros((len(replica), len(owners)))
    for col, k in enumerate(owners):
        by_step[replica == k, col] = 1.0
    return by_step


@pytest.mark.parametrize(("owners", "turns"), [
    ([0, 1, 0, 1], [0, 1]),
    ([1, 1, 0, 0, 0, 1, 1, 1], None),  # over half: a device (a silent host's blame landing elsewhere at times)
    ([1] * 13 + [0], None),  # one turn elsewhere is noise: the replica holds the fault
    ([1] * 10, None),  # a device
    ([1, 1, 0], None),  # one turn is no turn
    ([0, 1], [0, 1]),  # a two-step spike, each step another replica's batch
    ([1, 1], None),
])
def test_replicas_take_turns_when_none_held_over_half(owners: list[int], turns: list[int] | None) -> None:
    replica = np.repeat(np.arange(2), 2)
    found = replica_turns(_turns(owners), replica)
    assert (None if found is None else found[0].tolist()) == turns


def test_three_replicas_one_turn_each_take_turns() -> None:
    found = replica_turns(_turns([0, 1, 2], 3), np.repeat(np.arange(3), 2))
    assert found is not None and found[0].tolist() == [0, 1, 2]
