"""Bounded, non-blocking reads of user files: regular files only, size-capped, JSON depth-capped.

A FIFO or device named like a log would block a reader forever, a gzip bomb would fill memory and
a deeply nested JSON document would exhaust the stack; each is refused here with one line, before
the bytes are held, so every reader in collector/ gets the same protection.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import zlib
from pathlib import Path
from typing import Any

from collector.inputs.errors import TraceError
from collector.inputs.limits import ENV, limits


def check_regular(path: Path) -> os.stat_result:
    """stat() of a regular file; TraceError for a FIFO, device, socket or directory."""
    try:
        st = path.stat()
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})", "check the path and permissions") from exc
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise TraceError(f"{path}: {kind}, not a regular file", "replace it with the file itself (pipes and devices are not read)")
    return st


def read_regular(path: Path, cap: int, cap_name: str) -> bytes:
    """A regular file's bytes, at most `cap`; opened non-blocking so a FIFO swapped in cannot hang."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})", "check the path and permissions") from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TraceError(f"{path}: not a regular file", "replace it with the file itself (pipes and devices are not read)")
        if st.st_size > cap:
            raise TraceError(f"{path}: {st.st_size} bytes, over the {cap}-byte limit",
                             f"raise {ENV[cap_name]} if the file is genuine")
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise TraceError(f"{path}: over the {cap}-byte limit", f"raise {ENV[cap_name]} if the file is genuine")
    return data


def gunzip_bounded(data: bytes, cap: int, where: Path) -> bytes:
    """Decompress gzip data (all members), refusing output over `cap` before it is held."""
    out: list[bytes] = []
    size = 0
    rest = data
    try:
        while rest:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while True:
                chunk = d.decompress(rest, 1 << 20)
                size += len(chunk)
                if size > cap:
                    raise TraceError(f"{where}: decompresses to more than {cap} bytes ({cap // max(len(data), 1)}x "
                                     "its size)", f"raise {ENV['log_bytes']} or {ENV['gzip_ratio']} if the log is "
                                     "genuine (a gzip bomb is not)")
                out.append(chunk)
                rest = d.unconsumed_tail
                if d.eof or not rest:
                    break
            if not d.eof:
                raise TraceError(f"{where}: corrupt gzip log (truncated)", "re-fetch the log or gunzip it by hand")
            rest = d.unused_data.lstrip(b"\0")
    except zlib.error as exc:
        raise TraceError(f"{where}: corrupt gzip log ({exc})", "re-fetch the log or gunzip it by hand") from exc
    return b"".join(out)


def check_log_file(path: Path) -> None:
    """The cheap part of a log's budget, checked before anything is read (Trace.open runs it for
    every log, so a bomb is refused before any analysis): a regular file within the size cap,
    and, if gzipped, a declared decompressed size (the gzip trailer) within the size and ratio caps.
    A trailer that lies is still caught while decompressing (gunzip_bounded)."""
    lim = limits()
    st = check_regular(path)
    if st.st_size > lim.log_bytes:
        raise TraceError(f"{path}: {st.st_size} bytes, over the {lim.log_bytes}-byte limit",
                         f"raise {ENV['log_bytes']} if the log is genuine, or cut it to the window of interest")
    if st.st_size < 18:
        return
    with path.open("rb") as fh:
        magic = fh.read(2)
        if magic != b"\x1f\x8b":
            return
        fh.seek(-4, os.SEEK_END)
        declared = int.from_bytes(fh.read(4), "little")
    cap = min(lim.log_bytes, lim.gzip_ratio * st.st_size)
    if declared > cap:
        raise TraceError(f"{path}: decompresses to {declared} bytes, more than {cap} ({declared // st.st_size}x its size)",
                         f"raise {ENV['log_bytes']} or {ENV['gzip_ratio']} if the log is genuine (a gzip bomb is not)")


def json_depth(obj: Any, cap: int) -> int:
    """Nesting depth of a parsed JSON value, stopping (and returning cap + 1) once past `cap`."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    deepest = 0
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            o = list(o.values())
        if isinstance(o, list):
            deepest = max(deepest, d)
            if d > cap:
                return d
            stack.extend((v, d + 1) for v in o if isinstance(v, (dict, list)))
    return deepest


def load_json(data: bytes, where: Path) -> Any:
    """json.loads with the depth cap; TraceError (one line) for bad JSON or too deep nesting."""
    cap = limits().json_depth
    try:
        obj = json.loads(data)
    except RecursionError as exc:
        raise TraceError(f"{where}: JSON nested too deeply", f"raise {ENV['json_depth']} if genuine") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, or an integer too long to convert
        where_ = (f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else
                  "" if isinstance(exc, UnicodeDecodeError) else
                  f" (a number of more than {sys.get_int_max_str_digits()} digits)")
        raise TraceError(f"{where}: not valid JSON{where_}", "fix or regenerate the file") from exc
    if json_depth(obj, cap) > cap:
        raise TraceError(f"{where}: JSON nested deeper than {cap} levels", f"raise {ENV['json_depth']} if genuine")
    return obj


def read_json(path: Path) -> Any:
    """A small JSON file (meta.json, truth.json, a state file): a regular file within the meta.json size
    cap, parsed with the depth cap; TraceError (one line) otherwise."""
    return load_json(read_regular(path, limits().meta_bytes, "meta_bytes"), path)
