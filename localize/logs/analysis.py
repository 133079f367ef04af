"""Log-based failure localization (L4): failure-indicating lines, faulty nodes, stage and iteration.

Three patterns, after parsing with Drain (collector.logs):
- cross-job: events also seen in successful jobs (localize.logs.pool) are not failure-indicating;
- spatial: nodes run the same workload, so an isolation forest over per-node counts of the
  remaining events ranks the node whose logs differ; the events behind the difference explain it;
- temporal: iterations repeat, so an iteration whose event sequence departs from the previous
  ones (DTW, three-sigma) is where the failure shows; the stage comes from marker rules.
A line is failure-indicating when its event is unknown to successful jobs and it sits outside the
repeating training rhythm (init, loading, checkpoint or teardown), in an anomalous iteration, or
among the events that set the most suspicious node apart.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collector.logs import ParsedLogs, parse_logs
from collector.trace.traceio import Trace
from localize.logs.pool import EventPool
from localize.logs.temporal import STAGES, line_stages, temporal
from localize.verdict import Candidate, Verdict

#: root-cause kind of a failure-indicating line, first match wins (hardware before symptoms)
KIND_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # NVIDIA driver Xid events, uncorrectable ECC, NVLink, GSP, a GPU gone from the bus or its PCIe errors
    ("gpu", re.compile(r"(?i)\bxid\b|nvrm|\becc\b|fallen off the bus|double bit|\bdbe\b|\bgsp\b|nvlink|\bnvlw\b"
                       r"|row remap|nvidia \S+: aer:|cuda error: (?!out of memory)")),
    # RDMA/IB: verbs completion statuses (ibv_wc_status: 5 flush, 10 remote access, 12 retry exceeded,
    # 13 RNR retry exceeded), HCA and port events, link and cable faults, UCX/NCCL network errors
    ("nic", re.compile(r"(?i)mlx(?:\d|<NUM>)|\bcqe\b|cq error|link down|port error|port_err|ibv_|\bwc status"
                       r"|status=(?:5|10|12|13)\b|retry count(?:er)? exceeded|rnr retry|completion from peer"
                       r"|completion with error|vendor err|pcs_err|\broce\b|cable|\bhca\b|ib_event|async event")),
    # the host: OOM killer (kernel, cgroup, Slurm, Kubernetes), machine checks and uncorrected memory, disks,
    # lockups, a node the scheduler lost
    ("host", re.compile(r"(?i)oom-kill|oom_kill|oomkill|out of memory: killed|memory cgroup out of memory"
                        r"|invoked oom-killer|\bevicted\b|low on resource|i/o error|ext4-fs error|nvme|blk_update"
                        r"|machine check|mce:|hardware error|\bue memory|uncorrected hardware memory|memory failure"
                        r"|sigbus|bus error|kernel panic|lockup|hung_task|blocked for more than|heartbeat"
                        r"|input/output error|exitcode: -9\b|sigkill|nodenotready|not responding|node failure"
                        r"|failed node")),
    ("data", re.compile(r"(?i)\bnan\b|\binf\b|diverg|loss scale|loss is probably exploding")),
)
HARDWARE = ("gpu", "nic", "host")
_FRAMEWORK_EXC = re.compile(r"\b(?:TypeError|AttributeError|KeyError|IndexError|NotImplementedError|UnboundLocalError)\b")
_RANK = re.compile(r"\[rank(\d+)\]")
_PCI = re.compile(r"PCI:[0-9a-fA-F]{4}:([0-9a-fA-F]{2}):")
_BUSID = re.compile(r"cudaDev (\d+).*busId ([0-9a-fA-F]+)")
_IP = re.compile(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b")
EVIDENCE_LINES = 5
MAX_LINES_OUT = 2000


@dataclass
class NodeScore:
    host: str
    score: float  # 0..1, isolation-forest anomaly (1 = most isolated)
    distinct: float  # how far its event counts are from the other nodes'
    kind: str | None
    events: list[int] = field(default_factory=list)  # events that set it apart, most telling first
    mentioned: int = 0  # failure lines on other nodes that name this node
    named_as: str | None = None  # the kind those lines report (nic for "completion from peer ... status=12")
    hardware: float = 0.0  # hardware-fault lines of its own or naming it


@dataclass
class LogAnalysis:
    """Everything L4 extracts from one job's logs."""

    logs: ParsedLogs
    suspect: np.ndarray  # bool [lines]: event unknown to successful jobs
    failure: np.ndarray  # bool [lines]: failure-indicating
    stage_of_line: np.ndarray  # int8 [lines] index into STAGES
    nodes: list[NodeScore]  # ranked, most suspicious first
    node_found: bool  # one node stands out (a local fault) rather than all failing alike
    kind: str | None  # gpu, nic, host, config, data; None when nothing failed
    category: str | None  # hardware, network, user, framework
    stage: str | None
    iteration: int | None
    anomalous_iterations: list[int]
    pool_jobs: int

    def failure_lines(self) -> list[str]:
        return [self.logs.where(i) for i in np.flatnonzero(self.failure).tolist()]


