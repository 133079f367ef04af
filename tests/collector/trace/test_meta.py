"""meta.json's numbers: each refusal says what is wrong and the one thing that mends it."""

from __future__ import annotations

from typing import Any

import pytest

from collector.inputs.errors import TraceError
from collector.trace.meta import JobMeta


def _meta(**over: Any) -> dict[str, Any]:
    return {"job": "j", "world_size": 2, "ranks": {"0": {"host": "node-0", "gpu": 0}}, **over}


@pytest.mark.parametrize("world", [float("inf"), float("nan"), 16.5, "abc", True, 0, -3])
def test_a_world_size_no_cap_can_mend_asks_for_a_whole_number(world: object) -> None:
    with pytest.raises(TraceError) as exc:
        JobMeta.from_dict(_meta(world_size=world))
    assert exc.value.fix.startswith("give a whole number in 1..")
    assert "LAGGARD_MAX_WORLD_SIZE" not in str(exc.value)


def test_a_world_size_above_the_cap_names_the_cap() -> None:
    with pytest.raises(TraceError, match=r"world_size is 1000000000000, outside 1\.\.") as exc:
        JobMeta.from_dict(_meta(world_size=10**12))
    assert "LAGGARD_MAX_WORLD_SIZE" in exc.value.fix


@pytest.mark.parametrize("gpu", [10**4000, 1e300, -(10**30)])
def test_a_huge_number_is_shown_short(gpu: object) -> None:
    with pytest.raises(TraceError, match=r"rank 0 gpu is \S{1,30}( \(\d+ digits\))?, outside 0\.\.1023") as exc:
        JobMeta.from_dict(_meta(ranks={"0": {"host": "node-0", "gpu": gpu}}))
    assert len(str(exc.value)) < 160
