"""Training timelines from network flows alone (LLMPrism): jobs, parallelism, iterations.

Nothing here needs the job's help. Only collective-communication traffic counts: RoCEv2 (UDP 4791)
and TCP connections shaped like NCCL's or gloo's sockets (both ends on unprivileged, non-service
ports, the connection carrying repeated large bursts); SSH, TLS, DNS, HTTP and other services are
set aside and counted. Endpoints that exchange data (plus endpoints that share a
host, since hosts are allocated whole) form one job; one-way edges that close a cycle of hosts
are data-parallel rings, two-way edges between pairs of hosts are pipeline chains or, when they
close cycles, expert all-to-all meshes; and the data-parallel synchronisation that ends every
iteration marks the iteration boundaries. Tensor parallelism stays inside a host and never
reaches the network, so it is invisible here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta, _natural_key
from timeline.graph import components, on_cycle

#: average packet size below which a directed edge carries only acknowledgements
MIN_DATA_PACKET = 200
#: reverse/forward byte ratio below which an edge is one-way (a ring edge)
ONE_WAY = 0.2
#: edges carrying less than this share of the busiest edge are one-off (setup) traffic, not groups
MINOR_SHARE = 0.05
#: pauses shorter than this are not told apart when looking for the pause between iterations
GAP_FLOOR_NS = 1_000_000
#: a data-parallel ring of two hosts syncs once or twice per iteration (a stall may split a sync);
#: a pipeline edge carries one transfer per microbatch each way, and a pipeline has several microbatches
SYNCS_PER_ITERATION = 2.5
#: rings whose syncs are counted to know the number of iterations (each costs a pass over the flows)
RINGS_COUNTED = 4
TP_NOTE = "tensor parallelism inside a host never reaches the network and is invisible to flows"
#: well-known service ports (either end) that are never NCCL/gloo sockets, which listen on ephemeral ports
SERVICES = {22: "ssh", 53: "dns", 80: "http", 443: "tls", 8080: "http", 8443: "tls", 8000: "http", 3128: "http-proxy",
            853: "dns-over-tls", 5353: "mdns", 123: "ntp", 3306: "mysql", 5432: "postgres", 6379: "redis",
            2379: "etcd", 2380: "etcd", 9090: "prometheus", 9100: "node-exporter", 9092: "kafka", 27017: "mongodb"}
#: a TCP connection carries collective traffic when it repeats large data bursts
MIN_TCP_BURSTS = 3
MIN_TCP_BURST_BYTES = 16 * 1024
#: pause lengths this many times apart are of different kinds (compute phase vs pause inside a sync)
WIDE_BREAK = 4.0
#: a cut between pauses less than this far apart in length is no break between kinds of pause
#: (a straggler's host alternating 69 and 70 ms pauses cut every second one as evenly as every one)
MIN_BREAK = 1.1
#: complete iterations a capture must hold before its iterations are judged
MIN_ITERATIONS = 6


@dataclass
class FlowGroup:
    """A communication group seen on the network, at host level (ring/chain order)."""

    kind: str  # dp (ring), pp (chain), ep (mesh), tp (a ring's hops between the hosts it spans)
    hosts: list[str]
    edges: list[tuple[str, str]]  # directed endpoint (ip) edges that carry its data

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "hosts": self.hosts, "edges": len(self.edges)}


@dataclass
class FlowJob:
    """One recognised job: its endpoints, hosts, groups and reconstructed iterations."""

    name: str
    endpoints: list[str]
    hosts: list[str]
    groups: list[FlowGroup]
    iterations: pd.DataFrame  # step, start_ns, end_ns, duration_s, complete
    notes: list[str] = field(default_factory=list)

    def parallelism(self) -> dict[str, int]:
        """Visible parallel degrees in hosts: ring length (dp), chain length (pp), mesh size (ep)."""
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.kind] = max(out.get(g.kind, 1), len(g.hosts))
        return out

    def to_dict(self) -> dict[str, object]:
        it = self.iterations
        return {
            "job": self.name, "endpoints": len(self.endpoints), "hosts": self.hosts,
            "parallelism": self.parallelism(), "groups": [g.to_dict() for g in self.groups],
            "iterations": int(it["complete"].sum()) if len(it) else 0,
            "median_iteration_s": float(it.loc[it["complete"], "duration_s"].median()) if it["complete"].any() else None,
            "notes": self.notes,
        }


@dataclass
class FlowTimeline:
    jobs: list[FlowJob]
    host_of: dict[str, str]
    notes: list[str] = field(default_factory=list)
    flows: pd.DataFrame | None = None  # the collective traffic the jobs were recognised from

    def job(self, name: str | None = None) -> FlowJob | None:
        """The named job, else the largest one."""
        if name is not None:
            for j in self.jobs:
                if j.name == name:
                    return j
        return max(self.jobs, key=lambda j: len(j.endpoints)) if self.jobs else None


def collective_traffic(flows: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """The bursts of collective communication, and how many bursts of other traffic were set aside.

    RoCEv2 is kept. Other UDP (DNS, QUIC, NTP, ...) is not collective traffic. A TCP connection is
    kept when neither end is a privileged or well-known service port (NCCL and gloo sockets listen
    on ephemeral ports) and it carries at least MIN_TCP_BURSTS data bursts of MIN_TCP_BURST_BYTES
    (median): collectives move large buffers again and again, control and interactive traffic does not.
    """
    if flows.empty:
        return flows, {}
    proto = flows["proto"].to_numpy()
    sport, dport = flows["src_port"].to_numpy(), flows["dst_port"].to_numpy()
    keep = proto == "roce"
    tcp = proto == "tcp"
    low, high = np.minimum(sport, dport), np.maximum(sport, dport)
    service = (low < 1024) | np.isin(sport, list(SERVICES)) | np.isin(dport, list(SERVICES))
    cand = tcp & ~service
    if cand.any():
        f = flows[cand]
        a_first = (f["src_ip"] < f["dst_ip"]) | ((f["src_ip"] == f["dst_ip"]) & (f["src_port"] <= f["dst_port"]))
        conn = pd.DataFrame({"a": f["src_ip"].where(a_first, f["dst_ip"]), "b": f["dst_ip"].where(a_first, f["src_ip"]),
                             "lo": np.minimum(f["src_port"], f["dst_port"]), "hi": np.maximum(f["src_port"], f["dst_port"])})
        data = f["bytes"] >= MIN_DATA_PACKET * f["packets"]
        stats = conn[data.to_numpy()].assign(bytes=f.loc[data, "bytes"].to_numpy()).groupby(
            ["a", "b", "lo", "hi"])["bytes"].agg(["size", "median"])
        good = stats[(stats["size"] >= MIN_TCP_BURSTS) & (stats["median"] >= MIN_TCP_BURST_BYTES)].index
        ok = pd.MultiIndex.from_frame(conn).isin(good)
        keep[np.flatnonzero(cand)[ok]] = True
    dropped: dict[str, int] = {}
    counts: dict = {}
    if (~keep).any():
        port = np.where(np.isin(low, list(SERVICES)), low, high)
        names = np.where(tcp | (proto == "udp"), [SERVICES.get(int(p), "") for p in port], "")
        label = np.where(names != "", names, np.where(tcp & ~service, "tcp (not collective-shaped)", proto))
        counts = pd.Series(label[~keep]).value_counts().to_dict()
    dropped = {str(k): int(v) for k, v in counts.items()}
    return flows[keep], dropped


def too_short(job: FlowJob) -> str | None:
    """Why a job's iterations cannot be judged yet (too few complete ones in the capture), else None."""
    it = job.iterations
    done = int(it["complete"].sum()) if len(it) else 0
    if done >= MIN_ITERATIONS:
        return None
    if not done:
        return (f"capture too short: job {job.name} shows too few of the pauses between iterations to cut one, "
                f"need {MIN_ITERATIONS} complete iterations to judge any")
    typical = float(it.loc[it["complete"], "duration_s"].median())
    span = float(it["end_ns"].max() - it["start_ns"].min()) / 1e9
    return (f"capture too short: {done} complete iteration(s) of job {job.name} in {span:.2f} s, need "
            f"{MIN_ITERATIONS} to judge any; capture at least ~{(MIN_ITERATIONS + 2) * typical:.1f} s")


