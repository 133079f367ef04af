"""The log event pool has a budget (issue #14): read only from a regular file within
LAGGARD_MAX_POOL_BYTES, never written beyond it, and every refusal is one line, exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from collector.inputs.errors import UserError
from localize.logs.pool import EventPool
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[3]
OK_TRACE = ROOT / "traces" / "gpu-xid"  # has logs/


def test_learn_refuses_a_fifo_pool_instead_of_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "pool.json"
    os.mkfifo(fifo)
    for argv in (("logs", "learn", OK_TRACE, "--pool", fifo), ("logs", OK_TRACE, "--pool", fifo)):
        proc = run_cli(*argv, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "not a regular file" in proc.stderr


def test_learn_stops_at_the_pool_cap_and_writes_nothing(tmp_path: Path) -> None:
    pool = tmp_path / "pool.json"
    proc = run_cli("logs", "learn", OK_TRACE, "--pool", pool, env={"LAGGARD_MAX_POOL_BYTES": "2000"}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "LAGGARD_MAX_POOL_BYTES" in proc.stderr
    assert not pool.exists() and not pool.with_suffix(".tmp").exists()
    run_cli("logs", "learn", OK_TRACE, "--pool", pool, check=True, timeout=120)  # within the default cap
    assert len(EventPool.load(pool)) > 0
    # the same pool, read under a smaller cap, is refused before it is held
    proc = run_cli("logs", OK_TRACE, "--pool", pool, env={"LAGGARD_MAX_POOL_BYTES": "2000"}, timeout=120)
    assert proc.returncode == 2 and "over the 2000-byte limit" in proc.stderr, proc.stderr


@pytest.mark.parametrize("text", ['{"shapes": {"a": 1e999}}', '{"shapes": {"a": "many"}}', "[1, 2]",
                                  "[" * 100 + "]" * 100, "not json"])
def test_a_broken_pool_is_one_user_error(tmp_path: Path, text: str) -> None:
    p = tmp_path / "pool.json"
    p.write_text(text)
    with pytest.raises(UserError):
        EventPool.load(p)


def test_a_saved_pool_reads_back(tmp_path: Path) -> None:
    pool = EventPool({"GPU <*> fell off": 2}, {"GPU <*> fell off the bus": 1}, ["run5", "run6"])
    pool.save(tmp_path / "p.json")
    back = EventPool.load(tmp_path / "p.json")
    assert (back.shapes, back.templates, back.jobs) == (pool.shapes, pool.templates, pool.jobs)
    assert json.loads((tmp_path / "p.json").read_text())["version"] == 1
