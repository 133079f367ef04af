"""Import PyTorch profiler (Kineto) Chrome-trace JSON files into a trace's CommOps rows.

Files are `.json` or gzip `.json.gz` (torch.profiler.tensorboard_trace_handler writes
`<host>_<pid>.<ts>.pt.trace.json.gz`), given one by one or as a directory; the rank comes from
`distributedInfo.rank`, else the digits ending the file name, and a rank may have several files
(one per profiling cycle). Sources, best first: NCCL GPU kernels (`ncclDevKernel_*` in NCCL >=
2.19, `ncclKernel_*` before), `record_param_comms` CPU ops, and gloo's `gloo:<op>` annotations. A
kernel's collective name, group and sizes come from its own args, else from the
`record_param_comms` that launched it (same "External id"). Times are Kineto's: microseconds since
`baseTimeNanoseconds`. Steps come from the profiler's own `ProfilerStep#N` markers: an operator
belongs to the step whose marker spans the moment its CPU side ran (a kernel: its launch), so they
are never inferred when the markers are there. Group names come from the events' "Process Group
Description"/"Name" args when present (else "world"); seq counts per group in time order. The
ranks present are compared with the world size and groups `distributedInfo` declares, and a
partial rank set is recorded as such (meta.json `ranks_present`, `ranks_missing`).
"""

from __future__ import annotations

import math
import re
import zlib
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from collector.importers.flight_recorder import DTYPE_BYTES, OP_NAMES, RANK_IN_NAME, group_name
from collector.inputs.errors import TraceError, UserError
from collector.inputs.limits import ENV, limits
from collector.inputs.names import host_problem
from collector.inputs.safeio import check_regular, load_json, read_regular
from collector.trace.contract import MAX_NS
from collector.trace.meta import JobMeta, RankInfo, as_int
from collector.trace.schema import COMMOPS_SCHEMA
from collector.trace.traceio import write_table

#: decompressed size a .json.gz may reach (torch.profiler writes tens to hundreds of MB per rank)
MAX_TRACE_BYTES = 4 << 30
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_TRACE_NAME = re.compile(r"\.json(\.gz)?$")
_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
KERNEL_OPS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
              "Broadcast": "broadcast", "Reduce": "reduce", "AllToAll": "all_to_all", "Send": "send",
              "Recv": "recv", "SendRecv": "send"}


