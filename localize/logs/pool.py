"""The pool of log events seen in successful jobs (L4 cross-job filtering).

An event that also occurs in a job that finished fine does not explain a failure. The pool is a
small JSON file: the masked line shapes and Drain templates seen in successful jobs, each with
the number of jobs it occurred in. A default pool built from healthy simulated jobs ships with
the package; `laggard logs learn OK_TRACE...` adds to the user's pool
($LAGGARD_LOG_POOL, else ~/.local/share/laggard/log_pool.json), and both are used together.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from collector.inputs.errors import UserError

if TYPE_CHECKING:  # numpy and the log parser load only when a pool is used, so `laggard logs --help` is fast
    import numpy as np

    from collector.logs import ParsedLogs

POOL_ENV = "LAGGARD_LOG_POOL"
SHIPPED_POOL = Path(__file__).with_name("log_pool.json")


def user_pool_path() -> Path:
    """Where `laggard logs learn` writes: $LAGGARD_LOG_POOL, else the user data dir."""
    env = os.environ.get(POOL_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "laggard" / "log_pool.json"


@dataclass
class EventPool:
    shapes: dict[str, int] = field(default_factory=dict)
    templates: dict[str, int] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.shapes)

    @classmethod
    def load(cls, path: Path) -> EventPool:
        """The pool in `path` (empty when there is none): a regular file within LAGGARD_MAX_POOL_BYTES
        (a FIFO would hang every `laggard logs`, a huge file fill memory)."""
        from collector.inputs.limits import limits
        from collector.inputs.safeio import load_json, read_regular

        if not path.exists():
            return cls()
        raw = load_json(read_regular(path, limits().pool_bytes, "pool_bytes"), path)
        try:
            return cls({str(k): int(v) for k, v in raw.get("shapes", {}).items()},
                       {str(k): int(v) for k, v in raw.get("templates", {}).items()},
                       [str(j) for j in raw.get("jobs", [])])
        except (AttributeError, TypeError, ValueError, OverflowError) as exc:
            raise UserError(f"{path}: not a log event pool ({exc})",
                            f"delete it or point ${POOL_ENV} at a pool written by `laggard logs learn`") from exc

    @classmethod
    def default(cls) -> EventPool:
        """The shipped pool merged with the user's."""
        pool = cls.load(SHIPPED_POOL)
        pool.merge(cls.load(user_pool_path()))
        return pool

    def merge(self, other: EventPool) -> None:
        for k, v in other.shapes.items():
            self.shapes[k] = self.shapes.get(k, 0) + v
        for k, v in other.templates.items():
            self.templates[k] = self.templates.get(k, 0) + v
        self.jobs.extend(j for j in other.jobs if j not in self.jobs)

    def add(self, logs: ParsedLogs, job: str) -> int:
        """Count every event of a successful job once; returns how many were new."""
        import numpy as np

        used = np.unique(logs.shape)
        before = len(self.shapes)
        for s in used.tolist():
            shape = logs.shapes[s]
            self.shapes[shape] = self.shapes.get(shape, 0) + 1
        for t in np.unique(logs.shape_event[used]).tolist():
            tpl = logs.templates[t]
            self.templates[tpl] = self.templates.get(tpl, 0) + 1
        self.jobs.append(job)
        return len(self.shapes) - before

    def normal_shapes(self, logs: ParsedLogs, min_jobs: int = 1) -> np.ndarray:
        """Per shape of `logs`: seen in at least `min_jobs` successful jobs (by shape, or by exact template)."""
        import numpy as np

        out = np.zeros(len(logs.shapes), dtype=bool)
        for i, shape in enumerate(logs.shapes):
            tpl = logs.templates[int(logs.shape_event[i])]
            out[i] = self.shapes.get(shape, 0) >= min_jobs or self.templates.get(tpl, 0) >= min_jobs
        return out

    def save(self, path: Path) -> None:
        """Write the pool; refused (nothing written) when it would be over LAGGARD_MAX_POOL_BYTES,
        so every pool written can be read back."""
        from collector.inputs.limits import ENV, limits

        data = json.dumps({"version": 1, "jobs": self.jobs, "shapes": dict(sorted(self.shapes.items())),
                           "templates": dict(sorted(self.templates.items()))}, indent=0).encode()
        cap = limits().pool_bytes
        if len(data) > cap:
            raise UserError(f"{path}: the pool would grow to {len(data)} bytes, over the {cap}-byte limit "
                            f"({len(self.shapes)} events of {len(self.jobs)} jobs)",
                            f"learn from fewer jobs or a fresh --pool, or raise {ENV['pool_bytes']}")
        tmp = path.with_suffix(".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            tmp.replace(path)
        except OSError as exc:
            raise UserError(f"{path}: cannot write the pool ({exc.strerror})",
                            f"choose a writable --pool or ${POOL_ENV}") from exc
