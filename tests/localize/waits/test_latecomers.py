"""Recurrent latecomers: a rank last at its group's collective in every slow step, on a real trace
whose operators are too noisy for any single instance to be flagged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from collector.importers.kineto import import_kineto
from collector.trace.traceio import Trace
from localize.commops import COLUMNS, _instance_layout
from localize.ops.history import slot_quantiles
from localize.ops.table import Ops, prepare_ops
from localize.waits.latecomers import recurrent_latecomers
from tests.conftest import run_cli

# a real 4-rank gloo DDP job profiled by torch.profiler: rank 2 computes 60 ms longer from step 15;
# in normal steps the all-reduce copies already spread over 1.5-38 ms (tests/collector/importers/test_kineto.py)
PROFILE = Path(__file__).parents[2] / "collector" / "data" / "kineto-gloo-steps"


def _ops(tmp_path: Path) -> tuple[Ops, np.ndarray, np.ndarray]:
    import_kineto(PROFILE, tmp_path / "t")
    trace = Trace.open(tmp_path / "t")
    ops = prepare_ops(trace.commops(columns=COLUMNS))
    expected, _, _, unit_of_inst, _, _, _ = _instance_layout(ops, trace.meta)
    return ops, ops.inst_size >= expected, unit_of_inst


def _flagged(ops: Ops, complete: np.ndarray, unit: np.ndarray, irr: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """recurrent_latecomers with the delay the wait graph gives it: the others' mean wait beyond
    their slot's median wait in the reference steps."""
    wait = ops.wait
    beyond = np.maximum(wait - np.nan_to_num(slot_quantiles(ops, wait, ref)[0]), 0.0)
    delay = np.bincount(ops.inst, weights=beyond, minlength=ops.n_inst) / np.maximum(ops.inst_size - 1, 1)
    return recurrent_latecomers(ops, delay, unit, irr, ref, complete)


def test_the_slow_rank_is_the_recurrent_latecomer_of_the_slow_steps(tmp_path: Path) -> None:
    ops, complete, unit = _ops(tmp_path)
    flagged = _flagged(ops, complete, unit, np.arange(15, 24), np.arange(3, 15))
    late = ops.rank[ops.late_row[flagged]]
    assert flagged.sum() >= 6 and set(late.tolist()) == {2}


def test_normal_steps_have_no_recurrent_latecomer(tmp_path: Path) -> None:
    """The same job's healthy steps, some of them called irregular: whoever arrived last there
    changes from step to step, and nothing is flagged."""
    ops, complete, unit = _ops(tmp_path)
    assert not _flagged(ops, complete, unit, np.array([5, 8, 11, 13]), np.array([3, 4, 6, 7, 9, 10, 12, 14])).any()


def test_localize_names_the_rank_of_the_real_profile(tmp_path: Path) -> None:
    run_cli("import", "kineto", str(PROFILE), "--out", str(tmp_path / "t"), check=True)
    v = json.loads(run_cli("localize", str(tmp_path / "t"), "--format", "json", check=True).stdout)
    assert v["status"] == "irregular" and v["onset_step"] == 15
    assert v["candidates"][0]["kind"] == "gpu" and v["candidates"][0]["rank"] == 2
