"""Each rank's own step times for the real-job tests (`tests/collector/realjob.step_times` reads them)."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path


class StepLog:
    """`log_dir`: rank-R.jsonl, one line per step with its own start and end (ns); `step_log`: rank 0
    appends each finished step's number, which a test watches to act mid-run (throttle a NIC)."""

    def __init__(self, log_dir: str, step_log: str, rank: int) -> None:
        self.step_log = step_log if rank == 0 else ""
        self.out = None
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self.out = open(Path(log_dir) / f"rank-{rank}.jsonl", "w")  # noqa: SIM115 (held for the run)

    def done(self, step: int, start_ns: int) -> None:
        """Step `step`, begun at `start_ns`, has ended now."""
        if self.out is not None:
            self.out.write(json.dumps({"step": step, "start_ns": start_ns, "end_ns": time.time_ns()}) + "\n")
            self.out.flush()
        if self.step_log:
            with open(self.step_log, "a") as f:
                f.write(f"{step}\n")

    def close(self) -> None:
        """The run is over. Its objects are frozen out of the garbage collector: the collections of
        the interpreter's exit, ~1 s of CPU per torch process, made every run here 4 s longer
        (eight ranks exiting on two cores) for nothing the test looks at."""
        if self.out is not None:
            self.out.close()
        gc.freeze()