def analyze_logs(trace: Trace, pool: EventPool | None = None, resume: int = 3) -> LogAnalysis:
    """Run L4 on a trace's logs; `resume`: iterations a host must run on for an earlier line to be benign."""
    meta = trace.meta
    logs = parse_logs(trace.log_files(), root=trace.path, nodes=meta.hosts(),
                      rank_host={r: info.host for r, info in meta.ranks.items()})
    pool = EventPool.default() if pool is None else pool
    normal_shape = pool.normal_shapes(logs) if len(pool) else np.zeros(len(logs.shapes), dtype=bool)
    suspect = ~normal_shape[logs.shape] if len(logs) else np.zeros(0, dtype=bool)
    stage = line_stages(logs, ~suspect if len(pool) else np.ones(len(logs), dtype=bool))
    event = logs.event
    n_hosts = len(logs.hosts)
    n_events = len(logs.templates)

    # temporal: iterations that depart from the ones before them; lines the job got past are benign
    look = sorted(set(np.unique(logs.host[suspect]).tolist()))[:64]
    tmp = temporal(logs, stage, look)
    flagged = np.zeros(len(logs), dtype=bool)
    for h, its in tmp.flagged.items():
        if its:
            flagged |= (logs.host == h) & np.isin(logs.iteration, its)
    # inside the training rhythm a line counts only if its iteration departs (the first iterations on a
    # host have no history to compare with, so they are not part of the rhythm)
    rhythm = (stage == STAGES.index("training")) & _with_history(logs)
    resumed, final = _progress(logs, stage, suspect, resume, _ranks_per_host(trace, logs))
    cand = suspect & ~resumed & (~rhythm | flagged | final) & _new_here(logs)

    # spatial: per-node counts of the candidate events, plus how often other nodes' lines name the node
    counts = np.zeros((n_hosts, n_events))
    np.add.at(counts, (logs.host[cand], event[cand]), 1.0)
    named = _named(trace, logs, cand)
    mentioned = np.zeros(n_hosts)
    for hs in named.values():
        for h in hs:
            mentioned[h] += 1
    real = logs.nodes if logs.nodes.size else np.ones(n_hosts, dtype=bool)  # not an aggregated file's own lines
    nodes, node_found = _rank_nodes([h for h, ok in zip(logs.hosts, real, strict=True) if ok], counts[real],
                                    mentioned[real])
    # nodes with hardware errors of their own, or named by other nodes' hardware errors, come first
    # (a report about a peer, e.g. "completion from peer 10.0.3.14 with error", counts against the peer)
    hw = np.zeros(n_hosts)
    named_as: dict[int, Counter[str]] = {}  # what kind of fault other nodes' lines report about a node
    for i in np.flatnonzero(cand).tolist():
        k = _kind_of([logs.text(i)])
        if k in HARDWARE:
            for h in named.get(i) or {int(logs.host[i])}:
                hw[h] += 1
            for h in named.get(i, ()):
                named_as.setdefault(h, Counter())[k] += 1
    hw[~real] = 0
    where = {h: i for i, h in enumerate(logs.hosts)}
    for nd in nodes:
        said = named_as.get(where[nd.host])
        nd.named_as = said.most_common(1)[0][0] if said else None
        nd.hardware = float(hw[where[nd.host]])
    if hw.max() > 0:
        nodes.sort(key=lambda nd: -hw[where[nd.host]])
        node_found = True
    failure = cand.copy()
    if node_found and nodes and n_hosts > 1:
        # the suspicious node's own unknown events that no other node shows: precursors, e.g. ECC warnings
        top = logs.hosts.index(nodes[0].host)
        elsewhere = np.zeros(n_events, dtype=bool)
        elsewhere[np.unique(event[suspect & (logs.host != top)])] = True
        apart = suspect & (logs.host == top) & ~elsewhere[event]
        # a warning that keeps coming back on that node (once could be a benign hiccup)
        repeats = np.bincount(event[apart], minlength=n_events)
        apart &= (repeats[event] >= 2) | cand
        failure |= apart
        nodes[0].events = sorted(set(nodes[0].events) | set(np.unique(event[apart]).tolist()))

    kind, category = _classify(logs, failure, nodes, node_found)
    stage_name, iteration, anomalous = _when(logs, cand if cand.any() else failure, flagged, stage, nodes,
                                             node_found)
    return LogAnalysis(logs, suspect, failure, stage, nodes, node_found, kind, category, stage_name, iteration,
                       anomalous, len(pool.jobs))


