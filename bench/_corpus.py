"""The fuzz corpus: small generated inputs, one or more per class of hostile or broken input in issue #14.

`build(root)` writes every case under `root` and returns them; nothing is committed but this
script. Each case names the verbs that read it and what they must do: a broken input exits 2
with one line (never 0: that is a silent acceptance; never 3: that is laggard's own bug), a valid
one exits 0 (or 1). bench/reliability.py runs them through the real CLI; tests/collector/
test_fuzz_corpus.py through the readers in-process.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import pickle
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
BASE = REPO / "traces" / "gpu-spike"  # 16 ranks of commops, small and valid
LOGS_BASE = REPO / "traces" / "gpu-xid"  # commops plus logs/
FR_BASE = REPO / "tests" / "collector" / "data" / "fr-nccl-h100-json"
KINETO_BASE = REPO / "tests" / "collector" / "data" / "kineto-gloo"

TRACE_VERBS = ("validate", "timeline", "localize", "explain", "report")
LOG_VERBS = ("validate", "logs", "localize", "explain", "report")


@dataclass
class Case:
    name: str
    cls: str  # the class: meta-numbers, names, fifo, gzip, pickle, ...
    kind: str  # trace | fr | kineto
    path: Path
    verbs: tuple[str, ...]
    valid: bool = False  # True: a control the verbs must accept (exit 0/1)
    env: dict[str, str] = field(default_factory=dict)

    def size(self) -> int:
        """Bytes of input on disk (a FIFO counts 0; a directory is summed)."""
        if self.path.is_file():
            return self.path.stat().st_size
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())


def _copy_trace(src: Path, dst: Path, logs: bool = False) -> Path:
    dst.mkdir(parents=True)
    for name in ("meta.json", "commops.parquet"):
        shutil.copy(src / name, dst / name)
    if logs:
        shutil.copytree(src / "logs", dst / "logs")
    return dst


def _meta(path: Path, change: Callable[[dict], object]) -> None:
    meta = json.loads((path / "meta.json").read_text())
    change(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def _commops(path: Path, change: Callable[[dict[str, Any]], object]) -> None:
    t = pq.read_table(path / "commops.parquet")
    cols: dict[str, Any] = {n: t.column(n).to_numpy() if n not in ("group", "op") else t.column(n).to_pylist()
                            for n in t.column_names}
    change(cols)
    pq.write_table(pa.table({n: pa.array(v) for n, v in cols.items()}),
                   path / "commops.parquet")


def _set(key: str, value: object) -> Callable[[dict], object]:
    return lambda m: m.__setitem__(key, value)


def _host(name: str) -> Callable[[dict], object]:
    return lambda m: m["ranks"]["3"].__setitem__("host", name)


def _fifo(name: str) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        (path / name).unlink()
        os.mkfifo(path / name)
    return change


def _shared_refs_pickle(levels: int = 40) -> bytes:
    """About 300 bytes whose tree is 2**levels nodes: each level is a list holding the previous twice."""
    a: list = []
    for _ in range(levels):
        a = [a, a]
    return pickle.dumps({"version": "2.4", "entries": [], "pg_config": {}, "bomb": a}, protocol=4)


def _nested_pickle(depth: int = 100_000) -> bytes:
    """A list nested `depth` deep, built with opcodes (pickle.dumps itself would recurse)."""
    body = b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."
    return body


HOSTILE_PICKLES = {
    "reduce-os-system": b"cos\nsystem\n(S'touch /tmp/laggard-pwned'\ntR.",
    "stack-global-eval": b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x8c\x04eval\x93\x8c\x061+1\x85R.",
    "persistent-id": b"\x80\x04P0\n.",
    "build-inst": b"(c__builtin__\nobject\no.",
}


def _fr_dump(entries: list[dict], pg: dict | None = None) -> dict:
    return {"version": "2.4", "pg_config": pg or {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {}, "entries": entries}


def _fr_entry(**over: object) -> dict:
    e = {"profiling_name": "nccl:all_reduce", "process_group": ["0", "default_pg"], "collective_seq_id": 1,
         "p2p_seq_id": 0, "time_created_ns": 1_700_000_000_000_000_000, "time_discovered_started_ns": None,
         "time_discovered_completed_ns": None, "state": "completed", "input_sizes": [[1024]], "input_dtypes": ["Float"]}
    e.update(over)
    return e


def build(root: Path, bomb_bytes: int = 1 << 30) -> list[Case]:
    """Write the corpus under `root` (created); `bomb_bytes` is what the gzip bomb expands to."""
    root.mkdir(parents=True, exist_ok=True)
    cases: list[Case] = []

    def trace(name: str, cls: str, change: Callable[[Path], object], *, logs: bool = False, valid: bool = False,
              verbs: tuple[str, ...] | None = None) -> None:
        p = _copy_trace(LOGS_BASE if logs else BASE, root / name, logs)
        change(p)
        cases.append(Case(name, cls, "trace", p, verbs or (LOG_VERBS if logs else TRACE_VERBS), valid))

    # controls: what must keep working
    trace("ok-commops", "control", lambda p: None, valid=True)
    trace("ok-logs", "control", lambda p: None, logs=True, valid=True)
    trace("ok-escape-sequences", "terminal-escapes", lambda p: (p / "logs" / "node-1.log").open("ab").write(
        b"\x1b[2J\x1b]0;pwned\x07 NCCL WARN \x1b[31mfake\x1b[0m \xe2\x80\xae reversed\n"), logs=True, valid=True)
    esc = "\x1b]0;pwned\x07\x1b[2J"

    def escapes_in_names(p: Path) -> None:
        _meta(p, _set("job", f"job{esc}"))
        _commops(p, lambda c: c.__setitem__("group", [f"{g}{esc}" for g in c["group"]]))
    trace("ok-escapes-in-names", "terminal-escapes", escapes_in_names, valid=True)
    trace("ok-long-line", "line-length", lambda p: (p / "logs" / "node-2.log").open("ab").write(
        b"x" * (2 << 20) + b"\n"), logs=True, valid=True)

    # meta.json numbers and shapes
    trace("meta-world-infinity", "meta-numbers", lambda p: (p / "meta.json").write_text(
        (p / "meta.json").read_text().replace('"world_size": 32', '"world_size": Infinity')))
    trace("meta-world-huge", "meta-numbers", lambda p: _meta(p, _set("world_size", 10**12)))
    trace("meta-world-float", "meta-numbers", lambda p: _meta(p, _set("world_size", 16.5)))
    trace("meta-world-5000-digits", "meta-numbers", lambda p: (p / "meta.json").write_text(
        (p / "meta.json").read_text().replace('"world_size": 32', '"world_size": 1' + "0" * 5000)))
    trace("meta-world-zero", "meta-numbers", lambda p: _meta(p, _set("world_size", 0)))
    trace("meta-negative-rank", "ranks", lambda p: _meta(p, lambda m: m["ranks"].__setitem__("-1", m["ranks"].pop("0"))))
    trace("meta-gpu-nan", "meta-numbers", lambda p: (p / "meta.json").write_text(
        (p / "meta.json").read_text().replace('"gpu": 3', '"gpu": NaN', 1)))
    trace("meta-group-out-of-range", "ranks", lambda p: _meta(p, lambda m: m.setdefault("groups", {}).__setitem__("tp-0", [0, 10**9])))
    trace("meta-ranks-not-object", "meta-numbers", lambda p: _meta(p, _set("ranks", [1, 2, 3])))
    trace("meta-topology-list", "meta-numbers", lambda p: _meta(p, _set("topology", {"node-0": [1, 2]})))
    trace("meta-deep-json", "json-depth", lambda p: (p / "meta.json").write_text("[" * 200_000 + "]" * 200_000))
    trace("meta-not-json", "meta-numbers", lambda p: (p / "meta.json").write_bytes(os.urandom(300)))

    # names that would reach a command
    for name, host in (("slurm-hostlist", "node[0-999]"), ("user-at-host", "root@evil.example"),
                       ("option", "--all"), ("newline", "node-1\nnode-2"), ("dash", "-oProxyCommand=x"),
                       ("space", "node 1"), ("empty", "")):
        trace(f"names-host-{name}", "names", partial(_meta, change=_host(host)))
    trace("names-nic-dash", "names", lambda p: _meta(p, _set("topology", {"node-0": {"switch": "tor-0", "nics": ["-s"]}})))
    trace("names-nic-slash", "names", lambda p: _meta(p, _set("topology", {"node-0": {"switch": "tor-0", "nics": ["a/b"]}})))

    # rows that crash the analysis unless validate catches them
    rng = np.random.default_rng(14)
    trace("rows-random-steps", "value-ranges", lambda p: _commops(p, lambda c: c.__setitem__(
        "step", rng.integers(0, 2**31 - 1, c["step"].size, dtype=np.int64).astype(np.int32))))
    trace("rows-one-step-far-away", "value-ranges", lambda p: _commops(p, lambda c: c.__setitem__(
        "step", np.where(c["step"] == c["step"].max(), 9_999_999, c["step"]).astype(np.int32))))
    trace("rows-zero-durations", "value-ranges", lambda p: _commops(p, lambda c: c.__setitem__("end_ns", c["start_ns"].copy())),
          valid=True)
    trace("rows-negative-ranks", "ranks", lambda p: _commops(p, lambda c: c.__setitem__("rank", -c["rank"] - 1)))
    trace("rows-rank-beyond-world", "ranks", lambda p: _commops(p, lambda c: c.__setitem__("rank", c["rank"] + 1000)))
    trace("rows-peer-out-of-range", "ranks", lambda p: _commops(p, lambda c: c.__setitem__("peer", np.full_like(c["peer"], 2**30))))
    trace("rows-end-before-start", "value-ranges", lambda p: _commops(p, lambda c: c.__setitem__("end_ns", c["start_ns"] - 5)))

    def times_negative(c: dict[str, Any]) -> None:
        c["start_ns"] = c["start_ns"] - 2**62
        c["end_ns"] = c["end_ns"] - 2**62
    trace("rows-times-negative", "value-ranges", lambda p: _commops(p, times_negative))
    trace("rows-unknown-op", "value-ranges", lambda p: _commops(p, lambda c: c.__setitem__("op", ["rm -rf"] * len(c["op"]))))

    def empty(c: dict[str, Any]) -> None:
        for k, v in list(c.items()):
            c[k] = v[:0]
    trace("rows-empty", "value-ranges", lambda p: _commops(p, empty))
    trace("rows-truncated-parquet", "formats", lambda p: (p / "commops.parquet").write_bytes(
        (p / "commops.parquet").read_bytes()[:5000]))

    def csv_strings(p: Path) -> None:
        (p / "commops.parquet").unlink()
        (p / "commops.csv").write_text("rank,group,op,seq,peer,nbytes,start_ns,end_ns,step\nx,y,z,1,2,3,4,5,6\n")
    trace("rows-csv-strings", "formats", csv_strings)
    trace("rows-flows-not-an-ip", "value-ranges", lambda p: (p / "flows.csv").write_text(
        "start_ns,end_ns,src_ip,dst_ip,src_port,dst_port,proto,qp,bytes,packets\n"
        "1760000000000000000,1760000000000001000,node-0,10.0.0.2,5000,4791,roce,17,4096,4\n"))
    trace("rows-commops-fifo", "fifo", _fifo("commops.parquet"))
    trace("meta-fifo", "fifo", _fifo("meta.json"))

    # logs/
    trace("logs-fifo", "fifo", lambda p: os.mkfifo(p / "logs" / "node-9.log"), logs=True)
    trace("logs-random-bytes", "log-text", lambda p: (p / "logs" / "node-1.log").write_bytes(
        np.random.default_rng(1).bytes(64 << 10)), logs=True)
    trace("logs-base64-text", "log-text", lambda p: (p / "logs" / "node-1.log").write_text("".join(
        base64.b64encode(np.random.default_rng(2).bytes(60)).decode() + "\n" for _ in range(1000))), logs=True)
    trace("logs-corrupt-gzip", "gzip", lambda p: (p / "logs" / "node-1.log.gz").write_bytes(b"\x1f\x8b\x08\x00junk"), logs=True)

    def bomb(p: Path) -> None:
        with gzip.GzipFile(p / "logs" / "node-3.log.gz", "wb", compresslevel=9) as fh:
            chunk = b"\n" * (1 << 20)
            for _ in range(bomb_bytes >> 20):
                fh.write(chunk)
        (p / "logs" / "node-3.log").unlink()
    trace("logs-gzip-bomb", "gzip", bomb, logs=True)

    # Flight Recorder dumps
    def fr(name: str, cls: str, files: dict[str, bytes], valid: bool = False) -> None:
        d = root / name
        d.mkdir()
        for fname, data in files.items():
            (d / fname).write_bytes(data)
        cases.append(Case(name, cls, "fr", d, ("import flight-recorder",), valid))

    fr("fr-ok", "control", {p.name: p.read_bytes() for p in sorted(FR_BASE.iterdir()) if p.is_file()}, valid=True)
    fr("fr-rank-5000000", "ranks", {"rank_5000000": json.dumps(_fr_dump([_fr_entry()])).encode()})
    fr("fr-rank-negative", "ranks", {"rank_-1": json.dumps(_fr_dump([_fr_entry()])).encode()})
    fr("fr-shared-refs", "pickle", {"rank_0": _shared_refs_pickle()})
    fr("fr-nested-pickle", "pickle", {"rank_0": _nested_pickle()})
    for hname, data in HOSTILE_PICKLES.items():
        fr(f"fr-hostile-{hname}", "pickle", {"rank_0": data})
    fr("fr-deep-json", "json-depth", {"rank_0.json": b"{\"entries\": " + b"[" * 100_000 + b"]" * 100_000 + b"}"})
    fr("fr-size-overflow", "value-ranges", {"rank_0": json.dumps(_fr_dump([_fr_entry(input_sizes=[[2**62, 2**62]])])).encode()})
    fr("fr-time-overflow", "value-ranges", {"rank_0": json.dumps(_fr_dump([_fr_entry(time_created_ns=2**70)])).encode()})
    fr("fr-duration-inf", "value-ranges", {"rank_0": json.dumps(_fr_dump([_fr_entry(duration_ms=1e400)])).encode()})
    fr("fr-group-ranks-huge", "ranks", {"rank_0": json.dumps(_fr_dump([_fr_entry()], {"0": {"ranks": "[0, 99999999]"}})).encode()})
    fr("fr-truncated-pickle", "pickle", {"rank_0": pickle.dumps(_fr_dump([_fr_entry()]))[:60]})
    fr("fr-binunicode-lie", "pickle", {"rank_0": b"\x80\x04X" + struct.pack("<I", 2**31) + b"abc."})
    d = root / "fr-fifo"
    d.mkdir()
    os.mkfifo(d / "rank_0")
    cases.append(Case("fr-fifo", "fifo", "fr", d / "rank_0", ("import flight-recorder",)))
    fr("fr-fifo-in-dir", "fifo", {"rank_0": json.dumps(_fr_dump([_fr_entry()])).encode()})
    os.mkfifo(root / "fr-fifo-in-dir" / "rank_1")

    # profiler (Kineto) traces
    def kineto(name: str, cls: str, doc: object, fname: str = "trace_rank0.json", valid: bool = False) -> None:
        d = root / name
        d.mkdir()
        (d / fname).write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
        cases.append(Case(name, cls, "kineto", d, ("import kineto",), valid))

    ok_doc = json.loads(next(KINETO_BASE.glob("*.json")).read_text())
    kineto("kineto-ok", "control", ok_doc, valid=True)
    ev = {"ph": "X", "name": "gloo:all_reduce", "ts": 1.0, "dur": 2.0, "args": {}}
    kineto("kineto-ts-infinity", "value-ranges", {"traceEvents": [dict(ev, ts=1e400)]})
    kineto("kineto-world-huge", "ranks", {"distributedInfo": {"rank": 0, "world_size": 10**9}, "traceEvents": [ev]})
    kineto("kineto-rank-in-name", "ranks", {"traceEvents": [ev]}, fname="trace_rank99999999999.json")
    kineto("kineto-host-option", "names", {"host_name": "--all", "traceEvents": [ev]})
    kineto("kineto-deep", "json-depth", "[" * 100_000 + "]" * 100_000)
    kineto("kineto-fifo-in-dir", "fifo", ok_doc)
    os.mkfifo(root / "kineto-fifo-in-dir" / "trace_rank1.json")
    kineto("kineto-nelems-inf", "value-ranges", {"traceEvents": [dict(ev, name="record_param_comms",
                                                                       args={"Collective name": "allreduce", "In msg nelems": 1e400})]})
    return cases
