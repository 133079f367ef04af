"""Black-box localization from network flows (LLMPrism): slow iterations, stragglers, slow links.

Rules, applied to the job's reconstructed iterations:
- slow iterations: judged as every path judges steps (`timeline.steps.judge_window`), warm-up
  and noise left out;
- straggler host: in slow iterations its synchronisation bursts start last while its peers'
  flows already ran and stalled (lateness of a host's first burst against its ring);
- straggler from the first step (no normal iteration to compare with): a host that starts its
  ring's synchronisation last in nearly every iteration, far later than any peer ever does;
- slow link or NIC: a flow that runs at a low rate (bytes per second of activity) compared with
  the same edge in normal iterations, or with its peers; when every edge of one host is slow it
  is the host's NIC, when every edge through one switch is slow it is the switch.
Flows show hosts, not GPUs: a straggler GPU is reported as its host.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.inputs.errors import UserError
from collector.trace.meta import _natural_key
from collector.trace.traceio import Trace
from localize.verdict import Candidate, Status, Verdict
from timeline.flows import (
    MIN_DATA_PACKET,
    FlowJob,
    FlowTimeline,
    build_flow_timeline,
    flows_of_groups,
    too_short,
)
from timeline.steps import judge_window, robust_sigma, warmup_note


class NoTrainingJob(UserError):
    """The flows hold no collective-communication traffic: there is nothing to judge."""

    unjudged = True  # beside other evidence, the verdict goes on without the flows


class CaptureTooShort(UserError):
    """The capture holds too few complete iterations to judge any of them."""

    unjudged = True


K_SIGMA = 3.0
SLOW_EDGE = 1.5  # an edge is slow when its rate drops by this factor
PACER_APART = 1.25  # in a ring whose every edge is slow, the pacing edges read this much slower than the median
NIC_SHARE = 0.8  # share of a host's (switch's) edges that must be slow to blame the NIC (switch)
LATE_SHARE = 0.02  # a straggler starts at least this share of an iteration after its peers
MIN_RATE_PACKETS = 3
FROM_START_SHARE = 0.005  # slow from the first step: late by at least this share of an iteration...
FROM_START_CONSISTENCY = 0.9  # ...and its ring's latest host in at least this share of iterations


def judged_iterations(it: pd.DataFrame, warmup: bool = True) -> tuple[pd.DataFrame, float, list[int], int | None]:
    """Complete iterations judged as every path judges steps (`timeline.steps.judge_window`: δ
    against recent normal iterations, warm-up and noise left out, the onset from the change).

    Returns the iterations with `baseline_s` and `irregular`, the typical normal iteration's
    duration, the warm-up steps and the onset. `warmup`: the iterations start at the capture's first."""
    done = it["complete"].to_numpy(bool)
    out = it.assign(baseline_s=np.nan, irregular=False)
    if done.sum() < 3:
        return out, float("nan"), [], None
    d = it.loc[done, "duration_s"].to_numpy(np.float64)
    table, warm, onset = judge_window(pd.Series(d, index=it.loc[done, "step"].to_numpy(np.int64)), warmup=warmup)
    out.loc[done, "baseline_s"] = table["baseline_s"].to_numpy()
    out.loc[done, "irregular"] = table["irregular"].to_numpy(bool)
    base = table["baseline_s"].to_numpy(np.float64)
    typical = float(np.nanmedian(base)) if np.isfinite(base).any() else float(np.quantile(d, 0.1))
    return out, typical, warm, onset


def _per_iteration(flows: pd.DataFrame, it: pd.DataFrame) -> pd.DataFrame:
    """Bursts of complete iterations, tagged with their iteration's step."""
    ends = it["end_ns"].to_numpy()
    idx = np.searchsorted(ends, flows["start_ns"].to_numpy(), side="left")
    ok = idx < len(it)
    f = flows[ok].assign(step=it["step"].to_numpy()[idx[ok]])
    return f[f["step"].isin(it.loc[it["complete"], "step"])]


def edge_rates(f: pd.DataFrame, host_of: dict[str, str]) -> pd.DataFrame:
    """Per directed host edge and iteration: bytes per second of activity, over multi-packet bursts."""
    f = f[(f["packets"] >= MIN_RATE_PACKETS) & (f["end_ns"] > f["start_ns"])]
    f = f.assign(sh=f["src_ip"].map(host_of), dh=f["dst_ip"].map(host_of), active=f["end_ns"] - f["start_ns"])
    f = f[f["sh"] != f["dh"]]
    g = f.groupby(["sh", "dh", "step"], sort=False).agg(bytes=("bytes", "sum"), active=("active", "sum")).reset_index()
    return g.assign(rate=g["bytes"] / (g["active"] / 1e9))


