"""Fast pcap/pcapng reader: walk record headers with speculative fixed strides, parse with numpy.

Captures taken with a snap length (tcpdump -s 128) are mostly runs of records of one size, so
the walker guesses that the next records have the current record's size and checks the guess
for many records at once; only records of varying size are walked one by one. Packet fields
(addresses, ports, RoCEv2 BTH opcode and destination QP) are then read column-wise from a
fixed-width matrix of the first bytes of every packet.
"""

from __future__ import annotations

import contextlib
import ipaddress
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from collector.inputs.errors import UserError
from collector.trace.schema import FLOW_PROTOS, ROCE_UDP_PORT

#: bytes kept per packet: link header (<= 22), IPv4 with options (<= 60) or IPv6 (40), L4 + BTH (20)
DATA_BYTES = 104
MAX_CAPLEN = 1 << 18
CHUNK_PACKETS = 1 << 20

PCAP_MAGIC = {  # magic as read little-endian -> (endianness, ns resolution)
    0xA1B2C3D4: ("<", False),
    0xD4C3B2A1: (">", False),
    0xA1B23C4D: ("<", True),
    0x4D3CB2A1: (">", True),
}
PCAPNG_SHB = 0x0A0D0D0A
LINK_NULL, LINK_ETHERNET, LINK_RAW, LINK_SLL, LINK_SLL2 = 0, 1, 101, 113, 276
RAW_LINKS = (LINK_RAW, 12, 14, 228, 229)
SUPPORTED_LINKS = (LINK_NULL, LINK_ETHERNET, LINK_SLL, LINK_SLL2, *RAW_LINKS)
TCP, UDP, ROCE = (FLOW_PROTOS.index(p) for p in ("tcp", "udp", "roce"))
V4_MAPPED = np.uint64(0xFFFF_0000_0000)


@dataclass
class RawChunk:
    """Up to CHUNK_PACKETS records: times, lengths, link type and the first DATA_BYTES bytes."""

    ts_ns: np.ndarray
    caplen: np.ndarray
    wirelen: np.ndarray
    linktype: np.ndarray
    data: np.ndarray  # [n, DATA_BYTES] uint8, zero-padded past caplen


@dataclass
class PacketFields:
    """Parsed IP packets (TCP/UDP only). Addresses are 128-bit (IPv4 v4-mapped) as two uint64."""

    ts_ns: np.ndarray
    wirelen: np.ndarray
    src_hi: np.ndarray
    src_lo: np.ndarray
    dst_hi: np.ndarray
    dst_lo: np.ndarray
    sport: np.ndarray
    dport: np.ndarray
    proto: np.ndarray  # index into FLOW_PROTOS
    qp: np.ndarray  # RoCEv2 destination QP, -1 otherwise
    opcode: np.ndarray  # RoCEv2 BTH opcode, -1 otherwise

    def __len__(self) -> int:
        return int(self.ts_ns.size)


@dataclass
class ReadStats:
    """What the reader saw; `warnings` are one-line notes about a damaged or odd capture."""

    records: int = 0
    parsed: int = 0
    skipped_non_ip: int = 0
    warnings: list[str] = field(default_factory=list)


def _u32(buf: np.ndarray, pos: np.ndarray, big: bool) -> np.ndarray:
    """Unaligned 32-bit reads at many byte positions."""
    b = buf[pos[:, None] + np.arange(4)].astype(np.uint32)
    if big:
        return (b[:, 0] << 24) | (b[:, 1] << 16) | (b[:, 2] << 8) | b[:, 3]
    return b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)


class _Walker:
    """Finds record offsets; speculates runs of equal-size records and checks them vectorized.

    pcap: the length field is the captured length and the header is 16 bytes. pcapng: the length
    field is the block length, and a run ends (without a warning) at a block that is not an
    enhanced packet block (`block_type`).
    """

    def __init__(self, buf: np.ndarray, big: bool, len_at: int, hdr: int, block_type: int | None, limit: int) -> None:
        self.buf, self.big, self.len_at, self.hdr, self.limit = buf, big, len_at, hdr, limit
        self.block_type = block_type
        self.mv = buf.data
        self.fmt = (">" if big else "<") + "II"
        self.pos = 0

    def stride(self, n: int) -> int:
        return n if self.block_type is not None else self.hdr + n

    def bad(self, n: int) -> bool:
        if self.block_type is not None:
            return n < self.hdr + 4 or n % 4 != 0 or n > self.limit
        return n > self.limit


