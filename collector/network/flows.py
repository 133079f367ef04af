"""Flow bursts (`flows.parquet`) from packet captures and from flow-exporter records.

A burst is a run of packets of one 5-tuple (and RoCEv2 destination QP) with no gap longer than
the burst gap. Packets are grouped by a 64-bit hash of their key (a stable sort keeps time order
inside a key) and split where the key changes or the gap is exceeded, so ingest is linear and
vectorized. Bursts of consecutive chunks are merged by the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from collector.inputs.errors import UserError
from collector.inputs.safeio import check_regular
from collector.network.pcap import PacketFields, ReadStats, format_ips, iter_packets
from collector.trace.contract import ip_problem
from collector.trace.schema import FLOW_PROTOS, FLOWS_SCHEMA, ROCE_UDP_PORT

#: default burst gap: longer than packet spacing inside a collective, shorter than compute phases
DEFAULT_GAP_NS = 1_000_000
KEY_COLUMNS = ("src_hi", "src_lo", "dst_hi", "dst_lo", "sport", "dport", "proto", "qp")


@dataclass
class Bursts:
    """Columnar bursts before address formatting: key columns plus start/end/bytes/packets."""

    cols: dict[str, np.ndarray]

    def __len__(self) -> int:
        return int(self.cols["start_ns"].size)

    @classmethod
    def from_packets(cls, p: PacketFields) -> Bursts:
        cols = {k: getattr(p, k) for k in KEY_COLUMNS}
        cols.update(start_ns=p.ts_ns, end_ns=p.ts_ns, bytes=p.wirelen.astype(np.int64),
                    packets=np.ones(len(p), dtype=np.int64))
        return cls(cols)

    @classmethod
    def concat(cls, parts: list[Bursts]) -> Bursts:
        if not parts:
            return cls.empty()
        return cls({k: np.concatenate([b.cols[k] for b in parts]) for k in parts[0].cols})

    @classmethod
    def empty(cls) -> Bursts:
        dt = {"sport": np.int32, "dport": np.int32, "proto": np.int8}
        cols = {k: np.zeros(0, dtype=dt.get(k, np.uint64 if k.endswith(("_hi", "_lo")) else np.int64)) for k in KEY_COLUMNS}
        cols.update({k: np.zeros(0, dtype=np.int64) for k in ("start_ns", "end_ns", "bytes", "packets")})
        return cls(cols)


def _key_hash(c: dict[str, np.ndarray]) -> np.ndarray:
    """A well-mixed 64-bit hash of the key columns (splitmix64 finalizer over four words)."""
    u = np.uint64
    with np.errstate(over="ignore"):
        ports = (c["sport"].astype(u) << u(48)) | (c["dport"].astype(u) << u(32)) \
            | (c["proto"].astype(u) << u(24)) | (c["qp"].astype(u) & u(0xFFFFFF))
        h = np.full(ports.size, 0x9E3779B97F4A7C15, dtype=u)
        for w in (c["src_hi"] ^ ((c["dst_hi"] << u(17)) | (c["dst_hi"] >> u(47))), c["src_lo"], c["dst_lo"], ports):
            h ^= w
            h *= u(0xBF58476D1CE4E5B9)
            h ^= h >> u(31)
            h *= u(0x94D049BB133111EB)
            h ^= h >> u(29)
    return h


def coalesce(b: Bursts, gap_ns: int) -> Bursts:
    """Merge intervals of one key whose gap is at most gap_ns (input in time order per key).

    Keys are compared by their 64-bit hash; a collision between two live keys in one capture
    is vanishingly unlikely (about k^2 / 2^65 for k distinct keys).
    """
    n = len(b)
    if n == 0:
        return b
    c = b.cols
    h = _key_hash(c)
    order = np.argsort(h, kind="stable")
    hs, st, en = h[order], c["start_ns"][order], c["end_ns"][order]
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(hs[1:], hs[:-1], out=new[1:])
    new[1:] |= (st[1:] - en[:-1]) > gap_ns
    starts = np.flatnonzero(new)
    first = order[starts]
    out = {k: c[k][first] for k in KEY_COLUMNS}
    out["start_ns"] = np.minimum.reduceat(st, starts)
    out["end_ns"] = np.maximum.reduceat(en, starts)
    out["bytes"] = np.add.reduceat(c["bytes"][order], starts)
    out["packets"] = np.add.reduceat(c["packets"][order], starts)
    return Bursts(out)


def bursts_table(b: Bursts) -> pa.Table:
    """Bursts -> a FLOWS_SCHEMA table, sorted by start time."""
    c = b.cols
    order = np.argsort(c["start_ns"], kind="stable")
    protos = np.asarray(FLOW_PROTOS, dtype=object)
    return pa.Table.from_pydict({
        "start_ns": c["start_ns"][order],
        "end_ns": c["end_ns"][order],
        "src_ip": format_ips(c["src_hi"][order], c["src_lo"][order]).astype(str),
        "dst_ip": format_ips(c["dst_hi"][order], c["dst_lo"][order]).astype(str),
        "src_port": c["sport"][order].astype(np.int32),
        "dst_port": c["dport"][order].astype(np.int32),
        "proto": protos[c["proto"][order].astype(np.int64)].astype(str) if len(b) else np.asarray([], dtype=str),
        "qp": c["qp"][order].astype(np.int64),
        "bytes": c["bytes"][order],
        "packets": c["packets"][order],
    }, schema=FLOWS_SCHEMA)


@dataclass
class CaptureFlows:
    """The result of ingesting a capture: bursts, counts, and warnings about damage."""

    table: pa.Table
    stats: ReadStats = field(default_factory=ReadStats)


def pcap_to_flows(path: Path, gap_ns: int = DEFAULT_GAP_NS) -> CaptureFlows:
    """Read a pcap/pcapng capture into flow bursts; a damaged file keeps what was readable.

    Raises UserError when nothing at all could be read; otherwise damage is reported as
    one-line warnings in `.stats.warnings`.
    """
    if gap_ns < 0:
        raise UserError(f"burst gap {gap_ns} ns is negative", "give a gap >= 0, e.g. 1ms")
    stats = ReadStats()
    parts = [coalesce(Bursts.from_packets(p), gap_ns) for p in iter_packets(Path(path), stats)]
    if stats.records == 0 and stats.warnings:
        raise UserError(f"{path}: no readable packets ({stats.warnings[0].split(': ', 1)[-1]})",
                        "the capture is damaged from the start; capture again")
    merged = coalesce(Bursts.concat(parts), gap_ns) if len(parts) > 1 else (parts[0] if parts else Bursts.empty())
    return CaptureFlows(bursts_table(merged), stats)


# ---- flow-exporter records (IPFIX / NetFlow / sFlow style CSV) ----

#: contract column -> accepted exporter names (IPFIX information elements, nfdump/sFlow short names)
ALIASES: dict[str, tuple[str, ...]] = {
    "start": ("start_ns", "flowStartNanoseconds", "flowStartMicroseconds", "flowStartMilliseconds",
              "flowStartSeconds", "ts", "first", "start", "start_time", "timestamp"),
    "end": ("end_ns", "flowEndNanoseconds", "flowEndMicroseconds", "flowEndMilliseconds",
            "flowEndSeconds", "te", "last", "end", "end_time"),
    "src_ip": ("src_ip", "sourceIPv4Address", "sourceIPv6Address", "sa", "srcip", "src_addr", "srcaddr", "src"),
    "dst_ip": ("dst_ip", "destinationIPv4Address", "destinationIPv6Address", "da", "dstip", "dst_addr", "dstaddr", "dst"),
    "src_port": ("src_port", "sourceTransportPort", "sp", "srcport", "sport"),
    "dst_port": ("dst_port", "destinationTransportPort", "dp", "dstport", "dport"),
    "proto": ("proto", "protocolIdentifier", "pr", "protocol", "ip_protocol"),
    "qp": ("qp", "destinationQueuePair", "dest_qp", "dqp", "roce_qp"),
    "bytes": ("bytes", "octetDeltaCount", "octetTotalCount", "ibyt", "in_bytes", "octets"),
    "packets": ("packets", "packetDeltaCount", "packetTotalCount", "ipkt", "in_pkts", "pkts"),
}
UNIT_NS = {"Nanoseconds": 1, "Microseconds": 1_000, "Milliseconds": 1_000_000, "Seconds": 1_000_000_000}


def _pick(df: pd.DataFrame, name: str) -> str | None:
    lower = {c.lower(): c for c in df.columns}
    for alias in ALIASES[name]:
        if alias.lower() in lower:
            return lower[alias.lower()]
    return None


def _times_ns(col: pd.Series, name: str, source: Path) -> np.ndarray:
    """Exporter time column -> ns since epoch: unit from the IPFIX name, else from the magnitude or ISO text."""
    if pd.api.types.is_numeric_dtype(col):
        if pd.api.types.is_float_dtype(col) and not np.isfinite(col.to_numpy(dtype=np.float64)).all():
            raise UserError(f"{source}: column '{name}' has empty or non-finite times", "export complete flow records")
        mul = next((m for unit, m in UNIT_NS.items() if str(name).endswith(unit)), 0)
        if not mul:
            mag = float(np.nanmedian(np.abs(col.to_numpy(dtype=np.float64)))) if len(col) else 0.0
            mul = 1 if mag > 1e17 else 1_000 if mag > 1e14 else 1_000_000 if mag > 1e11 else 1_000_000_000
        if np.abs(col.to_numpy(dtype=np.float64)).max(initial=0.0) * mul >= 2.0**63:
            raise UserError(f"{source}: column '{name}' has times past the year 2262", "use ns/us/ms/s since epoch")
        if pd.api.types.is_integer_dtype(col):  # exact: no float rounding of 19-digit times
            return col.to_numpy(dtype=np.int64) * mul
        return (col.to_numpy(dtype=np.float64) * mul).round().astype(np.int64)
    try:
        return pd.to_datetime(col, utc=True).dt.as_unit("ns").astype("int64").to_numpy()
    except (ValueError, TypeError) as exc:
        raise UserError(f"{source}: column '{name}' is not a time", "use ns/us/ms/s since epoch or ISO 8601") from exc


def read_flow_records(path: Path) -> pa.Table:
    """Flow-exporter CSV (one row per exported flow record) -> a FLOWS_SCHEMA table.

    Records are already aggregated by the exporter, so each becomes one burst; RoCEv2 is
    recognised by UDP destination port 4791.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such flow-record file", "pass a CSV exported by your flow collector")
    check_regular(path)  # a FIFO or device would block the reader
    try:
        df = pacsv.read_csv(path).to_pandas()
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"{path}: cannot be read as CSV ({str(exc).splitlines()[0]})", "export flow records as CSV with a header row") from exc
    cols = {k: _pick(df, k) for k in ALIASES}
    need = ("start", "src_ip", "dst_ip", "bytes")
    missing = [k for k in need if cols[k] is None]
    if missing:
        raise UserError(f"{path}: no column for {', '.join(missing)}",
                        "name columns like IPFIX (flowStartMilliseconds, sourceIPv4Address, ...) or start_ns, src_ip, dst_ip, bytes")
    for k in ("src_ip", "dst_ip"):
        if n := int(df[cols[k]].isna().sum()):
            raise UserError(f"{path}: {n} record(s) with no {cols[k]}", "export complete flow records (both addresses)")
    start = _times_ns(df[cols["start"]], str(cols["start"]), path)
    end = _times_ns(df[cols["end"]], str(cols["end"]), path) if cols["end"] else start
    sport = _ints(df, cols["src_port"], 0, path)
    dport = _ints(df, cols["dst_port"], 0, path)
    proto = _protos(df[cols["proto"]] if cols["proto"] else None, dport, len(df))
    qp = _ints(df, cols["qp"], -1, path).astype(np.int64)
    qp = np.where(proto == "roce", qp, -1)
    order = np.argsort(start, kind="stable")
    table = pa.Table.from_pydict({
        "start_ns": start, "end_ns": np.maximum(end, start),
        "src_ip": df[cols["src_ip"]].astype(str).to_numpy(), "dst_ip": df[cols["dst_ip"]].astype(str).to_numpy(),
        "src_port": sport.astype(np.int32), "dst_port": dport.astype(np.int32), "proto": proto, "qp": qp,
        "bytes": _ints(df, cols["bytes"], 0, path), "packets": _ints(df, cols["packets"], 1, path),
    }, schema=FLOWS_SCHEMA)
    for k in ("src_ip", "dst_ip"):
        if why := ip_problem(table.column(k), str(cols[k])):
            raise UserError(f"{path}: {why}", "export each record's addresses as IPv4 (10.0.0.1) or IPv6 (fd00::1)")
    return table.take(pa.array(order))


