"""Text from inputs (job names, trace paths, log lines) reaches the terminal escaped by every verb:
a hostile name cannot retitle, clear or recolour the on-call engineer's terminal (issue #14)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\u202e"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\u202e"


def _hostile_trace(tmp_path: Path) -> Path:
    trace = tmp_path / f"t{HOSTILE}"
    shutil.copytree(ROOT / "traces" / "gpu-spike", trace)
    meta = json.loads((trace / "meta.json").read_text())
    meta["job"] = f"run7{HOSTILE}"
    (trace / "meta.json").write_text(json.dumps(meta))
    return trace


def _raw(text: str) -> bool:
    return any(c in text for c in ("\x1b", "\x07", "\u202e"))


def test_validate_shows_a_hostile_trace_path_escaped(tmp_path: Path) -> None:
    proc = run_cli("validate", _hostile_trace(tmp_path), check=True)
    assert not _raw(proc.stdout + proc.stderr)
    assert proc.stdout.strip().endswith(f"t{SHOWN}: valid"), proc.stdout


def test_report_markdown_on_stdout_shows_a_hostile_job_name_escaped(tmp_path: Path) -> None:
    proc = run_cli("report", _hostile_trace(tmp_path), "--out", "-", "--format", "md", check=True)
    assert not _raw(proc.stdout + proc.stderr)
    assert f"run7{SHOWN}" in proc.stdout


def test_no_verb_prints_without_escaping() -> None:
    """Every print in laggard/ goes through cliutil.emit (or wraps its text in safe_text): a new verb
    that prints a name raw fails here before it reaches a terminal."""
    import ast

    bare = []
    for path in sorted((ROOT / "laggard").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                escaped = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "safe_text"
                              for arg in node.args for n in ast.walk(arg))
                if not escaped:
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bare == [], f"print without safe_text (use cliutil.emit): {bare}"
