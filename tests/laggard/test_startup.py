"""`laggard --help`, `--version` and every verb's `--help` must not load the heavy libraries: they are
what made start-up take half a second. A behavioural check (which modules are loaded), not a timing;
the timings are printed by `python -m bench.startup`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from laggard.cli import _verb_modules

HEAVY = ("pandas", "pyarrow", "numpy", "sklearn", "matplotlib", "scipy", "torch", "drain3", "scapy", "jinja2")
ROOT = Path(__file__).resolve().parents[2]

CHILD = f"""
import contextlib, io, json, sys
from laggard.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps({{"heavy": sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r}),
                  "chars": len(out.getvalue())}}))
"""


def _loaded(*argv: str) -> dict[str, Any]:
    """Run the CLI in a fresh interpreter (this one has the heavy modules already) and list what loaded."""
    res = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("argv", [["--help"], ["--version"]] + [[v, "--help"] for v in sorted(_verb_modules())])
def test_help_and_version_load_no_heavy_library(argv: list[str]) -> None:
    got = _loaded(*argv)
    assert got["heavy"] == [], f"laggard {' '.join(argv)} loaded {got['heavy']}"
    if argv != ["--version"]:  # --version prints to stdout through argparse too, but checks nothing more
        assert int(got["chars"]) > 100  # the help really was printed


def test_capture_help_default_is_the_collectors() -> None:
    from collector.network.flows import DEFAULT_GAP_NS
    from laggard.commands.capture import DEFAULT_GAP_MS

    assert DEFAULT_GAP_MS == DEFAULT_GAP_NS / 1e6
