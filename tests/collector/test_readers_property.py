"""Property-based tests of every reader (issue #14): whatever the bytes, a reader returns data or
raises the one-line user error (exit 2) — never another exception, never a hang, never code run."""

from __future__ import annotations

import contextlib
import gzip
import ipaddress
import json
import math
import pickle
import string
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from collector.importers.flight_recorder import _PLAIN, RestrictedUnpickler, load_dump
from collector.importers.kineto import import_kineto
from collector.inputs.errors import TraceError, UserError
from collector.inputs.names import gpu_problem, host_problem, nic_problem
from collector.inputs.safeio import json_depth
from collector.inputs.text import safe_text
from collector.logs import read_log
from collector.network.flows import ALIASES, pcap_to_flows, read_flow_records
from collector.trace.contract import commops_problems, flows_problems, ip_problem
from collector.trace.meta import JobMeta
from collector.trace.schema import COMMOPS_SCHEMA, FLOWS_SCHEMA

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                           HealthCheck.too_slow])

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                                st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                           max_leaves=24)


# ------------------------------------------------------------------ names

label = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?", fullmatch=True)


@given(st.lists(label, min_size=1, max_size=4))
def test_rfc1123_names_are_accepted(labels: list[str]) -> None:
    assert host_problem(".".join(labels)) is None


@given(st.lists(st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_-]{0,20}[A-Za-z0-9])?", fullmatch=True), min_size=1, max_size=4))
def test_underscores_inside_labels_are_accepted(labels: list[str]) -> None:
    assert host_problem(".".join(labels)) is None  # gpu_node_01: real clusters name hosts so


@pytest.mark.parametrize("name", ["gpu_node_01", "node_1.cluster.local", "a_b-c_d", "n0_1"])
def test_cluster_names_with_underscores_are_hosts(name: str) -> None:
    assert host_problem(name) is None


@pytest.mark.parametrize("name", ["node[0-999]", "root@evil.example", "--all", "node-1\nnode-2", "node-1\n",
                                  "-oProxyCommand=x", "node 1", "", "_node", "node_", "-node_1", "node_1 ",
                                  "node_1@x", "node_[1-2]", "node_1\n", "node_1..x", "._a", "a._"])
def test_hostile_names_stay_refused_with_underscores_allowed(name: str) -> None:
    assert host_problem(name) is not None


@given(st.text(max_size=30), st.sampled_from(["@", "[", "]", " ", "\n", "\t", "/", ";", "$", "`", "*", "\r",
                                              "\x00", "\x1b", ",", ":", "=", "'", '"', "\\", "(", "|", "&"]))
def test_names_with_shell_or_scheduler_syntax_are_refused(name: str, bad: str) -> None:
    assert host_problem(name + bad) is not None and host_problem(bad + name) is not None
    assert host_problem(name[:15] + bad + "x") is not None  # inside a name too


@given(st.text(alphabet=string.ascii_letters + string.digits + "-_.", max_size=20))
def test_underscores_never_open_or_close_a_label(name: str) -> None:
    labels = name.removesuffix(".").split(".")
    if any(lb.startswith(("_", "-")) or lb.endswith(("_", "-")) for lb in labels):
        assert host_problem(name) is not None


@given(st.text(max_size=20))
def test_option_like_names_are_refused(rest: str) -> None:
    assert host_problem("-" + rest) is not None and nic_problem("-" + rest) is not None


@given(st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=1, max_size=15))
def test_kernel_nic_names(name: str) -> None:
    ok = not name.startswith("-") and name not in (".", "..")
    assert (nic_problem(name) is None) == ok


@given(json_scalars)
def test_gpu_index_is_an_integer(v: object) -> None:
    ok = isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1023
    assert (gpu_problem(v) is None) == ok


# ------------------------------------------------------------------ meta.json

