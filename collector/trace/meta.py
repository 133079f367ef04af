"""Job metadata (`meta.json`): ranks, hosts, groups, parallelism and topology."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.inputs.errors import TraceError
from collector.inputs.limits import ENV, limits
from collector.inputs.safeio import load_json, read_regular

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

    def ranks_by_host(self) -> dict[str, list[int]]:
        """Each host's ranks, in the order meta.json lists them."""
        out: dict[str, list[int]] = {}
        for r, info in self.ranks.items():
            out.setdefault(info.host, []).append(r)
        return out

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
        cap = limits().world_size
        world = as_int(raw["world_size"], f"{source}: world_size", 1, cap, f"raise {ENV['world_size']} for a larger job")
        for key, kind in (("ranks", dict), ("groups", dict), ("parallelism", dict), ("topology", dict)):
            if key in raw and not isinstance(raw[key], kind):
                raise TraceError(f"{source}: '{key}' is a {type(raw[key]).__name__}, not an object",
                                 "see docs/traces.md for the meta.json layout")
        if len(raw["ranks"]) > world:
            raise TraceError(f"{source}: {len(raw['ranks'])} ranks listed for world_size {world}",
                             "list ranks 0..world_size-1 once each")
        try:
            ranks = {}
            for r, v in raw["ranks"].items():
                rank = as_int(r, f"{source}: rank key", 0, world - 1, "ranks run 0..world_size-1")
                if not isinstance(v, dict):
                    raise TraceError(f"{source}: rank {rank} is not an object", 'give {"host": ..., "gpu": ...}')
                ranks[rank] = RankInfo(host=str(v["host"]), gpu=as_int(v.get("gpu", 0), f"{source}: rank {rank} gpu", 0, 1023),
                                       ip=str(v.get("ip", "")))
            groups: dict[str, list[int]] = {}
            for g, members in raw.get("groups", {}).items():
                if not isinstance(members, list):
                    raise TraceError(f"{source}: group '{str(g)[:40]}' is not a list of ranks", "groups are lists of ranks")
                groups[str(g)] = [as_int(x, f"{source}: group '{str(g)[:40]}' member", 0, world - 1,
                                         "groups may only hold ranks 0..world_size-1") for x in members]
            par = {str(k): as_int(v, f"{source}: parallelism {str(k)[:20]}", 1, world)
                   for k, v in raw.get("parallelism", {}).items()}
        except KeyError as exc:
            raise TraceError(f"{source}: malformed entry (missing {exc})", "ranks need host and gpu; groups are lists of ranks") from exc
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
        raw = load_json(read_regular(path, limits().meta_bytes, "meta_bytes"), path)
        return cls.from_dict(raw, str(path))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=1))


def coverage_note(meta: JobMeta) -> str | None:
    """One line saying plainly that a trace holds only some of the job's ranks (importers record
    `ranks_present` / `ranks_missing` against the world size the source declares), else None."""
    missing = meta.extra.get("ranks_missing")
    present = meta.extra.get("ranks_present")
    if not isinstance(missing, list) or not missing or not isinstance(present, list):
        return None

    def span(ranks: list[int]) -> str:
        return ", ".join(map(str, ranks[:8])) + (f", ... ({len(ranks)})" if len(ranks) > 8 else "")

    return (f"partial job: the trace holds rank(s) {span(present)} of world size {meta.world_size}; no trace from "
            f"rank(s) {span(missing)}. Steps and the present ranks' operators are judged; a missing rank's own "
            "times are unknown, so a slow or stuck missing rank shows only as present ranks waiting and cannot be named")


def as_int(value: Any, what: str, lo: int, hi: int, fix: str = "") -> int:
    """An integer in [lo, hi] from JSON (int, integral finite float, or digit string); TraceError otherwise.

    `fix` is the advice for a number above `hi` (often a cap the user may raise); anything else (not
    a number, not whole, below `lo`) is asked for as a whole number in lo..hi, since raising a cap
    cannot mend it.
    """
    plain = f"give a whole number in {lo}..{hi}"
    shown = ""
    if isinstance(value, bool):
        raise TraceError(f"{what} is a boolean, not an integer", plain)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise TraceError(f"{what} is {value}, not a whole number", plain)
        shown, value = str(value), int(value)
    elif isinstance(value, str):
        text = value.strip()
        if not (text.lstrip("-").isascii() and text.lstrip("-").isdigit()) or len(text) > 20:
            raise TraceError(f"{what} is {value[:30]!r}, not an integer", plain)
        value = int(text)
    elif not isinstance(value, int):
        raise TraceError(f"{what} is a {type(value).__name__}, not an integer", plain)
    if not lo <= value <= hi:
        digits = str(value)
        shown = shown or (digits if len(digits) <= 24 else f"{digits[:12]}... ({len(digits.lstrip('-'))} digits)")
        raise TraceError(f"{what} is {shown}, outside {lo}..{hi}", fix if fix and value > hi else plain)
    return value


def _natural_key(name: str) -> tuple[Any, ...]:
    """Sort node-2 before node-10."""
    import re

    return tuple(int(p) if p.isascii() and p.isdigit() else p for p in re.split(r"(\d+)", name))
