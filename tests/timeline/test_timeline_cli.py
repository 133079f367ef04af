"""`laggard timeline` as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laggard.cli import main
from tests.conftest import run_cli
from tests.timeline.timeline_factory import make_trace

STEPS = [1.0] * 5 + [1.8] + [1.0] * 4


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli")
    make_trace(out, {"tp": 2, "dp": 2}, STEPS, offsets_ns={1: 2_000_000_000})
    return out


def test_text_leads_with_status(trace_dir: Path) -> None:
    proc = run_cli("timeline", trace_dir)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("job factory: 4 GPUs")
    assert lines[1].startswith("status: IRREGULAR since step 5")
    assert "time lost" in lines[2]
    assert any(line.startswith("5!") and "spike" in line for line in lines)
    assert "\x1b[" not in proc.stdout  # plain text when piped


def test_json_and_fail_flag(trace_dir: Path) -> None:
    proc = run_cli("timeline", trace_dir, "--format", "json", "--fail-on-irregular")
    assert proc.returncode == 1
    d = json.loads(proc.stdout)
    assert d["irregular_steps"] == [5] and d["status"] == "irregular"
    assert len(d["steps"]) == len(STEPS)


def test_steps_and_delta_in_process(trace_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timeline", str(trace_dir), "--steps", "0:3", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "healthy"
    assert main(["timeline", str(trace_dir), "--delta", "2.0", "--fail-on-irregular"]) == 0
    assert "status: healthy" in capsys.readouterr().out


@pytest.mark.parametrize("args, msg", [
    (("/nonexistent/trace",), "no such trace"),
    (("{t}", "--steps", "9:1"), "ends before it starts"),
    (("{t}", "--delta", "1"), "must be above 1"),
])
def test_user_errors_one_line_exit_2(trace_dir: Path, args: tuple[str, ...], msg: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timeline", *(a.format(t=trace_dir) for a in args)]) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1
