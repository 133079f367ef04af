"""Flow and log evidence for the report: per-host throughput and suspicious log lines."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from collector.meta import JobMeta
from explain.report.model import FlowEvidence, LogEvidence

#: lines an on-call engineer wants to see first: errors, hardware faults, NCCL trouble, timeouts
SUSPICIOUS = re.compile(
    r"\b(ERROR|Error|FATAL|CRITICAL|WARN(ING)?|Traceback|Xid|ECC|NCCL WARN|timeout|timed out|"
    r"Timeout|exception|Exception|link down|retransmi\w*|throttl\w*|degraded|failed|Failed)\b"
)
MAX_LOG_BYTES = 64 << 20  # read at most this much per report: the examples, not the archive


def flow_evidence(flows: pd.DataFrame, meta: JobMeta, suspects: list[str], top: int = 24) -> FlowEvidence | None:
    """Median burst throughput of traffic leaving each host, slowest first (plus the suspects)."""
    if flows.empty:
        return None
    ip_host = {info.ip: info.host for info in meta.ranks.values() if info.ip}
    host = flows["src_ip"].map(ip_host)
    dur = (flows["end_ns"] - flows["start_ns"]).to_numpy() / 1e9
    ok = host.notna().to_numpy() & (dur > 0)
    if not ok.any():
        return None
    df = pd.DataFrame({"host": host[ok].to_numpy(), "gbps": flows["bytes"].to_numpy()[ok] * 8 / dur[ok] / 1e9})
    per = df.groupby("host")["gbps"].agg(["median", "size"]).sort_values("median")
    typical = float(per["median"].median())
    flagged = per.index[per["median"] < 0.6 * typical].tolist()
    keep = list(dict.fromkeys([*per.index[:top].tolist(), *[h for h in suspects if h in per.index]]))
    per = per.loc[keep]
    return FlowEvidence(per.index.tolist(), [round(float(v), 3) for v in per["median"]],
                        [int(v) for v in per["size"]], flagged)


def log_evidence(files: list[Path], suspects: list[str], top: int = 24, examples: int = 12) -> LogEvidence | None:
    """Count suspicious lines per host log; quote the first ones from suspect hosts, then others."""
    counts: dict[str, int] = {}
    found: dict[str, list[str]] = {}
    budget = MAX_LOG_BYTES
    for f in files:
        host = f.name.split(".log", 1)[0]
        n = 0
        with f.open("rb") as fh:
            data = fh.read(max(budget, 0)).decode("utf-8", "replace")
        budget -= len(data)
        for line in data.splitlines():
            if SUSPICIOUS.search(line):
                n += 1
                if len(found.setdefault(host, [])) < examples:
                    found[host].append(line.strip()[:240])
        counts[host] = n
    if not counts:
        return None
    order = sorted(counts, key=lambda h: (-counts[h], h))[:top]
    ranked_hosts = [h for h in suspects if h in found] + [h for h in order if h not in suspects]
    lines: list[tuple[str, str]] = []
    for h in ranked_hosts:
        for ln in found.get(h, []):
            if len(lines) >= examples:
                break
            lines.append((h, ln))
    return LogEvidence(order, [counts[h] for h in order], lines)


def suspect_hosts(candidates: list[dict], meta: JobMeta | None) -> list[str]:
    """Hosts named by the candidates (a switch names the hosts under it)."""
    out: list[str] = []
    for c in candidates:
        if c.get("host"):
            out.append(str(c["host"]))
        out.extend(str(h) for h in c.get("hosts") or [])
        if c.get("switch") and meta is not None:
            out.extend(h for h in meta.hosts() if meta.switch_of(h) == c["switch"])
    return list(dict.fromkeys(out))


def step_start_utc(ops: pd.DataFrame, step: int) -> str | None:
    """Wall time a step began (earliest entry on any host; host clocks may differ by ms)."""
    starts = ops.loc[ops["step"] == step, "start_ns"].to_numpy()
    if not len(starts):
        return None
    ts = pd.Timestamp(int(np.min(starts)), unit="ns", tz="UTC")
    return ts.strftime("%Y-%m-%d %H:%M:%S UTC")
