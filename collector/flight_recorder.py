"""Import PyTorch Flight Recorder dumps (NCCL and gloo; pickle or JSON) into a trace.

torch writes one dump per rank (`TORCH_FR_DUMP_TEMP_FILE` + rank: pickle from
`_dump_fr_trace()`, JSON from `_dump_fr_trace_json()`): {"version", "pg_config", "pg_status",
"entries": [{"profiling_name": "nccl:all_reduce", "process_group": (name, desc),
"collective_seq_id", "p2p_seq_id", "input_sizes", "input_dtypes", "time_created_ns",
"time_discovered_started_ns", "time_discovered_completed_ns", "state", ...}]}.
Every entry becomes a CommOps row (what the rank entered); NCCL entries not yet completed go to
pending.parquet. gloo records no completion, so its rows have unknown durations (end = start).
Hosts come from the dump when it names one (a "hostname"/"host_name"/"host" key that collectors
add), else from the directory layout HOST/PREFIX<rank>; NCCL entries still "scheduled" while the
job records GPU starts (TORCH_NCCL_ENABLE_TIMING=1) are listed in meta.json `not_started`: queued
on the CPU, never started by the GPU. Pickles are untrusted input: they are read with an unpickler that builds only plain containers
and scalars, and a dump that asks for anything else is refused.
"""

from __future__ import annotations

import ast
import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from collector.commops import layout
from collector.errors import UserError
from collector.meta import JobMeta, RankInfo
from collector.schema import COMMOPS_SCHEMA
from collector.traceio import write_table

#: Flight Recorder collective names (without the backend prefix) -> contract op
OP_NAMES = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce", "all_reduce_barrier": "barrier",
    "all_gather": "all_gather", "allgather": "all_gather", "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "_all_gather_base": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast", "reduce": "reduce",
    "barrier": "barrier", "send": "send", "recv": "recv", "gather": "all_gather", "scatter": "broadcast",
}
DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4, "Short": 2,
               "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1}
_PLAIN = (dict, list, tuple, str, int, float, bool, type(None), bytes, set, frozenset)


class Refused(pickle.UnpicklingError):
    """The pickle asked for something other than plain data."""


class RestrictedUnpickler(pickle.Unpickler):
    """Builds only what pickle's own opcodes build (dict, list, tuple, set, str, bytes, numbers).

    Every class or function lookup (the way a pickle runs code: os.system, eval, builtins.getattr,
    even harmless ones) is refused; Flight Recorder dumps never need one.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise Refused(f"the pickle wants to build {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise Refused("the pickle uses persistent ids")


def _interval(created: int, started: Any, completed: Any, duration_ms: Any) -> tuple[int, int]:
    """An entry's (start, end) in ns. The watchdog *discovers* starts and completions when it polls
    (about 100 ms late on an H100 with torch 2.11), so its times bound the op only coarsely; with
    TORCH_NCCL_ENABLE_TIMING=1 the dump carries the GPU-measured `duration_ms`, which then sets the
    op's length, ending at the discovered completion."""
    start = int(started or created)
    if duration_ms:
        end = int(completed) if completed else start + round(float(duration_ms) * 1e6)
        return max(created, end - round(float(duration_ms) * 1e6)), end
    return start, int(completed) if completed else start


