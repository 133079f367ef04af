"""Real NCCL jobs recorded on a GPU machine, localized again here by both paths.

`test_real_nccl.py` runs the jobs only where a CUDA GPU is; its runs on an H200 were kept
(`data/real-nccl/README.md`), so every machine, CI included, checks both localizers on operators
that NCCL ran and CUDA events timed: the right device first, alone, and the onset within a step.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.localize.test_real_jobs import check, own_steps, verdicts
from tests.localize.test_real_nccl import SCENARIOS

DATA = Path(__file__).parent / "data" / "real-nccl"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_recorded_real_nccl_job_is_localized_on_both_paths(tmp_path: Path, name: str) -> None:
    trace = tmp_path / "trace"
    shutil.copytree(DATA / name / "trace", trace)  # (the sidecar path writes its summaries beside the records)
    steps = own_steps(DATA / name)
    for path, v in verdicts(trace).items():
        try:
            check(v, SCENARIOS[name], steps)
        except AssertionError as e:
            raise AssertionError(f"{path}: {e}") from None


def test_the_recorded_runs_are_the_scenarios_of_the_gpu_test() -> None:
    assert sorted(p.name for p in DATA.iterdir() if p.is_dir()) == sorted(SCENARIOS)
