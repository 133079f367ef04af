"""Per-host training logs -> structured events (Drain3 templates) at hundreds of thousands of lines/s.

Raw lines are nearly all unique (timestamps, pids, losses), but their *shapes* are few. So every
digit is first folded to '0' over the whole file at C speed, lines are factorized by that key, and
only each new key is masked (IPs, hex ids, paths, numbers -> <IP>, <HEX>, <PATH>, <NUM>) and, if
its masked shape is new too, fed to Drain3. Repeated lines cost a hash lookup.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from drain3.drain import Drain

from collector.inputs.errors import TraceError
from collector.inputs.limits import ENV, limits
from collector.inputs.safeio import check_log_file, gunzip_bounded, read_regular

_FOLD = bytes.maketrans(b"123456789", b"000000000")
#: masks applied to each new digit-folded line, in order (IPs before numbers, paths before words)
MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\d+\.\d+\.\d+\.\d+(?::\d+)?"), "<IP>"),
    (re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?\b"
                r"|\b(?=[a-fA-F]*\d)(?=\d*[a-fA-F])[0-9a-fA-F]{6,}\b"), "<HEX>"),
    (re.compile(r"/[\w.\-]+(?:/[\w.\-]+)+"), "<PATH>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<NUM>"),
)
#: a framework progress line ("iteration 12/ 100", "step: 12", "step=12,"): it carries the iteration
PROGRESS_SHAPE = re.compile(r"(?i)\b(?:iteration|iter|steps?)\s*[:=]?\s*<NUM>")
NOT_PROGRESS = re.compile(r"(?i)checkpoint|saving|loading|loaded|skipping|timeout|watchdog|error|fail")
_PROGRESS_NUMBER = r"(?i)\b(?:iteration|iter|steps?)\s*[:=]?\s*(?P<it>\d+)"
#: a line's shape (its event) is mined from its first 2 KiB: what an event says is at its start, and
#: masking, Drain and the stage and progress rules cost in proportion to a shape's length (a log of
#: 60 KiB state dumps ran ~20x slower per byte than a normal log). The raw line is kept whole.
SHAPE_BYTES = 2048


def mask(line: str) -> str:
    """The shape of one line: variable parts replaced by typed placeholders."""
    for rx, token in MASKS:
        line = rx.sub(token, line)
    return line


class TemplateCache:
    """Drain3 behind two caches (folded line -> shape -> cluster), reusable across files and jobs."""

    def __init__(self, sim_th: float = 0.7, depth: int = 4) -> None:
        self.drain = Drain(depth=depth, sim_th=sim_th, parametrize_numeric_tokens=False)
        self._key_shape: dict[bytes, int] = {}
        self.shapes: list[str] = []
        self._shape_index: dict[str, int] = {}
        self.shape_cluster: list[int] = []

    def shape_ids(self, keys: Sequence[bytes]) -> np.ndarray:
        """Shape index of each distinct folded line; only unseen shapes reach Drain."""
        out = np.empty(len(keys), dtype=np.int32)
        for i, key in enumerate(keys):
            sid = self._key_shape.get(key)
            if sid is None:
                shape = mask(key[:SHAPE_BYTES].decode("utf-8", "replace")).strip()
                sid = self._shape_index.get(shape)
                if sid is None:
                    sid = len(self.shapes)
                    self.shapes.append(shape)
                    self._shape_index[shape] = sid
                    cluster, _ = self.drain.add_log_message(shape or "<EMPTY>")
                    self.shape_cluster.append(cluster.cluster_id)
                self._key_shape[key] = sid
            out[i] = sid
        return out

    def template(self, cluster_id: int) -> str:
        return str(self.drain.id_to_cluster[cluster_id].get_template())


@dataclass
class ParsedLogs:
    """Every line of a job's logs as an event, grouped by the node it came from (hosts one after
    another, each in file order). A per-host file's lines are its host's; a file that is not named
    after a node (an aggregated Slurm output, a cluster's event log) gives each line to the node the
    line names (its hostname, or its rank's host), else to the node of the line before it."""

    files: list[str]  # as cited in evidence: logs/node-3.log
    hosts: list[str]
    host: np.ndarray  # int32 [lines] index into hosts
    line: np.ndarray  # int32 [lines] 1-based line number in its file
    shape: np.ndarray  # int32 [lines] index into shapes
    shapes: list[str]  # masked lines
    shape_event: np.ndarray  # int32 [shapes] index into templates
    templates: list[str]  # Drain templates (final, after all lines were seen)
    iteration: np.ndarray  # int32 [lines] last iteration number printed on the host so far, -1 before any
    progress: np.ndarray  # bool [lines] the line is a framework progress line
    raw: list[list[bytes]] = field(repr=False, default_factory=list)  # per file, its lines
    file: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))  # int32 [lines] index into files
    nodes: np.ndarray = field(default_factory=lambda: np.empty(0, bool))  # bool [hosts]: a node of the job

    @property
    def event(self) -> np.ndarray:
        return self.shape_event[self.shape]

    def __len__(self) -> int:
        return int(self.host.size)

    def raw_line(self, i: int) -> bytes:
        return self.raw[int(self.file[i])][int(self.line[i]) - 1]

    def text(self, i: int) -> str:
        return self.raw_line(i).decode("utf-8", "replace")

    def where(self, i: int) -> str:
        return f"{self.files[int(self.file[i])]}:{int(self.line[i])}"


