"""The shipped Prometheus files, checked by Prometheus' own promtool (Debian's prometheus package)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

PROM = REPO / "deploy" / "prometheus"
pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool not installed (apt-get install prometheus)")


def _promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_rules_and_config_are_valid() -> None:
    for args in (("check", "rules", "rules.yml"), ("check", "config", "prometheus.yml")):
        p = _promtool(*args)
        assert p.returncode == 0, p.stdout + p.stderr


def test_rules_fire_as_their_unit_tests_say() -> None:
    p = _promtool("test", "rules", "rules_test.yml")
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def test_a_broken_expectation_fails(tmp_path: Path) -> None:
    """The unit tests can fail: the same file with the device changed must not pass."""
    text = (PROM / "rules_test.yml").read_text()
    assert "rank=21 (score 0.93)" in text
    shutil.copy(PROM / "rules.yml", tmp_path / "rules.yml")
    (tmp_path / "broken.yml").write_text(text.replace("rank=21 (score 0.93)", "rank=22 (score 0.93)"))
    p = _promtool("test", "rules", "broken.yml", cwd=tmp_path)
    assert p.returncode != 0 and "FAILED" in p.stdout + p.stderr