def endpoint_hosts(meta: JobMeta | None, ips: np.ndarray) -> dict[str, str]:
    """ip -> host, from meta.json ranks where known; an unknown endpoint is its own host."""
    known = {r.ip: r.host for r in meta.ranks.values() if r.ip} if meta is not None else {}
    return {ip: known.get(ip, ip) for ip in pd.unique(ips)}


def data_edges(flows: pd.DataFrame) -> pd.DataFrame:
    """Directed endpoint edges carrying data: bytes, packets, bursts, and the reverse bytes."""
    e = flows.groupby(["src_ip", "dst_ip"], sort=False).agg(
        bytes=("bytes", "sum"), packets=("packets", "sum"), bursts=("bytes", "size")).reset_index()
    e = e[e["bytes"] >= MIN_DATA_PACKET * e["packets"]]
    rev = e.set_index(["src_ip", "dst_ip"])["bytes"]
    idx = pd.MultiIndex.from_arrays([e["dst_ip"], e["src_ip"]])
    e = e.assign(rev_bytes=rev.reindex(idx).fillna(0).to_numpy())
    return e.reset_index(drop=True)


def recognize_jobs(edges: pd.DataFrame, host_of: dict[str, str]) -> list[list[str]]:
    """Connected components (union-find) over data edges plus same-host endpoints."""
    ips = sorted(host_of, key=_natural_key)
    if not ips:
        return []
    index = {ip: i for i, ip in enumerate(ips)}
    hosts = {h: i for i, h in enumerate(sorted(set(host_of.values())))}
    n = len(ips)
    # endpoints are nodes 0..n-1, hosts are nodes n..: every endpoint joins its host's node
    src = np.concatenate([edges["src_ip"].map(index).to_numpy(dtype=np.int64), np.arange(n)])
    dst = np.concatenate([edges["dst_ip"].map(index).to_numpy(dtype=np.int64),
                          n + np.asarray([hosts[host_of[ip]] for ip in ips], dtype=np.int64)])
    m = n + len(hosts)
    label = components(m, src, dst)
    active = set(edges["src_ip"]) | set(edges["dst_ip"])
    comps: dict[int, list[str]] = {}
    for ip in ips:
        comps.setdefault(int(label[index[ip]]), []).append(ip)
    jobs = [c for c in comps.values() if active.intersection(c)]
    return sorted(jobs, key=lambda c: _natural_key(host_of[c[0]]))