def slow_edges(rates: pd.DataFrame, irregular: set[int]) -> pd.DataFrame:
    """Edges whose rate in slow iterations fell against normal iterations, or against peers.

    With normal iterations each edge is its own reference (a healthy edge's ratio is 1), and
    the noise is how much edges' rates vary across normal iterations: most edges may be slow
    at once (a switch on a ring), so the job's median edge is no reference then. Without
    normal iterations, edges are compared with the job's typical edge.
    """
    bad = rates[rates["step"].isin(irregular)] if irregular else rates
    cur = bad.groupby(["sh", "dh"])["rate"].median()
    good = rates[~rates["step"].isin(irregular)] if irregular else rates.iloc[:0]
    normal = good.groupby(["sh", "dh"])["rate"].median()
    if len(normal):
        ratio = (normal.reindex(cur.index) / cur).fillna(1.0)
        ref = good.join(normal.rename("ref"), on=["sh", "dh"])["ref"]
        dev = (good["rate"] / ref - 1).abs()
        spread = 1.4826 * float(dev.median()) if len(dev) else 0.0
        center = 1.0
    else:  # no normal iteration: compare with the typical edge of the job
        ratio = float(cur.median()) / cur
        center = float(ratio.median()) if len(ratio) else 1.0
        spread = robust_sigma(ratio.to_numpy(dtype=np.float64)) if len(ratio) else 0.0
    flagged = ratio[(ratio > SLOW_EDGE) & (ratio > center + K_SIGMA * spread)]
    return pd.DataFrame({"ratio": ratio, "slow": ratio.index.isin(flagged.index)}, index=ratio.index).reset_index()


def network_candidates(edges: pd.DataFrame, switch_of: dict[str, str | None], source: str) -> list[Candidate]:
    """Slow edges -> switch (every edge through it slow), NIC (every edge of a host), else links."""
    slow = edges[edges["slow"]]
    if slow.empty:
        return []
    if len(slow) >= NIC_SHARE * len(edges) and len(set(slow["sh"]) | set(slow["dh"])) >= 3:
        pacers = _pacing_edges(slow)
        if pacers is None:
            return _paced_ring(slow, switch_of, source)
        paced = float(slow["ratio"].median())
        edges = edges.assign(slow=pd.MultiIndex.from_frame(edges[["sh", "dh"]]).isin(pacers))
        named = network_candidates(edges, switch_of, source)
        for c in named:
            c.evidence.append(f"the ring's other {len(edges) - len(pacers)} edges ran {paced:.1f}x slower: "
                              "they moved each chunk at full rate and waited for the slowest edge")
        return named
    out: list[Candidate] = []
    explained: set[tuple[str, str]] = set()
    sw = pd.Series({h: switch_of.get(h) for h in set(edges["sh"]) | set(edges["dh"])})
    for s in sorted({x for x in sw.dropna()}, key=_natural_key):
        under = set(sw[sw == s].index)
        through = edges[edges["sh"].isin(under) | edges["dh"].isin(under)]
        hit = through[through["slow"]]
        hosts_hit = (set(hit["sh"]) | set(hit["dh"])) & under
        if len(through) and len(hit) / len(through) >= NIC_SHARE and len(hosts_hit) >= 2:
            ratio = float(hit["ratio"].median())
            out.append(Candidate("switch", 1 - 1 / ratio, [
                f"{len(hit)} of {len(through)} flows through {s} run {ratio:.1f}x slower "
                f"(hosts {', '.join(sorted(hosts_hit, key=_natural_key))})"], switch=s, source=source))
            explained |= set(zip(hit["sh"], hit["dh"], strict=True))
    for h in sorted(set(edges["sh"]) | set(edges["dh"]), key=_natural_key):
        touch = edges[(edges["sh"] == h) | (edges["dh"] == h)]
        hit = touch[touch["slow"]]
        peers = (set(hit["sh"]) | set(hit["dh"])) - {h}
        if len(touch) and len(hit) / len(touch) >= NIC_SHARE and len(peers) >= 2:
            if set(zip(hit["sh"], hit["dh"], strict=True)) <= explained:
                continue
            ratio = float(hit["ratio"].median())
            out.append(Candidate("nic", 1 - 1 / ratio, [
                f"every flow of {h} ({len(hit)} edges, to {len(peers)} peers) runs {ratio:.1f}x slower "
                "while the rest of the job does not"], host=h, source=source))
            explained |= set(zip(hit["sh"], hit["dh"], strict=True))
    links: dict[tuple[str, ...], list[float]] = {}
    for a, b, r in zip(slow["sh"], slow["dh"], slow["ratio"], strict=True):
        if (a, b) not in explained:
            links.setdefault(tuple(sorted((a, b), key=_natural_key)), []).append(float(r))
    for pair, rs in links.items():
        ratio = float(np.median(rs))
        link = Candidate("link", 1 - 1 / ratio, [
            f"flows between {pair[0]} and {pair[1]} start on time but run {ratio:.1f}x slower "
            "than in normal iterations / than their peers"], hosts=list(pair), source=source)
        alike = [Candidate("nic", link.score, [
            f"every flow of {h} goes to {peer} and runs {ratio:.1f}x slower: with one peer, {h}'s NIC and the "
            "link between them carry the same flows, and a probe of the NIC tells them apart"], host=h, source=source)
            for h, peer in (pair, pair[::-1]) if _only_peer(edges, h) == peer]
        if alike:
            link.tie = 1 + len(alike)
            for c in alike:
                c.tie = link.tie
        out += [link, *alike]
    return out


