"""Where the CommOps logger writes, and the small files beside the shards (no torch needed).

A logger directory is a trace: `meta.json`, `commops/rank-XXXXX-NNNN.parquet` shards (the
contract's COMMOPS_SCHEMA), `ranks/rank-XXXXX.json` (what each rank knows about itself and its
groups) and `pending/rank-XXXXX.parquet` (operators entered but not completed at the last flush;
the evidence for hang attribution). The Flight Recorder importer writes `pending.parquet` too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from collector.inputs.errors import TraceError
from collector.inputs.safeio import check_regular, read_json
from collector.trace.meta import JobMeta, RankInfo
from collector.trace.schema import COMMOPS_SCHEMA

#: operators a rank entered and had not completed when it was last seen
PENDING_SCHEMA = pa.schema(
    [f for f in COMMOPS_SCHEMA if f.name != "end_ns"]
    + [
        pa.field("seen_ns", pa.int64(), nullable=False),  # when the rank was last seen waiting
        pa.field("failed", pa.bool_(), nullable=False),  # the op raised (timeout, peer gone)
    ]
)


def shard_path(root: Path, rank: int, index: int) -> Path:
    return root / "commops" / f"rank-{rank:05d}-{index:04d}.parquet"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a dot-prefixed temp file (ignored by dataset discovery), then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def atomic_write_table(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def read_rank_infos(root: Path) -> dict[int, dict[str, Any]]:
    """What each rank wrote about itself; a file that cannot be read as a bounded JSON object (being
    replaced right now, or a FIFO that would block the reader) is passed over: the next merge looks again."""
    out: dict[int, dict[str, Any]] = {}
    for p in sorted((root / "ranks").glob("rank-*.json")):
        try:
            info = read_json(p)
            out[int(info["rank"])] = info
        except (OSError, ValueError, KeyError, TypeError, TraceError):
            continue
    return out


def rank_shards(root: Path, ranks: list[int] | None = None) -> list[Path]:
    """The logger's shards of `ranks` (every rank's when None), sorted; TraceError for one that is not a
    regular file (a FIFO or device under commops/ would block or feed the reader forever)."""
    files = sorted((root / "commops").glob("rank-*.parquet"))
    if ranks is not None:
        want = {f"rank-{r:05d}" for r in ranks}
        files = [p for p in files if p.name[:10] in want]
    for p in files:
        check_regular(p)
    return files


def merge_meta(root: Path, job: str | None = None) -> JobMeta:
    """meta.json from every rank's self-description: world, ranks (host, gpu), all groups, and the
    parallelism the job declared. Ranks that disagree (a group name given to two different sets
    of ranks, two declared parallelisms) are kept first-come and listed in `commops_warnings`."""
    infos = read_rank_infos(root)
    if not infos:
        raise TraceError(f"{root}: no ranks/rank-*.json", "point at the directory the CommOps logger wrote")
    world = max(int(i.get("world_size", 0)) for i in infos.values())
    world = max(world, max(infos) + 1)
    ranks = {r: RankInfo(host=str(infos[r].get("host", "unknown")) if r in infos else "unknown",
                         gpu=int(infos[r].get("gpu", 0)) if r in infos else 0)
             for r in range(world)}
    warnings: list[str] = []
    groups: dict[str, list[int]] = {}
    for r, info in sorted(infos.items()):
        for name, members in info.get("groups", {}).items():
            ranks_of = [int(m) for m in members]
            seen = groups.setdefault(str(name), ranks_of)
            if seen != ranks_of and len(warnings) < 10:
                warnings.append(f"group {name!r} names ranks {seen} on one rank and {ranks_of} on rank {r}: "
                                "give each group its own name (e.g. commops.name_group(pg, 'tp-0'))")
    declared = [(r, i["parallelism"]) for r, i in sorted(infos.items()) if isinstance(i.get("parallelism"), dict)]
    parallelism = {str(k): int(v) for k, v in declared[0][1].items()} if declared else {}
    if any(p != declared[0][1] for _, p in declared):
        warnings.append(f"ranks declare different parallelism ({declared[0][1]} on rank {declared[0][0]}); kept that one")
    first = infos[min(infos)]
    extra: dict[str, Any] = {"source": "laggard-commops",
                             "commops_errors": sum(int(i.get("errors", 0)) for i in infos.values()),
                             "commops_dropped": sum(int(i.get("dropped", 0)) for i in infos.values())}
    if warnings:
        extra["commops_warnings"] = warnings
    return JobMeta(job=job or str(first.get("job", "commops")), world_size=world, ranks=ranks,
                   groups=dict(sorted(groups.items())), parallelism=parallelism, extra=extra)


def write_meta(root: Path, meta: JobMeta) -> None:
    atomic_write_bytes(root / "meta.json", json.dumps(meta.to_dict(), indent=1).encode())


def read_pending(root: Path) -> pa.Table | None:
    """Pending operators of a trace (live logger shards or an imported dump), or None."""
    parts = []
    single = root / "pending.parquet"
    if single.is_file():
        parts.append(pq.read_table(single, schema=PENDING_SCHEMA))
    parts += [pq.read_table(p, schema=PENDING_SCHEMA) for p in sorted((root / "pending").glob("rank-*.parquet"))]
    if not parts:
        return None
    return pa.concat_tables(parts)
