"""Timeline throughput: `build_timeline` on simulated traces, its wall time, CPU time, peak memory
and operator rows per second, plus how far its step times are from the simulator's.

    python -m bench.timeline                 # 2,048 and 8,192 GPUs x 20 steps
    python -m bench.timeline --quick         # 2,048 GPUs only
    python -m bench.timeline --gpus 16384    # one size
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, resource, sys, time
from collector.trace.traceio import Trace
from timeline.build import build_timeline
t0, c0 = time.perf_counter(), time.process_time()
tl = build_timeline(Trace.open(sys.argv[1]))
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "irregular": tl.irregular_steps, "durations": tl.steps["duration_s"].tolist()}))
"""


def run(gpus: int, steps: int, hidden: bool) -> None:
    """Simulate one trace, then time build_timeline on it in a fresh process (its own peak RSS)."""
    out = Path(tempfile.mkdtemp(prefix="lag-bench-tl-"))
    try:
        trace = out / "t"
        cmd = [sys.executable, "-m", "laggard", "simulate", "--gpus", str(gpus), "--tp", "8", "--pp", "8",
               "--steps", str(steps), "--fault", "gpu:rank=77,factor=2,steps=10:19", "--out", str(trace)]
        if hidden:
            cmd.append("--hide-steps")
        subprocess.run(cmd, check=True, capture_output=True)
        truth = json.loads((trace / "truth.json").read_text())
        res = json.loads(subprocess.run([sys.executable, "-c", CHILD, str(trace)], check=True,
                                        capture_output=True, text=True).stdout)
        err = max(abs(a / b - 1) for a, b in zip(res["durations"][1:], truth["step_time_s"][1:], strict=True))
        label = "hidden steps" if hidden else "step column"
        print(f"timeline {gpus:>6} GPUs x {steps} steps ({label}): {truth['rows']:,} rows in {res['wall']:.1f} s wall, "
              f"{res['cpu']:.1f} s CPU ({truth['rows'] / res['wall'] / 1e6:.2f} M rows/s wall, "
              f"{truth['rows'] / res['cpu'] / 1e6:.2f} M rows/s per CPU-second), peak RSS {res['rss_mib']:.0f} MiB; "
              f"irregular steps match truth: {res['irregular'] == truth['irregular_steps']}; "
              f"max step-time error {100 * err:.3f}%")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2,048 GPUs only")
    parser.add_argument("--gpus", type=int, help="one job size instead of the default set")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    sizes = [args.gpus] if args.gpus else [2048] if args.quick else [2048, 8192]
    for gpus in sizes:
        run(gpus, args.steps, hidden=False)
    run(sizes[0], args.steps, hidden=True)


if __name__ == "__main__":
    main()
