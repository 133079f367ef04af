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