@FAST
@given(json_values)
def test_meta_from_any_json_is_a_meta_or_a_trace_error(raw: object) -> None:
    try:
        meta = JobMeta.from_dict(raw)  # type: ignore[arg-type]
    except TraceError:
        return
    assert meta.world_size >= 1 and all(0 <= r < meta.world_size for r in meta.ranks)


@FAST
@given(st.integers(min_value=-5, max_value=40), st.dictionaries(st.text(max_size=4), json_scalars, max_size=5),
       st.lists(json_scalars, max_size=5), json_values)
def test_meta_shaped_documents(world: int, rank0: dict, group: list, topo: object) -> None:
    raw = {"job": "j", "world_size": world, "ranks": {"0": {"host": "node-0", **rank0}}, "groups": {"g": group},
           "topology": {"node-0": topo}}
    try:
        meta = JobMeta.from_dict(raw)
    except TraceError:
        return
    assert all(0 <= m < meta.world_size for ms in meta.groups.values() for m in ms)
    assert isinstance(meta.ranks[0].gpu, int) and math.isfinite(meta.ranks[0].gpu)


# ------------------------------------------------------------------ Flight Recorder dumps

@FAST
@given(st.binary(max_size=400))
def test_any_bytes_as_a_dump(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    p = tmp_path_factory.mktemp("fr") / "rank_0"
    p.write_bytes(data)
    try:
        out = load_dump(p)
    except UserError:
        return
    assert isinstance(out, dict) and isinstance(out["entries"], list)


@FAST
@given(json_values)
def test_any_plain_object_pickled_as_a_dump(tmp_path_factory: pytest.TempPathFactory, obj: object) -> None:
    p = tmp_path_factory.mktemp("fr") / "rank_0"
    p.write_bytes(pickle.dumps({"version": "2", "entries": [obj]}))
    with contextlib.suppress(UserError):
        load_dump(p)


@FAST
@given(st.binary(max_size=200))
@example(b"]q\x00(h\x00h\x00e.")  # a list that holds itself twice
def test_the_unpickler_builds_only_plain_data(data: bytes) -> None:
    import io

    try:
        obj = RestrictedUnpickler(io.BytesIO(data)).load()
    except Exception:
        return
    stack, seen = [obj], set()
    while stack:  # each object once: a pickle's memo can make a list that holds itself
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        assert isinstance(o, _PLAIN), type(o)
        if isinstance(o, dict):
            stack += [*o.keys(), *o.values()]
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack += list(o)[:1000]


@given(st.integers(min_value=1, max_value=60))
def test_shared_references_are_walked_once(levels: int) -> None:
    import time

    a: list = []
    for _ in range(levels):
        a = [a, a]
    data = pickle.dumps({"version": "2", "entries": [], "x": a})
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "rank_0"
        p.write_bytes(data)
        t0 = time.perf_counter()
        load_dump(p)
        assert time.perf_counter() - t0 < 1.0  # 2**60 nodes as a tree; linear as a DAG


# ------------------------------------------------------------------ Kineto traces

@FAST
@given(json_values, st.lists(st.dictionaries(st.sampled_from(["ph", "name", "ts", "dur", "args"]), json_values, max_size=5),
                             max_size=4))
def test_any_profiler_document(tmp_path_factory: pytest.TempPathFactory, info: object, events: list) -> None:
    d = tmp_path_factory.mktemp("k")
    for e in events:
        e.setdefault("ph", "X")
        e.setdefault("name", "gloo:all_reduce")
    (d / "trace_rank0.json").write_text(json.dumps({"distributedInfo": info, "traceEvents": events}))
    try:
        meta = import_kineto(d, d / "out")
    except UserError:
        return
    assert meta.world_size >= 1


# ------------------------------------------------------------------ logs

@FAST
@given(st.binary(max_size=2000), st.booleans())
def test_any_bytes_as_a_log(tmp_path_factory: pytest.TempPathFactory, data: bytes, gz: bool) -> None:
    p = tmp_path_factory.mktemp("logs") / ("node-0.log.gz" if gz else "node-0.log")
    p.write_bytes(gzip.compress(data) if gz else data)
    try:
        out = read_log(p)
    except TraceError:
        return
    assert len(out) <= max(len(data), 1) and all(len(line) <= 64 << 10 for line in out.split(b"\n"))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=1, max_value=8))