def infer_groups(edges: pd.DataFrame, host_of: dict[str, str], flows: pd.DataFrame | None = None) -> list[FlowGroup]:
    """Rings from one-way edges, chains and meshes from two-way edges, all at host level.

    A two-way pair is a data-parallel ring of two hosts when both directions run at once and
    each carries at most about two transfers per iteration (the gradient sync, possibly split
    by a stall); a pipeline edge carries one transfer per microbatch each way, many per
    iteration, whether sends are eager, rendezvous or batched.
    """
    e = edges.assign(sh=edges["src_ip"].map(host_of), dh=edges["dst_ip"].map(host_of))
    e = e[(e["sh"] != e["dh"]) & (e["bytes"] >= ONE_WAY * e["rev_bytes"])]  # drop the minor side of one-way pairs
    e = e[e["bytes"] >= MINOR_SHARE * e["bytes"].max()] if len(e) else e  # one-off transfers (setup broadcasts)
    one_way = e["rev_bytes"] < ONE_WAY * e["bytes"]
    ring_hops, split_hops = _split_ring_hops(e[one_way])
    rings = _rings(ring_hops) + _rings(split_hops, kind="tp")
    two = e[~one_way]
    pair_groups: list[FlowGroup] = []
    if flows is not None and len(two):
        pair_of = pd.Series([tuple(sorted(x, key=_natural_key)) for x in zip(two["sh"], two["dh"], strict=True)],
                            index=two.index)
        by_pair: dict[tuple[str, str], pd.DataFrame] = {
            cast(tuple[str, str], pair): two.loc[idx] for pair, idx in two.groupby(pair_of, sort=False).groups.items()}
        on_edge = _rows_by_edge(flows)
        timing = flows[["start_ns", "end_ns", "bytes"]]  # (rows taken from Arrow string columns cost a ms a take)
        sim, counts = _simultaneity(timing, on_edge, by_pair)
        iterations = _iteration_count(timing, on_edge, rings, [list(zip(k["src_ip"], k["dst_ip"], strict=True))
                                                              for k in by_pair.values()])
        for pair in sim.index:
            if sim[pair] >= 0.5 and counts[pair] <= SYNCS_PER_ITERATION * iterations:
                key = by_pair[pair]
                pair_groups.append(FlowGroup("dp", list(pair), list(zip(key["src_ip"], key["dst_ip"], strict=True))))
        taken = {tuple(g.hosts) for g in pair_groups}
        two = two[[pair not in taken for pair in pair_of]]
    groups = rings + pair_groups + _pairs(two)
    return sorted(groups, key=lambda g: (["dp", "pp", "ep", "tp"].index(g.kind), _natural_key(g.hosts[0])))


