"""The localizer's own judgement of steps (a fault that covers most of the window)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from localize.steps import judge


def test_a_fault_over_most_steps_leaves_the_first_steps_at_the_normal_baseline() -> None:
    """Three normal steps, then eleven at 2.3x: the faster half of all steps is the fault's level,
    and the first steps must not keep it as their baseline (operators' normal times are scaled by
    the baseline: scaled by the fault's level, every healthy collective measured slow)."""
    d = pd.Series([0.121, 0.1315, 0.1315, 0.30, 0.296, 0.302, 0.302, 0.302, 0.296, 0.296, 0.301, 0.299, 0.2955, 0.2995],
                  index=np.arange(0, 28, 2))
    t = judge(d)
    assert t["irregular"].tolist() == [False] * 3 + [True] * 11
    np.testing.assert_allclose(t["baseline_s"], 0.1315)


def test_a_healthy_noisy_job_keeps_its_running_baseline() -> None:
    rng = np.random.default_rng(4)
    d = pd.Series(0.2 * (1 + 0.02 * rng.standard_normal(30)))
    t = judge(d)
    assert not t["irregular"].any()
    assert np.all(np.abs(t["baseline_s"] / 0.2 - 1) < 0.05)
