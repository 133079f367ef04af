"""The real gloo job with its DP gradient sync overlapped with the backward (as DDP and Megatron's
overlap_grad_reduce do), localized end to end on both paths.

tests/collector/jobs/pipeline_train.py --overlap-grad: during the last microbatch's backward each
layer's share of the gradient is reduce-scattered with async_op=True as soon as the layer is done;
the step waits for all of them at its end. The DP records then overlap the rank's compute and its
TP and PP operators. The healthy run is live (checks and the judging of a wrong run again on a
fresh one are test_real_jobs.py's); its GPU from step 20 and host from step 20 were recorded from
runs of it and are replayed by `test_real_gloo_recorded.py`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.collector.realjob import run
from tests.localize import test_real_jobs as base

pytestmark = pytest.mark.slow

JOB = replace(base.JOB, overlap_grad="reduce_scatter")


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[str, tuple[Path, base.Answers, list[float]]] = {}

    def get(name: str, fresh: bool = False) -> tuple[Path, base.Answers, list[float]]:
        if name not in cache or fresh:
            out = tmp_path_factory.mktemp(name)
            trace = run(out, JOB, f"real-overlap-{name}", base.SCENARIOS[name])
            cache[name] = (trace, base.verdicts(trace), base.own_steps(out))
        return cache[name]

    return get


def test_the_logger_records_the_async_buckets_from_launch_during_the_backward(ran: Any) -> None:
    """One record per layer's bucket per rank and step, started while the backward still runs
    (before the step's last TP all-reduce ends), ended no later than the step's all-gather starts."""
    from collector.trace.traceio import Trace

    df = Trace.open(ran("healthy")[0]).commops()
    df = df[(df["step"] >= 1) & (df["step"] < JOB.steps)]
    rs = df[df["op"] == "reduce_scatter"]
    assert (rs.groupby(["rank", "step"]).size() == 2).all()  # two layers per stage: two buckets
    assert rs["group"].str.startswith("dp-").all()
    tp_end = df[df["group"].str.startswith("tp-")].groupby(["rank", "step"])["end_ns"].max()
    first = rs.groupby(["rank", "step"])["start_ns"].min()
    assert (first < tp_end.loc[first.index]).mean() > 0.95
    ag = df[df["op"] == "all_gather"].groupby(["rank", "step"])["start_ns"].min()
    last = rs.groupby(["rank", "step"])["end_ns"].max()
    assert (last <= ag.loc[last.index]).all()


@pytest.mark.parametrize("path", ["localize", "sidecar"])
def test_real_overlapped_healthy_job_is_healthy(ran: Any, path: str) -> None:
    base.on_real_runs(ran, "healthy", base.checked(path, None))
