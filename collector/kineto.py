"""Import PyTorch profiler (Kineto) Chrome-trace JSON files into a trace's CommOps rows.

One file per rank (rank from `distributedInfo.rank`, else the digits ending the file name).
Sources, best first: NCCL GPU kernels (`ncclDevKernel_*` in NCCL >= 2.19, `ncclKernel_*` before),
`record_param_comms` CPU ops, and gloo's `gloo:<op>` annotations. Times are Kineto's: microseconds
since `baseTimeNanoseconds`. Group names come from the events' "Process Group Description"/"Name"
args when present (else "world"); seq counts per group in time order.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from collector.contract import MAX_NS
from collector.errors import TraceError, UserError
from collector.flight_recorder import DTYPE_BYTES, OP_NAMES, group_name
from collector.limits import ENV, limits
from collector.meta import JobMeta, RankInfo, as_int
from collector.names import host_problem
from collector.safeio import load_json, read_regular
from collector.schema import COMMOPS_SCHEMA
from collector.traceio import write_table

_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
KERNEL_OPS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
              "Broadcast": "broadcast", "Reduce": "reduce", "AllToAll": "all_to_all", "Send": "send",
              "Recv": "recv", "SendRecv": "send"}


def load_trace(path: Path) -> dict[str, Any]:
    """One profiler trace as JSON: a regular file within the size and depth caps."""
    raw = read_regular(path, limits().dump_bytes, "dump_bytes")
    try:
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
    m = re.search(r"(\d+)(?:\.pt\.trace)?\.json$", path.name)
    if not m:
        raise UserError(f"{path}: cannot tell which rank wrote it", "name the file ...<rank>.json or keep distributedInfo")
    return as_int(m.group(1)[:12], f"{path}: rank in the file name", 0, cap - 1, fix)


def _comm_events(events: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    kernels, params, gloo = [], [], []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = str(e.get("name", ""))
        if _KERNEL.match(name):
            kernels.append(e)
        elif name == "record_param_comms":
            params.append(e)
        elif name.startswith("gloo:"):
            gloo.append(e)
    if kernels:
        return "nccl-kernel", kernels
    if params:
        return "record_param_comms", params
    return "gloo-annotation", gloo


def _row(kind: str, e: dict[str, Any]) -> tuple[str, str, int, int] | None:
    """(op, group, nbytes, peer) of one event, None if it is not a communication operator."""
    raw_args = e.get("args")
    args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
    name = str(e.get("name", ""))
    if kind == "nccl-kernel":
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


def import_kineto(src: Path, out: Path, job: str | None = None) -> JobMeta:
    if not src.exists():
        raise UserError(f"{src}: no such file or directory", "pass a profiler trace or a directory of them")
    files = [src] if src.is_file() else sorted(p for p in src.iterdir() if p.name.endswith(".json"))
    if not files:
        raise UserError(f"{src}: no .json traces", "export with prof.export_chrome_trace('trace_rank<r>.json')")
    frames, sources, hosts, world = [], set(), {}, 0
    for f in files:
        data = load_trace(f)
        rank = _rank(f, data)
        raw_info = data.get("distributedInfo")
        info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
        cap = limits().world_size
        world = max(world, as_int(info.get("world_size", 0) or 0, f"{f}: distributedInfo.world_size", 0, cap,
                                  f"raise {ENV['world_size']} for a larger job"), rank + 1)
        hosts[rank] = str(data.get("host_name", "unknown"))
        if why := host_problem(hosts[rank]):
            raise UserError(f"{f}: host_name: {why}", "profile on hosts with RFC 1123 names, or fix host_name")
        base = as_int(data.get("baseTimeNanoseconds", 0) or 0, f"{f}: baseTimeNanoseconds", 0, MAX_NS)
        kind, events = _comm_events(data["traceEvents"])
        rows = []
        for e in events:
            try:
                r = _row(kind, e)
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
        if rows:
            sources.add(kind)
            df = pd.DataFrame(rows, columns=["op", "group", "nbytes", "peer", "start_ns", "end_ns"])
            df = df.sort_values("start_ns", kind="stable")
            df["seq"] = df.groupby("group").cumcount() + 1
            df["rank"] = rank
            frames.append(df)
    if not frames:
        raise UserError(f"{src}: no communication events (ncclDevKernel_*, ncclKernel_*, record_param_comms, gloo:*)",
                        "profile a window that runs collectives, with ProfilerActivity.CUDA for NCCL kernels")
    all_rows = pd.concat(frames, ignore_index=True)
    all_rows["step"] = np.int32(-1)
    meta = JobMeta(job=job or "kineto", world_size=world,
                   ranks={r: RankInfo(host=hosts.get(r, "unknown"), gpu=r) for r in range(world)},
                   groups={}, extra={"source": "kineto", "kineto_sources": sorted(sources)})
    out.mkdir(parents=True, exist_ok=True)
    meta.save(out / "meta.json")
    table = pa.Table.from_pandas(all_rows[[f.name for f in COMMOPS_SCHEMA]], preserve_index=False)
    write_table(table, out / "commops.parquet", COMMOPS_SCHEMA)
    return meta