def read_log(path: Path) -> bytes:
    """A log file's bytes, gunzipped when it is gzip (by magic), within the budget.

    Regular files only (a FIFO would block), decompressed size capped before it is held (a gzip
    bomb), binary data refused (random bytes are not a log to find failures in), and lines longer
    than the line cap cut to it (so no single line can stall template mining).
    """
    lim = limits()
    check_log_file(path)
    data = read_regular(path, lim.log_bytes, "log_bytes")
    if data[:2] == b"\x1f\x8b":
        data = gunzip_bounded(data, min(lim.log_bytes, lim.gzip_ratio * len(data)), path)
    if data.count(b"\n") > lim.log_lines:
        raise TraceError(f"{path}: more than {lim.log_lines} lines",
                         f"raise {ENV['log_lines']} if the log is genuine, or cut it to the window of interest")
    bad = binary_share(data[:TEXT_PROBE])
    if bad > MAX_BINARY_SHARE:
        raise TraceError(f"{path}: not a text log ({bad:.0%} of its first bytes are not text)",
                         "put the job's text logs under logs/<host>.log (plain or .gz); remove binary files")
    blobs = blob_share(data[:TEXT_PROBE])
    if blobs > MAX_BLOB_SHARE:
        raise TraceError(f"{path}: not a log ({blobs:.0%} of its first lines are encoded data: one long token of "
                         "base64 or hex, no words)", "put the job's text logs under logs/<host>.log; remove data files")
    return _cut_long_lines(data, lim.line_bytes)


def _cut_long_lines(data: bytes, cap: int) -> bytes:
    """Lines over `cap` bytes are cut to `cap` (a Python loop only when such a line exists)."""
    pos, n = 0, len(data)
    while n - pos > cap:  # each window of cap+1 bytes must hold a newline; jumps ~cap bytes a step
        nl = data.rfind(b"\n", pos, pos + cap + 1)
        if nl < 0:
            break
        pos = nl + 1
    else:
        return data
    return b"\n".join(line[:cap] for line in data.split(b"\n"))


#: how much of a log is sniffed for binary content, and the share of non-text bytes that makes it binary
TEXT_PROBE = 1 << 16
MAX_BINARY_SHARE = 0.05
_TEXT_BYTES = bytes(range(32, 127)) + b"\t\n\r\x0c\x1b"
_HIGH = bytes(range(128, 256))


#: a line of only base64 or hex characters and at least BLOB_CHARS of them is encoded data, not an event;
#: a file whose first lines are mostly such is no log (JSON lines have braces and quotes, text has spaces)
BLOB_CHARS = 32
MAX_BLOB_SHARE = 0.5
_BLOB = re.compile(rb"[A-Za-z0-9+/=_-]{%d,}" % BLOB_CHARS)


def blob_share(data: bytes) -> float:
    """Share of the non-empty lines of `data` that are one token of base64 or hex and nothing else:
    random printable text mined as a log makes every line an unknown, "failure-indicating" event."""
    lines = [ln.strip() for ln in data.split(b"\n")[:-1] or data.split(b"\n")]
    lines = [ln for ln in lines if ln]
    if not lines:
        return 0.0
    return sum(1 for ln in lines if _BLOB.fullmatch(ln)) / len(lines)


def binary_share(data: bytes) -> float:
    """Share of bytes that are neither printable ASCII, whitespace nor part of valid UTF-8 text.

    Real logs are ASCII or UTF-8 with the odd ANSI colour; random bytes are ~60% non-text (and
    invalid UTF-8), so a low threshold separates them without judging the content.
    """
    if not data:
        return 0.0
    text = data.decode("utf-8", "replace")
    if text.count("\ufffd") > len(data) * MAX_BINARY_SHARE:  # invalid UTF-8 sequences
        return text.count("\ufffd") / len(data)
    # what is left after deleting text bytes and the high bytes of valid UTF-8 is control bytes
    return len(data.translate(None, _TEXT_BYTES + _HIGH)) / len(data)