def test_gzip_output_is_capped_before_it_is_held(monkeypatch_env: None, mib: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "node-0.log.gz"
        data = gzip.compress(b"a" * (mib << 20))
        p.write_bytes(data)
        with pytest.raises(TraceError, match="decompresses to"):  # the trailer gives it away
            read_log(p)
        p.write_bytes(data[:-4] + (100).to_bytes(4, "little"))  # a trailer that lies
        with pytest.raises(TraceError, match=r"decompresses to more than|incorrect length"):  # caught while streaming
            read_log(p)


@pytest.fixture
def monkeypatch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAGGARD_MAX_LOG_BYTES", str(512 << 10))


# ------------------------------------------------------------------ captures and flow records

PCAP_HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
PCAPNG_HEADER = b"\x0a\x0d\x0d\x0a" + struct.pack("<I", 28) + b"\x4d\x3c\x2b\x1a" + struct.pack("<HHqI", 1, 0, -1, 28)
UDP_PACKET = (bytes(12) + b"\x08\x00\x45\x00\x00\x30" + bytes(4) + b"\x40\x11" + bytes(2) + bytes([10, 0, 0, 1, 10, 0, 0, 2])
              + struct.pack(">HHHH", 5000, 4791, 28, 0))
records = st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 300),
                             st.binary(max_size=60)), max_size=6)


@FAST
@given(st.sampled_from([b"", PCAP_HEADER, PCAPNG_HEADER]), records, st.binary(max_size=64))
def test_any_capture(tmp_path_factory: pytest.TempPathFactory, head: bytes, recs: list[tuple], tail: bytes) -> None:
    body = b"".join(struct.pack("<IIII", ts, us, len(d), n) + d
                    for ts, us, n, extra in recs for d in [(UDP_PACKET + extra)[:n]])
    p = tmp_path_factory.mktemp("pcap") / "c.pcap"
    p.write_bytes(head + body + tail)
    try:
        out = pcap_to_flows(p)
    except UserError:
        return
    assert out.table.schema == FLOWS_SCHEMA


flow_cell = st.one_of(st.integers(-2**70, 2**70).map(str), st.floats(allow_nan=True).map(str),
                      st.sampled_from(["", "10.0.0.1", "::1", "x", "1e400", "-1", "2026-01-01T00:00:00Z", '"a,b"']))


@FAST
@given(st.lists(st.sampled_from([a for names in ALIASES.values() for a in names[:3]]), min_size=1, max_size=8,
                unique=True), st.lists(st.lists(flow_cell, min_size=8, max_size=8), max_size=5))
@example(["start_ns", "src_ip", "dst_ip", "bytes"], [["0", "", "", "1", "", "", "", ""]])  # no addresses
@example(["start_ns", "src_ip", "dst_ip", "bytes"], [["1e400", "10.0.0.1", "10.0.0.2", "1", "", "", "", ""]])
@example(["start_ns", "src_ip", "dst_ip", "bytes"], [["1", "10.0.0.1", "10.0.0.2", "1e400", "", "", "", ""]])
def test_any_flow_record_csv(tmp_path_factory: pytest.TempPathFactory, header: list[str], rows: list[list[str]]) -> None:
    p = tmp_path_factory.mktemp("csv") / "flows.csv"
    p.write_text(",".join(header) + "\n" + "".join(",".join(r[:len(header)]) + "\n" for r in rows))
    try:
        out = read_flow_records(p)
    except UserError:
        return
    assert out.schema == FLOWS_SCHEMA


# ------------------------------------------------------------------ row checks

