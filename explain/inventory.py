"""The job's inventory: the only hosts, GPUs and NICs a probe or remediation may name.

Built from meta.json, so an argument is valid only if the job itself runs there; NIC names come
from `topology[host]["nics"]` when the trace records them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from collector.meta import JobMeta

JOB_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


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
        gpus: dict[str, set[int]] = {}
        rank_of = {}
        for r, info in meta.ranks.items():
            gpus.setdefault(info.host, set()).add(int(info.gpu))
            rank_of[(info.host, int(info.gpu))] = r
        hosts = tuple(meta.hosts())
        switches: dict[str, list[str]] = {}
        nics: dict[str, tuple[str, ...]] = {}
        for h in hosts:
            sw = meta.switch_of(h)
            if sw:
                switches.setdefault(sw, []).append(h)
            names = meta.topology.get(h, {}).get("nics")
            if isinstance(names, list):
                nics[h] = tuple(str(n) for n in names)
        return cls(meta.job, hosts, {h: tuple(sorted(g)) for h, g in gpus.items()}, nics,
                   {s: tuple(v) for s, v in switches.items()}, rank_of)

    def switch_of(self, host: str) -> str | None:
        return next((s for s, hs in self.switches.items() if host in hs), None)