def gunzip(raw: bytes, path: Path, cap: int = MAX_TRACE_BYTES) -> bytes:
    """A gzip member's content, refused past `cap` bytes (a small file may expand a thousandfold)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(raw, cap + 1)
    except zlib.error as exc:
        raise UserError(f"{path}: not a valid gzip file ({exc})", "copy the .json.gz again") from exc
    if len(out) > cap:
        raise UserError(f"{path}: expands past {cap >> 20} MiB of JSON", "profile a shorter window (fewer active steps)")
    if not d.eof:
        raise UserError(f"{path}: not a complete gzip file; truncated?", "copy the .json.gz again")
    return out


def load_trace(path: Path) -> dict[str, Any]:
    """One profiler trace as JSON: a regular file within the size and depth caps."""
    raw = read_regular(path, limits().dump_bytes, "dump_bytes")
    try:
        if raw[:2] == b"\x1f\x8b":  # gzip, whatever the name says
            raw = gunzip(raw, path, min(MAX_TRACE_BYTES, limits().dump_bytes, limits().gzip_ratio * len(raw)))
        data = load_json(raw, path)
    except TraceError as exc:
        raise UserError(f"{exc.what}; truncated?", "pass the file written by export_chrome_trace()") from exc
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise UserError(f"{path}: no traceEvents list", "this is not a Chrome trace from torch.profiler")
    return data


def _rank(path: Path, data: dict[str, Any]) -> int:
    """The rank from distributedInfo, else from the file name; checked against the world-size cap."""
    info = data.get("distributedInfo")
    cap = limits().world_size
    fix = f"a rank is 0..world_size-1; raise {ENV['world_size']} for a larger job"
    if isinstance(info, dict) and "rank" in info:
        return as_int(info["rank"], f"{path}: distributedInfo.rank", 0, cap - 1, fix)
    m = re.search(RANK_IN_NAME + r"(?:\.pt\.trace)?\.json(?:\.gz)?$", path.name)
    if not m:
        raise UserError(f"{path}: cannot tell which rank wrote it", "name the file ...<rank>.json or keep distributedInfo")
    return as_int((m.group(1) or "") + m.group(2)[:12], f"{path}: rank in the file name", 0, cap - 1, fix)


def _scan(events: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """One pass over a file's events, keeping the few the importer reads: NCCL kernels,
    record_param_comms, gloo annotations, ProfilerStep markers and CUDA runtime calls."""
    out: dict[str, list[dict[str, Any]]] = {"kernel": [], "params": [], "gloo": [], "step": [], "runtime": []}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = e.get("name")
        if not isinstance(name, str):
            continue
        if name.startswith("nccl") and _KERNEL.match(name):
            out["kernel"].append(e)
        elif name == "record_param_comms":
            out["params"].append(e)
        elif name.startswith("gloo:"):
            out["gloo"].append(e)
        elif name.startswith("ProfilerStep#"):
            out["step"].append(e)
        elif e.get("cat") == "cuda_runtime":
            out["runtime"].append(e)
    return out


def _comm_events(scan: dict[str, list[dict[str, Any]]]) -> tuple[str, list[dict[str, Any]], dict[Any, dict[str, Any]]]:
    """The best communication source of one file, its events, and record_param_comms args by External id."""
    params = scan["params"]
    by_ext = {_args(e).get("External id"): e for e in params if _args(e).get("External id") is not None}
    if scan["kernel"]:
        return "nccl-kernel", scan["kernel"], by_ext
    if params:
        return "record_param_comms", params, by_ext
    return "gloo-annotation", scan["gloo"], by_ext


def _args(e: dict[str, Any]) -> dict[str, Any]:
    raw = e.get("args")
    return raw if isinstance(raw, dict) else {}


def _row(kind: str, e: dict[str, Any], by_ext: dict[Any, dict[str, Any]]) -> tuple[str, str, int, int] | None:
    """(op, group, nbytes, peer) of one event, None if it is not a communication operator.

    A kernel without collective args takes them from the record_param_comms that launched it."""
    args = _args(e)
    name = str(e.get("name", ""))
    if kind == "nccl-kernel":
        if "Collective name" not in args:
            args = {**_args(by_ext.get(args.get("External id"), {})), **args}
        m = _KERNEL.match(name)
        op = KERNEL_OPS.get(m.group(1)) if m else None
        if "Collective name" in args:
            op = OP_NAMES.get(str(args["Collective name"]).lower(), op)
    elif kind == "record_param_comms":
        op = OP_NAMES.get(str(args.get("Collective name", "")).lower())
    else:
        op = OP_NAMES.get(name.partition(":")[2].split(" ")[0])
    if op is None:
        return None
    desc = args.get("Process Group Description", "")
    pg = args.get("Process Group Name")
    group = group_name((str(pg), str(desc))) if pg is not None else "world"
    nelems = args.get("In msg nelems", 0)
    size = DTYPE_BYTES.get(str(args.get("dtype", "Float")), 4)
    peer = args.get("Dst Rank", args.get("Src Rank", args.get("Peer Rank", -1)))
    try:
        return op, group, int(nelems) * size, int(peer)
    except (TypeError, ValueError, OverflowError) as exc:
        raise UserError(f"event '{name[:60]}': message size {str(nelems)[:20]!r} or peer {str(peer)[:20]!r} "
                        "is not an integer", "this trace is corrupt; re-export it") from exc


def step_spans(events: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The profiler's own steps: (start us, end us, step number) of every `ProfilerStep#N`, by start."""
    rows = []
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and (m := _STEP.match(str(e.get("name", "")))):
            try:
                ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
            except (KeyError, TypeError, ValueError):
                continue
            rows.append((ts, ts + dur, int(m.group(1))))
    rows.sort()
    arr = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2].astype(np.int64)


