"""The job's inventory: the only hosts, GPUs and NICs a probe or remediation may name.

Built from meta.json, so an argument is valid only if the job itself runs there; NIC names come
from `topology[host]["nics"]` when the trace records them. Every name is checked once, here, by
collector.inputs.names (RFC 1123 hosts, kernel NIC names, integer GPU indexes): a trace with one bad name
is refused before anything runs, so no later step can hand an unchecked name to a command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from collector.inputs.errors import UserError
from collector.inputs.names import gpu_problem, host_problem, nic_problem
from collector.trace.meta import JobMeta

#: Slurm/Kubernetes job ids: never option-like (no leading '-')
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")


class InventoryError(UserError):
    """A host, NIC or GPU name in meta.json that must not reach a command."""


@dataclass
class Inventory:
    job: str
    hosts: tuple[str, ...]
    gpus: dict[str, tuple[int, ...]]
    nics: dict[str, tuple[str, ...]] = field(default_factory=dict)
    switches: dict[str, tuple[str, ...]] = field(default_factory=dict)  # switch -> hosts under it
    rank_of: dict[tuple[str, int], int] = field(default_factory=dict)

    @classmethod
    def from_meta(cls, meta: JobMeta) -> Inventory:
        """The inventory of a job; InventoryError (exit 2) names the first host, GPU or NIC that fails."""
        gpus: dict[str, set[int]] = {}
        rank_of = {}
        for r, info in sorted(meta.ranks.items()):
            why = host_problem(info.host) or gpu_problem(info.gpu)
            if why:
                raise InventoryError(f"meta.json rank {r}: {why}",
                                     "name each rank's host as the scheduler does (one host, no user@ or ranges)")
            gpus.setdefault(info.host, set()).add(int(info.gpu))
            rank_of[(info.host, int(info.gpu))] = r
        hosts = tuple(meta.hosts())
        switches: dict[str, list[str]] = {}
        nics: dict[str, tuple[str, ...]] = {}
        for h in hosts:
            sw = meta.switch_of(h)
            if sw:
                switches.setdefault(sw, []).append(h)
            entry = meta.topology.get(h, {})
            names = entry.get("nics") if isinstance(entry, dict) else None
            if isinstance(names, list):
                for n in names:
                    if why := nic_problem(n):
                        raise InventoryError(f"meta.json topology of {h}: {why}",
                                             "list the kernel interface names, e.g. \"nics\": [\"ens1np0\"]")
                nics[h] = tuple(str(n) for n in names)
        return cls(meta.job, hosts, {h: tuple(sorted(g)) for h, g in gpus.items()}, nics,
                   {s: tuple(v) for s, v in switches.items()}, rank_of)

    def switch_of(self, host: str) -> str | None:
        return next((s for s, hs in self.switches.items() if host in hs), None)

    def check_host(self, host: object) -> str | None:
        """Why `host` may not be named in a command (bad name, or not a host of this job), or None."""
        why = host_problem(host)
        if why:
            return why
        return None if host in self.hosts else f"host {host!r} is not part of job {self.job}"

    def check_gpu(self, host: str, gpu: object) -> str | None:
        why = gpu_problem(gpu)
        if why:
            return why
        return None if gpu in self.gpus.get(host, ()) else f"gpu {gpu} is not a GPU of {host} in this job"

    def check_nic(self, host: str, nic: object) -> str | None:
        why = nic_problem(nic)
        if why:
            return why
        return None if nic in self.nics.get(host, ()) else f"interface {nic!r} is not a known NIC of {host}"
