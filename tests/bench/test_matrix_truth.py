"""The matrix benchmark's truth: the onset it scores against is a step the logger kept and the fault was in."""

from __future__ import annotations

import pytest

from bench.matrix import _true_start


def test_true_start_is_the_first_logged_step_the_fault_was_active() -> None:
    # a spike in steps 5 and 11, which the sampled logger skipped: step 6 ran normally
    truth = {"logged_steps": [2, 4, 6, 8, 10, 14, 16], "step_time_s": [0.4] * 28,
             "faults": [{"active_steps": [5, 11, 14, 16]}]}
    assert _true_start(truth) == 14


def test_true_start_of_a_lasting_fault_on_every_step() -> None:
    truth = {"step_time_s": [0.4] * 10, "faults": [{"active_steps": list(range(4, 10))}]}
    assert _true_start(truth) == 4
    assert _true_start({"step_time_s": [0.4] * 10, "faults": [{"active_steps": []}]}) is None


def test_a_run_of_healthy_jobs_alone_reports_its_false_alarms(capsys: pytest.CaptureFixture[str]) -> None:
    """`--kinds healthy` has no fault to score: the report gives the false alarms, not a KeyError."""
    import pandas as pd

    from bench.matrix import report

    report(pd.DataFrame({"kind": ["healthy"] * 3, "p2p": ["rendezvous", "eager", "batched"],
                         "alarm": [False, True, False], "dp_sync": ["end"] * 3}))
    assert "false alarms on healthy jobs: rendezvous 0/1, eager 1/1, batched 0/1" in capsys.readouterr().out


def test_a_declared_tie_holding_the_truth_earns_one_over_its_size() -> None:
    """Every benchmark (matrix, real jobs) scores top-1 this way: first alone 1, one of k tied for
    first 1/k, named only below the tie 0."""
    from bench.localize import top_credit

    assert top_credit([0.9, 0.5], [True, False]) == 1.0
    assert top_credit([0.9, 0.9, 0.9, 0.5], [False, False, True, False]) == pytest.approx(1 / 3)
    assert top_credit([0.9, 0.8], [False, True]) == 0.0
    assert top_credit([], []) == 0.0