def steps_at(ts: np.ndarray, spans: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """The step whose marker spans each CPU time (us), -1 outside every marker."""
    starts, ends, numbers = spans
    if not starts.size:
        return np.full(ts.size, -1, dtype=np.int64)
    i = np.searchsorted(starts, ts, side="right") - 1
    ok = (i >= 0) & (ts < ends[np.clip(i, 0, None)])
    return np.where(ok, numbers[np.clip(i, 0, None)], -1)


def _launch_times(runtime: list[dict[str, Any]]) -> dict[Any, float]:
    """CPU time (us) of every CUDA runtime call by its correlation id: when a kernel was launched."""
    out: dict[Any, float] = {}
    for e in runtime:
        if e.get("cat") == "cuda_runtime":
            c = _args(e).get("correlation")
            if c is not None and isinstance(e.get("ts"), (int, float)):
                out[c] = float(e["ts"])
    return out


def trace_files(src: Path) -> list[Path]:
    """A trace file, or every .json / .json.gz trace in a directory. One that is not a regular file
    (a FIFO, a device, a dangling link) is refused, not skipped: read, it would block; skipped, its
    rank would pass for one that was not profiled."""
    if not src.exists():
        raise UserError(f"{src}: no such file or directory", "pass a profiler trace or a directory of them")
    if not src.is_dir():
        check_regular(src)
        return [src]
    files = sorted(p for p in src.iterdir() if not p.is_dir() and _TRACE_NAME.search(p.name))
    for p in files:
        check_regular(p)
    if not files:
        raise UserError(f"{src}: no .json or .json.gz traces",
                        "pass the directory torch.profiler.tensorboard_trace_handler wrote (*.pt.trace.json.gz)")
    return files


def _rows_of(f: Path, data: dict[str, Any]) -> tuple[str, pd.DataFrame]:
    """One file's communication rows (op, group, nbytes, peer, start_ns, end_ns, step) and their source."""
    base = as_int(data.get("baseTimeNanoseconds", 0) or 0, f"{f}: baseTimeNanoseconds", 0, MAX_NS)
    cap = limits().world_size
    scan = _scan(data["traceEvents"])
    kind, comm, by_ext = _comm_events(scan)
    launches = _launch_times(scan["runtime"]) if kind == "nccl-kernel" else {}
    rows, cpu_ts = [], []
    for e in comm:
        try:
            r = _row(kind, e, by_ext)
        except UserError as exc:
            raise UserError(f"{f}: {exc.what}", exc.fix) from exc
        if r is None:
            continue
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise UserError(f"{f}: event '{str(e.get('name'))[:60]}' has no numeric ts/dur", "this is not a Chrome trace") from exc
        if not (math.isfinite(ts) and math.isfinite(dur) and dur >= 0 and 0 <= base + (ts + dur) * 1e3 <= MAX_NS
                and base + ts * 1e3 >= 0):
            raise UserError(f"{f}: event '{str(e.get('name'))[:60]}' has ts {ts!r} / dur {dur!r} out of range",
                            "ts and dur are microseconds (finite, dur >= 0); this trace is corrupt")
        if abs(r[2]) > 2**62 or not -1 <= r[3] < cap:
            raise UserError(f"{f}: event '{str(e.get('name'))[:60]}' has a message size or peer out of range",
                            "this trace is corrupt")
        rows.append((*r, base + int(ts * 1e3), base + int((ts + dur) * 1e3)))
        if kind == "nccl-kernel":  # a kernel runs on the GPU later; its step is where it was launched
            a = _args(e)
            launcher = by_ext.get(a.get("External id"), {})
            ts = launches.get(a.get("correlation"), launcher.get("ts", ts))
        cpu_ts.append(float(ts))
    df = pd.DataFrame(rows, columns=["op", "group", "nbytes", "peer", "start_ns", "end_ns"])
    steps = steps_at(np.asarray(cpu_ts, dtype=np.float64), step_spans(scan["step"]))
    if steps.size and int(steps.max()) > limits().max_step:
        raise UserError(f"{f}: ProfilerStep#{int(steps.max())} is beyond step {limits().max_step}",
                        f"raise {ENV['max_step']} if the job really ran that long")
    df["step"] = steps.astype(np.int32)
    return kind, df


def _declared(info: dict[str, Any], f: Path) -> dict[str, list[int]]:
    """Process groups `distributedInfo.pg_config` declares: contract name -> global ranks (each
    checked against the world-size cap before anything is built from it)."""
    out: dict[str, list[int]] = {}
    cfg = info.get("pg_config")
    cap = limits().world_size
    for pg in cfg if isinstance(cfg, list) else []:
        try:
            raw = pg.get("ranks", [])
            if not isinstance(raw, list) or len(raw) > cap:
                raise TypeError("not a list of ranks")
            ranks = [as_int(r, f"{f}: pg_config rank", 0, cap - 1, f"raise {ENV['world_size']} for a larger job")
                     for r in raw]
            if ranks:
                out[group_name((str(pg.get("pg_name", "")), str(pg.get("pg_desc", ""))))] = ranks
        except (AttributeError, TypeError, ValueError):
            continue
    return out


def import_kineto(src: Path, out: Path, job: str | None = None) -> JobMeta:
    files = trace_files(src)
    frames: dict[int, list[pd.DataFrame]] = {}
    sources: set[str] = set()
    hosts: dict[int, str] = {}
    groups: dict[str, set[int]] = {}
    marked: set[int] = set()
    world = 0
    for f in files:
        data = load_trace(f)
        rank = _rank(f, data)
        raw_info = data.get("distributedInfo")
        info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
        cap = limits().world_size
        world = max(world, as_int(info.get("world_size", 0) or 0, f"{f}: distributedInfo.world_size", 0, cap,
                                  f"raise {ENV['world_size']} for a larger job"), rank + 1)
        for g, members in _declared(info, f).items():
            groups.setdefault(g, set()).update(members)
        hosts[rank] = str(data.get("host_name", "unknown"))
        if why := host_problem(hosts[rank]):
            raise UserError(f"{f}: host_name: {why}", "profile on hosts with RFC 1123 names, or fix host_name")
        kind, df = _rows_of(f, data)
        frames.setdefault(rank, [])
        if len(df):
            sources.add(kind)
            frames[rank].append(df)
            if (df["step"] >= 0).any():
                marked.add(rank)
    per_rank = []
    for rank, parts in frames.items():
        if not parts:
            continue
        spans = sorted((int(p["start_ns"].min()), int(p["end_ns"].max())) for p in parts)
        if any(b[0] < a[1] for a, b in pairwise(spans)):
            raise UserError(f"{src}: two traces of rank {rank} cover the same time (a copy, or .json beside its .json.gz)",
                            "keep one file per profiling window of each rank")
        df = pd.concat(parts, ignore_index=True).sort_values("start_ns", kind="stable")
        df["seq"] = df.groupby("group").cumcount() + 1
        df["rank"] = rank
        per_rank.append(df)
    if not per_rank:
        raise UserError(f"{src}: no communication events (ncclDevKernel_*, ncclKernel_*, record_param_comms, gloo:*)",
                        "profile a window that runs collectives, with ProfilerActivity.CUDA for NCCL kernels")
    all_rows = pd.concat(per_rank, ignore_index=True)
    if marked and len(marked) < len(per_rank):  # steps of some ranks only cannot be compared with the rest
        all_rows["step"] = np.int32(-1)
        marked = set()
    present = sorted(frames)
    world = max(world, *(max(m) + 1 for m in groups.values())) if groups else world
    missing = sorted(set(range(world)) - set(present))
    meta = JobMeta(job=job or "kineto", world_size=world,
                   ranks={r: RankInfo(host=hosts.get(r, "unknown"), gpu=r) for r in range(world)},
                   groups={g: sorted(m) for g, m in sorted(groups.items())},
                   extra={"source": "kineto", "kineto_sources": sorted(sources), "ranks_present": present,
                          "ranks_missing": missing,
                          "steps_from": "ProfilerStep markers" if marked else "not recorded"})
    out.mkdir(parents=True, exist_ok=True)
    meta.save(out / "meta.json")
    table = pa.Table.from_pandas(all_rows[[f.name for f in COMMOPS_SCHEMA]], preserve_index=False)
    write_table(table, out / "commops.parquet", COMMOPS_SCHEMA)
    return meta
