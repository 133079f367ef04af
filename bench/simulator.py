"""Simulator throughput: operator rows/s of generation on one core, and a 16,384-GPU x 20-step trace
written end to end with its wall time and peak memory.

    python -m bench.simulator            # full figures (16,384 GPUs; a few minutes)
    python -m bench.simulator --quick    # 2,048 GPUs only
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simulator.cluster import Layout
from simulator.config import FaultSpec, SimConfig
from simulator.engine import Engine
from simulator.faults import FaultModel, resolve_faults


def generation_rate(gpus: int, steps: int) -> tuple[int, float]:
    """Rows and CPU seconds of the timing engine alone (no Parquet), on this process's one core."""
    cfg = SimConfig(gpus=gpus, tp=8, pp=8, steps=steps, seed=1,
                    faults=[FaultSpec.parse("gpu:rank=77,factor=2,steps=2:9")]).resolved()
    layout = Layout.build(cfg)
    engine = Engine(cfg, layout, FaultModel(cfg, layout, resolve_faults(cfg, layout)))
    t0 = time.process_time()
    rows = sum(len(b) for b in engine.run())
    return rows, time.process_time() - t0


def end_to_end(gpus: int, steps: int) -> None:
    """Run `laggard simulate` in a child process: wall time, CPU time, peak RSS, rows, bytes."""
    out = Path(tempfile.mkdtemp(prefix="lag-bench-"))
    try:
        cmd = [sys.executable, "-m", "laggard", "simulate", "--gpus", str(gpus), "--tp", "8", "--pp", "8",
               "--steps", str(steps), "--fault", "gpu:rank=77,factor=2,steps=5:19", "--out", str(out / "t")]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (usage.ru_utime + usage.ru_stime) - (before.ru_utime + before.ru_stime)
        import json

        truth = json.loads((out / "t" / "truth.json").read_text())
        size = sum(f.stat().st_size for f in (out / "t").iterdir())
        print(f"end-to-end {gpus:>6} GPUs x {steps} steps: {truth['rows']:,} rows in {wall:.1f} s wall, "
              f"{cpu:.1f} s CPU ({truth['rows'] / cpu / 1e6:.2f} M rows/s per CPU-second, Parquet included), "
              f"peak RSS <= {usage.ru_maxrss / 1024:.0f} MiB, trace {size / 2**20:.0f} MiB")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip the 16,384-GPU run")
    args = parser.parse_args()
    for gpus, steps in ((2048, 10), (8192, 4)):
        rows, cpu = generation_rate(gpus, steps)
        print(f"generation {gpus:>6} GPUs x {steps} steps: {rows:,} rows in {cpu:.2f} s CPU = "
              f"{rows / cpu / 1e6:.2f} M rows/s on one core (target >= 5)")
    end_to_end(2048, 20)
    if not args.quick:
        end_to_end(16384, 20)


if __name__ == "__main__":
    main()