int64 = st.integers(min_value=-2**63, max_value=2**63 - 1)
int32 = st.integers(min_value=-2**31, max_value=2**31 - 1)


@FAST
@given(st.lists(st.tuples(int32, int64, int32, int64, int64, int64, int32), min_size=0, max_size=30))
def test_commops_checks_never_raise(rows: list[tuple]) -> None:
    cols: list[Sequence[Any]] = list(zip(*rows, strict=True)) if rows else [[]] * 7
    t = pa.table({"rank": pa.array(cols[0], pa.int32()), "group": pa.array(["g"] * len(rows)),
                  "op": pa.array(["all_reduce"] * len(rows)), "seq": pa.array(cols[1], pa.int64()),
                  "peer": pa.array(cols[2], pa.int32()), "nbytes": pa.array(cols[3], pa.int64()),
                  "start_ns": pa.array(cols[4], pa.int64()), "end_ns": pa.array(cols[5], pa.int64()),
                  "step": pa.array(cols[6], pa.int32())}, schema=COMMOPS_SCHEMA)
    meta = JobMeta("j", 4, {r: __import__("collector.trace.meta").trace.meta.RankInfo("node-0", r) for r in range(4)})
    problems = commops_problems(t, meta, "x")
    if rows and not problems:  # accepted rows are inside every range analysis relies on
        a = t.to_pandas()
        assert a["rank"].between(0, 3).all() and (a["end_ns"] >= a["start_ns"]).all() and (a["step"] >= -1).all()


@FAST
@given(st.lists(st.tuples(int64, int64, int32, int32, int64), min_size=1, max_size=20))
def test_flow_checks_never_raise(rows: list[tuple]) -> None:
    c = list(zip(*rows, strict=True))
    n = len(rows)
    t = pa.table({"start_ns": pa.array(c[0], pa.int64()), "end_ns": pa.array(c[1], pa.int64()),
                  "src_ip": ["a"] * n, "dst_ip": ["b"] * n, "src_port": pa.array(c[2], pa.int32()),
                  "dst_port": pa.array(c[3], pa.int32()), "proto": ["tcp"] * n, "qp": pa.array([-1] * n, pa.int64()),
                  "bytes": pa.array(c[4], pa.int64()), "packets": pa.array([1] * n, pa.int64())}, schema=FLOWS_SCHEMA)
    flows_problems(t, "x")


def _is_ip(s: str) -> bool:
    try:
        ipaddress.ip_address(s)
    except ValueError:
        return False
    return "%" not in s  # a zone (fe80::1%eth0) names a link of the host that read it, not an address


@given(st.ip_addresses().flatmap(lambda a: st.sampled_from([str(a), a.exploded, str(a).upper()])))
def test_every_ip_address_is_accepted(address: str) -> None:
    assert ip_problem(pa.chunked_array([[address]]), "src_ip") is None


@given(st.text("0123456789abcdefABCDEF:.%g ", max_size=45))
@example("::ffff:1.2.3.4")
@example("1:2:3:4:5:6:1.2.3.4")
@example("1.2.3.04")
@example("10.0.0.1\n")
def test_the_address_check_agrees_with_ipaddress(s: str) -> None:
    assert (ip_problem(pa.chunked_array([[s]]), "src_ip") is None) == _is_ip(s)


# ------------------------------------------------------------------ JSON depth and terminal text

@given(json_values)
def test_json_depth_matches_a_recursive_count(v: object) -> None:
    def depth(o: object) -> int:
        if isinstance(o, dict):
            o = list(o.values())
        return 1 + max(map(depth, o), default=0) if isinstance(o, list) else 0

    assert json_depth(v, 1000) == depth(v)


@given(st.text())
def test_safe_text_leaves_no_control_character(s: str) -> None:
    out = safe_text(s)
    assert not any((ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f or c in "\u202e\u2066" for c in out)
    assume("\\" not in s)
    assert len(out) >= len(s)

