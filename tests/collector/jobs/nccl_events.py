"""A one-GPU NCCL job (torchrun, 1 process) that shows what the CUDA-event timing must capture.

Each step delays the GPU (torch.cuda._sleep) before an all-reduce, so the host reaches the op long
before the GPU does: the logged start must be the GPU's arrival, not the host's call. An async
all-reduce is followed by another GPU delay before wait(): its logged end must be the op's own
completion. CPU-tensor ops on the mixed "cpu:gloo,cuda:nccl" group take the host path. The host
times of each call are written to `--out` for the test to compare with the shards.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from collector import commops


def gpu_delay(ms: float) -> None:
    """Keep the current stream busy for about `ms` milliseconds (calibrated once)."""
    torch.cuda._sleep(int(ms * gpu_delay.cycles_per_ms))  # type: ignore[attr-defined]


def calibrate() -> float:
    """Sleep cycles per millisecond, measured after a warm-up (an idle GPU clocks low at first)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    rate = 0.0
    for _ in range(3):
        start.record()
        torch.cuda._sleep(cycles)  # type: ignore[attr-defined]
        end.record()
        end.synchronize()
        rate = cycles / start.elapsed_time(end)
    return rate


class TimedDelay:
    """A GPU delay bracketed by events, so the test compares with what the GPU really did."""

    def __init__(self, ms: float) -> None:
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.start.record()
        gpu_delay(ms)
        self.end.record()

    def ns(self) -> float:
        return self.start.elapsed_time(self.end) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--profile", help="also write a Kineto trace of a few all-reduces into this directory")
    ap.add_argument("--fr-dump", help="also write this rank's NCCL Flight Recorder dump (pickle, and .json)")
    a = ap.parse_args()
    commops.attach()
    dist.init_process_group(backend="cpu:gloo,cuda:nccl")
    torch.cuda.set_device(0)
    gpu_delay.cycles_per_ms = calibrate()  # type: ignore[attr-defined]
    x = torch.ones(1 << 20, device="cuda")
    host = torch.ones(1024)
    calls: list[dict[str, float | int | str]] = []
    dist.all_reduce(x)  # step 0: the first NCCL op also creates the communicator (~0.4 s)
    torch.cuda.synchronize()
    commops.step()
    for step in range(1, a.steps + 1):
        before = TimedDelay(a.delay_ms)
        sync_call = time.time_ns()
        dist.all_reduce(x)
        work = dist.all_reduce(x, async_op=True)
        after = TimedDelay(a.delay_ms)  # queued after the async op: must not count in its time
        work.wait()
        cpu_call = time.time_ns()
        dist.all_reduce(host)
        torch.cuda.synchronize()
        calls.append({"step": step, "kind": "sync", "host_call_ns": sync_call, "delay_ns": before.ns()})
        calls.append({"step": step, "kind": "cpu", "host_call_ns": cpu_call, "delay_ns": after.ns()})
        commops.step()
    with open(a.out, "w") as f:
        json.dump({"calls": calls}, f)
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                dist.all_reduce(x)
            torch.cuda.synchronize()
        prof.export_chrome_trace(f"{a.profile}/rank{dist.get_rank()}.json")
    if a.fr_dump:
        from torch._C import _distributed_c10d as c10d

        with open(a.fr_dump, "wb") as f:
            # only NCCL builds of torch define the dump functions, and torch's stubs omit them
            f.write(c10d._dump_nccl_trace())  # type: ignore[attr-defined]
        with open(f"{a.fr_dump}.json", "wb") as f:
            dump = c10d._dump_nccl_trace_json()  # type: ignore[attr-defined]
            f.write(dump if isinstance(dump, bytes) else dump.encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