def _pacing_edges(slow: pd.DataFrame) -> pd.MultiIndex | None:
    """The edges of a paced ring that ran slower still than the rest of it, if a few did.

    The slowest edge is busy the whole time; the others move each chunk at full rate and pause,
    and only pauses shorter than the capture's burst gap hide in their bursts. So the edges that
    set the pace read slowest, clearly apart from a tight cluster of paced ones (a 4.75x link on a
    ring of eight hosts: 3.1x on its edge, 1.85-1.88x on the seven others); none apart, no answer.
    """
    ratio = slow["ratio"].to_numpy(dtype=np.float64)
    center = float(np.median(ratio))
    spread = robust_sigma(ratio)
    apart = (ratio > PACER_APART * center) & (ratio > center + K_SIGMA * spread)
    if not apart.any() or apart.sum() > len(ratio) / 2:
        return None
    return pd.MultiIndex.from_frame(slow.loc[apart, ["sh", "dh"]])


def _paced_ring(slow: pd.DataFrame, switch_of: dict[str, str | None], source: str) -> list[Candidate]:
    """Every flow of the job slow: a ring's edges all run at its slowest edge's pace, so no edge
    stands out and any device they cross may be it. The switch over them all, every NIC and
    every link, declared one tie (a 2.3x NIC on a ring of eight hosts under one switch read 1.6x
    on every edge, and the switch alone was named)."""
    ratio = float(slow["ratio"].median())
    hosts = sorted(set(slow["sh"]) | set(slow["dh"]), key=_natural_key)
    pairs = sorted({tuple(sorted((a, b), key=_natural_key)) for a, b in zip(slow["sh"], slow["dh"], strict=True)})
    switches = sorted({sw for h in hosts if (sw := switch_of.get(h))}, key=_natural_key)
    why = (f"every flow of the job ({len(slow)} edges over {len(hosts)} hosts) runs {ratio:.1f}x slower: a ring "
           "paces all its edges at its slowest, so flows cannot tell which device it crosses is slow")
    out = [Candidate("switch", 1 - 1 / ratio, [why], switch=sw, source=source) for sw in switches]
    out += [Candidate("nic", 1 - 1 / ratio, [why], host=h, source=source) for h in hosts]
    out += [Candidate("link", 1 - 1 / ratio, [why], hosts=list(pair), source=source) for pair in pairs]
    for c in out:
        c.tie = len(out)
    return out


def _only_peer(edges: pd.DataFrame, host: str) -> str | None:
    """The one host `host` exchanges flows with, when it has one and most of those flows are slow."""
    touch = edges[(edges["sh"] == host) | (edges["dh"] == host)]
    peers = (set(touch["sh"]) | set(touch["dh"])) - {host}
    if len(peers) != 1 or touch["slow"].mean() < NIC_SHARE:
        return None
    return str(peers.pop())