def _new_here(logs: ParsedLogs) -> np.ndarray:
    """Lines whose event had not appeared on their host in an earlier iteration (L4: what this
    iteration has that the previous ones did not)."""
    it = logs.iteration.astype(np.int64)
    key = logs.host.astype(np.int64) * len(logs.templates) + logs.event
    first = np.full(len(logs.hosts) * len(logs.templates), np.iinfo(np.int64).max)
    ok = it >= 0
    np.minimum.at(first, key[ok], it[ok])
    return ~ok | (first[key] >= it)


def _ranks_per_host(trace: Trace, logs: ParsedLogs) -> np.ndarray:
    count = Counter(info.host for info in trace.meta.ranks.values())
    return np.array([max(1, count.get(h, 1)) for h in logs.hosts], dtype=np.int64)


def _progress(logs: ParsedLogs, stage: np.ndarray, suspect: np.ndarray, k: int,
              ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(resumed, final) per line. Resumed: its host went on normally afterwards (>= k more iterations,
    a later stage begun by a known line, a normal teardown, or, before training, two known lines per
    rank). Final: in the host's last iteration of a run that never ended normally."""
    if not len(logs):
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    n_hosts = len(logs.hosts)
    it = logs.iteration.astype(np.int64)
    last_it = np.full(n_hosts, -1, dtype=np.int64)
    np.maximum.at(last_it, logs.host, it)
    more = last_it[logs.host] - it >= k
    pos = np.arange(len(logs))
    normal = ~suspect
    ends = normal & (stage == STAGES.index("teardown"))
    last_end = np.full(n_hosts, -1, dtype=np.int64)
    np.maximum.at(last_end, logs.host[ends], pos[ends])
    later = np.zeros(len(logs), dtype=bool)
    for st in range(len(STAGES) - 1):
        nxt = normal & (stage > st) & (stage != STAGES.index("checkpoint"))
        last = np.full(n_hosts, -1, dtype=np.int64)
        np.maximum.at(last, logs.host[nxt], pos[nxt])
        later |= (stage == st) & (pos < last[logs.host])
    # known lines still to come on the same host (hosts are contiguous, in file order)
    normal_after = np.cumsum(normal[::-1])[::-1] - normal
    host_end = np.zeros(n_hosts, dtype=np.int64)
    np.maximum.at(host_end, logs.host, pos)
    after_host = normal_after - (np.cumsum(normal[::-1])[::-1][np.minimum(host_end[logs.host] + 1, len(logs) - 1)]
                                 * (host_end[logs.host] + 1 < len(logs)))
    early = stage <= STAGES.index("data loading")
    busy = early & (after_host >= 2 * ranks[logs.host])
    resumed = more | (pos < last_end[logs.host]) | later | busy
    final = (it == last_it[logs.host]) & (last_end[logs.host] < 0)
    return resumed, final


def _with_history(logs: ParsedLogs, need: int = 3) -> np.ndarray:
    """Lines whose iteration has at least `need` earlier iterations on the same host."""
    key = logs.host.astype(np.int64) * (1 << 32) + logs.iteration.astype(np.int64)
    new = np.r_[True, key[1:] != key[:-1]]
    starts = np.r_[True, logs.host[1:] != logs.host[:-1]] if logs.host.size else np.zeros(0, bool)
    seen = np.cumsum(new & (logs.iteration >= 0))
    base = np.maximum.accumulate(np.where(starts, seen - (new & (logs.iteration >= 0)), 0))
    return (logs.iteration >= 0) & (seen - base > need)


def _named(trace: Trace, logs: ParsedLogs, suspect: np.ndarray) -> dict[int, set[int]]:
    """Suspect lines that name *other* nodes (by host name or one of their IPs): line -> those nodes."""
    index = {h: i for i, h in enumerate(logs.hosts)}
    by_ip = {info.ip: index[info.host] for info in trace.meta.ranks.values() if info.ip and info.host in index}
    names = re.compile(r"\b(" + "|".join(re.escape(h) for h in sorted(index, key=len, reverse=True)) + r")\b") \
        if index else None
    out: dict[int, set[int]] = {}
    for i in np.flatnonzero(suspect).tolist():
        text = logs.text(i)
        own = int(logs.host[i])
        hit = {by_ip[ip] for ip in _IP.findall(text) if ip in by_ip}
        if names is not None:
            hit |= {index[m] for m in names.findall(text)}
        hit.discard(own)
        if hit:
            out[i] = hit
    return out


def _rank_nodes(names: list[str], counts: np.ndarray, mentioned: np.ndarray) -> tuple[list[NodeScore], bool]:
    """Isolation forest over per-node event vectors; returns nodes ranked and whether one stands out."""
    n = counts.shape[0]
    if n == 0:
        return [], False
    x = np.log1p(np.c_[counts, mentioned])
    med = np.median(x, axis=0)
    present = (x > 0).sum(axis=0)
    weight = np.log1p(n / np.maximum(present, 1))  # an event on few nodes says more than one on all
    dev = np.abs(x - med) * weight
    distinct = dev.sum(axis=1)
    if n >= 3 and x.shape[1] and np.ptp(x, axis=0).any():
        # slow to import, and only jobs with three or more nodes need it
        from sklearn.ensemble import IsolationForest

        forest = IsolationForest(n_estimators=200, max_samples=min(n, 256), random_state=0)
        forest.fit(x)
        iso = -forest.score_samples(x)  # 0..1, higher = easier to isolate
    else:
        iso = np.full(n, 0.5)
    # rank by isolation; break near-ties by how far the node is from the others
    order = np.lexsort((-distinct, -np.round(iso, 3)))
    spread = float(np.median(distinct))
    top = order[0]
    node_found = bool(distinct[top] > max(1.0, 3.0 * spread) and (n < 3 or iso[top] > np.median(iso) + 0.05))
    nodes = []
    for h in order.tolist():
        ev = np.flatnonzero((counts[h] > 0) & (dev[h, :-1] > 0) & (x[h, :-1] > med[:-1]))
        ev = ev[np.argsort(-dev[h, ev], kind="stable")]
        nodes.append(NodeScore(names[h], float(iso[h]), float(distinct[h]), None, ev.tolist(),
                               int(mentioned[h])))
    return nodes, node_found


def _kind_of(texts: list[str]) -> str | None:
    """The most specific kind any of the texts shows (gpu before nic before host before data)."""
    found = {k for t in texts for k, rx in KIND_RULES if rx.search(t)}
    for k, _ in KIND_RULES:
        if k in found:
            return k
    return None


def _node_lines(logs: ParsedLogs, failure: np.ndarray, host: str, events: list[int] | None,
                limit: int = 200) -> list[int]:
    """Failure lines of one node (of the given events only, unless None)."""
    h = logs.hosts.index(host)
    sel = (logs.host == h) & failure
    if events is not None:
        sel &= np.isin(logs.event, events)
    return np.flatnonzero(sel)[:limit].tolist()


def _classify(logs: ParsedLogs, failure: np.ndarray, nodes: list[NodeScore],
              node_found: bool) -> tuple[str | None, str | None]:
    if not failure.any():
        return None, None
    if node_found:
        for node in nodes[:8]:
            node.kind = (_kind_of([logs.text(i) for i in _node_lines(logs, failure, node.host, node.events)])
                         or _kind_of([logs.text(i) for i in _node_lines(logs, failure, node.host, None)]))
        top = nodes[0]
        if top.kind in HARDWARE:
            return top.kind, "network" if top.kind == "nic" else "hardware"
        if top.kind is None and top.mentioned:
            # the others name it: a node that went silent went away (host); one still logging its own failure
            # lines (timeouts) was reachable, so what the others report about it stands (its NIC)
            alive = bool(_node_lines(logs, failure, top.host, None, limit=1))
            top.kind = (top.named_as if alive else None) or "host"
            return top.kind, "network" if top.kind == "nic" else "hardware"
    texts = list({logs.shapes[s] for s in np.unique(logs.shape[failure]).tolist()})
    if any(KIND_RULES[3][1].search(t) for t in texts):
        return "data", "user"
    if any(_FRAMEWORK_EXC.search(t) for t in texts):
        return "config", "framework"
    return "config", "user"


def _when(logs: ParsedLogs, failure: np.ndarray, flagged: np.ndarray, stage: np.ndarray, nodes: list[NodeScore],
          node_found: bool) -> tuple[str | None, int | None, list[int]]:
    """Stage and iteration of the failure: where its first lines are, and the densest anomalous iteration."""
    if not failure.any():
        return None, None, []
    idx = np.flatnonzero(failure)
    starts = [int(idx[logs.host[idx] == h][0]) for h in np.unique(logs.host[idx]).tolist()]
    if node_found:
        top = logs.hosts.index(nodes[0].host)
        own = [i for i in starts if logs.host[i] == top]
        starts = own or starts
    stage_name = Counter(STAGES[int(stage[i])] for i in starts).most_common(1)[0][0]
    hit = failure & flagged
    its = logs.iteration[hit]
    anomalous = sorted({int(i) for i in its.tolist() if i >= 0})
    if anomalous:
        vals, cnt = np.unique(its[its >= 0], return_counts=True)
        iteration: int | None = int(vals[np.argmax(cnt)])
    else:
        first = [int(logs.iteration[i]) for i in starts if logs.iteration[i] >= 0]
        iteration = min(first) if first and stage_name in ("training", "checkpoint") else None
    return stage_name, iteration, anomalous


def _gpu_of(trace: Trace, logs: ParsedLogs, host: str, lines: list[int]) -> tuple[int | None, int | None]:
    """The failing GPU on a host: the PCI bus in an Xid line (via NCCL's busId table), else a rank tag."""
    h = logs.hosts.index(host)
    ranks = {info.gpu: r for r, info in trace.meta.ranks.items() if info.host == host}
    for i in lines:
        m = _PCI.search(logs.text(i))
        if m:
            bus = m.group(1).lower()
            for j in np.flatnonzero(logs.host == h)[:20000].tolist():
                b = _BUSID.search(logs.text(j)) if b"busId" in logs.raw_line(j) else None
                if b and b.group(2).lower().startswith(bus):
                    gpu = int(b.group(1))
                    return ranks.get(gpu), gpu
    for i in lines:
        m = _RANK.search(logs.text(i))
        if m and int(m.group(1)) in trace.meta.ranks:
            r = int(m.group(1))
            return r, trace.meta.ranks[r].gpu
    return None, None


def _cite(logs: ParsedLogs, i: int) -> str:
    text = logs.text(i)
    return f"{logs.where(i)}: {text[:300]}"


def localize_logs(trace: Trace, top: int = 5, pool: EventPool | None = None) -> Verdict:
    """The log-based verdict: candidates (kind from the events), evidence citing file:line."""
    a = analyze_logs(trace, pool)
    return verdict_of(trace, a, top)


def verdict_of(trace: Trace, a: LogAnalysis, top: int = 5) -> Verdict:
    logs = a.logs
    candidates: list[Candidate] = []
    if a.kind in HARDWARE and a.nodes:
        best = a.nodes[0].distinct
        most_hw = max(n.hardware for n in a.nodes[:top])
        for node in a.nodes[:top]:
            lines = _node_lines(logs, a.failure, node.host, node.events)
            if not lines and node is a.nodes[0]:
                lines = _node_lines(logs, a.failure, node.host, None)
            kind = node.kind or a.kind
            if node is not a.nodes[0] and not lines and not node.mentioned:
                continue
            evidence = [_cite(logs, i) for i in _first_per_event(logs, lines)[:EVIDENCE_LINES]]
            if node.mentioned:
                evidence.append(f"named by {node.mentioned} failure line(s) on other nodes")
            rank = gpu = None
            if kind == "gpu":
                rank, gpu = _gpu_of(trace, logs, node.host, lines)
            score = node.score * (min(1.0, node.distinct / best) if best > 1e-9 else 1.0)
            if most_hw > 0:  # hardware faults of its own, or reported against it, set the ranking: the score shows it
                score *= 0.5 + 0.5 * node.hardware / most_hw
            if candidates:
                score = min(score, candidates[-1].score)  # ranked best first; scores follow the ranking
            candidates.append(Candidate(kind=kind, score=round(score, 4), evidence=evidence, host=node.host, rank=rank,
                                        gpu=gpu, switch=trace.meta.switch_of(node.host), source="logs"))
    elif a.kind is not None:
        idx = np.flatnonzero(a.failure)
        host = a.nodes[0].host if a.node_found and a.nodes else None
        evidence = [_cite(logs, i) for i in _first_per_event(logs, idx.tolist())[:EVIDENCE_LINES]]
        candidates.append(Candidate(kind=a.kind, score=0.9, evidence=evidence, host=host, source="logs"))
    extra = {"logs": summary(a), "source": "logs"}
    # the failure's iteration: the first one whose lines departed from those before it
    onset = a.iteration if a.iteration is not None else min(a.anomalous_iterations, default=None)
    return Verdict(job=trace.meta.job, status="irregular" if a.kind else "healthy",
                   irregular_steps=a.anomalous_iterations, candidates=candidates, extra=extra,
                   onset_step=onset if a.kind else None)


def _first_per_event(logs: ParsedLogs, lines: list[int]) -> list[int]:
    seen: set[int] = set()
    out = []
    for i in lines:
        e = int(logs.shape_event[logs.shape[i]])
        if e not in seen:
            seen.add(e)
            out.append(i)
    return out


def summary(a: LogAnalysis) -> dict[str, Any]:
    """The JSON-able findings: stage, iteration, nodes, and the failure-indicating lines by event."""
    logs = a.logs
    idx = np.flatnonzero(a.failure)
    events = []
    for e in np.unique(logs.event[idx]).tolist() if idx.size else []:
        sel = idx[logs.event[idx] == e]
        events.append({"template": logs.templates[e], "count": int(sel.size),
                       "nodes": sorted({logs.hosts[h] for h in np.unique(logs.host[sel]).tolist()}),
                       "first": _cite(logs, int(sel[0]))})
    events.sort(key=lambda d: d["first"])
    return {
        "category": a.category,
        "stage": a.stage,
        "iteration": a.iteration,
        "anomalous_iterations": a.anomalous_iterations,
        "node_found": a.node_found,
        "nodes": [{"host": n.host, "score": round(n.score, 4), "distinct": round(n.distinct, 3), "kind": n.kind,
                   "mentioned": n.mentioned, "events": [logs.templates[e] for e in n.events[:5]]}
                  for n in a.nodes[:8]],
        "lines_total": len(logs),
        "suspect_lines": int(a.suspect.sum()),
        "failure_lines": int(idx.size),
        "events": events,
        "lines": [_cite(logs, i) for i in idx[:MAX_LINES_OUT].tolist()],
        "pool_jobs": a.pool_jobs,
    }
