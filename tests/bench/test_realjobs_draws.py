"""bench.realjobs' draws: what each fault slows, for the truth it is scored against."""

from __future__ import annotations

import random

from bench.realjobs import draw_compute
from tests.collector.realjob import DataParallelJob


def test_faults_from_the_first_step_slow_what_they_name() -> None:
    """A stage fault slows every rank of its stage (Megatron's order: pp slowest); a data fault
    needs replicas to move between; nothing starts after the first step."""
    rng = random.Random(0)
    kinds = set()
    for _ in range(200):
        job, fault, shape = draw_compute(rng, moe=rng.random() < 0.3, from_start=True)
        kinds.add(fault.kind)
        assert fault.start == 0 and fault.every == 1 and "from the first step" in shape
        if fault.kind == "config":
            width = job.tp * job.dp
            assert fault.stage is not None and fault.ranks == list(range(fault.stage * width, (fault.stage + 1) * width))
        if fault.kind in ("config", "data"):
            assert not isinstance(job, DataParallelJob)
        if fault.kind == "data":
            assert job.dp > 1 and fault.batches > 1 and not fault.ranks
        if fault.kind in ("gpu", "host"):
            assert fault.ranks and all(0 <= r < job.world for r in fault.ranks)
    assert kinds == {"gpu", "host", "config", "data"}