def _walk(w: _Walker, start: int, end: int, stats: ReadStats, what: str) -> Iterator[np.ndarray]:
    """Yield sorted arrays of record offsets until the end, a truncated record or a corrupt header.

    Damage stops the walk with a one-line warning in stats; `w.pos` is where the walk stopped.
    """
    pos, streak, spec, last = start, 0, 0, -1
    out: list[np.ndarray] = []
    scalar: list[int] = []
    count = 0
    pcapng = w.block_type is not None
    while pos + w.hdr <= end:
        btype, n = struct.unpack_from(w.fmt, w.mv, pos + w.len_at - 4) if pcapng else (None, struct.unpack_from(w.fmt[0] + "I", w.mv, pos + w.len_at)[0])
        if pcapng and btype != w.block_type:
            break
        stride = w.stride(n)
        if w.bad(n):
            stats.warnings.append(f"{what}: corrupt record header at byte {pos} (length {n}); kept the {stats.records + count} records before it")
            break
        if pos + stride > end:
            stats.warnings.append(f"{what}: capture truncated at byte {pos} (record needs {stride} bytes, {end - pos} left); kept the {stats.records + count} complete records")
            break
        if spec:
            k = min(spec, (end - pos) // stride)
            cand = pos + stride * np.arange(k, dtype=np.int64)
            ok = _u32(w.buf, cand + w.len_at, w.big) == n
            if pcapng:
                ok &= _u32(w.buf, cand, w.big) == w.block_type
            m = k if bool(ok.all()) else int(np.argmin(ok))
            out.append(cand[:m])
            count += m
            pos += m * stride
            spec = min(spec * 4, 1 << 16) if m == k else 0
            streak = 0
        else:
            scalar.append(pos)
            count += 1
            pos += stride
            streak = streak + 1 if stride == last else 0
            last = stride
            if streak >= 8:
                spec = 16
            if len(scalar) >= 4096:
                out.append(np.asarray(scalar, dtype=np.int64))
                scalar = []
        if count >= CHUNK_PACKETS:
            if scalar:
                out.append(np.asarray(scalar, dtype=np.int64))
                scalar = []
            offs = np.sort(np.concatenate(out))
            stats.records += offs.size
            w.pos = pos
            yield offs
            out, count = [], 0
    if scalar:
        out.append(np.asarray(scalar, dtype=np.int64))
    w.pos = pos
    if out:
        offs = np.sort(np.concatenate(out))
        stats.records += offs.size
        yield offs
    if not pcapng and pos + w.hdr > end and pos != end:
        stats.warnings.append(f"{what}: capture truncated at byte {pos} ({end - pos} stray bytes at the end); kept the {stats.records} complete records")


def _gather(buf: np.ndarray, offs: np.ndarray, width: int) -> np.ndarray:
    """[n, width] matrix of the bytes at each offset (zero past the end of the buffer).

    Runs of equally spaced records (the common case) are copied through a strided view;
    the rest are gathered by fancy indexing.
    """
    n = offs.size
    out = np.zeros((n, width), dtype=np.uint8)
    if n == 0:
        return out
    d = np.diff(offs)
    # run starts: positions where the spacing to the next record changes
    change = np.flatnonzero(np.diff(d) != 0) + 1 if d.size > 1 else np.zeros(0, dtype=np.int64)
    bounds = np.concatenate([[0], change, [max(n - 1, 0)]])
    covered = np.zeros(n, dtype=bool)
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        if b - a < 64:
            continue
        stride = int(d[a])
        rows = b - a + 1  # records a..b are spaced by `stride`
        if int(offs[a + rows - 1]) + width > buf.size or stride < 1:
            rows -= 1
        view = np.lib.stride_tricks.as_strided(buf[int(offs[a]):], shape=(rows, width), strides=(stride, 1), writeable=False)
        out[a:a + rows] = view
        covered[a:a + rows] = True
    rest = np.flatnonzero(~covered)
    if rest.size:
        idx = offs[rest, None] + np.arange(width, dtype=np.int64)
        inside = idx < buf.size
        out[rest] = np.where(inside, buf[np.minimum(idx, buf.size - 1)], 0)
    return out


def _col(m: np.ndarray, at: int, n: int, big: bool) -> np.ndarray:
    """An n-byte (1, 2, 4 or 8) unsigned integer column of a byte matrix, as int64/uint64."""
    block = np.ascontiguousarray(m[:, at:at + n])
    out = block.view((">" if big else "<") + f"u{n}").reshape(-1)
    return out.astype(np.uint64 if n == 8 else np.int64)


def _rows(rec: np.ndarray, hdr: int, caplen: np.ndarray) -> np.ndarray:
    """The packet bytes of each record matrix row, zeroed past the captured length."""
    data = np.ascontiguousarray(rec[:, hdr:hdr + DATA_BYTES])
    short = np.flatnonzero(caplen < DATA_BYTES)
    if short.size:
        data[short] = np.where(np.arange(DATA_BYTES) < caplen[short, None], data[short], 0)
    return data


def open_capture(path: Path) -> tuple[np.ndarray, mmap.mmap | None]:
    if not path.exists():
        raise UserError(f"{path}: no such capture file", "pass a .pcap or .pcapng file (tcpdump -w / tshark -w)")
    if path.stat().st_size == 0:
        raise UserError(f"{path}: empty capture file", "capture again; the file has no header")
    with path.open("rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mm, dtype=np.uint8), mm


def iter_packets(path: Path, stats: ReadStats | None = None) -> Iterator[PacketFields]:
    """Parsed TCP/UDP/RoCEv2 packets of a pcap or pcapng file, chunk by chunk.

    Damage (a truncated or corrupt record) ends the walk with a one-line warning in stats.
    """
    stats = stats if stats is not None else ReadStats()
    path = Path(path)
    buf, mm = open_capture(path)
    try:
        if buf.size < 4:
            raise UserError(f"{path}: too short to be a capture ({buf.size} bytes)", "pass a complete .pcap or .pcapng file")
        magic = int.from_bytes(bytes(buf[:4]), "little")
        if magic in PCAP_MAGIC:
            yield from _iter_pcap(path, buf, stats)
        elif magic == PCAPNG_SHB:
            yield from _iter_pcapng(path, buf, stats)
        else:
            raise UserError(f"{path}: not a pcap or pcapng file (magic 0x{magic:08x})", "write captures with tcpdump -w or tshark -w")
    finally:
        del buf
        if mm is not None:
            with contextlib.suppress(BufferError):  # a view still referenced (a traceback): freed with it
                mm.close()


def _iter_pcap(path: Path, buf: np.ndarray, stats: ReadStats) -> Iterator[PacketFields]:
    if buf.size < 24:
        raise UserError(f"{path}: pcap header truncated ({buf.size} of 24 bytes)", "capture again; the file is cut short")
    endian, nsec = PCAP_MAGIC[int.from_bytes(bytes(buf[:4]), "little")]
    snaplen, network = struct.unpack_from(endian + "II", buf.data, 16)
    link = network & 0x0FFFFFFF
    if link not in SUPPORTED_LINKS:
        raise UserError(f"{path}: unsupported link type {link}", "capture on an Ethernet, cooked (any) or raw-IP interface")
    big = endian == ">"
    walker = _Walker(buf, big, 8, 16, None, max(int(snaplen), MAX_CAPLEN))
    for offs in _walk(walker, 24, buf.size, stats, str(path)):
        parts: list[PacketFields] = []
        rest = np.ones(offs.size, dtype=bool)
        for a, rows, stride in _runs(offs):
            got = _fast_run(buf, int(offs[a]), stride, rows, link, endian, nsec)
            if got is not None:
                fields, ok = got
                parts.append(fields)
                rest[a:a + rows] = ~ok
                stats.parsed += len(fields)
        slow = offs[rest]
        if slow.size:
            rec = _gather(buf, slow, 16 + DATA_BYTES)
            caplen = _col(rec, 8, 4, big)
            wirelen = _col(rec, 12, 4, big)
            frac = _col(rec, 4, 4, big)
            ts = _col(rec, 0, 4, big) * 1_000_000_000 + (frac if nsec else frac * 1000)
            parts.append(parse(RawChunk(ts, caplen, np.maximum(wirelen, caplen), np.full(slow.size, link, np.int32),
                                        _rows(rec, 16, caplen)), stats))
        yield _time_ordered(parts)


def _runs(offs: np.ndarray, min_rows: int = 64) -> list[tuple[int, int, int]]:
    """(first index, rows, stride) of runs of at least min_rows equally spaced records."""
    if offs.size < min_rows:
        return []
    d = np.diff(offs)
    change = np.flatnonzero(np.diff(d) != 0) + 1
    bounds = np.concatenate([[0], change, [d.size]])
    out = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        if b - a + 1 >= min_rows:  # diffs a..b-1 equal: records a..b
            out.append((a, b - a + 1, int(d[a])))
    # neighbouring runs share their boundary record; give it to the earlier run only
    fixed = []
    last_end = -1
    for a, rows, stride in out:
        if a <= last_end:
            rows -= last_end - a + 1
            a = last_end + 1
        if rows > 0:
            fixed.append((a, rows, stride))
            last_end = a + rows - 1
    return fixed


def _layout(buf: np.ndarray, rec: int, link: int) -> tuple[list[tuple[int, str, int]], int, int, int] | None:
    """Fixed layout of the IPv4 TCP/UDP packet at record `rec` (pcap): checks, l3, l4, ip proto."""
    d = rec + 16
    checks: list[tuple[int, str, int]] = []
    if link == LINK_ETHERNET:
        l3, et_at = 14, 12
        et = int.from_bytes(bytes(buf[d + 12:d + 14]), "big")
        while et in (0x8100, 0x88A8) and l3 < 22:
            checks.append((et_at, ">u2", et))
            et_at, l3 = l3 + 2, l3 + 4
            et = int.from_bytes(bytes(buf[d + et_at:d + et_at + 2]), "big")
        checks.append((et_at, ">u2", et))
        if et != 0x0800:
            return None
    elif link in (LINK_SLL, LINK_SLL2):
        et_at, l3 = (14, 16) if link == LINK_SLL else (0, 20)
        if int.from_bytes(bytes(buf[d + et_at:d + et_at + 2]), "big") != 0x0800:
            return None
        checks.append((et_at, ">u2", 0x0800))
    else:
        l3 = 4 if link == LINK_NULL else 0
    vi, proto = int(buf[d + l3]), int(buf[d + l3 + 9])
    if vi >> 4 != 4 or proto not in (6, 17):
        return None
    checks += [(l3, "u1", vi), (l3 + 9, "u1", proto)]
    return checks, l3, l3 + (vi & 15) * 4, proto


def _fast_run(buf: np.ndarray, start: int, stride: int, rows: int, link: int, endian: str,
              nsec: bool) -> tuple[PacketFields, np.ndarray] | None:
    """Fields of a run of equal-size pcap records read through a structured view of the file.

    The layout is taken from the run's first packet and checked on every row; rows that differ
    are returned as not ok and parsed the general way.
    """
    if link == LINK_NULL:
        return None
    lay = _layout(buf, start, link)
    if lay is None:
        return None
    checks, l3, l4, proto = lay
    caplen = stride - 16
    need = l4 + (20 if proto == 17 else 4)
    if need > caplen:
        return None
    names = ["sec", "frac", "caplen", "wirelen", "src", "dst", "sport", "dport"]
    formats = [endian + "u4"] * 4 + [">u4", ">u4", ">u2", ">u2"]
    offsets = [0, 4, 8, 12, 16 + l3 + 12, 16 + l3 + 16, 16 + l4, 16 + l4 + 2]
    for i, (at, fmt, _) in enumerate(checks):
        names.append(f"c{i}")
        formats.append(fmt)
        offsets.append(16 + at)
    if proto == 17:
        names += ["opcode", "qpw"]
        formats += ["u1", ">u4"]
        offsets += [16 + l4 + 8, 16 + l4 + 12]
    dt = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": stride})
    view = np.ndarray(shape=(rows,), dtype=dt, buffer=buf, offset=start)
    ok = view["caplen"] == caplen
    for i, (_, _, want) in enumerate(checks):
        ok &= view[f"c{i}"] == want
    idx = None if bool(ok.all()) else np.flatnonzero(ok)
    v = view if idx is None else view[idx]
    n = v.shape[0]
    frac = v["frac"].astype(np.int64)
    ts = v["sec"].astype(np.int64) * 1_000_000_000 + (frac if nsec else frac * 1000)
    dport = v["dport"].astype(np.int32)
    zeros = np.zeros(n, dtype=np.uint64)
    if proto == 17:
        roce = dport == ROCE_UDP_PORT
        qp = np.where(roce, (v["qpw"] & 0xFFFFFF).astype(np.int64), -1)
        opcode = np.where(roce, v["opcode"].astype(np.int16), -1).astype(np.int16)
        kind = np.where(roce, ROCE, UDP).astype(np.int8)
    else:
        qp = np.full(n, -1, dtype=np.int64)
        opcode = np.full(n, -1, dtype=np.int16)
        kind = np.full(n, TCP, dtype=np.int8)
    fields = PacketFields(ts, np.maximum(v["wirelen"].astype(np.int64), caplen), zeros, V4_MAPPED | v["src"].astype(np.uint64),
                          zeros, V4_MAPPED | v["dst"].astype(np.uint64), v["sport"].astype(np.int32), dport,
                          kind, qp, opcode)
    return fields, ok


def _time_ordered(parts: list[PacketFields]) -> PacketFields:
    """Concatenate parsed packets and restore capture time order when parts interleave."""
    if len(parts) == 1:
        return parts[0]
    cat = PacketFields(*(np.concatenate([getattr(p, f) for p in parts]) for f in PacketFields.__dataclass_fields__))
    if cat.ts_ns.size > 1 and bool((np.diff(cat.ts_ns) < 0).any()):
        order = np.argsort(cat.ts_ns, kind="stable")
        cat = PacketFields(*(getattr(cat, f)[order] for f in PacketFields.__dataclass_fields__))
    return cat


def _iter_pcapng(path: Path, buf: np.ndarray, stats: ReadStats) -> Iterator[PacketFields]:
    """Sections and interface blocks are walked by hand; runs of packet blocks go to _walk."""
    pos, end = 0, buf.size
    endian = "<"
    links: list[int] = []
    res: list[tuple[int, int]] = []  # per interface: (multiplier to ns, divisor)
    while pos + 12 <= end:
        btype, blen = struct.unpack_from(endian + "II", buf.data, pos)
        if btype == PCAPNG_SHB:
            bom = bytes(buf[pos + 8:pos + 12])
            endian = "<" if bom == b"\x4d\x3c\x2b\x1a" else ">" if bom == b"\x1a\x2b\x3c\x4d" else ""
            if not endian:
                raise UserError(f"{path}: corrupt pcapng section header at byte {pos}", "capture again")
            (blen,) = struct.unpack_from(endian + "I", buf.data, pos + 4)
            links, res = [], []
        if blen < 12 or blen % 4 or blen > MAX_CAPLEN + 64:
            stats.warnings.append(f"{path}: corrupt pcapng block at byte {pos} (length {blen}); kept the {stats.records} records before it")
            return
        if pos + blen > end:
            stats.warnings.append(f"{path}: capture truncated at byte {pos} (block needs {blen} bytes, {end - pos} left); kept the {stats.records} complete records")
            return
        if btype == 1:  # interface description
            link = struct.unpack_from(endian + "H", buf.data, pos + 8)[0]
            links.append(link)
            res.append(_tsresol(buf, pos + 16, pos + blen - 4, endian))
            pos += blen
        elif btype == 6:  # enhanced packet blocks: a run, until another block type appears
            big = endian == ">"
            walker = _Walker(buf, big, 4, 28, 6, MAX_CAPLEN + 64)
            nwarn = len(stats.warnings)
            for offs in _walk(walker, pos, end, stats, str(path)):
                rec = _gather(buf, offs, 28 + DATA_BYTES)
                iface = _col(rec, 8, 4, big)
                if iface.size and int(iface.max()) >= len(links):
                    stats.warnings.append(f"{path}: packet block names interface {int(iface.max())} that was never described; skipped the rest")
                    return
                raw_ts = (_col(rec, 12, 4, big).astype(np.uint64) << np.uint64(32)) | _col(rec, 16, 4, big).astype(np.uint64)
                mul = np.asarray([m for m, _ in res], dtype=np.uint64)[iface]
                div = np.asarray([d for _, d in res], dtype=np.uint64)[iface]
                ts = (raw_ts * mul // div).astype(np.int64)
                caplen = _col(rec, 20, 4, big)
                wirelen = _col(rec, 24, 4, big)
                yield parse(RawChunk(ts, caplen, np.maximum(wirelen, caplen),
                                     np.asarray(links, dtype=np.int32)[iface], _rows(rec, 28, caplen)), stats)
            if len(stats.warnings) > nwarn:
                return
            pos = walker.pos
        else:
            pos += blen
    if pos != end:
        stats.warnings.append(f"{path}: capture truncated at byte {pos} ({end - pos} stray bytes at the end); kept the {stats.records} complete records")


def _tsresol(buf: np.ndarray, pos: int, end: int, endian: str) -> tuple[int, int]:
    """if_tsresol option of an interface block -> (multiplier, divisor) to nanoseconds."""
    while pos + 4 <= end:
        code, length = struct.unpack_from(endian + "HH", buf.data, pos)
        if code == 0:
            break
        if code == 9 and length >= 1:
            v = int(buf[pos + 4])
            if v & 0x80:
                return 1_000_000_000, 1 << (v & 0x7F)
            exp = v & 0x7F
            return (10 ** (9 - exp), 1) if exp <= 9 else (1, 10 ** (exp - 9))
        pos += 4 + ((length + 3) & ~3)
    return 1000, 1  # default: microseconds


def _be(data: np.ndarray, off: np.ndarray, n: int) -> np.ndarray:
    """Big-endian unsigned integer of n bytes at a per-row column offset (a slice when constant)."""
    if off.size and int(off.min()) == int(off.max()):
        at = int(off[0])
        if n in (1, 2, 4, 8) and at + n <= DATA_BYTES:
            return _col(data, at, n, True).astype(np.uint64)
        cols = data[:, at:at + n].astype(np.uint64)
    else:
        idx = np.minimum(off[:, None] + np.arange(n), DATA_BYTES - 1)
        cols = np.take_along_axis(data, idx, axis=1).astype(np.uint64)
    out = np.zeros(data.shape[0], dtype=np.uint64)
    for i in range(cols.shape[1]):
        out = (out << np.uint64(8)) | cols[:, i]
    return out


def parse(chunk: RawChunk, stats: ReadStats) -> PacketFields:
    """IPv4/IPv6 TCP and UDP packets of a chunk, RoCEv2 (UDP 4791) with BTH opcode and dest QP."""
    d, link, caplen = chunk.data, chunk.linktype, chunk.caplen
    n = d.shape[0]
    et = np.zeros(n, dtype=np.uint64)
    l3 = np.zeros(n, dtype=np.int64)
    eth = link == LINK_ETHERNET
    if eth.any():
        e = _be(d, np.full(n, 12), 2)
        l3e = np.full(n, 14)
        for _ in range(2):  # up to two VLAN tags (802.1Q / 802.1ad)
            tagged = (e == 0x8100) | (e == 0x88A8)
            e = np.where(tagged, _be(d, l3e + 2, 2), e)
            l3e = np.where(tagged, l3e + 4, l3e)
        et, l3 = np.where(eth, e, et), np.where(eth, l3e, l3)
    for lt, et_at, l3_at in ((LINK_SLL, 14, 16), (LINK_SLL2, 0, 20)):
        m = link == lt
        if m.any():
            et = np.where(m, _be(d, np.full(n, et_at), 2), et)
            l3[m] = l3_at
    raw = np.isin(link, RAW_LINKS) | (link == LINK_NULL)
    if raw.any():
        off = np.where(link == LINK_NULL, 4, 0)
        ver = _be(d, off, 1) >> np.uint64(4)
        et = np.where(raw, np.where(ver == 4, 0x0800, np.where(ver == 6, 0x86DD, 0)), et)
        l3 = np.where(raw, off, l3)
    first = _be(d, l3, 1)
    v4 = (et == 0x0800) & ((first >> np.uint64(4)) == 4) & (caplen >= l3 + 20)
    v6 = (et == 0x86DD) & ((first >> np.uint64(4)) == 6) & (caplen >= l3 + 40)
    ihl = (first & np.uint64(15)).astype(np.int64) * 4
    ipproto = np.where(v4, _be(d, l3 + 9, 1), _be(d, l3 + 6, 1))
    l4 = l3 + np.where(v4, ihl, 40)
    keep = (v4 | v6) & ((ipproto == 6) | (ipproto == 17)) & (caplen >= l4 + 4) & (l4 + 4 <= DATA_BYTES)
    stats.skipped_non_ip += int(n - keep.sum())
    idx = np.flatnonzero(keep)
    d, l3, l4, v4 = d[idx], l3[idx], l4[idx], v4[idx]
    ipproto, caplen = ipproto[idx], caplen[idx]
    src4, dst4 = _be(d, l3 + 12, 4), _be(d, l3 + 16, 4)
    src_hi = np.where(v4, np.uint64(0), _be(d, l3 + 8, 8))
    src_lo = np.where(v4, V4_MAPPED | src4, _be(d, l3 + 16, 8))
    dst_hi = np.where(v4, np.uint64(0), _be(d, l3 + 24, 8))
    dst_lo = np.where(v4, V4_MAPPED | dst4, _be(d, l3 + 32, 8))
    sport = _be(d, l4, 2).astype(np.int32)
    dport = _be(d, l4 + 2, 2).astype(np.int32)
    roce = (ipproto == 17) & (dport == ROCE_UDP_PORT) & (caplen >= l4 + 20) & (l4 + 20 <= DATA_BYTES)
    proto = np.where(ipproto == 6, TCP, np.where(roce, ROCE, UDP)).astype(np.int8)
    qp = np.where(roce, _be(d, l4 + 13, 3).astype(np.int64), -1)
    opcode = np.where(roce, _be(d, l4 + 8, 1).astype(np.int16), -1).astype(np.int16)
    stats.parsed += int(idx.size)
    return PacketFields(chunk.ts_ns[idx], chunk.wirelen[idx], src_hi, src_lo, dst_hi, dst_lo,
                        sport, dport, proto, qp, opcode)


def format_ips(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """128-bit addresses -> strings (dotted quad for v4-mapped), formatting each distinct value once."""
    pairs = np.stack([hi, lo], axis=1) if hi.size else np.zeros((0, 2), dtype=np.uint64)
    uniq, inv = np.unique(pairs, axis=0, return_inverse=True)
    names = []
    for h, low in uniq.tolist():
        if h == 0 and (low >> 32) == 0xFFFF:
            names.append(str(ipaddress.IPv4Address(low & 0xFFFFFFFF)))
        else:
            names.append(str(ipaddress.IPv6Address((h << 64) | low)))
    return np.asarray(names, dtype=object)[inv.reshape(-1)] if names else np.asarray([], dtype=object)


def write_pcap(path: Path, ts_ns: np.ndarray, frames: list[bytes] | np.ndarray, wirelen: np.ndarray | None = None,
               linktype: int = LINK_ETHERNET, snaplen: int = 65535) -> None:
    """Write a nanosecond pcap. `frames` is a list of bytes or a [n, k] uint8 matrix of equal-size frames."""
    n = int(ts_ns.size)
    if isinstance(frames, np.ndarray):
        body = frames.astype(np.uint8).reshape(n, -1)
        caplens = np.full(n, body.shape[1], dtype=np.int64)
    else:
        caplens = np.asarray([len(f) for f in frames], dtype=np.int64)
    wl = caplens if wirelen is None else np.maximum(np.asarray(wirelen, dtype=np.int64), caplens)
    hdr = np.zeros((n, 4), dtype="<u4")
    hdr[:, 0] = ts_ns // 1_000_000_000
    hdr[:, 1] = ts_ns % 1_000_000_000
    hdr[:, 2] = caplens
    hdr[:, 3] = wl
    with Path(path).open("wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, snaplen, linktype))
        if isinstance(frames, np.ndarray):
            rec = np.concatenate([hdr.view(np.uint8).reshape(n, 16), body], axis=1)
            fh.write(rec.tobytes())
        else:
            hb = hdr.view(np.uint8).reshape(n, 16)
            fh.write(b"".join(hb[i].tobytes() + f for i, f in enumerate(frames)))
