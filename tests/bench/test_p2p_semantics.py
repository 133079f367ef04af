"""The p2p-semantics benchmark: its reading of a send's time, and a real two-rank gloo run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.p2p_semantics import size_bytes, verdict
from tests.conftest import REPO


def test_sizes_read_in_binary_units() -> None:
    assert [size_bytes(s) for s in ("1KiB", "4MiB", "1GiB", "100")] == [1024, 4 << 20, 1 << 30, 100]


def test_a_send_as_long_as_the_receivers_delay_waited_for_it() -> None:
    assert verdict(98.0, 100.0).startswith("waited")
    assert verdict(3.0, 100.0).startswith("completed alone")
    assert verdict(40.0, 100.0) == "partly waited"


@pytest.mark.slow
def test_gloo_sends_wait_for_a_late_receiver() -> None:
    """What the real gloo jobs of tests/localize rely on: a gloo send completes only once its
    receiver has posted, small or large (measured, not assumed)."""
    p = subprocess.run([sys.executable, "-m", "bench.p2p_semantics", "--backend", "gloo", "--sizes", "1KiB,4MiB",
                        "--late-ms", "150", "--reps", "2", "--json"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["rows"]
    assert [r["size"] for r in rows] == ["1KiB", "4MiB"]
    for r in rows:
        assert r["send_ms"] >= 0.6 * 150 > 10 * r["alone_ms"], r
