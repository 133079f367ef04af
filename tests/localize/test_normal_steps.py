"""Which steps are normal: the history every operator is judged against."""

from __future__ import annotations

import numpy as np
import pandas as pd

from localize.commops import normal_steps


def test_warm_up_and_the_partial_first_step_are_not_normal() -> None:
    """An independent generator's job (link fault on a DP ring from step 14): the warm-up step's
    collectives all ran 2.5x, and counted as normal they cancelled the ring's evidence."""
    steps = np.arange(40)
    irregular = np.arange(14, 40)
    table = pd.DataFrame({"step": steps, "pattern": ["warm-up", "warm-up"] + [""] * 38})
    assert normal_steps(steps, irregular, table).tolist() == list(range(2, 14))
    assert normal_steps(steps, irregular, None).tolist() == list(range(1, 14))
    assert normal_steps(np.arange(3), np.array([2]), None).tolist() == [0, 1]  # too few steps to drop one
    assert normal_steps(steps, steps[1:], table).tolist() == [0]  # nothing else left
