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


def test_a_slow_first_logged_step_is_no_onset_on_either_path(tmp_path: Path) -> None:
    """Sampled steps, the first logged one (step 1) still warming up, then data taking turns from
    step 7: the full records leave the first recorded step out (it is partial), and so do the
    summaries now; they said "since step 1"."""
    from dataclasses import replace

    lay = Layout(tp=2, pp=2, dp=4, gpus_per_host=4, hosts_per_switch=2, order="tp-dp-pp")
    active = list(range(7, 40, 2))
    logged = [1, 3, 7, 11, 13, 15, 21, 22, 25, 27, 28, 29, 35, 37, 39]
    spec = replace(altgen_job("first-step", lay, Fault("data", 2.0, "alternate", active), steps=40, seed=5),
                   logged=logged, warmup_steps=3, warmup_factor=1.8)
    trace = written(spec, tmp_path)
    for v in both_paths(trace):
        assert v.status == "irregular" and v.candidates[0].kind == "data", [c.device() for c in v.candidates]
        assert v.onset_step == 7, (v.onset_step, v.irregular_steps)



@pytest.mark.slow
@pytest.mark.parametrize(("job", "onset"), [(2, 1011), (43, 7)])
def test_an_on_and_off_host_is_timed_from_its_first_slow_step(tmp_path: Path, job: int, onset: int) -> None:
    """The independent generator's seed 2026: a host slow every other step, one rank per TP group
    logged. Job 2: the host is its whole pipeline stage, so beside its stage peers (none) it never
    looked slow, and the onset fell on a later step (1013). Job 43 (1,024 GPUs, 1.14x): no step
    is irregular against its neighbours; compared with its peers the host read "slow from the
    first step" (0). Both paths now time it from its first slow step after normal ones. Its one
    logged rank could be the GPU or the host: the summaries now read its unlogged peers' waits over
    the last six slow steps (one step left it a tie), as the full records do over all of them."""
    from bench.altgen import random_spec

    spec = random_spec(job, "host", 2026)
    assert spec.fault is not None
    for v in both_paths(written(spec, tmp_path / spec.name)):
        assert v.candidates[0].device() == f"host node-{spec.fault.host}", [c.device() for c in v.candidates[:3]]
        assert v.onset_step == onset, (v.onset_step, [c.device() for c in v.candidates[:3]])
