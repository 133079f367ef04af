"""A 4-rank gloo DDP job profiled the way users profile: torch.profiler with a schedule and
tensorboard_trace_handler (gzip), one `*.pt.trace.json.gz` per rank carrying ProfilerStep#N markers.

--slow-rank R --slow-from K --slow-ms M makes rank R compute M ms longer from step K on.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def burn(ms: float) -> None:
    """Busy compute, like a slow GPU seen from the host."""
    end = time.perf_counter() + ms / 1e3
    x = torch.ones(64, 64)
    while time.perf_counter() < end:
        x = torch.tanh(x @ x * 0.01)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-from", type=int, default=10**9)
    ap.add_argument("--slow-ms", type=float, default=0.0)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(32, 64), torch.randn(32, 8)
    sched = schedule(wait=1, warmup=1, active=a.steps - 2)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched,
                 on_trace_ready=tensorboard_trace_handler(a.out, use_gzip=True)) as prof:
        for step in range(a.steps):
            burn(a.compute_ms + (a.slow_ms if rank == a.slow_rank and step >= a.slow_from else 0.0))
            loss = nn.functional.mse_loss(model(data), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
