"""Bounded reads of user files: every malformed document is one TraceError line, never another exception."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from collector.errors import TraceError
from collector.safeio import load_json


@pytest.mark.parametrize("doc", [b'{"world_size": 1' + b"0" * 5000 + b"}", b"[" + b"9" * (sys.get_int_max_str_digits() + 1) + b"]"])
def test_a_number_too_long_for_python_is_a_user_error(doc: bytes) -> None:
    digits = sys.get_int_max_str_digits()
    with pytest.raises(TraceError, match=rf"meta.json: not valid JSON \(a number of more than {digits} digits\)"):
        load_json(doc, Path("meta.json"))


def test_bad_json_names_its_line() -> None:
    with pytest.raises(TraceError, match=r"not valid JSON \(line 2\)"):
        load_json(b"{\n,}", Path("meta.json"))