def host_of_file(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".log"):
        name = name.removesuffix(suffix)
    return name


def parse_logs(paths: Sequence[Path], cache: TemplateCache | None = None, root: Path | None = None,
               nodes: Sequence[str] | None = None, rank_host: dict[int, str] | None = None) -> ParsedLogs:
    """Parse logs (`logs/<host>.log[.gz]`) into events, iterations and progress flags.

    `nodes`: the job's hosts. Without it every file is one host. With it, a file named after no node
    is aggregated: each of its lines goes to the node it names (`rank_host` maps srun's `12: ` and
    `[rank12]` labels), else to the node of the line before it; lines before any go to the file itself.
    """
    cache = cache or TemplateCache()
    files, raws = [], []
    host_names: list[str] = []
    index: dict[str, int] = {}
    host_parts, line_parts, shape_parts, file_parts = [], [], [], []
    known = set(nodes or ())
    for k, path in enumerate(paths):
        data = read_log(path)
        raw = data.split(b"\n")
        if raw and raw[-1] == b"":
            raw.pop()
        folded = data.translate(_FOLD).split(b"\n")[: len(raw)]
        codes, uniq = pd.factorize(np.array(folded, dtype=object))
        shape_parts.append(cache.shape_ids(list(uniq))[codes] if len(raw) else np.empty(0, np.int32))
        n = len(raw)
        own = host_of_file(path)
        if nodes is None or own in known or not n:
            origin = [own] * n if n else []
            names = [own]
        else:
            origin = _origins(raw, sorted(known), rank_host or {}, own)
            names = list(dict.fromkeys(origin))
        for name in names:
            if name not in index:
                index[name] = len(host_names)
                host_names.append(name)
        host_parts.append(np.array([index[o] for o in origin], dtype=np.int32) if n else np.empty(0, np.int32))
        line_parts.append(np.arange(1, n + 1, dtype=np.int32))
        file_parts.append(np.full(n, k, dtype=np.int32))
        raws.append(raw)
        files.append(str(path.relative_to(root)) if root is not None and path.is_relative_to(root) else path.name)
    host = np.concatenate(host_parts) if host_parts else np.empty(0, np.int32)
    line = np.concatenate(line_parts) if line_parts else np.empty(0, np.int32)
    file = np.concatenate(file_parts) if file_parts else np.empty(0, np.int32)
    shape = np.concatenate(shape_parts).astype(np.int32) if shape_parts else np.empty(0, np.int32)
    # group lines by host; a host with lines from several files (its own and an aggregated one) gets them
    # in time order, by the timestamps the lines carry (file order where they carry none)
    pairs = np.unique(host.astype(np.int64) * max(len(files), 1) + file) if host.size else np.empty(0, np.int64)
    if pairs.size > len(np.unique(host)):
        order = np.lexsort((line, file, _stamps(raws, file, line), host))
    else:
        order = np.argsort(host, kind="stable")
    host, line, file, shape = host[order], line[order], file[order], shape[order]
    # dense template ids over the clusters this parse used
    clusters = np.asarray(cache.shape_cluster, dtype=np.int64)
    used, shape_event = np.unique(clusters, return_inverse=True)
    templates = [cache.template(int(c)) for c in used]
    is_progress_shape = np.array([bool(PROGRESS_SHAPE.search(s)) and not NOT_PROGRESS.search(s)
                                  for s in cache.shapes], dtype=bool)
    progress = is_progress_shape[shape] if shape.size else np.zeros(0, bool)
    iteration = _iterations(raws, file, host, line, progress)
    is_node = np.array([nodes is None or h in known for h in host_names], dtype=bool)
    return ParsedLogs(files, host_names, host, line, shape, list(cache.shapes), shape_event.astype(np.int32),
                      templates, iteration, progress, raws, file, is_node)


_RANK_LABEL = r"^\s*(?P<a>\d{1,6}): |\[rank(?P<b>\d{1,6})\]"