def host_lateness(f: pd.DataFrame, job: FlowJob, host_of: dict[str, str], steps: set[int]) -> pd.Series:
    """Per host: mean over the given iterations of how late it starts synchronising (ns).

    The mean, not the median: a straggler need not be the cause of every slow iteration.
    """
    rows = lateness_per_iteration(f, job, host_of, steps)
    if rows.empty:
        return pd.Series(dtype=np.float64)
    return rows.groupby("h")["late"].mean().sort_values(ascending=False)


def peer_median(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per element: the median of the other elements of its group (NaN where it has none, or is NaN).

    A ring member's lateness is against its peers, not a median it is part of: in a ring of two
    hosts that median is the mean of both, and halves the straggler's lateness.
    """
    out = np.full(len(values), np.nan)
    ok = ~np.isnan(values)
    idx = np.flatnonzero(ok)
    if not idx.size:
        return out
    order = idx[np.lexsort((values[idx], group[idx]))]
    g, v = group[order], values[order]
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    size = np.diff(np.r_[first, len(g)])
    start = np.repeat(first, size)
    n = np.repeat(size, size)
    k = np.arange(len(g)) - start  # own position among its group, sorted
    m = n - 1  # peers

    def peer(j: np.ndarray) -> np.ndarray:  # the j-th smallest of the peers
        return v[np.minimum(start + j + (j >= k), len(v) - 1)]

    lo, hi = peer(np.maximum((m - 1) // 2, 0)), peer(np.maximum(m // 2, 0))
    out[order] = np.where(m > 0, (lo + hi) / 2, np.nan)
    return out


def lateness_per_iteration(f: pd.DataFrame, job: FlowJob, host_of: dict[str, str], steps: set[int]) -> pd.DataFrame:
    """Per iteration and host (columns step, h, late): how late it starts synchronising, in ns.

    Lateness is measured against the median of the same ring's other hosts in the same iteration, on
    a host's first send and first receive on ring edges. A late member's own sends always
    start late; sends into it start late too where the transport waits for the receiver
    (rendezvous), but then so do its predecessor's sends. Scoring (send + min(receive+, send))/2
    puts the straggler first under either transport: its successor only receives late, its
    predecessor only sends late. A host that starts late only because its pipeline neighbour
    sent late is waiting, not slow (Holmes' back-tracing, on flows): with pipeline inputs, its
    send lateness is at most how much longer than its ring peers it worked after its last input.
    """
    pp_edges = [e for g in job.groups if g.kind == "pp" for e in g.edges]
    pp = f[f["step"].isin(steps)]
    if pp_edges:
        pp = pp.merge(pd.DataFrame(pp_edges, columns=["src_ip", "dst_ip"]), on=["src_ip", "dst_ip"])
        pp = pp.assign(h=pp["dst_ip"].map(host_of))
    rows = []
    rings = [g for g in job.groups if g.kind == "dp"]
    for rf in flows_of_groups(f[f["step"].isin(steps)], rings):
        if rf.empty:
            continue
        sends = rf.assign(h=rf["src_ip"].map(host_of)).groupby(["step", "h"])["start_ns"].min().rename("sync")
        recvs = rf.assign(h=rf["dst_ip"].map(host_of)).groupby(["step", "h"])["start_ns"].min().rename("recv")
        first = pd.concat([sends, recvs], axis=1).reset_index()
        step = first["step"].to_numpy()
        out_late = _against_peers(first["sync"], step)
        in_late = _against_peers(first["recv"], step)
        if pp_edges and len(pp):
            x = pp.merge(first[["step", "h", "sync"]], on=["step", "h"])
            last_in = x[x["end_ns"] <= x["sync"]].groupby(["step", "h"])["end_ns"].max().rename("input")
            first = first.merge(last_in.reset_index(), on=["step", "h"], how="left")
            own = first["sync"] - first["input"]  # time the host spent after its last pipeline input
            own_late = _against_peers(own, first["step"].to_numpy())
            out_late = np.where(np.isnan(own_late), out_late, np.minimum(out_late, own_late))
        in_late = np.clip(np.nan_to_num(in_late, nan=0.0), 0.0, None)
        first["late"] = (out_late + np.minimum(in_late, out_late)) / 2
        rows.append(first[["step", "h", "late"]])
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["step", "h", "late"])


def _against_peers(x: pd.Series, step: np.ndarray) -> np.ndarray:
    """How far each value lies from its peers' median in the same iteration (ns; 0 with no peer to compare)."""
    v = x.to_numpy(dtype=np.float64)
    peers = peer_median(v, step)
    return np.where(np.isnan(peers) & ~np.isnan(v), 0.0, v - peers)


def slow_from_start(late: pd.DataFrame, base_s: float) -> list[tuple[str, float, float]]:
    """Hosts late to every synchronisation: (host, share of iterations it was its ring's latest, median lateness ns).

    With no normal iteration there is nothing to compare a host with but its ring peers in the
    same iterations: a host whose compute is slow from the first step starts its ring's sync
    last in (nearly) every iteration, by a margin far above how late the other hosts ever are.
    """
    if late.empty or base_s <= 0:
        return []
    steps = late["step"].nunique()
    per = late.groupby("h")["late"]
    med = per.median()
    ahead = med.clip(lower=0.0)  # peers that stall for a late host are early: they set no bar
    spread = 1.4826 * float((ahead - ahead.median()).abs().median())
    floor = max(FROM_START_SHARE * base_s * 1e9, float(ahead.median()) + 10 * K_SIGMA * spread)
    latest = late.loc[late.groupby("step")["late"].idxmax(), "h"].value_counts() / steps
    out = []
    for h, m in med[med > floor].sort_values(ascending=False).items():
        share = float(latest.get(h, 0.0))
        if share >= FROM_START_CONSISTENCY and (late.loc[late["h"] == h, "late"] > floor / 2).mean() >= FROM_START_CONSISTENCY:
            out.append((str(h), share, float(m)))
    return out


def network_loss(rates: pd.DataFrame, edges: pd.DataFrame) -> float:
    """Time the slow edges lost per iteration (ns, median over iterations of the worst edge's
    active time beyond what its rate at the reference would take); 0 without slow edges."""
    slow = edges[edges["slow"]]
    if slow.empty or rates.empty:
        return 0.0
    r = rates.merge(slow[["sh", "dh", "ratio"]], on=["sh", "dh"])
    lost = r["active"] * (1.0 - 1.0 / r["ratio"])
    return float(lost.groupby(r["step"]).max().median()) if len(r) else 0.0


def endpoint_candidates(f: pd.DataFrame, irregular: set[int], host_hit: set[str], meta_ips: dict[str, tuple[int, str, int]],
                        host_of: dict[str, str], source: str) -> list[Candidate]:
    """One GPU's own network path (its NIC port or PCIe link): every edge of one endpoint slow.

    Only for hosts not already blamed as a whole; the endpoint's rank comes from meta.json.
    """
    rates = edge_rates(f, {ip: ip for ip in host_of})
    if rates.empty:
        return []
    edges = slow_edges(rates, irregular)
    slow = edges[edges["slow"]]
    out = []
    for ip in sorted(set(slow["sh"]) | set(slow["dh"])):
        if host_of.get(ip) in host_hit:
            continue
        touch = edges[(edges["sh"] == ip) | (edges["dh"] == ip)]
        hit = touch[touch["slow"]]
        peers = (set(hit["sh"]) | set(hit["dh"])) - {ip}
        if len(hit) / len(touch) < NIC_SHARE or len(peers) < 2 or len(hit) < len(slow) * 0.5:
            continue
        ratio = float(hit["ratio"].median())
        rank, host, gpu = meta_ips.get(ip, (None, host_of.get(ip), None))
        out.append(Candidate("gpu", 1 - 1 / ratio, [
            f"every flow of endpoint {ip} ({len(hit)} edges) runs {ratio:.1f}x slower while the other "
            f"endpoints of {host} do not: that GPU's own path (PCIe link or NIC port) is slow"],
            rank=rank, host=host, gpu=gpu, source=source))
    return out


def localize_flows(trace: Trace, steps: tuple[int, int] | None = None, top: int = 5,
                   timeline: FlowTimeline | None = None) -> Verdict:
    """The verdict from flows alone: slow iterations, then the devices that explain them."""
    source = "flows"
    tl = timeline or build_flow_timeline(trace.flows(), trace.meta)
    flows = tl.flows if tl.flows is not None else trace.flows()
    job = tl.job(trace.meta.job)
    if job is None:
        raise NoTrainingJob(f"{trace.path}: no training job found in the flows ({'; '.join(tl.notes) or 'no data traffic'})",
                            "capture on the job's data interfaces (RoCEv2, or the NCCL/gloo sockets) while it trains")
    if (short := too_short(job)) is not None:
        raise CaptureTooShort(f"{trace.path}: {short}", "capture again for longer; no verdict from this capture")
    it = job.iterations
    from_start = steps is None or (len(it) > 0 and steps[0] <= int(it["step"].min()))
    if steps is not None:
        it = it[(it["step"] >= steps[0]) & (it["step"] <= steps[1])]
    it, base, warm, onset = judged_iterations(it.reset_index(drop=True), warmup=from_start)
    irregular = [int(s) for s in it.loc[it["irregular"], "step"]]
    ep = set(job.endpoints)
    data = flows[flows["src_ip"].isin(ep) & flows["dst_ip"].isin(ep) & (flows["bytes"] >= MIN_DATA_PACKET * flows["packets"])]
    f = _per_iteration(data, it)  # data bursts only: acknowledgements and control messages say nothing of timing
    rates = edge_rates(f, tl.host_of)
    edges = slow_edges(rates, set(irregular)) if len(rates) else pd.DataFrame(columns=["sh", "dh", "ratio", "slow"])
    switch_of = {h: trace.meta.switch_of(h) for h in tl.host_of.values()}
    cands = network_candidates(edges, switch_of, source)
    hit = {c.host for c in cands if c.host} | {h for c in cands for h in (c.hosts or [])}
    hit |= {h for h, sw in switch_of.items() if sw and any(c.switch == sw for c in cands)}
    meta_ips = {i.ip: (r, i.host, i.gpu) for r, i in trace.meta.ranks.items() if i.ip}
    cands += endpoint_candidates(f, set(irregular), hit, meta_ips, tl.host_of, source)
    normal = set(it.loc[it["complete"] & ~it["irregular"], "step"].astype(int))
    if irregular:
        late = host_lateness(f, job, tl.host_of, set(irregular))
        ref = host_lateness(f, job, tl.host_of, normal) if normal else pd.Series(dtype=np.float64)
        excess = float(it.loc[it["irregular"], "duration_s"].median() - base) * 1e9
        for h, lateness in late.items():
            extra = float(lateness - ref.get(h, 0.0))
            if extra > LATE_SHARE * base * 1e9 and h not in hit:
                cands.append(Candidate("host", min(1.0, extra / max(excess, 1.0)), [
                    f"in slow iterations {h}'s synchronisation bursts start {extra / 1e6:.1f} ms after its ring peers' "
                    "(peers' flows ran and stalled waiting for it)",
                    "flows see hosts, not GPUs: a slow GPU, its PCIe link or CPU contention on this host look alike"],
                    host=str(h), source=source))
    if not irregular and cands:
        cands = [c for c in cands if c.score >= 1 - 1 / 2.0]  # without a slow iteration, only strong outliers
    if not any(c.kind == "host" for c in cands):  # a host slow from the first step leaves no normal iteration
        # (a piece of an iteration cut short, under half the typical one, holds no sync of its own)
        whole = it["complete"] & (it["duration_s"] >= it.loc[it["complete"], "duration_s"].median() / 2)
        complete = set(it.loc[whole, "step"].astype(int))
        # a host later than its peers by less than the slow edges lose each iteration explains less
        # than they do: a 2.8x NIC's ring read its far member 1.2 ms late, named above the NIC
        lost = network_loss(rates, edges) if len(rates) else 0.0
        for h, share, lateness in slow_from_start(lateness_per_iteration(f, job, tl.host_of, complete), base):
            if h in hit:
                continue
            cands.append(Candidate("host", share * min(1.0, lateness / lost) if lost > 0 else share, [
                f"{h} starts its ring's synchronisation last in {100 * share:.0f}% of iterations, "
                f"{lateness / 1e6:.1f} ms after its ring peers (median), from the first step: no iteration is normal",
                "flows see hosts, not GPUs: a slow GPU, its PCIe link or CPU contention on this host look alike"],
                host=h, source=source))
            onset = int(it["step"].min())
    cands.sort(key=lambda c: -c.score)
    durs = it.loc[it["irregular"], "duration_s"]
    slowdown = float(durs.median() / base) if irregular and base > 0 else 1.0
    status: Status = "irregular" if irregular or cands else "healthy"
    summary = job.to_dict()
    summary["baseline_iteration_s"] = base
    summary["notes"] = [*job.notes, *tl.notes, *([warmup_note(warm)] if warm else [])]
    return Verdict(job.name, status, irregular, slowdown, cands[:top], extra={"flows": summary, "source": "flows"},
                   onset_step=onset)
