"""A real gloo job recorded on this machine (`data/real-gloo/README.md`), localized again by both
paths with what a busy CI machine did to it: whole-machine stalls in steps the fault left alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.localize.test_real_jobs import brief, verdicts

DATA = Path(__file__).parent / "data" / "real-gloo"


def stall_machine(trace: Path, steps: list[int], stall_s: float) -> None:
    """Every rank stops for `stall_s` as each of `steps` begins: its records from that step on
    start and end that much later, as when the machine is busy with another job."""
    for shard in sorted((trace / "commops").glob("*.parquet")):
        table = pq.read_table(shard)
        step = table.column("step").to_numpy()
        shift = np.int64(stall_s * 1e9) * (step[:, None] >= np.asarray(steps)[None, :]).sum(axis=1)
        for name in ("start_ns", "end_ns"):
            moved = pa.array(table.column(name).to_numpy() + shift, type=table.schema.field(name).type)
            table = table.set_column(table.schema.get_field_index(name), name, moved)
        pq.write_table(table, shard)


@pytest.mark.slow
@pytest.mark.parametrize("stalled", [[], [1, 2, 3, 4, 5, 7, 21, 22, 23, 24, 25]], ids=["as-run", "busy-machine"])
def test_a_recorded_straggler_is_named_on_both_paths(tmp_path: Path, stalled: list[int]) -> None:
    """Eleven 60 ms stalls (3-4x a step) outnumber the straggler's ten 15x steps. The summary path
    fetched the most typical irregular steps by the steps' median, a stall's, and named no rank in
    CI's run (here: the host, 0.78). The time the steps lost puts rank 1's steps first."""
    trace = tmp_path / "trace"
    shutil.copytree(DATA / "straggler", trace)
    stall_machine(trace, stalled, 0.06)
    for path, v in verdicts(trace).items():
        assert v["status"] == "irregular" and v["candidates"][0].get("rank") == 1, f"{path}: {brief(v)}"
        assert set(range(10, 20)) <= set(v["irregular_steps"]), f"{path}: {brief(v)}"
