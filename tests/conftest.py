"""Shared fixtures: run the CLI of this checkout, and small simulated traces."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, check: bool = False, timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run `python -m laggard ARGS` against this checkout (not whatever is installed)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(kw.pop("env", {}) or {})  # type: ignore[arg-type]
    proc = subprocess.run(
        [sys.executable, "-m", "laggard", *map(str, args)],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=kw.pop("cwd", REPO),  # type: ignore[arg-type]
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"laggard {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stderr}")
    return proc


@pytest.fixture
def cli():
    return run_cli
