"""The fuzz corpus (bench/_corpus.py, every input class of issue #14) through the readers, in-process.

validate and the readers share one check: for every broken trace, validate reports a problem AND
opening and reading it raises the one-line user error; for every control, neither happens. The
CLI-level figures (exit codes, hangs, peak memory per input) are bench/reliability.py's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench._corpus import Case, build
from collector.importers.flight_recorder import import_flight_recorder
from collector.importers.kineto import import_kineto
from collector.inputs.errors import UserError
from collector.logs import read_log
from collector.trace.traceio import Trace
from collector.trace.validate import validate_trace

PWNED = Path("/tmp/laggard-pwned")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    return build(tmp_path_factory.mktemp("corpus"), bomb_bytes=16 << 20)


def _read_everything(path: Path) -> None:
    """What the analysis verbs read: meta (Trace.open), every evidence table, every log."""
    trace = Trace.open(path)
    for kind in trace.evidence:
        trace.table(kind)
    for log in trace.log_files():
        read_log(log)


def test_the_corpus_covers_every_class_of_the_issue(corpus: list[Case]) -> None:
    classes = {c.cls for c in corpus}
    assert {"meta-numbers", "names", "fifo", "gzip", "pickle", "json-depth", "ranks", "value-ranges", "log-text",
            "terminal-escapes", "line-length", "formats", "control"} <= classes
    assert sum(c.size() for c in corpus) < 32 << 20  # small files, made here, not committed


@pytest.mark.timeout(300)
def test_validate_and_the_readers_agree_on_every_trace(corpus: list[Case]) -> None:
    missed = []
    for case in (c for c in corpus if c.kind == "trace"):
        problems = validate_trace(case.path)
        try:
            _read_everything(case.path)
            refused = None
        except UserError as exc:
            refused = str(exc)
        if case.valid and (problems or refused):
            missed.append(f"{case.name}: valid input refused: {problems[:1]} {refused}")
        if not case.valid and not (problems and refused):
            missed.append(f"{case.name}: validate {'refused' if problems else 'accepted'}, "
                          f"readers {'refused' if refused else 'accepted'}")
        for p in problems:
            assert "\n" not in p.line(), p
    assert missed == []


@pytest.mark.timeout(300)
def test_importers_refuse_every_broken_dump_and_run_no_code(corpus: list[Case], tmp_path: Path) -> None:
    PWNED.unlink(missing_ok=True)
    missed = []
    for case in (c for c in corpus if c.kind in ("fr", "kineto")):
        importer = import_flight_recorder if case.kind == "fr" else import_kineto
        try:
            importer(case.path, tmp_path / case.name)
            ok = True
        except UserError as exc:
            ok = False
            assert "\n" not in str(exc)
        if ok != case.valid:
            missed.append(f"{case.name}: {'accepted' if ok else 'refused'}")
    assert missed == []
    assert not PWNED.exists()


@pytest.mark.slow
def test_logs_verb_shows_escape_sequences_instead_of_obeying_them(corpus: list[Case]) -> None:
    case = next(c for c in corpus if c.name == "ok-escape-sequences")
    proc = subprocess.run([sys.executable, "-m", "laggard.cli", "logs", str(case.path), "--lines", "200"],
                          capture_output=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    assert b"\x1b" not in proc.stdout + proc.stderr and b"\xe2\x80\xae" not in proc.stdout
