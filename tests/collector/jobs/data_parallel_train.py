"""A data-parallel job on gloo/CPU, sharded (FSDP2's fully_shard) or replicated (DDP): physics the
localizer was not written for. There is no pipeline, no tensor parallelism, no sync at a step's end.
FSDP2 all-gathers every layer's parameters before its forward (prefetching the next layer's) and
again before its backward, and reduce-scatters its gradients as the backward leaves it; --replicate 2
makes it HSDP, a 2-D mesh: shards within a replica group, an all-reduce across replicas. --ddp wraps
the model in DistributedDataParallel instead, whose reducer all-reduces 1 MiB gradient buckets as
the backward fills them.

Compute is sleep inside each layer's forward (--layer-ms) and backward (twice that), through an
autograd function, so that a slow rank's backward delays the collectives as a slow GPU does.

Faults: --slow-ranks 2,3 --slow-factor 1.6 --slow-from 20 [--slow-to 30] [--slow-every 2] multiplies
those ranks' compute in those steps (one rank: a slow GPU; one node's ranks: a slow host).
--step-log FILE: rank 0 appends each finished step's number. --log-dir DIR: each rank writes
rank-R.jsonl, one line per step with its own start/end (ns). Run it under collector.commops.run.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from tests.collector.jobs.steplog import StepLog


class Compute(torch.autograd.Function):
    """Identity whose forward sleeps `ms` and whose backward sleeps twice that: a layer's kernels."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ms: float) -> torch.Tensor:
        ctx.ms = ms
        time.sleep(ms / 1e3)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(2 * ctx.ms / 1e3)
        return grad, None


class Layer(torch.nn.Module):
    """A linear layer whose compute takes `ms` x the rank's current slowdown."""

    def __init__(self, dim: int, ms: float, factor: Callable[[], float]) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.ms, self.factor = ms, factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(Compute.apply(x, self.ms * self.factor())))


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dim", type=int, default=512, help="layer width: each layer's parameters are dim^2 floats")
    ap.add_argument("--layer-ms", type=float, default=8.0, help="forward compute per layer")
    ap.add_argument("--replicate", type=int, default=1, help="replica groups (HSDP) when above 1")
    ap.add_argument("--ddp", action="store_true", help="DistributedDataParallel instead of FSDP2")
    ap.add_argument("--slow-ranks", default="")
    ap.add_argument("--slow-factor", type=float, default=1.0)
    ap.add_argument("--slow-from", type=int, default=0)
    ap.add_argument("--slow-to", type=int, default=1 << 30)
    ap.add_argument("--slow-every", type=int, default=1)
    ap.add_argument("--step-log", default="")
    ap.add_argument("--log-dir", default="")
    return ap.parse_args()


def main() -> None:
    a = parse()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = rank in {int(r) for r in a.slow_ranks.split(",") if r.strip()}
    now = {"step": 0}

    def factor() -> float:
        s = now["step"]
        on = a.slow_from <= s < a.slow_to and (s - a.slow_from) % a.slow_every == 0
        return a.slow_factor if slow and on else 1.0

    model = torch.nn.Sequential(*[Layer(a.dim, a.layer_ms, factor) for _ in range(a.layers)])
    if a.ddp:
        model = DistributedDataParallel(model, bucket_cap_mb=1)
    else:
        if a.replicate > 1:
            mesh = init_device_mesh("cpu", (a.replicate, world // a.replicate), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    log = StepLog(a.log_dir, a.step_log, rank)
    dist.barrier()
    for step in range(a.steps):
        now["step"] = step
        t0 = time.time_ns()
        model(torch.randn(16, a.dim, generator=gen)).sum().backward()
        opt.step()
        opt.zero_grad()
        log.done(step, t0)
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
