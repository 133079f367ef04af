"""Does a busy machine move the verdict? `python -m bench.stalls [--runs 40] [--stall-s 0.03,0.06,0.1]`.

Replays a real gloo job recorded on this project's machine (`tests/localize/data/real-gloo/straggler`:
4 ranks, rank 1 at 15x its 20 ms steps in steps 10-19) with whole-machine stalls added to random
steps, as a busy CI machine made them: 3-15 stalls, each one of `--stall-s` long, mostly outside the
straggler's steps. Both paths answer through the CLI (`laggard localize`; `laggard sidecar run`,
then `sidecar localize`). Prints each wrong answer and how many each path got right; exit 0.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "localize" / "data" / "real-gloo" / "straggler"
STRAGGLER, FAULT_STEPS, STEPS = 1, range(10, 20), 30


def stall_machine(trace: Path, steps: list[int], stall_s: float) -> None:
    """Every rank stops for `stall_s` as each of `steps` begins: its records from that step on
    start and end that much later, as when the machine is busy with another job."""
    for shard in sorted((trace / "commops").glob("*.parquet")):
        table = pq.read_table(shard)
        step = table.column("step").to_numpy()
        shift = np.int64(stall_s * 1e9) * (step[:, None] >= np.asarray(steps)[None, :]).sum(axis=1)
        for name in ("start_ns", "end_ns"):
            moved = pa.array(table.column(name).to_numpy() + shift, type=table.schema.field(name).type)
            table = table.set_column(table.schema.get_field_index(name), name, moved)
        pq.write_table(table, shard)


def answers(trace: Path) -> dict[str, dict]:
    """Both paths' verdicts (JSON), as a user gets them."""
    def cli(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "laggard", *args], capture_output=True, text=True,
                              cwd=ROOT, check=True).stdout

    full = json.loads(cli("localize", str(trace), "--format", "json"))
    cli("sidecar", "run", str(trace), "--all-hosts")
    return {"localize": full, "sidecar": json.loads(cli("sidecar", "localize", str(trace), "--format", "json"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--stall-s", default="0.03,0.06,0.1", help="stall lengths drawn from (s)")
    ap.add_argument("--seed", type=int, default=2)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    lengths = [float(x) for x in a.stall_s.split(",")]
    right = {"localize": 0, "sidecar": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.runs):
            k, stall = rng.randint(3, 15), rng.choice(lengths)
            pool = [s for s in range(1, STEPS) if s not in FAULT_STEPS] if rng.random() < 0.6 else list(range(1, STEPS))
            steps = sorted(rng.sample(pool, k))
            trace = Path(tmp) / f"run-{i}"
            shutil.copytree(RECORDED, trace)
            stall_machine(trace, steps, stall)
            for path, v in answers(trace).items():
                top = v["candidates"][0] if v.get("candidates") else {}
                if v["status"] == "irregular" and top.get("rank") == STRAGGLER:
                    right[path] += 1
                else:
                    named = ", ".join(f"{c['kind']} {c.get('rank', c.get('host'))} {c['score']:.2f}"
                                      for c in v.get("candidates", [])[:3]) or "no device"
                    print(f"run {i}: {k} stalls of {stall:g} s in steps {steps}: {path} answered {v['status']}, {named}")
            print(f"\r{i + 1}/{a.runs} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    for path, n in right.items():
        print(f"{path:9s} named rank {STRAGGLER} first in {n}/{a.runs} runs")


if __name__ == "__main__":
    main()
