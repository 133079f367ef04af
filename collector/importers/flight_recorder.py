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
import math
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from collector.commops import layout
from collector.inputs.errors import TraceError, UserError
from collector.inputs.limits import ENV, limits
from collector.inputs.names import host_problem
from collector.inputs.safeio import check_regular, load_json, read_regular
from collector.trace.contract import MAX_NS
from collector.trace.groupnames import group_label
from collector.trace.meta import JobMeta, RankInfo
from collector.trace.schema import COMMOPS_SCHEMA
from collector.trace.traceio import write_table

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
    raw = read_regular(path, limits().dump_bytes, "dump_bytes")
    if not raw.strip():
        raise UserError(f"{path}: empty file", "re-dump the Flight Recorder; this rank wrote nothing")
    if raw.lstrip()[:1] in (b"{", b"["):
        try:
            data = load_json(raw, path)
        except TraceError as exc:
            raise UserError(f"{exc.what}; truncated?",
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


def _check_plain(obj: Any, path: Path) -> None:
    """Every object is plain data, nesting is within the depth cap, and the walk is linear: a
    container met again through a shared reference is not walked again (a 300-byte pickle of
    shared references is a DAG whose tree is 2**levels nodes), and the objects walked are capped."""
    lim = limits()
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(obj, 0)]
    walked = 0
    while stack:
        o, depth = stack.pop()
        if not isinstance(o, _PLAIN):
            raise UserError(f"{path}: unexpected {type(o).__name__}", "this is not a Flight Recorder dump")
        if not isinstance(o, (dict, list, tuple, set, frozenset)):
            continue
        if id(o) in seen:
            continue
        seen.add(id(o))
        walked += len(o)
        if depth >= lim.json_depth:
            raise UserError(f"{path}: nested deeper than {lim.json_depth} levels", "this is not a Flight Recorder dump")
        if walked > lim.objects:
            raise UserError(f"{path}: more than {lim.objects} objects", f"raise {ENV['objects']} if the dump is genuine")
        items = [x for kv in o.items() for x in kv] if isinstance(o, dict) else o
        stack.extend((v, depth + 1) for v in items)


#: digits ending a name (before an optional extension), with a minus sign when the '-' before them
#: follows no letter or digit: `rank_-1` is rank -1, `fr-dump-3` is rank 3 after a '-' separator
RANK_IN_NAME = r"(?:(?<![A-Za-z0-9])(-))?(\d+)"


def rank_of(path: Path) -> int:
    """The rank in a dump's file name (PREFIX<rank>), checked against 0 and the world-size cap."""
    m = re.search(RANK_IN_NAME + r"(\.json|\.pkl|\.pickle)?$", path.name)
    if not m:
        raise UserError(f"{path}: no rank number at the end of the file name",
                        "Flight Recorder names dumps PREFIX<rank>; rename the file or pass a directory of such files")
    sign, digits = m.group(1), m.group(2)
    if sign:
        raise UserError(f"{path}: rank -{digits[:12]} in the file name is negative",
                        "Flight Recorder names dumps PREFIX<rank> with rank 0..world_size-1; rename the file to its rank")
    cap = limits().world_size
    if len(digits) > 9 or int(digits) >= cap:
        raise UserError(f"{path}: rank {digits[:12]} in the file name is beyond the {cap}-rank limit",
                        f"rename the file to its rank, or raise {ENV['world_size']} for a larger job")
    return int(digits)


def group_name(pg: Any) -> str:
    """Same names as the CommOps logger (`collector.trace.groupnames.group_label`) from a dump's
    `process_group`: (name, desc), or the name alone."""
    if isinstance(pg, (list, tuple)) and len(pg) == 2:
        return group_label(str(pg[0]), str(pg[1]))
    return group_label(str(pg), "")


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
    """Payload bytes from the input shapes; ValueError when the sizes do not fit int64."""
    sizes, dtypes = entry.get("input_sizes") or [], entry.get("input_dtypes") or []
    total = 0
    for i, shape in enumerate(sizes):
        n = 1
        for d in shape if shape else []:
            n *= _bounded(d, "input size", 0, INT64_MAX)
            if n > INT64_MAX:
                raise ValueError("input size overflows int64")
        total += n * DTYPE_BYTES.get(str(dtypes[i]) if i < len(dtypes) else "Float", 4)
        if total > INT64_MAX:
            raise ValueError("payload overflows int64")
    return total