def load_dump(path: Path) -> dict[str, Any]:
    """One rank's dump as plain data; a one-line UserError for anything unreadable or hostile."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror})", "check the path and permissions") from exc
    if not raw.strip():
        raise UserError(f"{path}: empty file", "re-dump the Flight Recorder; this rank wrote nothing")
    if raw.lstrip()[:1] in (b"{", b"["):
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            raise UserError(f"{path}: not valid JSON{where}; truncated?",
                            "re-dump with _dump_fr_trace_json() or pass the pickle dump") from exc
    else:
        try:
            data = RestrictedUnpickler(io.BytesIO(raw)).load()
        except Refused as exc:
            raise UserError(f"{path}: refused: {exc}",
                            "Flight Recorder dumps hold only plain data; do not import files from untrusted sources") from exc
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError,
                OverflowError, RecursionError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: not a Flight Recorder dump ({type(exc).__name__}); truncated or not a pickle",
                            "pass the files written to TORCH_FR_DUMP_TEMP_FILE<rank>") from exc
    _check_plain(data, path)
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise UserError(f"{path}: no 'entries' list", "this is not a Flight Recorder dump")
    return data


def _check_plain(obj: Any, path: Path, depth: int = 0) -> None:
    if depth > 64:
        raise UserError(f"{path}: nested too deeply", "this is not a Flight Recorder dump")
    if not isinstance(obj, _PLAIN):
        raise UserError(f"{path}: unexpected {type(obj).__name__}", "this is not a Flight Recorder dump")
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_plain(k, path, depth + 1)
            _check_plain(v, path, depth + 1)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            _check_plain(v, path, depth + 1)


def rank_of(path: Path) -> int:
    m = re.search(r"(\d+)(\.json|\.pkl|\.pickle)?$", path.name)
    if not m:
        raise UserError(f"{path}: no rank number at the end of the file name",
                        "Flight Recorder names dumps PREFIX<rank>; rename the file or pass a directory of such files")
    return int(m.group(1))


def group_name(pg: Any) -> str:
    """Same names as the CommOps logger: the user's group_desc, 'world', or 'pg-<name>'."""
    if isinstance(pg, (list, tuple)) and len(pg) == 2:
        name, desc = str(pg[0]), str(pg[1])
    else:
        name, desc = str(pg), ""
    if desc == "default_pg" or (name in ("0", "default_pg") and desc in ("", "undefined")):
        return "world"
    if desc and desc != "undefined":
        return desc
    return f"pg-{name}"


@dataclass
class Imported:
    rows: dict[str, list[Any]] = field(default_factory=lambda: {f.name: [] for f in COMMOPS_SCHEMA})
    pending: dict[str, list[Any]] = field(default_factory=lambda: {f.name: [] for f in layout.PENDING_SCHEMA})
    groups: dict[str, set[int]] = field(default_factory=dict)
    backends: set[str] = field(default_factory=set)
    hosts: dict[int, str] = field(default_factory=dict)
    scheduled: list[tuple[int, str, int]] = field(default_factory=list)  # (rank, group, seq) of NCCL "scheduled" entries
    tracks_starts: bool = False  # some dump records GPU starts, so "scheduled" means queued, not yet running
    versions: set[str] = field(default_factory=set)
    skipped: int = 0


def _nbytes(entry: dict[str, Any]) -> int:
    sizes, dtypes = entry.get("input_sizes") or [], entry.get("input_dtypes") or []
    total = 0
    for i, shape in enumerate(sizes):
        n = int(np.prod([int(d) for d in shape])) if shape else 1
        total += n * DTYPE_BYTES.get(str(dtypes[i]) if i < len(dtypes) else "Float", 4)
    return total


def _tracks_starts(dump: dict[str, Any]) -> bool:
    """Whether this dump can tell "queued" from "running": NCCL records when an operator started on
    the GPU only with TORCH_NCCL_ENABLE_TIMING=1 (else every operator stays "scheduled" until done).
    Timing is a job-wide setting, so one dump that records starts speaks for all."""
    for e in dump["entries"]:
        if isinstance(e, dict) and (e.get("state") == "started" or (e.get("time_discovered_started_ns") or 0) > 0):
            return True
    status = dump.get("pg_status")
    if isinstance(status, dict):
        for st in status.values():
            try:
                if isinstance(st, dict) and int(st.get("last_started_collective", -1)) >= 0:
                    return True
            except (TypeError, ValueError):
                continue
    return False


#: where a dump may name the host that wrote it (keys some launchers and collectors add)
HOST_KEYS = ("hostname", "host_name", "host", "node", "nodename")


