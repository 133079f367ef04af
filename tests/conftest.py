"""Shared fixtures: run the CLI of this checkout, and small simulated traces."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str | Path, check: bool = False, timeout: float = 600, env: dict[str, str] | None = None,
            cwd: str | Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run `python -m laggard ARGS` against this checkout (not whatever is installed)."""
    full_env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "laggard", *map(str, args)],
        capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"laggard {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stderr}")
    return proc


@pytest.fixture
def cli():
    return run_cli
