"""`laggard logs` and `laggard logs learn` end to end through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cluster import Layout
from simulator.config import SimConfig
from simulator.logs import emit_logs
from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # each case starts the CLI in a new process


def make(tmp_path: Path, name: str, seed: int, failure: str | None, hosts: int = 4) -> Path:
    d = tmp_path / name
    d.mkdir()
    Layout.build(SimConfig(gpus=8 * hosts, tp=8, job=name).resolved()).meta().save(d / "meta.json")
    emit_logs(d, seed, failure)
    return d


def test_logs_text_and_json(tmp_path: Path) -> None:
    d = make(tmp_path, "job", 31, "host_disk")
    truth = json.loads((d / "truth.json").read_text())["log_failures"][0]
    env = {"LAGGARD_LOG_POOL": str(tmp_path / "none.json")}
    text = run_cli("logs", d, env=env, check=True).stdout
    assert f"host   {truth['host']}" in text and f"logs/{truth['host']}.log:" in text
    assert f"stage {truth['stage']}" in text
    out = json.loads(run_cli("logs", d, "--format", "json", "--top", "2", env=env, check=True).stdout)
    assert out["candidates"][0]["host"] == truth["host"] and out["candidates"][0]["kind"] == "host"
    assert out["logs"]["stage"] == truth["stage"] and len(out["candidates"]) <= 2
    assert set(out["logs"]["lines"][0].split(": ")[0].split(":")[0:1]) <= {f"logs/{h}.log" for h in
                                                                         ("node-0", "node-1", "node-2", "node-3")}
    assert run_cli("logs", d, "--fail-on-irregular", env=env).returncode == 1


def test_logs_learn_writes_the_pool(tmp_path: Path) -> None:
    ok = make(tmp_path, "ok", 32, None, hosts=2)
    pool = tmp_path / "pool.json"
    out = run_cli("logs", "learn", ok, "--format", "json", env={"LAGGARD_LOG_POOL": str(pool)}, check=True)
    info = json.loads(out.stdout)
    assert info["pool"] == str(pool) and info["new_events"] > 10 and info["jobs"] == 1
    again = json.loads(run_cli("logs", "learn", ok, "--pool", pool, "--format", "json", check=True).stdout)
    assert again["new_events"] == 0 and again["jobs"] == 2


def test_user_mistakes_exit_2_with_one_line(tmp_path: Path) -> None:
    r = run_cli("logs", tmp_path / "missing")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    d = make(tmp_path, "nologs", 33, None, hosts=2)
    for f in (d / "logs").iterdir():
        f.unlink()
    (d / "logs").rmdir()
    (d / "commops.jsonl").write_text("")
    r = run_cli("logs", d)
    assert r.returncode == 2 and "logs/" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("logs", "learn")
    assert r.returncode == 2 and "successful" in r.stderr
    r = run_cli("logs", tmp_path / "missing", "--lines", "-5")
    assert r.returncode == 2 and "--lines -5" in r.stderr and len(r.stderr.strip().splitlines()) == 1
