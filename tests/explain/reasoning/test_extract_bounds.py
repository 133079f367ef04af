"""Key extraction from alert text stays linear: a long word or a line of many `ssh` cannot stall explain."""

from __future__ import annotations

import random
import re
import time

import pytest

from explain.reasoning.extract import PORT_RES, extract_keys

#: the port patterns as first written: the reference for what the bounded ones must still find
REFERENCE = (re.compile(r"\bssh\b[^\n]*?\s-p\s*(\d{2,5})\b"),
             re.compile(r"(?:\d{1,3}(?:\.\d{1,3}){3}|[A-Za-z][\w-]*\d)\]?:(\d{2,5})\b"))
PIECES = ["ssh ", "ssh", " -p ", "-p", "22", "2222", "node-3", "node", "x", "1", "-", "_", ":", "]:", "[", " ",
          "\n", "10.0.0.1", ".", "a1:22-b3:44", "host_7", "é", "٣"]


@pytest.mark.parametrize("seed", range(40))
def test_bounded_ports_match_the_reference_on_host_sized_text(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 40)))
        for new, ref in zip(PORT_RES[1:3], REFERENCE, strict=True):
            assert set(new.findall(text)) == set(ref.findall(text)), text


@pytest.mark.parametrize("text", ["x" * 65_536, "x1" * 32_768, "node1-x" * 9_362, "ssh " * 16_384, "a-" * 32_768])
def test_a_long_alert_is_read_in_linear_time(text: str) -> None:
    t0 = time.perf_counter()
    extract_keys(text, ("node-1",))
    assert time.perf_counter() - t0 < 3.0  # the unbounded patterns took minutes on these 64 KiB


def test_ports_after_hosts_and_ssh_are_still_found() -> None:
    keys = extract_keys("ssh -o BatchMode=yes node-3 -p 2222; NCCL to [node-7]:29500 and 10.0.0.1:8080")
    assert keys.ports == [2222, 8080, 29500]
