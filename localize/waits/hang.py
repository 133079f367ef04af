"""Hang attribution: which ranks never arrived at the operator the others are stuck in.

Evidence: pending operators (entered, never completed: the CommOps logger's pending/ files, or
NCCL Flight Recorder entries not completed) and how far each rank got in each group (its
highest sequence number). A live trace is hung only where some rank waited at least
`min_wait_s` or its operator failed (timeout); an imported Flight Recorder dump is a snapshot
taken at the failure, so any rank behind its group's frontier is stuck. A laggard that is itself
waiting in another operator is a victim; the roots are the laggards that wait on nothing.

What the dump shows decides the kind: a root that never entered the operator stopped issuing
operators on its CPU (kind "host": host code, data loading, a held GIL, or a CPU wait on its own
GPU); one whose CPU queued it but whose GPU never started it while its peers did (NCCL with
TORCH_NCCL_ENABLE_TIMING=1 records starts) is stuck in GPU work (kind "gpu"); a rank that wrote no
dump at all is a dead or hung process (kind "host").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pandas as pd

from collector.commops.layout import read_pending
from collector.trace.traceio import Trace
from localize.verdict import Candidate, Verdict


@dataclass(frozen=True)
class Stall:
    rank: int
    group: str
    op: str
    seq: int
    peer: int
    step: int
    wait_s: float


def _frontiers(entered: pd.DataFrame) -> tuple[dict[tuple[int, str], int], dict[tuple[str, int, int, str], int]]:
    """Highest seq per (rank, group) for collectives, per (group, src, dst, side) for p2p."""
    coll = entered[~entered["op"].isin(["send", "recv"])]
    cf = coll.groupby(["rank", "group"])["seq"].max().reset_index()
    p2p = entered[entered["op"].isin(["send", "recv"])]
    pf: dict[tuple[str, int, int, str], int] = {}
    if len(p2p):
        p2p = p2p.assign(src=p2p["rank"].where(p2p["op"] == "send", p2p["peer"]),
                         dst=p2p["peer"].where(p2p["op"] == "send", p2p["rank"]))
        front = p2p.groupby(["group", "src", "dst", "op"])["seq"].max().reset_index()
        for x in front.to_dict("records"):
            pf[(str(x["group"]), int(x["src"]), int(x["dst"]), str(x["op"]))] = int(x["seq"])
    return {(int(x["rank"]), str(x["group"])): int(x["seq"]) for x in cf.to_dict("records")}, pf


def _facts(rank: int, blocks: list[Stall], queued: list[Stall], keep: int = 3) -> list[str]:
    """One evidence line per stuck operator the rank holds up (not one per waiting peer), with
    the peers that wait on it; at most `keep` lines and a count of the rest."""
    by_op: dict[tuple[str, str, int, int], list[Stall]] = defaultdict(list)
    for s in blocks:
        key = (s.group, s.op, s.seq, s.rank if s.op in ("send", "recv") else -1)
        by_op[key].append(s)
    keys = sorted(by_op, key=lambda k: (k[1] in ("send", "recv"), k[0], k[2], k[3]))
    lines = []
    for g, op, seq, peer in keys[:keep]:
        waits = by_op[(g, op, seq, peer)]
        who = sorted({s.rank for s in waits})
        longest = max(s.wait_s for s in waits)
        if op == "recv":
            what = f"rank {rank} never sent what rank {peer} waits for (recv #{seq} of {g})"
        elif op == "send":
            what = f"rank {rank} never received what rank {peer} sends (send #{seq} of {g})"
        elif any(s.group == g and s.seq == seq for s in queued):
            what = f"rank {rank} queued {op} #{seq} of {g} but its GPU never started it"
        else:
            what = f"rank {rank} never entered {op} #{seq} of {g}"
        lines.append(f"{what}; rank(s) {_ranks(who)} waiting" + (f" up to {longest:.1f}s" if longest else ""))
    if len(keys) > keep:
        lines.append(f"and {len(keys) - keep} more stuck operator(s) wait on rank {rank}")
    return lines


def _ranks(ranks: list[int], show: int = 8) -> str:
    """'0, 2, 3' or '0, 2, 3, ... (15 ranks)' for long lists."""
    if len(ranks) <= show:
        return ", ".join(map(str, ranks))
    return ", ".join(map(str, ranks[:show])) + f", ... ({len(ranks)} ranks)"


def find_hang(trace: Trace, min_wait_s: float = 2.0) -> Verdict | None:
    """A `status: "hang"` verdict naming the ranks that did not arrive, or None if nothing is stuck."""
    pending = read_pending(trace.path)
    snapshot = trace.meta.extra.get("source") == "flight-recorder"
    if pending is None and not snapshot:
        return None
    cols = ["rank", "group", "op", "seq", "peer", "start_ns", "step"]
    done = trace.commops(columns=cols) if trace.has("commops") else pd.DataFrame(columns=cols)
    pend = pending.to_pandas() if pending is not None else pd.DataFrame(columns=[*cols, "seen_ns", "failed"])
    entered = pd.concat([done[cols], pend[cols]], ignore_index=True)
    coll_front, p2p_front = _frontiers(entered)
    members = {g: list(r) for g, r in trace.meta.groups.items()}
    for (r, g) in coll_front:
        members.setdefault(g, [])
        if r not in members[g]:
            members[g].append(r)

    raw = trace.meta.extra.get("not_started")
    not_started = {(int(x[0]), str(x[1]), int(x[2])) for x in raw} if isinstance(raw, list) else set()

    def behind(m: int, g: str, seq: int) -> bool:
        """Member m holds up operator seq of group g: it never entered it, or its GPU never started it."""
        return coll_front.get((m, g), -1) < seq or (m, g, seq) in not_started

    stalls: list[Stall] = []
    if len(pend):
        wait = (pend["seen_ns"] - pend["start_ns"]) / 1e9
        stuck = pend[pend["failed"] | (wait >= min_wait_s)]
        for row, w in zip(stuck.itertuples(index=False), wait[stuck.index], strict=True):
            if (int(row.rank), str(row.group), int(row.seq)) in not_started:
                continue  # queued behind its own GPU's work: not waiting on a peer
            stalls.append(Stall(int(row.rank), str(row.group), str(row.op), int(row.seq), int(row.peer),
                                int(row.step), float(w)))
    if snapshot:  # every rank at its group's frontier waits there (gloo dumps record no completion)
        running = entered
        if not_started:  # an anti-join, not a loop over rows: dumps hold thousands of entries per rank
            ns = pd.DataFrame(sorted(not_started), columns=["rank", "group", "seq"]).assign(queued=True)
            flag = entered[["rank", "group", "seq"]].astype({"rank": "int64", "group": str, "seq": "int64"}).merge(
                ns, on=["rank", "group", "seq"], how="left")["queued"].fillna(False).to_numpy(dtype=bool)
            running = entered[~flag]
        run_front, _ = _frontiers(running)  # queued operators a GPU has not reached wait on nobody
        last = running.sort_values("seq").groupby(["rank", "group"]).tail(1)
        for row in last.itertuples(index=False):
            g = str(row.group)
            if row.op in ("send", "recv"):
                continue
            front = max(run_front.get((m, g), -1) for m in members.get(g, [int(row.rank)]))
            if int(row.seq) == front and any(behind(m, g, front) for m in members.get(g, [])):
                stalls.append(Stall(int(row.rank), g, str(row.op), int(row.seq), -1, int(row.step), 0.0))
    dumped = trace.meta.extra.get("dumped_ranks")
    silent = sorted(set(trace.meta.ranks) - set(dumped)) if snapshot and isinstance(dumped, list) else []
    if not stalls and not silent:
        return None

    waiting = {s.rank for s in stalls}
    blocked_on: dict[int, list[Stall]] = defaultdict(list)  # laggard -> stalls it blocks
    for s in stalls:
        if s.op == "send":
            if p2p_front.get((s.group, s.rank, s.peer, "recv"), -1) < s.seq:
                blocked_on[s.peer].append(s)
        elif s.op == "recv":
            if s.peer >= 0 and p2p_front.get((s.group, s.peer, s.rank, "send"), -1) < s.seq:
                blocked_on[s.peer].append(s)
        else:
            for m in members.get(s.group, []):
                if behind(m, s.group, s.seq):
                    blocked_on[m].append(s)

    for r in silent:  # in a dump-on-failure snapshot, a rank that wrote nothing is hung or dead
        blocked_on.setdefault(r, [])
    roots = [r for r in blocked_on if r not in waiting] or list(blocked_on)
    candidates = []
    total = sum(len(v) for v in blocked_on.values()) or 1
    for r in sorted(blocked_on, key=lambda r: (r not in roots, -len(blocked_on[r]), r)):
        info = trace.meta.ranks.get(r)
        host, gpu = (info.host if info and info.host != "unknown" else None), (info.gpu if info else None)
        blocks = blocked_on[r]
        if not blocks:
            candidates.append(Candidate(kind="host", score=0.5 if r in roots else 0.1, rank=r, host=host, gpu=gpu,
                                        source="commops", evidence=[
                f"rank {r} wrote no Flight Recorder dump while the others did: its process is hung or dead"]))
            continue
        queued = [s for s in blocks if s.op not in ("send", "recv") and (r, s.group, s.seq) in not_started]
        ev = _facts(r, blocks, queued)
        if r in waiting:
            mine = [s for s in stalls if s.rank == r]
            ev.append(f"rank {r} is itself waiting in {mine[0].op} #{mine[0].seq} of {mine[0].group}: a victim, not the cause")
        elif queued:
            ev.append(f"rank {r}'s CPU queued the operator but its GPU never started it: the GPU is stuck in earlier work")
        else:
            ev.append(f"rank {r} is not inside any communication operator: its CPU thread stopped issuing them "
                      "(host code, data loading, a held GIL, or a CPU wait on its own GPU)")
        score = (0.5 + 0.5 * len(blocks) / total) if r in roots else 0.2 * len(blocks) / total
        candidates.append(Candidate(kind="gpu" if queued else "host", score=score, evidence=ev, rank=r,
                                    host=host, gpu=gpu, source="commops"))
    steps = sorted({s.step for s in stalls if s.step >= 0})
    stuck_ops = sorted({(s.group, s.op, s.seq) for s in stalls})
    extra = {"hang": {"stuck_ops": [{"group": g, "op": o, "seq": q} for g, o, q in stuck_ops],
                      "waiting_ranks": sorted(waiting),
                      "not_arrived": sorted(blocked_on),
                      "source": "flight-recorder" if snapshot else "commops-pending"}}
    if not candidates:
        extra["hang"]["note"] = "every member entered the stuck operator: the communication itself is stuck"
    return Verdict(job=trace.meta.job, status="hang", irregular_steps=steps[:1], candidates=candidates, extra=extra)
