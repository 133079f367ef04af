"""What a verb loads or reserves that issue #14's memory budget (10x input + 300 MB) depends on.
Behavioural checks (which modules, which allocator), not a measurement: `python -m bench.memory`
prints each verb's peak against the budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from laggard.cli import ARROW_POOL

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import contextlib, io, json, sys
from laggard.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(sys.argv[1:])
import pyarrow as pa
print(json.dumps({"rc": rc, "pool": pa.default_memory_pool().backend_name,
                  "loaded": sorted({m.split(".")[0] for m in sys.modules} & {"rich", "networkx", "sklearn"})}))
"""


def test_explain_loads_no_progress_bar_graph_or_ml_library_and_uses_the_lean_allocator(tmp_path: Path) -> None:
    # stderr is a pipe here, as in a script or cron job: no progress bar is shown, so rich stays unloaded;
    # a fresh HOME: the knowledge-base index is fitted without scikit-learn (a commops-only trace needs none)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", CHILD, "explain", str(ROOT / "traces" / "gpu-spike"), "--probes",
                          "dry-run", "--no-llm", "--audit", str(tmp_path / "audit.jsonl")],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0
    assert got["pool"] == ARROW_POOL != "mimalloc"  # Arrow's default reserved ~30 MB more
    assert got["loaded"] == []
    assert "Unsupported backend" not in res.stderr  # the chosen allocator is built into this pyarrow


def test_the_allocator_stays_the_users_choice(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}
    res = subprocess.run([sys.executable, "-c", CHILD, "validate", str(ROOT / "traces" / "gpu-spike")],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["pool"] == "mimalloc"