def _ints(df: pd.DataFrame, col: str | None, default: int, source: Path) -> np.ndarray:
    """A count or port column as int64 (unreadable cells take `default`); UserError past int64."""
    if col is None:
        return np.full(len(df), default, dtype=np.int64)
    vals = pd.to_numeric(df[col], errors="coerce").fillna(default)
    if pd.api.types.is_float_dtype(vals) and not (np.abs(vals.to_numpy()) < 2.0**63).all():
        raise UserError(f"{source}: column '{col}' has a value beyond a 64-bit integer", "export counts and ports as integers")
    return vals.to_numpy(dtype=np.int64)


def _protos(col: pd.Series | None, dport: np.ndarray, n: int) -> np.ndarray:
    """IANA numbers or names -> tcp/udp/roce (UDP to port 4791 is RoCEv2)."""
    if col is None:
        names = np.full(n, "udp", dtype=object)
    else:
        text = col.astype(str).str.strip().str.lower()
        names = text.replace({"6": "tcp", "17": "udp", "rocev2": "roce"}).to_numpy(dtype=object)
    names = np.where((names == "udp") & (dport == ROCE_UDP_PORT), "roce", names)
    return np.where(np.isin(names, FLOW_PROTOS), names, "udp").astype(str)


def write_flows_trace(out: Path, table: pa.Table, meta: dict | None, job: str) -> dict[str, int]:
    """Write flows.parquet and a meta.json: the given one, or one rank per endpoint seen.

    Without a meta.json each address stands for its own host (no topology): jobs and
    parallelism are still recognised, but candidates name addresses instead of hosts.
    """
    from collector.trace.meta import JobMeta
    from collector.trace.traceio import write_table

    ips = sorted(set(table.column("src_ip").to_pylist()) | set(table.column("dst_ip").to_pylist()))
    if meta is None:
        meta = {"job": job, "world_size": len(ips),
                "ranks": {str(i): {"host": ip, "gpu": 0, "ip": ip} for i, ip in enumerate(ips)}}
    JobMeta.from_dict(meta, "--meta").save(out / "meta.json")
    write_table(table, out / "flows.parquet", FLOWS_SCHEMA)
    return {"bursts": table.num_rows, "endpoints": len(ips)}
