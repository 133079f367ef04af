"""Peak memory of each verb on the shipped traces: `python -m bench.memory [--quick] [--verbs V,...]`.

Target (issue #14): peak RSS <= 10x the input's size + 300 MB for any input. Each verb runs on each
trace in traces/ through the real CLI in its own process; the peak is that process's max RSS
(getrusage of the child). The input's size is every file of the trace on disk. Prints one line per
run, the closest margin, and exits 1 when any run is over its budget. --quick: one trace with logs.
--large: instead, two simulated traces, 5 M rows (2,048 GPUs, tp 8, pp 8, 13 steps, one slow GPU: 24 MB
of Parquet; under LAGGARD_MAX_FULL_ROWS, so localized from the full records) and 10 M rows (4,096 GPUs:
over it, so localized from per-host summaries), through validate, timeline, localize, explain and
report (issue #14 on large valid traces).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20
VERBS = ("validate", "timeline", "localize", "logs", "explain", "report")


#: the verbs --large runs, and the jobs it simulates (x 13 steps: 4,952,064 and 9,904,128 operator rows)
LARGE_VERBS = ("validate", "timeline", "localize", "explain", "report")
LARGE_GPUS = {"large": 2048, "larger": 4096}
LARGE_JOB = ("--tp", "8", "--pp", "8", "--steps", "13", "--seed", "17", "--fault", "gpu:rank=683,factor=2,steps=7:12")


def simulate_large(out: Path, gpus: int) -> Path:
    """A --large trace, written by `laggard simulate` (in its own process: not measured)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "laggard.cli", "simulate", "--gpus", str(gpus), *LARGE_JOB, "--out", str(out)],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return out


def budget_mb(input_bytes: int) -> float:
    """The issue's budget: 10x the input + 300 MB."""
    return 10 * input_bytes / MB + 300


def trace_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def argv(verb: str, trace: Path, out: Path) -> list[str]:
    base = [sys.executable, "-m", "laggard.cli", verb, str(trace)]
    if verb == "explain":
        return [*base, "--probes", "dry-run", "--no-llm", "--audit", str(out / "audit.jsonl")]
    if verb == "report":
        return [*base, "--out", str(out / "report.html")]
    return base


def peak_mb(cmd: list[str]) -> tuple[int, float]:
    """Exit code and max RSS (MB) of one child process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only traces/gpu-xid (commops and logs)")
    ap.add_argument("--large", action="store_true", help="simulated 5 M- and 10 M-row traces (every verb but logs)")
    ap.add_argument("--verbs", default=None, help=f"comma-separated verbs (default {','.join(VERBS)}; "
                                                  f"with --large {','.join(LARGE_VERBS)})")
    args = ap.parse_args()
    verbs = [v for v in (args.verbs or ",".join(LARGE_VERBS if args.large else VERBS)).split(",") if v]
    traces = [ROOT / "traces" / "gpu-xid"] if args.quick else sorted(
        p for p in (ROOT / "traces").iterdir() if (p / "meta.json").is_file())
    over, worst = [], (float("inf"), "no run")
    with tempfile.TemporaryDirectory(prefix="laggard-mem-") as tmp:
        if args.large:
            traces = [simulate_large(Path(tmp) / name, gpus) for name, gpus in LARGE_GPUS.items()]
        for trace in traces:
            size = trace_bytes(trace)
            budget = budget_mb(size)
            for verb in verbs:
                if verb == "logs" and not (trace / "logs").is_dir():
                    continue
                rc, mb = peak_mb(argv(verb, trace, Path(tmp)))
                mark = "" if mb <= budget else "  OVER"
                if mark or rc not in (0, 1):
                    over.append(f"{trace.name} {verb}")
                worst = min(worst, (budget - mb, f"{trace.name} {verb}"))
                print(f"{trace.name:16s} {verb:9s} exit {rc}  peak {mb:6.1f} MB  budget {budget:6.1f} MB "
                      f"(input {size / 1024:6.0f} KiB){mark}", flush=True)
    print(f"closest to the budget: {worst[1]} (margin {worst[0]:.1f} MB)")
    print(f"{len(over)} run(s) over the budget or failing" + (f": {', '.join(over)}" if over else ""))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
