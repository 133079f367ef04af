"""Job metadata (`meta.json`): ranks, hosts, groups, parallelism and topology."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.errors import TraceError

PARALLEL_DIMS = ("dp", "tp", "pp", "ep", "cp")


@dataclass
class RankInfo:
    host: str
    gpu: int
    ip: str = ""


@dataclass
class JobMeta:
    """Typed view of meta.json; `extra` keeps unknown keys so nothing is lost on rewrite."""

    job: str
    world_size: int
    ranks: dict[int, RankInfo]
    groups: dict[str, list[int]] = field(default_factory=dict)
    parallelism: dict[str, int] = field(default_factory=dict)
    topology: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def host_of(self, rank: int) -> str:
        return self.ranks[rank].host

    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.ranks.values()}, key=_natural_key)

    def switch_of(self, host: str) -> str | None:
        sw = self.topology.get(host, {}).get("switch")
        return str(sw) if sw is not None else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "world_size": self.world_size,
            "ranks": {
                str(r): {"host": i.host, "gpu": i.gpu, **({"ip": i.ip} if i.ip else {})}
                for r, i in sorted(self.ranks.items())
            },
        }
        if self.groups:
            out["groups"] = self.groups
        if self.parallelism:
            out["parallelism"] = self.parallelism
        if self.topology:
            out["topology"] = self.topology
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "meta.json") -> JobMeta:
        if not isinstance(raw, dict):
            raise TraceError(f"{source}: expected a JSON object", "see docs/traces.md for the meta.json layout")
        for key in ("job", "world_size", "ranks"):
            if key not in raw:
                raise TraceError(f"{source}: missing key '{key}'", "add it (see docs/traces.md, meta.json)")
        try:
            world = int(raw["world_size"])
            ranks = {
                int(r): RankInfo(host=str(v["host"]), gpu=int(v.get("gpu", 0)), ip=str(v.get("ip", "")))
                for r, v in raw["ranks"].items()
            }
            groups = {str(g): [int(x) for x in members] for g, members in raw.get("groups", {}).items()}
            par = {str(k): int(v) for k, v in raw.get("parallelism", {}).items()}
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise TraceError(f"{source}: malformed entry ({exc})", "ranks need host and gpu; groups are lists of ranks") from exc
        known = {"job", "world_size", "ranks", "groups", "parallelism", "topology"}
        return cls(
            job=str(raw["job"]),
            world_size=world,
            ranks=ranks,
            groups=groups,
            parallelism=par,
            topology=dict(raw.get("topology", {})),
            extra={k: v for k, v in raw.items() if k not in known},
        )

    @classmethod
    def load(cls, path: Path) -> JobMeta:
        if not path.exists():
            raise TraceError(f"{path}: meta.json not found", "every trace needs meta.json (see docs/traces.md)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}: not valid JSON (line {exc.lineno})", "fix or regenerate meta.json") from exc
        return cls.from_dict(raw, str(path))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=1))


def _natural_key(name: str) -> tuple[Any, ...]:
    """Sort node-2 before node-10."""
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
