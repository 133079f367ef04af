"""Key extraction from alert, chat or log text: hosts, ranks, ports, IPs and error codes (metric A).

Pure regular expressions, no execution: text that looks like a command is read as text. With an
inventory, host names are matched exactly against the job's hosts as well.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

HOST_RE = re.compile(
    r"(?<![\w.-])((?:node|host|worker|compute|gpu-node|gpunode|dgx|hgx|cn|srv|server|trn|a100|h100|h800|a800)"
    r"(?:[-_]?[a-z]*)?[-_]?\d+(?:[-_][a-z0-9]+)*)(?![\w-])", re.I)
SSH_HOST_RE = re.compile(r"\bssh\s+(?:-\w+\s+\S+\s+)*(?:[\w.-]+@)?([A-Za-z][\w.-]*[A-Za-z0-9])(?![\w.@-])")
IP_RE = re.compile(r"(?<![\d.])((?:25[0-5]|2[0-4]\d|1?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|1?\d?\d)){3})(?![\d.])")
RANK_LIST_RE = re.compile(r"\branks?\s*(?:[:=#]\s*)?((?:\d+)(?:\s*(?:,|/|&|and|or)\s*\d+)*)", re.I)
RANK_RANGE_RE = re.compile(r"\branks?\s*(?:[:=#]\s*)?(\d+)\s*(?:-|\.\.|to)\s*(\d+)\b", re.I)
PORT_RES = (
    re.compile(r"\bports?\s*(?:[:=#]\s*|number\s+)?(\d{2,5})\b", re.I),
    # each ssh looks for its -p only up to the next ssh (that one finds the same port): one pass per line
    re.compile(r"\bssh\b(?:(?!\bssh\b)[^\n])*?\s-p\s*(\d{2,5})\b"),
    # a host starts at the first of its letters and is at most 253 characters (RFC 1123), so a long
    # word costs one bounded look per letter run, not a scan to its end from every letter
    re.compile(r"(?:\d{1,3}(?:\.\d{1,3}){3}|(?<![A-Za-z])[A-Za-z][\w-]{0,251}\d)\]?:(\d{2,5})\b"),
    re.compile(r"\b(?:MASTER_PORT|master_port|--master-port|--master_port)\s*[=: ]\s*(\d{2,5})\b"),
    re.compile(r"\bUDP\s+(\d{4})\b"),
)
ERROR_RES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bxid\b\s*[:#=]?\s*(?:\(PCI:[\w:.]+\):\s*)?(\d{1,3})\b", re.I), "xid:{}"),
    (re.compile(r"\b(nccl(?:System|Internal|Remote|InvalidUsage|InvalidArgument|UnhandledCuda)Error)\b"), "nccl:{}"),
    (re.compile(r"\b(cudaError\w+|CUDA_ERROR_\w+)\b"), "cuda:{}"),
    (re.compile(r"\bexit(?:ed with)?\s*(?:code|status)\s*[:=]?\s*(\d{1,3})\b", re.I), "exit:{}"),
    (re.compile(r"\b(E(?:NOSPC|TIMEDOUT|CONNREFUSED|CONNRESET|HOSTUNREACH|NOMEM|IO|AGAIN))\b"), "{}"),
    (re.compile(r"\b(SIG(?:KILL|SEGV|ABRT|TERM|BUS))\b"), "{}"),
)


@dataclass
class Keys:
    hosts: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    ips: list[str] = field(default_factory=list)
    error_codes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def merge(self, other: Keys) -> Keys:
        return Keys(*(sorted(set(a) | set(b), key=_key) for a, b in zip(self.as_lists(), other.as_lists(), strict=True)))

    def as_lists(self) -> tuple[list[Any], ...]:
        return self.hosts, self.ranks, self.ports, self.ips, self.error_codes


def _key(x: Any) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(x)))


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def extract_keys(text: str, known_hosts: tuple[str, ...] = ()) -> Keys:
    hosts = {m.group(1) for m in HOST_RE.finditer(text)}
    hosts |= {m.group(1) for m in SSH_HOST_RE.finditer(text) if not IP_RE.fullmatch(m.group(1))}
    for h in known_hosts:
        if re.search(rf"(?<![\w-]){re.escape(h)}(?![\w-])", text):
            hosts.add(h)
    ranks: set[int] = set()
    for m in RANK_RANGE_RE.finditer(text):
        lo, hi = int(m.group(1)), int(m.group(2))
        if 0 <= hi - lo <= 64:
            ranks |= set(range(lo, hi + 1))
    for m in RANK_LIST_RE.finditer(text):
        if not RANK_RANGE_RE.match(text, m.start()):
            ranks |= set(_ints(m.group(1)))
    ports: set[int] = set()
    for rx in PORT_RES:
        ports |= {int(p) for p in rx.findall(text) if 1 <= int(p) <= 65535}
    errors = set()
    for rx, fmt in ERROR_RES:
        errors |= {fmt.format(v) for v in rx.findall(text)}
    ips = {m for m in IP_RE.findall(text)}
    return Keys(sorted(hosts, key=_key), sorted(ranks), sorted(ports), sorted(ips, key=_key), sorted(errors, key=_key))
