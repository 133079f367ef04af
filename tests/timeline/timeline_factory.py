"""Tiny hand-built CommOps traces with known step durations and per-host clock offsets.

Megatron rank order tp-cp-ep-dp-pp; per step each rank runs every microbatch's forward, then
every microbatch's backward (per layer a tp all_reduce / cp all_gather or reduce_scatter / ep
all_to_all; activations down and gradients up the pipeline by send/recv), then the dp
reduce_scatter and all_gather, whose end is the end of the step. Every member of a collective ends it at the
same true time; start times jitter a little. Logged times are on each host's own clock.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta, RankInfo
from collector.trace.schema import COMMOPS_SCHEMA
from collector.trace.traceio import Trace, write_table

KINDS = ("tp", "cp", "ep", "dp", "pp")


def layout(dims: dict[str, int]) -> tuple[int, dict[str, list[list[int]]], dict[int, dict[str, int]]]:
    """World size, groups per kind, and each rank's coordinates, in Megatron order tp-cp-ep-dp-pp."""
    size = [dims.get(k, 1) for k in KINDS]
    world = int(np.prod(size))
    coords: dict[int, dict[str, int]] = {}
    for idx in itertools.product(*[range(s) for s in reversed(size)]):
        c = dict(zip(reversed(KINDS), idx, strict=True))
        r, mult = 0, 1
        for k, s in zip(KINDS, size, strict=True):
            r += c[k] * mult
            mult *= s
        coords[r] = c
    groups: dict[str, list[list[int]]] = {}
    for k in KINDS:
        if dims.get(k, 1) <= 1:
            continue
        seen: dict[tuple[int, ...], list[int]] = {}
        for r in range(world):
            key = tuple(coords[r][o] for o in KINDS if o != k)
            seen.setdefault(key, []).append(r)
        groups[k] = [sorted(m) for m in seen.values()]
    return world, groups, coords


def make_trace(
    out: Path,
    dims: dict[str, int],
    step_s: list[float],
    gpus_per_host: int = 4,
    offsets_ns: dict[int, int] | None = None,
    hide_steps: bool = False,
    names: str = "kind",
    layers: int = 3,
    microbatches: int = 2,
    dp_buckets: int = 0,
    seed: int = 0,
    meta_extra: dict[str, Any] | None = None,
) -> Trace:
    """Write meta.json and commops.parquet; `names`: "kind" (tp-0), "opaque" (pg7) or "swapped".

    dp_buckets > 0 replaces the dp reduce_scatter/all_gather with that many equal all_reduces.
    """
    rng = np.random.default_rng(seed)
    world, groups, coords = layout(dims)
    host_of = {r: r // gpus_per_host for r in range(world)}
    offsets = offsets_ns or {}
    gname: dict[tuple[str, int], str] = {}
    member_of: dict[tuple[str, int], int] = {}
    order = list(groups)
    for kind, gl in groups.items():
        for i, members in enumerate(gl):
            if names == "opaque":
                name = f"pg{order.index(kind) * 100 + i}"
            elif names == "swapped":
                name = f"{order[(order.index(kind) + 1) % len(order)]}-{i}"
            else:
                name = f"{kind}-{i}"
            for r in members:
                member_of[(kind, r)] = i
            gname[(kind, i)] = name
    seq: dict[Any, int] = {}
    rows: list[tuple[Any, ...]] = []
    pp = dims.get("pp", 1)
    t0 = 1_700_000_000 * 10**9
    slots = layers + 2
    for k, d in enumerate(step_s):
        start = t0 + int(sum(step_s[:k]) * 1e9)
        dur = d * 1e9

        def at(frac: float, start: int = start, dur: float = dur) -> int:
            return start + int(20e6 + frac * (dur - 40e6))

        # collectives of one instance share an end time; key them by position
        for r in range(world):
            c = coords[r]
            ev: list[tuple[str, str, int, int, float, float]] = []  # kind, op, peer, nbytes, t, len
            stride = world // pp
            # forward passes, then backward passes (GPipe order): activations flow down the
            # pipeline at the end of each forward microbatch, gradients up after each backward;
            # a send and its recv are one instance and end together
            for phase in ("F", "B"):
                for mb in range(microbatches):
                    base = (mb + (microbatches if phase == "B" else 0)) * slots
                    for layer in range(layers):
                        pos = base + layer
                        if dims.get("tp", 1) > 1:
                            ev.append(("tp", "all_reduce", -1, 1 << 18, pos, 0.2))
                        if dims.get("cp", 1) > 1:
                            op = "all_gather" if phase == "F" else "reduce_scatter"
                            ev.append(("cp", op, -1, 1 << 17, pos + 0.3, 0.2))
                        if dims.get("ep", 1) > 1:
                            ev.append(("ep", "all_to_all", -1, 1 << 19, pos + 0.6, 0.2))
                    down = 1 if phase == "F" else -1
                    if pp > 1 and 0 <= c["pp"] - down < pp:
                        ev.append(("pp", "recv", r - down * stride, 1 << 20, base + slots - 1, 0.3))
                    if pp > 1 and 0 <= c["pp"] + down < pp:
                        ev.append(("pp", "send", r + down * stride, 1 << 20, base + slots - 1, 0.3))
            if dims.get("dp", 1) > 1:
                end_pos = 2 * microbatches * slots
                if dp_buckets:
                    for b in range(dp_buckets):
                        ev.append(("dp", "all_reduce", -1, 1 << 24, end_pos + 0.3 * b, 0.25))
                else:
                    ev.append(("dp", "reduce_scatter", -1, 1 << 25, end_pos, 0.4))
                    ev.append(("dp", "all_gather", -1, 1 << 25, end_pos + 0.5, 0.4))
            total = max(pos + length for *_, pos, length in ev)  # the step's last op ends it
            for kind, op, peer, nbytes, t, length in ev:
                g = gname[(kind, member_of[(kind, r)])]
                key: Any = (g, r, peer, r) if op == "send" else (g, peer, r, r) if op == "recv" else (g, r)
                s = seq.get(key, 0)
                seq[key] = s + 1
                frac = t / total
                end = at(frac + length / total)
                begin = at(frac) + int(rng.integers(0, max(int(0.002 * dur), 1)))
                off = offsets.get(host_of[r], 0)
                rows.append((r, g, op, s, peer, nbytes, begin + off, max(end, begin + 1000) + off, -1 if hide_steps else k))
    df = pd.DataFrame(rows, columns=COMMOPS_SCHEMA.names)
    out.mkdir(parents=True, exist_ok=True)
    write_table(df, out / "commops.parquet", COMMOPS_SCHEMA)
    meta = JobMeta(
        job="factory",
        world_size=world,
        ranks={r: RankInfo(host=f"node-{host_of[r]}", gpu=r % gpus_per_host) for r in range(world)},
        groups={gname[(k, i)]: m for k, gl in groups.items() for i, m in enumerate(gl)},
        extra=dict(meta_extra or {}),
    )
    meta.save(out / "meta.json")
    return Trace.open(out)


def kinds_by_members(dims: dict[str, int]) -> list[tuple[str, list[int]]]:
    """(kind, members) of every group of the layout, to check inference independently of names."""
    _, groups, _ = layout(dims)
    return [(k, m) for k, gl in groups.items() for m in gl]
