"""A device slow on and off: its slow steps lie far apart, and the first of them is the onset
(not the densest run of them, which the step times alone would pick). Jobs of the second,
independent generator (`bench.altgen`: rendezvous p2p, skewed clocks), judged on both paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.altgen import Fault, Layout
from tests.localize.altgen_jobs import altgen_job, both_paths, written

ACTIVE = [8, 14, 20, 21, 22, 28]  # the densest run (20-22) is not the first
STEP0 = 1000


@pytest.mark.parametrize(("fault", "device"), [
    (Fault("host", 2.5, "random", ACTIVE, host=1), "host node-1"),
    (Fault("gpu", 2.5, "random", ACTIVE, rank=6), "gpu rank 6 (node-1 gpu 2)"),
])
def test_the_onset_of_a_device_slow_on_and_off_is_its_first_slow_step(tmp_path: Path, fault: Fault, device: str) -> None:
    lay = Layout(tp=2, pp=2, dp=4, gpus_per_host=4, hosts_per_switch=2, order="tp-dp-pp")
    trace = written(altgen_job("on-and-off", lay, fault, steps=32, seed=11, step0=STEP0), tmp_path)
    for v in both_paths(trace):
        assert v.status == "irregular"
        assert v.candidates[0].device() == device, [c.device() for c in v.candidates]
        assert v.onset_step == STEP0 + ACTIVE[0], (v.onset_step, v.irregular_steps)
