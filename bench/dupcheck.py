"""What the duplicate-row check would cost on every read: `python -m bench.dupcheck [--quick] [--rows N]`.

The contract's duplicate check (same rank, group, op, seq, peer) runs in `laggard validate` only.
Issue #14 asks whether every reader could afford it: the rule is "on every read if it costs under
~5% of the read". Simulates a job of about --rows CommOps rows (default 5 M), then times, best of
three in this process, Trace.table("commops") (the read every verb does, with the contract's row
checks) and the duplicate check alone (commops_problems with full=True minus without), and prints
both and their ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROWS_PER_STEP_2048 = 380_928  # operator rows per step of the 2048-GPU tp=8 pp=8 job simulated below


def best_of(fn: Callable[[], object], runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=5e6, help="about how many rows (default 5e6)")
    ap.add_argument("--quick", action="store_true", help="1 M rows")
    args = ap.parse_args()
    rows = 1e6 if args.quick else args.rows
    steps = max(1, round(rows / ROWS_PER_STEP_2048))
    from collector.trace.contract import commops_problems
    from collector.trace.traceio import Trace

    with tempfile.TemporaryDirectory(prefix="laggard-dup-") as tmp:
        trace = Path(tmp) / "t"
        subprocess.run([sys.executable, "-m", "laggard", "simulate", "--gpus", "2048", "--tp", "8", "--pp", "8",
                        "--steps", str(steps), "--seed", "1", "--out", str(trace)], check=True, capture_output=True)
        tr = Trace.open(trace)
        table = tr.table("commops")
        read_s = best_of(lambda: tr.table("commops"))
        plain_s = best_of(lambda: commops_problems(table, tr.meta, "t"))
        full_s = best_of(lambda: commops_problems(table, tr.meta, "t", full=True))
    dup_s = max(full_s - plain_s, 0.0)
    print(f"{table.num_rows:,} CommOps rows: read with the contract's row checks {read_s:.2f} s; "
          f"duplicate check {dup_s:.2f} s = {dup_s / read_s:.0%} of the read (rule: on every read if under 5%)")
    print("verdict: " + ("cheap enough for every read" if dup_s < 0.05 * read_s else "validate only"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
