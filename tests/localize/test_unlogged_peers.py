"""One rank logged per TP group (Megatron's usual logging): a slow GPU that was not logged is
named by its group's logged rank, which spends the wait inside operators no peer copy shows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collector.meta import JobMeta, RankInfo
from collector.traceio import Trace
from localize.combine import localize_trace
from localize.commops import proxy_ranks
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace


def test_the_only_logged_member_of_a_group_is_its_proxy() -> None:
    meta = JobMeta("t", 8, {r: RankInfo(f"node-{r // 4}", r % 4) for r in range(8)},
                   {"tp-0": [0, 1, 2, 3], "tp-1": [4, 5, 6, 7], "dp-0": [0, 4]})
    logged = np.array([0, 4, 5])
    assert proxy_ranks(meta, logged, 8).tolist() == [True] + [False] * 7  # tp-1 has two logged members
    assert not proxy_ranks(meta, logged, 8, skip={"tp-0"}).any()


@pytest.mark.parametrize(("p2p", "gpus", "tp", "pp", "rank"), [("rendezvous", 64, 8, 1, 22), ("batched", 128, 4, 2, 45)])
def test_a_slow_unlogged_gpu_is_named_by_its_groups_logged_rank(tmp_path: Path, p2p: str, gpus: int, tp: int, pp: int,
                                                                  rank: int) -> None:
    cfg = SimConfig(gpus=gpus, tp=tp, pp=pp, gpus_per_host=4 if tp == 8 else 8, steps=16, seed=4242, p2p=p2p,
                    logged_ranks="one-per-tp", faults=[FaultSpec.parse(f"gpu:rank={rank},factor=2.5,steps=5:15")], job="j")
    simulate_trace(cfg, tmp_path, counterfactual=False)
    v = localize_trace(Trace.open(tmp_path), ("commops",))
    assert v.status == "irregular" and v.candidates[0].kind == "gpu", [c.device() for c in v.candidates]
    assert v.candidates[0].rank == rank - rank % tp and abs(int(v.onset_step) - 5) <= 1