def _iteration_count(flows: pd.DataFrame, on_edge: dict[tuple[str, str], np.ndarray], rings: list[FlowGroup],
                     pairs: list[list[tuple[str, str]]]) -> int:
    """Iterations in the capture: syncs of the rings of three or more hosts; without rings, the fewest
    pauses any two-way pair (or all traffic) shows, since a pipeline edge may pause between microbatches
    as long as between iterations but a ring of two pauses only between its syncs."""
    def cycles(edges: list[tuple[str, str]]) -> int:
        return int(sync_anchors(_flows_on(flows, on_edge, edges)).size)
    if rings:  # every ring syncs every iteration: a few of the longest tell the count
        return max(cycles(g.edges) for g in sorted(rings, key=lambda g: -len(g.hosts))[:RINGS_COUNTED])
    return min([int(sync_anchors(flows).size)] + [cycles(e) for e in pairs])


def _rows_by_edge(flows: pd.DataFrame) -> dict[tuple[str, str], np.ndarray]:
    """Row positions of each directed endpoint edge's flows, from one grouping: selecting each
    edge's rows by comparison costs edges x flows, minutes at thousands of GPUs."""
    src, dst = flows["src_ip"].astype(str).to_numpy(), flows["dst_ip"].astype(str).to_numpy()
    groups = pd.DataFrame({"s": src, "d": dst}).groupby(["s", "d"], sort=False).indices
    return {(str(a), str(b)): np.asarray(idx) for (a, b), idx in cast(dict[tuple[str, str], np.ndarray], groups).items()}


def _flows_on(flows: pd.DataFrame, on_edge: dict[tuple[str, str], np.ndarray], edges: list[tuple[str, str]]) -> pd.DataFrame:
    """The flows of some edges, in the table's order."""
    found = [on_edge[(str(a), str(b))] for a, b in edges if (str(a), str(b)) in on_edge]
    return flows.iloc[np.sort(np.concatenate(found))] if found else flows.iloc[:0]


