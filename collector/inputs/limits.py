"""Every reader's budget: the caps that keep a hostile or broken input from taking unbounded time or memory.

Each cap has a default sized for the largest real jobs laggard targets (tens of thousands of
GPUs, multi-GB per-host logs are cut by the sidecar long before) and an environment variable to
raise it for a job that is really larger. Readers refuse what exceeds a cap with one line (exit 2)
naming the variable, so a user who meets one knows what to change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        val = int(raw) if raw.strip() else default
    except ValueError:
        return default
    return val if val > 0 else default


@dataclass(frozen=True)
class Limits:
    world_size: int  # ranks in one job (meta.json, dumps, profiler traces)
    meta_bytes: int  # meta.json
    dump_bytes: int  # one Flight Recorder dump or profiler trace
    log_bytes: int  # one log file, after decompression
    gzip_ratio: int  # decompressed / compressed size of a gzipped log (text gzips 5-20x; bombs 1000x)
    log_lines: int  # lines in one log file (each costs ~100 bytes of index besides its text)
    line_bytes: int  # one log line (longer ones are cut)
    max_step: int  # the largest training iteration number a record may carry
    step_cells: int  # steps spanned x ranks: the size of the step-by-rank tables the analysis builds
    json_depth: int  # nesting of any JSON or pickle document
    objects: int  # containers and scalars in one pickle
    pool_bytes: int  # the log event pool (`laggard logs learn`), read and written
    full_rows: int  # CommOps rows the full-records localizer holds in one process (~100 B each at its peak)

    @classmethod
    def from_env(cls) -> Limits:
        return cls(
            world_size=_env_int("LAGGARD_MAX_WORLD_SIZE", 131_072),
            meta_bytes=_env_int("LAGGARD_MAX_META_BYTES", 256 << 20),
            dump_bytes=_env_int("LAGGARD_MAX_DUMP_BYTES", 2 << 30),
            log_bytes=_env_int("LAGGARD_MAX_LOG_BYTES", 1 << 30),
            gzip_ratio=_env_int("LAGGARD_MAX_GZIP_RATIO", 100),
            log_lines=_env_int("LAGGARD_MAX_LOG_LINES", 20_000_000),
            line_bytes=_env_int("LAGGARD_MAX_LINE_BYTES", 64 << 10),
            max_step=_env_int("LAGGARD_MAX_STEP", 10_000_000),
            step_cells=_env_int("LAGGARD_MAX_STEP_CELLS", 10_000_000),
            json_depth=_env_int("LAGGARD_MAX_JSON_DEPTH", 64),
            objects=_env_int("LAGGARD_MAX_OBJECTS", 50_000_000),
            pool_bytes=_env_int("LAGGARD_MAX_POOL_BYTES", 64 << 20),
            full_rows=_env_int("LAGGARD_MAX_FULL_ROWS", 5_000_000),
        )


def limits() -> Limits:
    """The caps in force now (read from the environment on each call; cheap)."""
    return Limits.from_env()


ENV = {"world_size": "LAGGARD_MAX_WORLD_SIZE", "meta_bytes": "LAGGARD_MAX_META_BYTES",
       "dump_bytes": "LAGGARD_MAX_DUMP_BYTES", "log_bytes": "LAGGARD_MAX_LOG_BYTES",
       "gzip_ratio": "LAGGARD_MAX_GZIP_RATIO", "log_lines": "LAGGARD_MAX_LOG_LINES",
       "line_bytes": "LAGGARD_MAX_LINE_BYTES", "max_step": "LAGGARD_MAX_STEP", "step_cells": "LAGGARD_MAX_STEP_CELLS",
       "json_depth": "LAGGARD_MAX_JSON_DEPTH", "objects": "LAGGARD_MAX_OBJECTS", "pool_bytes": "LAGGARD_MAX_POOL_BYTES",
       "full_rows": "LAGGARD_MAX_FULL_ROWS"}
