"""Start-up time of the CLI: `python -m bench.startup [--quick]`.

Prints, for `laggard --help`, `--version` and every verb's `--help`, the best wall time of a few
fresh interpreters, next to `python -c pass` (the floor) and how much laggard adds to it (on a busy
machine every time grows; what laggard adds is the part it owns). Target: every one at most 0.15 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from laggard.cli import _verb_modules

TARGET_S = 0.15
ROOT = Path(__file__).resolve().parents[1]


def best_of(argv: list[str], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 runs per command instead of 7")
    ap.add_argument("--runs", type=int, default=None, help="runs per command (best is kept)")
    args = ap.parse_args()
    runs = args.runs or (3 if args.quick else 7)
    py = sys.executable
    floor = best_of([py, "-c", "pass"], runs)
    print(f"python -c pass: {floor:.3f} s (best of {runs})")
    cases = [["--help"], ["--version"]] + [[v, "--help"] for v in sorted(_verb_modules())]
    over = []
    for argv in cases:
        t = best_of([py, "-m", "laggard", *argv], runs)
        mark = "" if t <= TARGET_S else f"  over the {TARGET_S} s target"
        if mark:
            over.append(" ".join(argv))
        print(f"laggard {' '.join(argv):<24} {t:.3f} s  (+{t - floor:.3f} s over python -c pass){mark}")
    print(f"{len(cases) - len(over)}/{len(cases)} within {TARGET_S} s" + (f"; over: {', '.join(over)}" if over else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