def _simultaneity(flows: pd.DataFrame, on_edge: dict[tuple[str, str], np.ndarray],
                  by_pair: dict[tuple[str, str], pd.DataFrame]) -> tuple[pd.Series, dict]:
    """Per two-way host pair: share of active time both directions run at once; transfers of its rarer direction."""
    sims, counts = {}, {}
    for (a, b), one in by_pair.items():
        one = one[(one["sh"] == a) & (one["dh"] == b)]
        if one.empty:
            continue
        s_ip, d_ip = one.iloc[0]["src_ip"], one.iloc[0]["dst_ip"]  # one endpoint pair stands for the hosts
        fw = _flows_on(flows, on_edge, [(s_ip, d_ip)])
        bw = _flows_on(flows, on_edge, [(d_ip, s_ip)])
        if fw.empty or bw.empty:
            continue
        t_f, t_b = _busy(fw), _busy(bw)
        t_u = _busy(pd.concat([fw, bw]))
        sims[(a, b)] = (t_f + t_b - t_u) / max(min(t_f, t_b), 1)
        counts[(a, b)] = min(int(_activity(fw)[0].size), int(_activity(bw)[0].size))
    return pd.Series(sims, dtype=np.float64), counts


def _busy(f: pd.DataFrame) -> int:
    s, e, _ = _activity(f)
    return int((e - s).sum())


def _components(pairs: pd.DataFrame) -> list[pd.DataFrame]:
    hosts = sorted(set(pairs["sh"]) | set(pairs["dh"]), key=_natural_key)
    if not hosts:
        return []
    idx = {h: i for i, h in enumerate(hosts)}
    a, b = pairs["sh"].map(idx).to_numpy(), pairs["dh"].map(idx).to_numpy()
    label = components(len(hosts), a, b)
    lab = pd.Series(label[a], index=pairs.index)
    return [pairs[lab == k] for k in sorted(set(label[a].tolist()))]


