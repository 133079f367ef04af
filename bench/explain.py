"""`python -m bench.explain`: wall time of `laggard explain` without an LLM (target <= 5 s).

Simulates a few scenarios, writes a verdict for each (the real localizer when this build has one,
else the evaluation oracle), and times the full command as a user runs it, in a fresh process.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = ("gpu-straggler", "pcie-downgrade", "switch-congestion", "stage-imbalance")


def main() -> None:
    from collector.trace.traceio import Trace
    from laggard.commands.eval import localizer, verdict_for
    from simulator.config import scenario_config
    from simulator.writer import simulate_trace

    loc = localizer("auto")
    env = dict(os.environ, PYTHONPATH=str(REPO), LAGGARD_LLM_BASE_URL="")
    with tempfile.TemporaryDirectory(prefix="bench-explain-") as tmp:
        for name in SCENARIOS:
            out = Path(tmp) / name
            simulate_trace(scenario_config(name, steps=12), out)
            vfile = out / "verdict.json"
            vfile.write_text(json.dumps(verdict_for(Trace.open(out), loc).to_dict()))
            cmd = [sys.executable, "-m", "laggard", "explain", str(out), "--verdict", str(vfile), "--no-llm",
                   "--format", "json", "--audit", str(Path(tmp) / "audit.jsonl")]
            wall, cpu, res = timed(cmd, env)
            d = json.loads(res.stdout)
            full = ""
            if loc is not None:  # the whole command as a user runs it: localize, then explain
                fw, fc, _ = timed([c for c in cmd if c not in ("--verdict", str(vfile))], env)
                full = f"; with localize {fw:5.2f} s wall, {fc:5.2f} s CPU"
            # on a busy machine wall time measures the neighbours; CPU time is what the command needs
            print(f"{name:18} explain --verdict {wall:5.2f} s wall, {cpu:5.2f} s CPU{full} (median of 3"
                  f"; diagnose {d['elapsed_s']:.3f} s); cause {d['cause']['entry'] if d['cause'] else None}, "
                  f"{len(d['probes'])} probe(s); localizer {'real' if loc else 'oracle'}")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    walls, cpus = [], []
    for _ in range(3):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        walls.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return statistics.median(walls), statistics.median(cpus), res


if __name__ == "__main__":
    main()
