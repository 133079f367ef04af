"""A CPU limit on one node's processes, set by the kernel: a cgroup whose CFS quota drops mid-run.

This is what a Kubernetes CPU limit does to a pod: once the node's processes have used their
quota in a 100 ms period, the kernel stops every one of their threads until the next period,
wherever they are (computing, copying a tensor into a socket, logging). Nothing in the job or
in laggard's simulator models that; the kernel does it. cgroup v2 (`cpu.max`) or v1
(`cpu.cfs_quota_us`), as root.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))  # v2, or the v2 hierarchy of a hybrid host
V1 = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


class CpuLimit:
    """A cgroup for one node's processes; `argv` starts a command inside it, `limit` sets its quota."""

    def __init__(self, name: str) -> None:
        root = _v2_root()
        self.v2 = root is not None
        self.path = (root or V1) / name

    @staticmethod
    def why_not() -> str:
        """Why this machine cannot run it, or ""."""
        if os.geteuid() != 0:
            return "a cgroup's CPU quota needs root"
        if _v2_root() is None and not (V1 / "cpu.cfs_quota_us").exists():
            return "no cgroup CPU controller is mounted here (cgroup v2 cpu.max or v1 cpu.cfs_quota_us)"
        return ""

    def up(self) -> None:
        self.path.mkdir(exist_ok=True)
        self.limit(None)

    def argv(self, argv: list[str]) -> list[str]:
        """`argv` run inside the cgroup (its children stay there)."""
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *argv]

    def limit(self, share: float | None) -> None:
        """Quota of `share` of one CPU per period (None: no limit)."""
        quota = "max" if share is None and self.v2 else "-1" if share is None else str(int(share * PERIOD_US))
        if self.v2:
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(quota)

    def down(self) -> None:
        """Lift the limit and remove the cgroup (once its processes have exited)."""
        if self.path.exists():
            self.limit(None)
            with contextlib.suppress(OSError):  # (a process still inside keeps it; the next run reuses none)
                self.path.rmdir()


def _v2_root() -> Path | None:
    """The cgroup v2 hierarchy whose children may have the cpu controller, if any."""
    for root in ROOTS:
        control = root / "cgroup.subtree_control"
        if control.exists() and "cpu" in control.read_text().split():
            return root
    return None
