"""Where probes run: the local machine, a host over SSH, or (from the simulator) a virtual cluster.

A backend gets an argv list, never a string, and runs it without a shell. Anything with a
`run(host, argv, timeout) -> (rc, output)` method is a backend; the simulator's virtual cluster
matches this Protocol by shape and does not import explain/.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from collector.inputs.names import host_problem

#: POSIX portable user names (what --ssh-user may be)
USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")


@runtime_checkable
class ProbeBackend(Protocol):
    """Runs one argv on one host (None: the operator's own machine) and returns (rc, output)."""

    name: str

    def run(self, host: str | None, argv: Sequence[str], timeout: float) -> tuple[int, str]: ...


def _run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    if shutil.which(argv[0]) is None:
        return 127, ""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, shell=False,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return 124, ""
    except OSError as exc:
        return 126, f"{exc}"
    return proc.returncode, proc.stdout + (proc.stderr if proc.returncode else "")


class LocalBackend:
    """Runs probes on this machine; with dry_run it only records what it would run (rc -1)."""

    def __init__(self, dry_run: bool = False) -> None:
        self.name = "local-dry-run" if dry_run else "local"
        self.dry_run = dry_run
        self.ran: list[list[str]] = []

    def run(self, host: str | None, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        self.ran.append(list(argv))
        if self.dry_run:
            return -1, ""
        return _run(argv, timeout)


class SSHBackend:
    """Runs probes on job hosts with `ssh [opts] HOST -- ARGV...`; control commands run locally.

    ssh joins the remote words with spaces for the remote shell, so every word is checked to be
    free of shell metacharacters first; probe argvs are fixed templates and pass this check.
    """

    SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,=:/+%@")

    def __init__(self, user: str | None = None, options: Sequence[str] = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=5")) -> None:
        self.name = "ssh"
        self.user = user
        self.options = list(options)

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        bad = [w for w in argv if not w or not set(w) <= self.SAFE]
        if bad:
            raise ValueError(f"refusing to send {bad} over ssh: unsafe characters")
        if why := host_problem(host):
            raise ValueError(f"refusing to ssh: {why}")
        if self.user is not None and not USER_RE.match(self.user):
            raise ValueError(f"refusing to ssh as {self.user!r}: not a user name")
        target = f"{self.user}@{host}" if self.user else host
        return ["ssh", *self.options, target, "--", *argv]

    def run(self, host: str | None, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        if host is None:
            return _run(argv, timeout)
        return _run(self.command(host, argv), timeout)