def _tracks_starts(dump: dict[str, Any]) -> bool:
    """Whether this dump can tell "queued" from "running": NCCL records when an operator started on
    the GPU only with TORCH_NCCL_ENABLE_TIMING=1 (else every operator stays "scheduled" until done).
    Timing is a job-wide setting, so one dump that records starts speaks for all."""
    for e in dump["entries"]:
        started = e.get("time_discovered_started_ns") if isinstance(e, dict) else None
        if isinstance(e, dict) and (e.get("state") == "started" or (isinstance(started, int) and started > 0)):
            return True
    status = dump.get("pg_status")
    if isinstance(status, dict):
        for st in status.values():
            try:
                if isinstance(st, dict) and int(st.get("last_started_collective", -1)) >= 0:
                    return True
            except (TypeError, ValueError, OverflowError):
                continue
    return False


#: where a dump may name the host that wrote it (keys some launchers and collectors add)
HOST_KEYS = ("hostname", "host_name", "host", "node", "nodename")


def dump_host(dump: dict[str, Any], path: Path, src: Path) -> str | None:
    """The host that wrote a dump: a host key in the dump, else the sub-directory of `src` it sits in
    (collectors gather dumps as HOST/PREFIX<rank>), else None."""
    host = None
    for key in HOST_KEYS:
        v = dump.get(key)
        if isinstance(v, str) and v.strip():
            host = v.strip()
            break
    if host is None and src.is_dir() and path.parent != src and path.parent.parent == src:
        host = path.parent.name
    if host is not None and (why := host_problem(host)):  # it will name ssh targets and Slurm nodes
        raise UserError(f"{path}: {why}", "name the dump's host (or its HOST/ directory) as the scheduler does")
    return host


INT64_MAX = 2**63 - 1


