"""Bounded reads of user files: every malformed document is one TraceError line, never another exception."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from collector.inputs.errors import TraceError
from collector.inputs.safeio import load_json, read_json


@pytest.mark.parametrize("doc", [b'{"world_size": 1' + b"0" * 5000 + b"}", b"[" + b"9" * (sys.get_int_max_str_digits() + 1) + b"]"])
def test_a_number_too_long_for_python_is_a_user_error(doc: bytes) -> None:
    digits = sys.get_int_max_str_digits()
    with pytest.raises(TraceError, match=rf"meta.json: not valid JSON \(a number of more than {digits} digits\)"):
        load_json(doc, Path("meta.json"))


def test_bad_json_names_its_line() -> None:
    with pytest.raises(TraceError, match=r"not valid JSON \(line 2\)"):
        load_json(b"{\n,}", Path("meta.json"))


@pytest.mark.timeout(30)
def test_a_small_json_file_is_read_only_if_regular(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "state.json")  # open() of it would block until a writer came
    with pytest.raises(TraceError, match="not a regular file"):
        read_json(tmp_path / "state.json")
    (tmp_path / "ok.json").write_text('{"next_step": 3}')
    assert read_json(tmp_path / "ok.json") == {"next_step": 3}
