"""Flow and log evidence for the report: per-host throughput, and failure-indicating log lines (L4)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta
from collector.trace.traceio import Trace
from explain.report.model import FlowEvidence, LogEvidence


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


def log_evidence(trace: Trace, suspects: list[str], top: int = 24, examples: int = 12) -> LogEvidence | None:
    """Failure-indicating lines per host, found exactly as `laggard logs` finds them (L4: lines also
    printed by successful jobs, and lines the job got past, are left out); quotes suspects' first."""
    from localize.logs.analysis import analyze_logs  # scikit-learn: only when a report has logs

    a = analyze_logs(trace)
    logs = a.logs
    idx = np.flatnonzero(a.failure)
    counts = {h: 0 for h in logs.hosts}
    found: dict[str, list[str]] = {}
    for i in idx.tolist():
        host = logs.hosts[int(logs.host[i])]
        counts[host] += 1
        if len(found.setdefault(host, [])) < examples:
            found[host].append(f"{logs.where(i)}: {logs.text(i).strip()[:240]}")
    if not counts:
        return None
    order = sorted(counts, key=lambda h: (-counts[h], h))[:top]
    ranked_hosts = [h for h in suspects if h in found] + [n.host for n in a.nodes if n.host not in suspects]
    ranked_hosts += [h for h in order if h not in ranked_hosts]
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
