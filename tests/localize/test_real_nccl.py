"""Real NCCL jobs on GPUs, localized end to end by `laggard localize` and `laggard sidecar localize`.

The Megatron-shaped job of test_real_jobs.py (tp2 x pp2 x dp2, 1F1B with batched 4 MiB p2p pairs,
TP all-reduces per layer, the distributed optimizer's DP sync, a grad-norm all-reduce) with
`--device cuda`: every operator runs in NCCL on the GPU and the CommOps logger times it with CUDA
events (the GPU's own arrival and completion, not the host's call). Four torchrun agents play four
nodes. On a machine with fewer GPUs than ranks the ranks share them, each declaring its own NCCL
host, so NCCL's traffic goes through its network transport as between nodes.

Compute is a kernel that keeps the GPU busy 30 ms a layer forward (twice that backward), queued
before the layer's all-reduce: a slow GPU's kernels take longer. It dominates the step so that a
fault shows through the shared GPU's slow communication (every NCCL op of eight processes sharing
one GPU takes milliseconds). A run in which the fault did not show, or a healthy run that the shared
GPU made irregular, as the ranks' own step logs say, is skipped with the step times that say so
(test_real_jobs.disturbed).

Skipped without a CUDA GPU (run these on a GPU machine). `LAGGARD_KEEP_REAL_TRACES=DIR` keeps each
run's trace and the ranks' own step logs in DIR, to be read again where there is no GPU.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.collector.realjob import Fault, RealJob, run
from tests.localize.test_real_jobs import check, disturbed, own_steps, verdicts


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = [pytest.mark.slow, pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (run on a GPU machine)")]

JOB = RealJob(steps=32, layer_ms=30.0, extra=["--device", "cuda"])
NCCL_ENV = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}
SCENARIOS: dict[str, Fault | None] = {
    "nccl-gpu-from-16": Fault("gpu", 16, 2.0, ranks=[5]),
    "nccl-host-from-16": Fault("host", 16, 2.0, ranks=JOB.ranks_of(1), host=JOB.host(1)),
    "nccl-healthy": None,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_real_nccl_job_is_localized_on_both_paths(tmp_path: Path, name: str) -> None:
    fault = SCENARIOS[name]
    trace = run(tmp_path, JOB, f"real-{name}", fault, env=NCCL_ENV, timeout=200.0)
    keep = os.environ.get("LAGGARD_KEEP_REAL_TRACES")
    if keep:
        shutil.copytree(tmp_path, Path(keep) / name, dirs_exist_ok=True)
    steps = own_steps(tmp_path)
    why = disturbed(steps, fault)
    if why:
        pytest.skip(why)
    for path, v in verdicts(trace).items():
        try:
            check(v, fault, steps)
        except AssertionError as e:
            raise AssertionError(f"{path}: {e}") from None
