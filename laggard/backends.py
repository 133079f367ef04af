"""Wiring: pick the probe backend for a trace (explain/ defines the Protocol, simulator/ the virtual cluster).

Default ("auto"): a local dry run, which shows the argv that would run and executes nothing, for
every trace. The simulator's virtual cluster answers probes from truth.json, so its answers are
simulated, never observed: it runs only when asked for by name (`virtual`), and every answer it
gives is labelled "simulated". Real probes on this machine (`local`) or over SSH (`ssh`) are opt-in.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from collector.inputs.errors import UserError

if TYPE_CHECKING:
    from explain.actions.backends import ProbeBackend

MODES = ("auto", "virtual", "local", "ssh", "dry-run")


def choose_backend(trace: Path, mode: str = "auto", ssh_user: str | None = None) -> ProbeBackend:
    from explain.actions.backends import LocalBackend, SSHBackend

    if mode == "auto":
        mode = "dry-run"
    if mode == "virtual":
        if not (trace / "truth.json").exists():
            raise UserError(f"{trace}: --probes virtual needs a simulated trace (truth.json)",
                            "use --probes local, ssh or dry-run for a real job")
        from simulator.virtual_cluster import VirtualCluster

        try:
            return VirtualCluster(trace)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            raise UserError(f"{trace}: truth.json is not the simulator's ground truth ({type(exc).__name__})",
                            "regenerate the trace with `laggard simulate`, or use --probes dry-run") from exc
    if mode == "local":
        return LocalBackend()
    if mode == "ssh":
        from explain.actions.backends import USER_RE

        if ssh_user is not None and not USER_RE.match(ssh_user):
            raise UserError(f"--ssh-user {ssh_user[:40]!r} is not a user name", "give a plain login name, e.g. --ssh-user ops")
        return SSHBackend(user=ssh_user)
    if mode == "dry-run":
        return LocalBackend(dry_run=True)
    raise UserError(f"unknown --probes mode '{mode}'", f"use one of {', '.join(MODES)}")