def dump_host(dump: dict[str, Any], path: Path, src: Path) -> str | None:
    """The host that wrote a dump: a host key in the dump, else the sub-directory of `src` it sits in
    (collectors gather dumps as HOST/PREFIX<rank>), else None."""
    for key in HOST_KEYS:
        v = dump.get(key)
        if isinstance(v, str) and v.strip():
            return v.strip()
    if src.is_dir() and path.parent != src and path.parent.parent == src:
        return path.parent.name
    return None


def _add_dump(acc: Imported, rank: int, dump: dict[str, Any], path: Path) -> None:
    acc.versions.add(str(dump.get("version", "")))
    group_ranks = _pg_ranks(dump.get("pg_config"))
    acc.tracks_starts |= _tracks_starts(dump)
    seen_ns = 0
    for i, e in enumerate(dump["entries"]):
        _check_entry(e, i, path)
        try:
            pname = str(e["profiling_name"])
            backend, _, rest = pname.partition(":")
            base = rest.split(" ")[0] if rest else backend
            op = OP_NAMES.get(base)
            if op is None:
                acc.skipped += 1
                continue
            acc.backends.add(backend if rest else "unknown")
            pg = e["process_group"]
            g = group_name(pg)
            pg_key = str(pg[0]) if isinstance(pg, (list, tuple)) else str(pg)
            acc.groups.setdefault(g, set()).add(rank)
            acc.groups[g].update(group_ranks.get(pg_key, ()))
            p2p = op in ("send", "recv")
            seq = int(e["p2p_seq_id"] if p2p else e["collective_seq_id"])
            peer = _peer(rest, group_ranks.get(pg_key)) if p2p else -1
            created = int(e["time_created_ns"])
            start, end = _interval(created, e.get("time_discovered_started_ns"),
                                   e.get("time_discovered_completed_ns"), e.get("duration_ms"))
            state = str(e.get("state", "scheduled"))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise UserError(f"{path}: entry {i} is malformed ({type(exc).__name__}: {exc})",
                            "entries need profiling_name, process_group, collective_seq_id, time_created_ns") from exc
        seen_ns = max(seen_ns, created, end)
        if backend == "nccl" and state != "completed":
            if state == "scheduled":
                acc.scheduled.append((rank, g, seq))
            for k, v in (("rank", rank), ("group", g), ("op", op), ("seq", seq), ("peer", peer),
                         ("nbytes", _nbytes(e)), ("start_ns", start), ("step", -1), ("seen_ns", 0),
                         ("failed", False)):
                acc.pending[k].append(v)
            continue
        for k, v in (("rank", rank), ("group", g), ("op", op), ("seq", seq), ("peer", peer),
                     ("nbytes", _nbytes(e)), ("start_ns", start), ("end_ns", max(end, start)), ("step", -1)):
            acc.rows[k].append(v)
    acc.pending["seen_ns"] = [s or seen_ns for s in acc.pending["seen_ns"]]


_ENTRY_TYPES: tuple[tuple[str, tuple[type, ...], bool], ...] = (
    ("profiling_name", (str,), True),
    ("process_group", (list, tuple, str), True),
    ("collective_seq_id", (int,), True),
    ("p2p_seq_id", (int,), False),
    ("time_created_ns", (int,), True),
    ("time_discovered_started_ns", (int, type(None)), False),
    ("time_discovered_completed_ns", (int, type(None)), False),
    ("state", (str,), False),
    ("input_sizes", (list, tuple), False),
    ("input_dtypes", (list, tuple), False),
)


def _check_entry(e: Any, i: int, path: Path) -> None:
    """Refuse entries whose fields have the wrong types, naming the first bad field."""
    if not isinstance(e, dict):
        raise UserError(f"{path}: entry {i} is a {type(e).__name__}, not a dict", "this is not a Flight Recorder dump")
    for key, types, required in _ENTRY_TYPES:
        if key not in e:
            if required:
                raise UserError(f"{path}: entry {i} has no '{key}'", "this is not a Flight Recorder dump (or a newer format)")
            continue
        v = e[key]
        if isinstance(v, bool) or not isinstance(v, types):
            raise UserError(f"{path}: entry {i} field '{key}' is a {type(v).__name__}",
                            f"expected {' or '.join(t.__name__ for t in types)}; the dump is corrupt")


