"""A small gloo DDP training job for the real-capture tests: one rank per process.

Each rank logs one JSON line per step with the wall-clock time (ns) at which backward, and so
the gradient all-reduce, finished. `--slow-rank R --slow-from S --slow-s X` makes rank R sleep
X more seconds of "compute" from step S on (a straggler).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--port", type=int, default=29577)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compute-s", type=float, default=0.12)
    ap.add_argument("--params", type=int, default=500_000)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-from", type=int, default=10**9)
    ap.add_argument("--slow-s", type=float, default=0.0)
    ap.add_argument("--log", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{a.port}", rank=a.rank, world_size=a.world)
    width = 1000
    model = torch.nn.Sequential(torch.nn.Linear(width, a.params // width), torch.nn.ReLU(),
                                torch.nn.Linear(a.params // width, 1))
    ddp = DistributedDataParallel(model, bucket_cap_mb=64)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x, y = torch.randn(32, width), torch.randn(32, 1)
    with open(a.log, "w") as log:
        for step in range(a.steps):
            t0 = time.time_ns()
            time.sleep(a.compute_s + (a.slow_s if a.rank == a.slow_rank and step >= a.slow_from else 0.0))
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # DDP all-reduces gradients before this returns
            t1 = time.time_ns()
            opt.step()
            log.write(json.dumps({"step": step, "start_ns": t0, "synced_ns": t1}) + "\n")
            log.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