def _split_ring_hops(e: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One-way edges of rings that close over the network, and the hops of rings that close inside
    hosts (a tensor-parallel group split across hosts: its other hops are NVLink).

    A data-parallel ring whose every hop crosses hosts is a cycle of endpoints; a TP ring of two
    hosts reaches the network in two hops, from one GPU to another and back from a third to a
    fourth, which close no cycle of endpoints. At host level the two are joined (both pass through
    the same hosts), and the TP hops, busy in every layer, would cut the DP ring's syncs into
    layers. Split only when some rings close over the network: with none (every ring also passes
    inside hosts, or enters and leaves a host by different NICs), endpoints tell nothing."""
    if e.empty:
        return e, e
    ips = pd.unique(pd.concat([e["src_ip"], e["dst_ip"]]))
    index = {ip: i for i, ip in enumerate(ips)}
    cyc = on_cycle(len(ips), e["src_ip"].map(index).to_numpy(), e["dst_ip"].map(index).to_numpy())
    if not cyc.any() or cyc.all():
        return e, e.iloc[:0]
    return e[cyc], e[~cyc]


def _rings(e: pd.DataFrame, kind: str = "dp") -> list[FlowGroup]:
    out = []
    for comp in _components(e):
        succ = comp.groupby("sh")["dh"].agg(lambda s: sorted(set(s)))
        hosts = sorted(set(comp["sh"]) | set(comp["dh"]), key=_natural_key)
        order = [hosts[0]]
        while len(order) < len(hosts):  # follow successors around the cycle
            nxt = succ.get(order[-1], [])
            step = next((h for h in nxt if h not in order), None)
            if step is None:
                break
            order.append(step)
        if len(order) < len(hosts):
            order = hosts
        out.append(FlowGroup(kind, order, list(zip(comp["src_ip"], comp["dst_ip"], strict=True))))
    return out


def _pairs(e: pd.DataFrame) -> list[FlowGroup]:
    out = []
    for comp in _components(e):
        hosts = sorted(set(comp["sh"]) | set(comp["dh"]), key=_natural_key)
        und = {tuple(sorted(p)) for p in zip(comp["sh"], comp["dh"], strict=True)}
        deg = pd.Series([h for p in und for h in p]).value_counts()
        edges = list(zip(comp["src_ip"], comp["dst_ip"], strict=True))
        if len(und) >= len(hosts) or int(deg.max()) > 2:
            out.append(FlowGroup("ep", hosts, edges))
            continue
        # a chain: walk from an end; stage 0 is the end whose data is sent first
        ends = [h for h in hosts if deg.get(h, 0) == 1] or hosts[:1]
        nbr: dict[str, list[str]] = {}
        for a, b in und:
            nbr.setdefault(a, []).append(b)
            nbr.setdefault(b, []).append(a)
        order = [ends[0]]
        while len(order) < len(hosts):
            step = next((h for h in nbr.get(order[-1], []) if h not in order), None)
            if step is None:
                break
            order.append(step)
        out.append(FlowGroup("pp", order, edges))
    return out


def _activity(flows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge burst intervals into activity intervals (overlapping bursts join): start, end, bytes."""
    f = flows.sort_values("start_ns")
    s, e, b = f["start_ns"].to_numpy(), f["end_ns"].to_numpy(), f["bytes"].to_numpy()
    run_end = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    starts = np.flatnonzero(new)
    if not starts.size:
        return s, e, b
    return s[starts], np.maximum.reduceat(e, starts), np.add.reduceat(b, starts)


def _gap_threshold(gaps: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """The pause that separates iterations, and the bytes one iteration synchronises.

    Every iteration synchronises the same gradient volume, so a good threshold cuts the
    activity into segments of even bytes -- most of them: evenness is the interquartile spread
    over the median, so a phase where a straggler's stall splits each synchronisation in two
    cannot outvote the rest. Among candidate thresholds (between consecutive
    distinct pauses, pauses shorter than a burst gap counting as one) keep those whose
    segments are about as even as the most even cut, and of these take the coarsest: cutting
    between the phases of one sync (a reduce-scatter and its all-gather, a bucket and the next)
    also gives even parts, at pauses shorter than the compute between iterations, which may
    stretch past a burst gap by any factor while a straggler or a slow link holds its ring.
    The coarsest that is a break (pauses MIN_BREAK apart on either side): where iterations'
    pauses alternate a little, cutting only the longer of each pair is as even, two at a time.
    """
    g = np.maximum(gaps, GAP_FLOOR_NS)
    levels = np.unique(np.quantile(g, np.linspace(0.0, 1.0, 257))) if g.size > 256 else np.unique(g)
    cum = np.concatenate([[0.0], np.cumsum(b, dtype=np.float64)])
    if levels.size < 2:
        return 0.0, float(np.median(b))
    scored = []
    for lo, hi in zip(levels[:-1].tolist(), levels[1:].tolist(), strict=True):
        cuts = np.flatnonzero(g > lo)
        if cuts.size < 8:
            continue
        seg = np.diff(cum[cuts + 1])  # whole segments between consecutive cuts (the first is partial)
        q1, med, q3 = np.quantile(seg, [0.25, 0.5, 0.75])
        scored.append((float((q3 - q1) / med), float(np.sqrt(lo * hi)), float(med), hi / lo >= MIN_BREAK))
    if not scored:
        return 0.0, float(np.median(b))
    best = min(x[0] for x in scored)
    even = [x for x in scored if x[0] <= best + 0.02]
    _, thr, vol, _ = max([x for x in even if x[3]] or even, key=lambda x: x[1])
    # the widest break between pause lengths separates compute phases from pauses inside a sync;
    # when the capture holds too few of those long pauses to score them, yet they are a regular
    # part of the traffic (not a rare checkpoint stall), a cut below them splits iterations into
    # their phases: the capture is too short to show iterations at all
    ratios = np.log(levels[1:] / levels[:-1])
    w = int(np.argmax(ratios))
    wide = float(np.sqrt(levels[w] * levels[w + 1]))
    n_long, n_cut = int((g > wide).sum()), int((g > thr).sum())
    if ratios[w] >= np.log(WIDE_BREAK) and thr < wide and n_long < 8 and n_long >= 0.2 * n_cut:
        return float("nan"), float("nan")
    return thr, vol


def sync_anchors(flows: pd.DataFrame) -> np.ndarray:
    """End times of the synchronisation bursts that close each iteration, for one group's flows.

    Every iteration synchronises about the same volume V, and the pause that ends it (the
    next forward and backward pass) comes when that volume has gone by. So among the long
    pauses (at least half the longest, or half an iteration's pause) that fall between three
    quarters and one and a quarter of V after the previous end, the iteration ends at the first
    one after nine tenths of V (else the one closest to V): a stall just after the next
    iteration's first chunks (peers waiting for a straggler) can be many times longer than the
    pause between iterations, but comes later.
    """
    if flows.empty:
        return np.zeros(0, dtype=np.int64)
    s, e, b = _activity(flows)
    if s.size == 1:
        return e
    gaps = (s[1:] - e[:-1]).astype(np.float64)
    _, vol = _gap_threshold(gaps, b)
    if np.isnan(vol):  # too few pauses between iterations to tell them from pauses inside one
        return np.zeros(0, dtype=np.int64)
    cum = np.cumsum(b, dtype=np.float64)  # cum[i]: bytes up to the end of interval i (gap i follows it)
    after = np.append(gaps, gaps.max())  # the end of the capture counts as a long pause
    # the capture holds about cum/V iterations, each ended by a pause: the shortest of them is
    # about the cum/V-th longest pause (stalls for a straggler only add to the longer ones)
    every = int(np.clip(round(cum[-1] / vol), 1, after.size))
    iteration_pause = float(np.partition(after, after.size - every)[after.size - every])
    out = []
    base = 0.0
    while True:
        lo, hi = (int(x) for x in np.searchsorted(cum, [base + 0.75 * vol, base + 1.25 * vol]))
        if lo >= s.size:
            break
        window = after[lo:max(hi, lo + 1)]
        at = cum[lo:lo + window.size] - base
        long = window >= 0.5 * min(float(window.max()), iteration_pause)
        done = np.flatnonzero(long & (at >= 0.9 * vol))
        end = lo + (int(done[0]) if done.size else int(np.argmin(np.where(long, np.abs(at - vol), np.inf))))
        out.append(e[end])
        base = float(cum[end])
        if end == s.size - 1:
            break
    return np.asarray(out, dtype=np.int64)


def _nearest(sorted_times: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each time in t, the nearest of sorted_times (which is not empty)."""
    pos = np.clip(np.searchsorted(sorted_times, t), 1, max(sorted_times.size - 1, 1))
    cand = np.stack([sorted_times[pos - 1], sorted_times[np.minimum(pos, sorted_times.size - 1)]])
    return cand[np.argmin(np.abs(cand - t), axis=0), np.arange(t.size)]


def _align(ref: np.ndarray, other: np.ndarray, period: float) -> np.ndarray:
    """For each reference anchor, the nearest anchor of another group within half a period (else -1).

    The groups' offset is the median distance to the nearest anchor, either side: rings that
    end together, a hair before or after one another, must not read as half a period apart
    (the next anchor after each read 0 or a whole period, and their median half of one).
    """
    if other.size == 0:
        return np.full(ref.size, -1, dtype=np.int64)
    shift = float(np.median(_nearest(other, ref) - ref)) if ref.size else 0.0
    shift = shift if abs(shift) < period / 2 else 0.0
    best = _nearest(other, ref + shift)
    return np.where(np.abs(best - ref - shift) < period / 2, best, -1)


def flows_of_groups(flows: pd.DataFrame, groups: list[FlowGroup]) -> list[pd.DataFrame]:
    """Each group's flows (those on its edges, in the table's order), from one grouping of the
    table by edge: a join per group costs groups x flows, hours at 8,192 GPUs."""
    on_edge = _rows_by_edge(flows)
    return [_flows_on(flows, on_edge, g.edges).reset_index(drop=True) for g in groups]


def reconstruct_iterations(flows: pd.DataFrame, groups: list[FlowGroup]) -> pd.DataFrame:
    """Iterations from the periodic data-parallel synchronisation (else from all of the job's bursts).

    Each data-parallel ring gives the end of its last synchronisation burst per iteration; rings
    are aligned by time and the iteration ends when the last ring finishes. The first iteration's
    start is only the job's first burst, so it is marked incomplete.
    """
    flows = flows[flows["bytes"] >= MIN_DATA_PACKET * flows["packets"]]  # data, not acknowledgements
    rings = [g for g in groups if g.kind == "dp"]
    anchors = [sync_anchors(f) for f in flows_of_groups(flows, rings)] if rings else [sync_anchors(flows)]
    ref = max(anchors, key=lambda a: a.size)
    cols = ["step", "start_ns", "end_ns", "duration_s", "complete"]
    if ref.size == 0:
        return pd.DataFrame(columns=cols)
    period = float(np.median(np.diff(ref))) if ref.size > 1 else float("inf")
    ends = ref.copy()
    for a in anchors:
        m = _align(ref, a, period)
        ends = np.where(m > ends, m, ends)
    first = int(flows["start_ns"].min())
    starts = np.concatenate([[first], ends[:-1]])
    return pd.DataFrame({
        "step": np.arange(ends.size), "start_ns": starts, "end_ns": ends,
        "duration_s": (ends - starts) / 1e9, "complete": np.arange(ends.size) > 0,
    })


def build_flow_timeline(flows: pd.DataFrame, meta: JobMeta | None = None) -> FlowTimeline:
    """Recognise every job in a flow table (its collective traffic only), its groups, and its iterations."""
    flows, dropped = collective_traffic(flows)
    notes = [f"set aside {sum(dropped.values()):,} burst(s) of traffic that is not collective communication: "
             + ", ".join(f"{k} {v:,}" for k, v in sorted(dropped.items(), key=lambda x: -x[1]))] if dropped else []
    if flows.empty:
        notes.append("no collective-communication traffic (RoCEv2, or NCCL/gloo-shaped TCP): no training job found")
    host_of = endpoint_hosts(meta, np.concatenate([flows["src_ip"].to_numpy(), flows["dst_ip"].to_numpy()]))
    edges = data_edges(flows)
    meta_ips = {r.ip for r in meta.ranks.values() if r.ip} if meta is not None else set()
    jobs = []
    for i, endpoints in enumerate(recognize_jobs(edges, host_of)):
        ep = set(endpoints)
        je = edges[edges["src_ip"].isin(ep) & edges["dst_ip"].isin(ep)]
        jf = flows[flows["src_ip"].isin(ep) & flows["dst_ip"].isin(ep)]
        jf = jf[jf.set_index(["src_ip", "dst_ip"]).index.isin(je.set_index(["src_ip", "dst_ip"]).index)]
        groups = infer_groups(je, host_of, jf)
        name = meta.job if meta is not None and meta_ips and ep & meta_ips else f"job-{i}"
        job_notes = [TP_NOTE]
        if not any(g.kind == "dp" for g in groups):
            job_notes.append("no data-parallel ring seen: iterations are cut at the longest pauses of all traffic")
        hosts = sorted({host_of[x] for x in endpoints}, key=_natural_key)
        jobs.append(FlowJob(name, endpoints, hosts, groups, reconstruct_iterations(jf, groups), job_notes))
    return FlowTimeline(jobs, host_of, notes, flows)