def _pg_ranks(pg_config: Any) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    if not isinstance(pg_config, dict):
        return out
    for key, cfg in pg_config.items():
        try:
            ranks = cfg.get("ranks", []) if isinstance(cfg, dict) else []
            if isinstance(ranks, str):
                ranks = ast.literal_eval(ranks)  # torch writes '[0, 1]'; literal_eval runs no code
            if ranks:
                out[str(key)] = [int(r) for r in ranks]
        except (ValueError, SyntaxError, TypeError):
            continue
    return out


def _peer(rest: str, ranks: list[int] | None) -> int:
    """'send 0->1' / 'recv 1<-0' (group ranks) -> the peer's global rank when the group is known."""
    m = re.search(r"(\d+)\s*(->|<-)\s*(\d+)", rest)
    if not m:
        return -1
    peer = int(m.group(3))
    return ranks[peer] if ranks and peer < len(ranks) else peer


def dump_files(src: Path) -> list[Path]:
    if not src.exists():
        raise UserError(f"{src}: no such file or directory", "pass a Flight Recorder dump or a directory of them")
    if src.is_file():
        return [src]
    inner = [src, *sorted(d for d in src.iterdir() if d.is_dir() and not d.name.startswith("."))]
    files = [p for d in inner for p in sorted(d.iterdir())
             if p.is_file() and not p.name.startswith(".") and re.search(r"\d+(\.json|\.pkl|\.pickle)?$", p.name)]
    if not files:
        raise UserError(f"{src}: no dump files (PREFIX<rank>) in this directory",
                        "set TORCH_FR_BUFFER_SIZE and TORCH_FR_DUMP_TEMP_FILE in the job and point at that directory")
    return files


def import_flight_recorder(src: Path, out: Path, world_size: int | None = None, job: str | None = None) -> JobMeta:
    """Read every dump under `src` and write a trace (meta.json, commops.parquet, pending.parquet)."""
    acc = Imported()
    ranks: list[int] = []
    for f in dump_files(src):
        r = rank_of(f)
        if r in ranks:
            raise UserError(f"{f}: a second dump for rank {r}", "keep one dump per rank in the directory")
        ranks.append(r)
        dump = load_dump(f)
        host = dump_host(dump, f, src)
        if host:
            acc.hosts[r] = host
        _add_dump(acc, r, dump, f)
    if not acc.rows["rank"] and not acc.pending["rank"]:
        raise UserError(f"{src}: no communication entries in the dump(s)",
                        "dump after the job ran collectives, with TORCH_FR_BUFFER_SIZE > 0")
    world = max(world_size or 0, max(ranks) + 1, *(max(g) + 1 for g in acc.groups.values() if g))
    if "world" in acc.groups or world_size:
        acc.groups["world"] = set(range(world))
    meta = JobMeta(
        job=job or "flight-recorder", world_size=world,
        ranks={r: RankInfo(host=acc.hosts.get(r, "unknown"), gpu=r) for r in range(world)},
        groups={g: sorted(m) for g, m in sorted(acc.groups.items())},
        extra={"source": "flight-recorder", "backends": sorted(acc.backends), "fr_version": sorted(acc.versions),
               "dumped_ranks": sorted(ranks), "skipped_entries": acc.skipped,
               "completed_ops": len(acc.rows["rank"]), "pending_ops": len(acc.pending["rank"]),
               "not_started": [list(x) for x in sorted(set(acc.scheduled))] if acc.tracks_starts else [],
               "durations": "unknown" if acc.backends <= {"gloo", "unknown"} else "measured"},
    )
    out.mkdir(parents=True, exist_ok=True)
    meta.save(out / "meta.json")
    write_table(pa.Table.from_pydict(acc.rows, schema=COMMOPS_SCHEMA), out / "commops.parquet", COMMOPS_SCHEMA)
    if acc.pending["rank"]:
        layout.atomic_write_table(out / "pending.parquet", pa.Table.from_pydict(acc.pending, schema=layout.PENDING_SCHEMA))
    return meta
