"""A small real torch.distributed (gloo, CPU) training job for the CommOps end-to-end tests.

4 ranks = 2 pipeline stages x 2 tensor-parallel ranks; a DDP-wrapped head replicated over all
ranks (group dp-0). Per step: stage 0 computes, all-reduces its activation in its TP group and
sends it to its stage-1 peer (isend, or batch_isend_irecv on odd steps); stage 1 receives,
all-reduces in its TP group; then every rank runs the DDP head backward (gradient all-reduce
through DDP's reducer) and steps its optimizer.

Faults: --slow-rank R --slow-steps A:B --slow-ms M  makes rank R compute M ms longer;
        --hang-rank R --hang-step K  makes rank R stop before its TP all-reduce of step K.
Logger: --attach calls commops.attach() in code; otherwise run it under collector.commops.run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def burn(ms: float) -> None:
    """Busy compute (not sleep), like a slow GPU would look from the host."""
    end = time.perf_counter() + ms / 1e3
    x = torch.ones(64, 64)
    while time.perf_counter() < end:
        x = torch.tanh(x @ x * 0.01)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compute-ms", type=float, default=10.0)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-steps", default="")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-step", type=int, default=-1)
    ap.add_argument("--timeout-s", type=float, default=30.0)
    ap.add_argument("--attach", action="store_true")
    ap.add_argument("--step-log", help="rank 0 appends each finished step here (for tests that act mid-run)")
    ap.add_argument("--no-ddp", action="store_true", help="plain all_reduce of grads (baseline)")
    ap.add_argument("--toggle-every", type=int, default=0,
                    help="bench: attach/detach the logger every N steps and report step times of both")
    a = ap.parse_args()
    if a.attach or a.toggle_every:
        from collector import commops

        commops.attach()
    t_start = time.perf_counter()
    timeout = datetime.timedelta(seconds=a.timeout_s)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "this job is laid out for 4 ranks"
    stage, tp_idx = rank // 2, rank % 2
    tp = [dist.new_group([0, 1], timeout=timeout, group_desc="tp-0"),
          dist.new_group([2, 3], timeout=timeout, group_desc="tp-1")][stage]
    pp = [dist.new_group([0, 2], timeout=timeout, group_desc="pp-0"),
          dist.new_group([1, 3], timeout=timeout, group_desc="pp-1")][tp_idx]
    dp = dist.new_group([0, 1, 2, 3], timeout=timeout, group_desc="dp-0")
    lo, _, hi = a.slow_steps.partition(":")
    slow = range(int(lo), int(hi)) if a.slow_steps else range(0)

    torch.manual_seed(0)
    layer = nn.Linear(64, 64)
    head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    model = head if a.no_ddp else nn.parallel.DistributedDataParallel(head, process_group=dp)
    opt = torch.optim.SGD(list(model.parameters()) + list(layer.parameters()), lr=0.01)
    data = torch.randn(32, 64)
    act = torch.zeros(32, 64)
    peer = rank + 2 if stage == 0 else rank - 2
    t_loop = time.perf_counter()
    times: dict[bool, list[float]] = {True: [], False: []}
    for step in range(a.steps):
        if a.toggle_every and step and step % a.toggle_every == 0:  # between steps, not timed
            on = (step // a.toggle_every) % 2 == 0
            commops.attach() if on else commops.detach()
        t_step = time.perf_counter()
        burn(a.compute_ms + (a.slow_ms if rank == a.slow_rank and step in slow else 0.0))
        if rank == a.hang_rank and step == a.hang_step:
            time.sleep(600)  # stuck before the collective; torchrun's SIGTERM ends it
        with torch.no_grad():
            if stage == 0:
                act = torch.tanh(layer(data))
                dist.all_reduce(act, group=tp)
                if step % 2:
                    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, act, peer, group=pp)]):
                        w.wait()
                else:
                    dist.isend(act, peer, group=pp).wait()
            else:
                if step % 2:
                    for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, act, peer, group=pp)]):
                        w.wait()
                else:
                    dist.recv(act, peer, group=pp)
                dist.all_reduce(act, group=tp)
        out = model(act + layer(data))
        loss = out.square().mean()
        opt.zero_grad()
        loss.backward()
        if a.no_ddp:
            for p in head.parameters():
                dist.all_reduce(p.grad, group=dp)
        opt.step()
        if a.step_log and rank == 0:
            with open(a.step_log, "a") as f:
                f.write(f"{step}\n")
        if a.toggle_every and step % a.toggle_every:  # skip each block's first step (warm-up)
            times[(step // a.toggle_every) % 2 == 0].append(time.perf_counter() - t_step)
    dist.barrier(group=dp)
    t_end = time.perf_counter()
    if rank == 0 and os.environ.get("DIST_TRAIN_REPORT"):
        print(f"dist_train steps={a.steps} setup_s={t_loop - t_start:.3f} "
              f"step_s={(t_end - t_loop) / max(a.steps, 1):.5f}", flush=True)
        if a.toggle_every:
            import statistics

            print(f"toggled on_s={statistics.median(times[True]):.6f} off_s={statistics.median(times[False]):.6f} "
                  f"n={len(times[True])},{len(times[False])}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