def _bounded(v: Any, what: str, lo: int, hi: int) -> int:
    """An int in [lo, hi] (ValueError otherwise): every number from a dump is checked before use."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError(f"{what} {str(v)[:30]!r} is not a number")
    if isinstance(v, float) and (not math.isfinite(v) or not v.is_integer()):
        raise ValueError(f"{what} {v!r} is not a whole number")
    if isinstance(v, str) and len(v) > 20:
        raise ValueError(f"{what} {v[:30]!r} is not a number")
    n = int(v)
    if not lo <= n <= hi:
        raise ValueError(f"{what} {n} outside {lo}..{hi}")
    return n


def _add_dump(acc: Imported, rank: int, dump: dict[str, Any], path: Path) -> None:
    acc.versions.add(str(dump.get("version", "")))
    try:
        group_ranks = _pg_ranks(dump.get("pg_config"))
    except UserError as exc:
        raise UserError(f"{path}: {exc.what}", exc.fix) from exc
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
            seq = _bounded(e["p2p_seq_id"] if p2p else e["collective_seq_id"], "seq id", 0, INT64_MAX)
            peer = _peer(rest, group_ranks.get(pg_key)) if p2p else -1
            if peer >= limits().world_size:
                raise ValueError(f"peer {peer} beyond the world-size limit")
            created = _bounded(e["time_created_ns"], "time_created_ns", 0, MAX_NS)
            for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                if e.get(key) is not None:
                    _bounded(e[key], key, 0, MAX_NS)
            dur = e.get("duration_ms")
            if dur is not None and not (isinstance(dur, int | float) and not isinstance(dur, bool)
                                        and math.isfinite(dur) and 0 <= dur <= 1e9):
                raise ValueError(f"duration_ms {str(dur)[:30]!r} is not a duration")
            start, end = _interval(created, e.get("time_discovered_started_ns"),
                                   e.get("time_discovered_completed_ns"), dur)
            state = str(e.get("state", "scheduled"))
            nbytes = _nbytes(e)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
            raise UserError(f"{path}: entry {i} is malformed ({type(exc).__name__}: {exc})",
                            "entries need profiling_name, process_group, collective_seq_id, time_created_ns") from exc
        seen_ns = max(seen_ns, created, end)
        if backend == "nccl" and state != "completed":
            if state == "scheduled":
                acc.scheduled.append((rank, g, seq))
            for k, v in (("rank", rank), ("group", g), ("op", op), ("seq", seq), ("peer", peer),
                         ("nbytes", nbytes), ("start_ns", start), ("step", -1), ("seen_ns", 0),
                         ("failed", False)):
                acc.pending[k].append(v)
            continue
        for k, v in (("rank", rank), ("group", g), ("op", op), ("seq", seq), ("peer", peer),
                     ("nbytes", nbytes), ("start_ns", start), ("end_ns", min(max(end, start), MAX_NS)), ("step", -1)):
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
    cap = limits().world_size
    if not isinstance(pg_config, dict):
        return out
    for key, cfg in pg_config.items():
        try:
            ranks = cfg.get("ranks", []) if isinstance(cfg, dict) else []
            if isinstance(ranks, str):
                if len(ranks) > 16 * cap:
                    continue
                ranks = ast.literal_eval(ranks)  # torch writes '[0, 1]'; literal_eval runs no code
            if ranks:
                if not isinstance(ranks, list | tuple) or len(ranks) > cap:
                    raise ValueError(f"{len(ranks)} ranks, over the {cap}-rank limit")
                out[str(key)] = [_bounded(r, "group rank", 0, cap - 1) for r in ranks]
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError, OverflowError) as exc:
            raise UserError(f"pg_config group {str(key)[:40]!r}: ranks are not a list of ranks ({exc})",
                            f"a group lists global ranks below the {cap}-rank limit ({ENV['world_size']})") from exc
    return out


def _peer(rest: str, ranks: list[int] | None) -> int:
    """'send 0->1' / 'recv 1<-0' (group ranks) -> the peer's global rank when the group is known."""
    m = re.search(r"(\d+)\s*(->|<-)\s*(\d+)", rest)
    if not m:
        return -1
    peer = int(m.group(3))
    return ranks[peer] if ranks and peer < len(ranks) else peer


def dump_files(src: Path) -> list[Path]:
    """`src`, or the files named PREFIX<rank> in it and in its HOST/ subdirectories. One so named that
    is not a regular file (a FIFO, a device, a dangling link) is refused, as a commops shard is:
    read, it would block; skipped, its rank would pass for one that wrote no dump."""
    if not src.exists():
        raise UserError(f"{src}: no such file or directory", "pass a Flight Recorder dump or a directory of them")
    if not src.is_dir():
        check_regular(src)  # a FIFO or device would block the reader
        return [src]
    inner = [src, *sorted(d for d in src.iterdir() if d.is_dir() and not d.name.startswith("."))]
    files = [p for d in inner for p in sorted(d.iterdir())
             if not p.is_dir() and not p.name.startswith(".") and re.search(r"\d+(\.json|\.pkl|\.pickle)?$", p.name)]
    for p in files:
        check_regular(p)
    if not files:
        raise UserError(f"{src}: no dump files (PREFIX<rank>) in this directory",
                        "set TORCH_FR_BUFFER_SIZE and TORCH_FR_DUMP_TEMP_FILE in the job and point at that directory")
    return files


def import_flight_recorder(src: Path, out: Path, world_size: int | None = None, job: str | None = None) -> JobMeta:
    """Read every dump under `src` and write a trace (meta.json, commops.parquet, pending.parquet)."""
    cap = limits().world_size
    if world_size is not None and not 1 <= world_size <= cap:
        raise UserError(f"--world-size {world_size} is outside 1..{cap}",
                        f"give the job's number of ranks (raise {ENV['world_size']} for a larger job)")
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
    if world > limits().world_size or (world_size and world > world_size):
        raise UserError(f"{src}: ranks up to {world - 1} for a world of {world_size or limits().world_size}",
                        f"pass the job's --world-size, or raise {ENV['world_size']} for a larger job")
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