def _origins(raw: list[bytes], nodes: list[str], rank_host: dict[int, str], own: str) -> list[str]:
    """Per line of an aggregated file, the node it came from (see parse_logs), vectorized with pyarrow."""
    texts = pa.array(raw, pa.binary()).cast(pa.string(), safe=False)
    alt = "|".join(re.escape(h) for h in sorted(nodes, key=len, reverse=True))
    named = pc.extract_regex(texts, rf"(?:^|[^\w.-])(?P<h>{alt})(?:[^\w-]|$)").field("h")
    label = pc.extract_regex(texts, _RANK_LABEL)
    a = np.array(pc.fill_null(label.field("a"), "").to_numpy(zero_copy_only=False), dtype=object)
    b = np.array(pc.fill_null(label.field("b"), "").to_numpy(zero_copy_only=False), dtype=object)
    digits = np.where(a != "", a, np.where(b != "", b, "-1"))
    # a hostname wins; else a rank label mapped to its host; else the node of the line before
    by_rank = digits.astype(np.int64)
    name = np.array(pc.fill_null(named, "").to_numpy(zero_copy_only=False), dtype=object)
    for r in np.unique(by_rank[(name == "") & (by_rank >= 0)]).tolist():
        name[(name == "") & (by_rank == r)] = rank_host.get(int(r), "")
    has = name != ""
    last = np.maximum.accumulate(np.where(has, np.arange(len(raw)), -1))
    return [own if j < 0 else str(name[j]) for j in last.tolist()]


_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                        "Nov", "Dec"), 1)}
#: ISO / python logging (2026-11-22T07:00:01.123, 2026-11-22 07:00:01,123) or syslog (Nov 22 07:00:01)
_STAMP = (r"(?:\d{4}-(?P<mo>\d\d)-(?P<d>\d\d)[T ]|(?P<mon>[A-Z][a-z]{2}) +(?P<sd>\d{1,2}) )"
          r"(?P<H>\d\d):(?P<M>\d\d):(?P<S>\d\d)(?:[.,](?P<f>\d{1,6}))?")


def _stamps(raws: list[list[bytes]], file: np.ndarray, line: np.ndarray) -> np.ndarray:
    """Seconds (within a year, which is all one job spans) of each line's first timestamp; a line without
    one takes the previous line's in its file (the next one's before the first)."""
    out = np.full(file.size, np.nan)
    for f in np.unique(file).tolist():
        idx = np.flatnonzero(file == f)
        texts = pa.array([raws[f][n - 1][:160] for n in line[idx].tolist()], pa.binary()).cast(pa.string(), safe=False)
        m = pc.extract_regex(texts, _STAMP)

        def col(name: str, m: pa.StructArray = m) -> np.ndarray:
            vals = pc.fill_null(m.field(name), "").to_numpy(zero_copy_only=False)
            return np.array([float(v) if v else np.nan for v in vals]) if name != "mon" else \
                np.array([float(_MONTHS.get(v, 0)) or np.nan for v in vals])

        month = np.where(np.isnan(col("mo")), col("mon"), col("mo"))
        day = np.where(np.isnan(col("d")), col("sd"), col("d"))
        frac = col("f")
        frac = np.where(np.isnan(frac), 0.0, frac / 10.0 ** np.char.str_len(
            np.array(pc.fill_null(m.field("f"), "0").to_numpy(zero_copy_only=False), dtype=str)))
        t = (((month * 31 + day) * 24 + col("H")) * 60 + col("M")) * 60 + col("S") + frac
        ok = ~np.isnan(t)
        if ok.any():  # forward fill, then back fill the lines before the first stamp
            pos = np.maximum.accumulate(np.where(ok, np.arange(t.size), -1))
            t = np.where(pos >= 0, t[np.maximum(pos, 0)], t[np.flatnonzero(ok)[0]])
        else:
            t = np.zeros(t.size)
        out[idx] = t
    return out


def _iterations(raws: list[list[bytes]], file: np.ndarray, host: np.ndarray, line: np.ndarray,
                progress: np.ndarray) -> np.ndarray:
    """Per line, the highest iteration number printed on its host so far (-1 before the first)."""
    out = np.full(host.size, -1, dtype=np.int64)
    idx = np.flatnonzero(progress)
    if idx.size:
        texts = pa.array([raws[f][n - 1] for f, n in zip(file[idx].tolist(), line[idx].tolist(), strict=True)],
                         pa.binary()).cast(pa.string(), safe=False)
        found = pc.extract_regex(texts, _PROGRESS_NUMBER).field("it")
        nums = pc.cast(pc.fill_null(found, "-1"), pa.int64()).to_numpy(zero_copy_only=False)
        out[idx] = nums
    # running max within each host (hosts are contiguous): offset by host so maxima do not leak
    big = np.int64(1) << 40
    shifted = np.where(out >= 0, out, -1) + host.astype(np.int64) * big
    run = np.maximum.accumulate(np.where(out >= 0, shifted, host.astype(np.int64) * big - 1))
    res = run - host.astype(np.int64) * big
    return np.where(res >= 0, res, -1).astype(np.int32)
