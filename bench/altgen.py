"""A second job model written from the data contract alone, so accuracy figures do not rest on one simulator's assumptions.

Models Megatron-style tp x pp x dp jobs (1F1B, TP all-reduces or sequence parallelism's gathers and
reduce-scatters, rendezvous or batched p2p, DP ring all-reduce or reduce_scatter+all_gather, skewed host clocks) with gpu/host/nic/link/switch/data faults and a pipeline stage
given more work than the others (stage: the configuration), and scores `laggard localize`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

OPS = ["all_reduce", "reduce_scatter", "all_gather", "barrier", "send", "recv", "all_to_all"]
OP = {name: i for i, name in enumerate(OPS)}
FAULT_KINDS = ["healthy", "gpu", "host", "nic", "link", "switch", "slow_start", "data", "stage"]
LOGGING = ["all", "tp0", "every3", "random40"]  # drawn; also with --set "tp0-random40" (Megatron's usual) and
# "hosts75" (a quarter of the hosts run no logger)
EPOCH_NS = 1_770_000_000_000_000_000
MIN_SLOWDOWN = 1.1

# a stage program item: ("C", "F"|"B", microbatch) compute, or ("P", ((dir, "fwd"|"bwd", id), ...)) p2p, where
# id is the microbatch (or, interleaved, the transfer: the virtual stage it leaves times m plus the microbatch)
Item = tuple[Any, ...]


@dataclass(frozen=True)
class Layout:
    """Where every (stage, replica, tp-index) lives: ranks, hosts and switches."""

    tp: int
    pp: int
    dp: int
    gpus_per_host: int
    hosts_per_switch: int
    order: str  # "tp-dp-pp" (Megatron) or "tp-pp-dp"
    ep: int = 1  # expert parallel: blocks of ep consecutive DP replicas exchange tokens (all_to_all) in every chunk
    placement: str = "block"  # ranks onto hosts: "block" (torchrun: a node's ranks consecutive) or "cyclic" (round-robin)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def n_hosts(self) -> int:
        return self.world // self.gpus_per_host

    def ranks(self) -> np.ndarray:
        """Global rank of (stage, replica, tp index), shape (pp, dp, tp)."""
        s, d, t = np.meshgrid(np.arange(self.pp), np.arange(self.dp), np.arange(self.tp), indexing="ij")
        if self.order == "tp-dp-pp":
            return t + self.tp * (d + self.dp * s)
        return t + self.tp * (s + self.pp * d)

    def host_of(self, rank: np.ndarray | int) -> np.ndarray:
        """Host index of each rank: consecutive ranks share a host ("block"), or go round the hosts ("cyclic",
        as `srun --distribution=cyclic` or one pod per GPU place them)."""
        r = np.asarray(rank)
        return r % self.n_hosts if self.placement == "cyclic" else r // self.gpus_per_host

    def gpu_of(self, rank: np.ndarray | int) -> np.ndarray:
        r = np.asarray(rank)
        return r // self.n_hosts if self.placement == "cyclic" else r % self.gpus_per_host

    def hosts(self) -> np.ndarray:
        return self.host_of(self.ranks())

    def switch_of(self, host: np.ndarray | int) -> np.ndarray:
        return np.asarray(host) // self.hosts_per_switch


@dataclass
class Fault:
    """One injected fault: what, where, how strong, in which (internal, 0-based) steps."""

    kind: str
    factor: float
    pattern: str
    active: list[int]
    rank: int = -1
    host: int = -1
    hosts: tuple[int, int] = (-1, -1)
    switch: int = -1
    stage: int = -1  # stage faults: the pipeline stage given more work than the others (the job's configuration)
    scope: str = "uplink"  # switch faults: "uplink" (only traffic leaving the rack) or "whole" (host to host inside it too)


@dataclass
class Costs:
    """Per-job sizes: compute per chunk, bytes and bandwidths, noise."""

    fwd_chunk_s: float
    tp_bytes: int
    act_bytes: int
    grad_bytes: int
    nvlink_Bps: float
    net_Bps: float
    latency_s: float
    compute_sigma: float
    net_sigma: float
    optimizer_s: float
    a2a_bytes: int = 0
    rank_sigma: float = 0.0  # static per-GPU speed spread (silicon, clocks, thermals)
    stage_extra: tuple[float, ...] = ()  # per-stage compute multiplier: embedding on the first, loss on the last


@dataclass
class JobSpec:
    """Everything that defines one generated job and how it is logged and named."""

    name: str
    layout: Layout
    microbatches: int
    steps: int
    p2p: str  # rendezvous | batched | eager (eager only when pinned: NCCL's sends up to 8 MiB, measured)
    dp_mode: str  # all_reduce | rs_ag
    step_sync: str  # none | mp (Megatron's grad-norm all-reduce over the model-parallel group) | barrier
    logging: str
    step0: int
    naming: str  # docs | megatron | opaque
    meta_groups: bool
    meta_parallelism: bool
    warmup_steps: int
    warmup_factor: float
    costs: Costs
    fault: Fault | None
    kind: str = "healthy"
    seed: int = 0
    logged: list[int] = field(default_factory=list)
    step_ids: bool = True  # False: every row's step is -1 (the contract's "not known"), the reader finds iterations
    schedule: str = "1f1b"  # or "gpipe" (every forward, then every backward: torch.distributed.pipelining's ScheduleGPipe)
    tp_comm: str = "all_reduce"  # or "sp": Megatron's sequence parallelism, an all-gather before and a
    # reduce-scatter after each attention and MLP block in place of its all-reduce


#: model chunks a stage holds in the interleaved schedule (Megatron's virtual pipeline stages)
CHUNKS = 2


def stage_program(s: int, pp: int, m: int, schedule: str = "1f1b") -> list[Item]:
    """Megatron's non-interleaved 1F1B for stage s, with its combined p2p calls (send_forward_recv_backward etc.);
    or GPipe: every microbatch's forward, then every backward, each p2p call on its own; or interleaved:
    `CHUNKS` model chunks a stage, virtual stage c * pp + s, so the last stage sends each chunk's
    activations on to the first (the pipeline's transfers wrap), each chunk's forwards in turn, then
    the backwards in reverse chunk order, microbatches in groups of pp (Megatron's order, all forwards
    before the backwards), each send posted with the next receive."""
    w = min(pp - s - 1, m)
    rem = m - w
    prog: list[Item] = []

    def p2p(*ops: tuple[str, str, int]) -> None:
        kept = tuple(o for o in ops if 0 <= s + (1 if (o[0] == "send") == (o[1] == "fwd") else -1) < pp)
        if kept:
            prog.append(("P", kept))

    if schedule == "interleaved":
        last = CHUNKS * pp - 1
        group = [(k // pp % CHUNKS, k // (pp * CHUNKS) * pp + k % pp) for k in range(CHUNKS * m)]  # (chunk, mb)
        for flow, phase, order in (("fwd", "F", group), ("bwd", "B", [(CHUNKS - 1 - c, j) for c, j in group])):
            ahead = 1 if flow == "fwd" else -1  # the virtual stage this flow moves on to
            steps = []
            for c, j in order:
                v = c * pp + s
                src, dst = v - ahead, v + ahead
                recv = ("recv", flow, min(src, v) * m + j) if 0 <= src <= last else None
                send = ("send", flow, min(dst, v) * m + j) if 0 <= dst <= last else None
                steps.append((recv, ("C", phase, c * m + j), send))
            if steps[0][0] is not None:
                prog.append(("P", (steps[0][0],)))
            for i, (_, compute, send) in enumerate(steps):
                prog.append(compute)
                nxt = steps[i + 1][0] if i + 1 < len(steps) else None
                ops = tuple(o for o in (send, nxt) if o is not None)  # Megatron's send_forward_recv_forward
                if ops:
                    prog.append(("P", ops))
        return prog
    if schedule == "gpipe":
        for phase, flow in (("F", "fwd"), ("B", "bwd")):
            for j in range(m):
                p2p(("recv", flow, j))
                prog.append(("C", phase, j))
                p2p(("send", flow, j))
        return prog
    for j in range(w):
        p2p(("recv", "fwd", j))
        prog.append(("C", "F", j))
        p2p(("send", "fwd", j))
    if rem > 0:
        p2p(("recv", "fwd", w))
    for i in range(rem):
        prog.append(("C", "F", w + i))
        p2p(("send", "fwd", w + i), ("recv", "bwd", i))
        prog.append(("C", "B", i))
        if i == rem - 1:
            p2p(("send", "bwd", i))
        else:
            p2p(("send", "bwd", i), ("recv", "fwd", w + i + 1))
    for j in range(rem, m):
        p2p(("recv", "bwd", j))
        prog.append(("C", "B", j))
        p2p(("send", "bwd", j))
    return prog


def peer_stage(s: int, op: tuple[str, str, int], pp: int) -> int:
    """Stage on the other end of a p2p op: activations flow down the pipeline, gradients up (from the
    last stage on to the first, and back, between an interleaved schedule's model chunks)."""
    direction, flow, _ = op
    return (s + 1 if (direction == "send") == (flow == "fwd") else s - 1) % pp


def schedule_order(progs: list[list[Item]]) -> list[tuple[int, int]]:
    """A causal evaluation order of every (stage, item): a p2p item runs once every peer has posted its side."""
    where: dict[tuple[int, tuple[str, str, int]], int] = {}
    for s, prog in enumerate(progs):
        for k, item in enumerate(prog):
            if item[0] == "P":
                for op in item[1]:
                    where[(s, op)] = k
    ptr = [0] * len(progs)
    order: list[tuple[int, int]] = []
    moved = True
    while moved:
        moved = False
        for s, prog in enumerate(progs):
            while ptr[s] < len(prog):
                item = prog[ptr[s]]
                if item[0] == "P":
                    ready = True
                    for op in item[1]:
                        s2 = peer_stage(s, op, len(progs))
                        mirror = ("recv" if op[0] == "send" else "send", op[1], op[2])
                        ready &= ptr[s2] >= where[(s2, mirror)]
                    if not ready:
                        break
                order.append((s, ptr[s]))
                ptr[s] += 1
                moved = True
    if any(p < len(prog) for p, prog in zip(ptr, progs, strict=True)):
        raise RuntimeError("1F1B program deadlocks")
    return order


class Rows:
    """Accumulates commops rows as column arrays (one append per event, vectorized over ranks)."""

    def __init__(self) -> None:
        self.cols: dict[str, list[np.ndarray]] = defaultdict(list)

    def add(self, rank: np.ndarray, group: np.ndarray, op: int, seq: int | np.ndarray, peer: np.ndarray | int,
            nbytes: int, start: np.ndarray, end: np.ndarray, step: int) -> None:
        rank = rank.ravel()
        n = rank.size
        self.cols["rank"].append(rank)
        self.cols["group"].append(np.broadcast_to(group, start.shape).ravel())
        self.cols["op"].append(np.full(n, op))
        self.cols["seq"].append(np.broadcast_to(np.asarray(seq), start.shape).ravel())
        self.cols["peer"].append(np.broadcast_to(np.asarray(peer), start.shape).ravel())
        self.cols["nbytes"].append(np.full(n, nbytes))
        self.cols["start"].append(start.ravel().copy())
        self.cols["end"].append(end.ravel().copy())
        self.cols["step"].append(np.full(n, step))

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate(v) for k, v in self.cols.items()}


class Net:
    """Transfer cost between hosts in one step: NVLink inside a host, the network (with this step's faults) across."""

    def __init__(self, spec: JobSpec, step: int, warm: float) -> None:
        lay, c, f = spec.layout, spec.costs, spec.fault
        self.lay, self.c, self.warm = lay, c, warm
        self.nic = np.ones(lay.n_hosts)
        self.link: tuple[int, int, float] | None = None
        self.switch: tuple[int, float] | None = None
        self.rack_too = f is not None and f.scope == "whole"
        if f is not None and step in f.active:
            if f.kind == "nic":
                self.nic[f.host] = f.factor
            elif f.kind == "link":
                self.link = (f.hosts[0], f.hosts[1], f.factor)
            elif f.kind == "switch":
                self.switch = (f.switch, f.factor)

    def inv_bw(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Seconds per byte from host a to host b, elementwise."""
        factor = np.maximum(self.nic[a], self.nic[b])
        if self.link is not None:
            x, y, lf = self.link
            on = ((a == x) & (b == y)) | ((a == y) & (b == x))
            factor = np.where(on, np.maximum(factor, lf), factor)
        if self.switch is not None:
            sw, sf = self.switch
            sa, sb = self.lay.switch_of(a), self.lay.switch_of(b)
            crosses = (sa == sw) | (sb == sw)
            on = crosses & (a != b) if self.rack_too else crosses & (sa != sb)
            factor = np.where(on, np.maximum(factor, sf), factor)
        return np.where(a == b, 1.0 / self.c.nvlink_Bps, factor / self.c.net_Bps) * self.warm

    def ring(self, members: np.ndarray) -> np.ndarray:
        """Slowest edge of a ring over the last axis of a host array: seconds per byte of the whole ring."""
        return self.inv_bw(members, np.roll(members, -1, axis=-1)).max(axis=-1)


def compute_factor(spec: JobSpec, step: int, rng: np.random.Generator) -> np.ndarray:
    """Per-rank compute slowdown of one step from the fault (host faults with a little per-rank jitter; data: the
    replica that drew the longest sequences this step, a different one each time)."""
    lay, f = spec.layout, spec.fault
    out = np.ones(lay.world)
    jitter = 1.0 + 0.1 * rng.uniform(-1, 1, lay.world)
    if f is None or step not in f.active:
        return out
    if f.kind in ("gpu", "slow_start"):
        out[f.rank] = f.factor
    elif f.kind == "host":
        on = lay.host_of(np.arange(lay.world)) == f.host
        out[on] = f.factor * jitter[on]
    elif f.kind == "data":
        out[lay.ranks()[:, int(rng.integers(lay.dp)), :].ravel()] = f.factor
    elif f.kind == "stage":
        out[lay.ranks()[f.stage].ravel()] = f.factor
    return out


def simulate(spec: JobSpec, fault: bool = True) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Run every step of the job; return the logged rows (true time, seconds) and each step's wall time."""
    rng = np.random.default_rng(spec.seed)
    if not fault:
        spec = JobSpec(**{**spec.__dict__, "fault": None})
    lay, c, m = spec.layout, spec.costs, spec.microbatches
    R, H = lay.ranks(), lay.hosts()
    n_tp, n_pp, n_dp = lay.pp * lay.dp, lay.dp * lay.tp, lay.pp * lay.tp
    tpg = np.arange(n_tp).reshape(lay.pp, lay.dp, 1)  # group index (as in group_members) of the TP group of (s, d)
    ppg = n_tp + np.arange(n_pp).reshape(lay.dp, lay.tp)  # of the pipeline group of (d, t)
    dpg = n_tp + n_pp + np.arange(n_dp).reshape(lay.pp, 1, lay.tp)  # of the DP group of (s, t)
    mpg = n_tp + n_pp + n_dp + np.arange(lay.dp).reshape(1, lay.dp, 1)  # of the model-parallel group of replica d
    n_blocks = lay.dp // lay.ep
    epg = n_tp + n_pp + n_dp + lay.dp + np.repeat(np.arange(lay.pp * n_blocks * lay.tp).reshape(lay.pp, n_blocks, lay.tp),
                                                   lay.ep, axis=1)  # of the EP group of (s, d // ep, t)
    world_group = np.array(n_tp + n_pp + n_dp + lay.dp + (lay.pp * n_blocks * lay.tp if lay.ep > 1 else 0))
    progs = [stage_program(s, lay.pp, m, spec.schedule) for s in range(lay.pp)]
    order = schedule_order(progs)
    mirror_at = {(s, op): k for s, prog in enumerate(progs) for k, it in enumerate(prog) if it[0] == "P" for op in it[1]}
    n_dp_ops = 1 if spec.dp_mode == "all_reduce" else 2
    sequence_parallel = spec.tp_comm == "sp"
    chunks = CHUNKS if spec.schedule == "interleaved" else 1  # (each chunk a stage's layers / chunks)
    tp_ops_per_step = m * (8 if sequence_parallel else 4) * chunks
    logged = set(spec.logged)
    speed = rng.lognormal(0.0, c.rank_sigma, lay.world)[R] * np.asarray(c.stage_extra or (1.0,) * lay.pp)[:, None, None]
    rows = Rows()
    T = np.zeros((lay.pp, lay.dp, lay.tp))
    step_end = np.zeros(spec.steps)
    prev_end = 0.0
    for k in range(spec.steps):
        warm = spec.warmup_factor if k < spec.warmup_steps else 1.0
        net = Net(spec, k, warm)
        cf = compute_factor(spec, k, rng)[R] * speed
        keep = k in logged
        tp_inv = net.ring(H)  # (pp, dp): TP ring per group
        He = H.reshape(lay.pp, n_blocks, lay.ep, lay.tp)
        ep_inv = net.inv_bw(He[:, :, :, None, :], He[:, :, None, :, :]).max(axis=(2, 3))  # (pp, blocks, tp): slowest pair
        tp_seq = np.full(lay.pp, k * tp_ops_per_step)
        ep_seq = np.full(lay.pp, k * m * 4 * chunks)  # (an expert group's own count: one all-to-all a block)
        post: dict[tuple[int, int], np.ndarray] = {(s, 0): T[s].copy() for s in range(lay.pp)}
        xfer: dict[tuple[int, str, int], tuple[np.ndarray, np.ndarray]] = {}
        for s, idx in order:
            item = progs[s][idx]
            if item[0] == "C":
                cur = T[s]
                scale = (1.0 if item[1] == "F" else 2.0) / chunks
                for _ in range(2):
                    noise = rng.lognormal(0.0, c.compute_sigma, cur.shape)
                    hiccup = np.where(rng.random(cur.shape) < 5e-4, rng.uniform(1.5, 3.0, cur.shape), 1.0)
                    dur = c.tp_bytes * 2 * (lay.tp - 1) / lay.tp * tp_inv[s] * rng.lognormal(0.0, c.net_sigma, lay.dp)
                    if sequence_parallel:  # the block's input gathered from the sequence shards: half the ring's bytes
                        done = cur.max(axis=1) + dur / 2 + c.latency_s
                        gathered = done[:, None] + rng.uniform(0, 5e-6, cur.shape)
                        if keep and lay.tp > 1:
                            rows.add(R[s], tpg[s], OP["all_gather"], int(tp_seq[s]), -1, c.tp_bytes, cur, gathered, k)
                        tp_seq[s] += 1
                        cur, dur = gathered, dur / 2
                    arrive = cur + c.fwd_chunk_s * scale * noise * hiccup * cf[s] * warm
                    done = arrive.max(axis=1) + dur + c.latency_s
                    cur = done[:, None] + rng.uniform(0, 5e-6, cur.shape)
                    if keep and lay.tp > 1:
                        op = OP["reduce_scatter" if sequence_parallel else "all_reduce"]
                        rows.add(R[s], tpg[s], op, int(tp_seq[s]), -1, c.tp_bytes, arrive, cur, k)
                    if lay.ep > 1:
                        arrive = cur
                        dur = c.a2a_bytes * (lay.ep - 1) / lay.ep * ep_inv[s] * rng.lognormal(0.0, c.net_sigma, ep_inv[s].shape)
                        done = arrive.reshape(n_blocks, lay.ep, lay.tp).max(axis=1) + dur + c.latency_s
                        cur = np.repeat(done, lay.ep, axis=0) + rng.uniform(0, 5e-6, cur.shape)
                        if keep:
                            rows.add(R[s], epg[s], OP["all_to_all"], int(ep_seq[s]), -1, c.a2a_bytes, arrive, cur, k)
                        ep_seq[s] += 1
                    tp_seq[s] += 1
                T[s] = cur
            else:
                mine = post[(s, idx)]
                ends = []
                for op in item[1]:
                    s2 = peer_stage(s, op, lay.pp)
                    sender = s if op[0] == "send" else s2
                    key = (sender, op[1], op[2])
                    if key not in xfer:
                        receiver = s2 if op[0] == "send" else s
                        mirror = ("recv" if op[0] == "send" else "send", op[1], op[2])
                        theirs = post[(s2, mirror_at[(s2, mirror)])]
                        dur = c.act_bytes * net.inv_bw(H[sender], H[receiver]) * rng.lognormal(0.0, c.net_sigma, mine.shape)
                        if spec.p2p == "eager":  # the send is buffered: it ends alone; the data waits for its receiver
                            sent, posted = (mine, theirs) if op[0] == "send" else (theirs, mine)
                            xfer[key] = (sent + c.latency_s, np.maximum(posted + c.latency_s, sent + dur + c.latency_s))
                        else:
                            both = np.maximum(mine, theirs) + dur + c.latency_s
                            xfer[key] = (both, both)
                    ends.append(xfer[key][0] if op[0] == "send" else xfer[key][1])
                done = np.max(ends, axis=0)
                if keep:
                    for op, end in zip(item[1], ends, strict=True):
                        s2 = peer_stage(s, op, lay.pp)
                        seq = k * (chunks * lay.pp * m if chunks > 1 else m) + op[2]
                        logged_end = done if spec.p2p == "batched" else end
                        rows.add(R[s], ppg, OP[op[0]], seq, R[s2], c.act_bytes, mine, logged_end, k)
                T[s] = done
            post[(s, idx + 1)] = T[s].copy()
        dp_inv = net.ring(np.moveaxis(H, 1, 2))  # (pp, tp): DP ring per group
        dp_ops = ["all_reduce"] if spec.dp_mode == "all_reduce" else ["reduce_scatter", "all_gather"]
        for i, op_name in enumerate(dp_ops):
            frac = 2.0 if spec.dp_mode == "all_reduce" else 1.0
            dur = c.grad_bytes * frac * (lay.dp - 1) / lay.dp * dp_inv * rng.lognormal(0.0, c.net_sigma, dp_inv.shape)
            arrive = T.copy()
            done = arrive.max(axis=1, keepdims=True) + dur[:, None, :] + c.latency_s
            T = done + rng.uniform(0, 5e-6, T.shape)
            if keep:
                rows.add(R, dpg, OP[op_name], k * n_dp_ops + i, -1, c.grad_bytes, arrive, T, k)
            if i == 0 and spec.step_sync == "mp":
                arrive = T.copy()
                T = arrive.max(axis=(0, 2), keepdims=True) + c.latency_s * 5 + rng.uniform(0, 5e-6, T.shape)
                if keep:
                    rows.add(R, mpg, OP["all_reduce"], k, -1, 4, arrive, T, k)
            if i == 0:
                T = T + c.optimizer_s * rng.lognormal(0.0, c.compute_sigma, T.shape) * cf * warm
        if spec.step_sync == "barrier":
            arrive = T.copy()
            T = np.full(T.shape, arrive.max() + c.latency_s * 2) + rng.uniform(0, 5e-6, T.shape)
            if keep:
                rows.add(R, world_group, OP["barrier"], k, -1, 4, arrive, T, k)
        step_end[k] = T.max() - prev_end
        prev_end = T.max()
    return rows.arrays(), step_end


def group_members(lay: Layout) -> list[tuple[str, list[int]]]:
    """Every process group as (kind, ranks), in the index order simulate() logs them under."""
    R = lay.ranks()
    out = [("tp", R[s, d].tolist()) for s in range(lay.pp) for d in range(lay.dp)]
    out += [("pp", R[:, d, t].tolist()) for d in range(lay.dp) for t in range(lay.tp)]
    out += [("dp", R[s, :, t].tolist()) for s in range(lay.pp) for t in range(lay.tp)]
    out += [("mp", sorted(R[:, d, :].ravel().tolist())) for d in range(lay.dp)]
    if lay.ep > 1:
        out += [("ep", R[s, b * lay.ep:(b + 1) * lay.ep, t].tolist())
                for s in range(lay.pp) for b in range(lay.dp // lay.ep) for t in range(lay.tp)]
    return [*out, ("world", list(range(lay.world)))]


MEGATRON_NAMES = {"tp": "tensor_model_parallel_", "pp": "pipeline_", "dp": "data_parallel_group_",
                  "mp": "model_parallel_group_", "ep": "expert_model_parallel_"}


def group_names(kinds: list[str], naming: str, rng: np.random.Generator) -> list[str]:
    """A name per group: the docs' `tp-3`, Megatron-like `tensor_model_parallel_3`, or opaque `pg17`."""
    if naming == "opaque":
        return [f"pg{i}" for i in rng.permutation(len(kinds))]
    count: dict[str, int] = defaultdict(int)
    names = []
    for kind in kinds:
        if kind == "world":
            names.append("world" if naming == "docs" else "default_pg")
            continue
        names.append(f"{kind}-{count[kind]}" if naming == "docs" else f"{MEGATRON_NAMES[kind]}{count[kind]}")
        count[kind] += 1
    return names


def unlogged_hosts(spec: JobSpec) -> np.ndarray:
    """The hosts that run no logger under logging "hosts75": a quarter of them, drawn per job."""
    n = spec.layout.n_hosts
    return np.random.default_rng(spec.seed + 11).choice(n, max(1, n // 4), replace=False)


def write_trace(spec: JobSpec, out: Path, rows: dict[str, np.ndarray], step_time: np.ndarray,
                slowdown: float = 1.0) -> dict[str, Any]:
    """Write meta.json, commops.parquet and truth.json; return the truth."""
    rng = np.random.default_rng(spec.seed + 7)
    lay = spec.layout
    R = lay.ranks()
    members = group_members(lay)
    names = np.array(group_names([k for k, _ in members], spec.naming, rng), dtype=object)
    t_index = np.zeros(lay.world, dtype=np.int64)
    t_index[R.ravel()] = np.broadcast_to(np.arange(lay.tp), R.shape).ravel()
    mask = np.ones(rows["rank"].size, dtype=bool)
    if spec.logging.startswith("tp0"):
        mask = t_index[rows["rank"]] == 0
    hosts = lay.host_of(rows["rank"])
    if spec.logging == "hosts75":
        mask = ~np.isin(hosts, unlogged_hosts(spec))
    offsets = rng.uniform(-0.1, 0.1, lay.n_hosts)
    drift = rng.uniform(-2e-6, 2e-6, lay.n_hosts)

    def clock(t: np.ndarray) -> np.ndarray:
        return EPOCH_NS + np.round((t + offsets[hosts] + drift[hosts] * t) * 1e9).astype(np.int64)

    table = pa.table({
        "rank": pa.array(rows["rank"][mask], pa.int32()),
        "group": pa.array(names[rows["group"]][mask].astype(str), pa.string()),
        "op": pa.array(np.array(OPS, dtype=object)[rows["op"][mask]].astype(str), pa.string()),
        "seq": pa.array(rows["seq"][mask], pa.int64()),
        "peer": pa.array(rows["peer"][mask], pa.int32()),
        "nbytes": pa.array(rows["nbytes"][mask], pa.int64()),
        "start_ns": pa.array(clock(rows["start"])[mask], pa.int64()),
        "end_ns": pa.array(clock(rows["end"])[mask], pa.int64()),
        "step": pa.array(rows["step"][mask] + spec.step0 if spec.step_ids else np.full(int(mask.sum()), -1),
                         pa.int32()),
    })
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / "commops.parquet")
    host_name = [f"node-{h}" for h in range(lay.n_hosts)]
    meta: dict[str, Any] = {
        "job": spec.name, "world_size": lay.world,
        "ranks": {str(r): {"host": host_name[int(lay.host_of(r))], "gpu": int(lay.gpu_of(r)),
                           "ip": f"10.{r // 65536}.{(r // 256) % 256}.{r % 256}"} for r in range(lay.world)},
        "topology": {h: {"switch": f"tor-{i // lay.hosts_per_switch}"} for i, h in enumerate(host_name)},
    }
    if spec.meta_groups:
        used = set(np.unique(rows["group"]).tolist())
        meta["groups"] = {str(names[i]): ranks for i, (_, ranks) in enumerate(members) if i in used}
    if spec.meta_parallelism:
        meta["parallelism"] = {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "ep": lay.ep, "cp": 1}
    (out / "meta.json").write_text(json.dumps(meta))
    truth = {**truth_of(spec, step_time, host_name, offsets), "job_slowdown": round(slowdown, 4)}
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    return truth


def truth_of(spec: JobSpec, step_time: np.ndarray, host_name: list[str], offsets: np.ndarray) -> dict[str, Any]:
    """The injected fault in the contract's words, in logged step numbers."""
    f = spec.fault
    lay = spec.layout
    faults = []
    if f is not None:
        named = {"slow_start": "gpu", "stage": "config"}.get(f.kind, f.kind)
        entry: dict[str, Any] = {"kind": named, "pattern": f.pattern,
                                 "magnitude": round(f.factor, 3), "factor": round(f.factor, 3),
                                 "start_step": spec.step0 + min(f.active), "end_step": spec.step0 + max(f.active),
                                 "active_steps": [spec.step0 + k for k in f.active]}
        if f.kind in ("gpu", "slow_start"):
            entry.update(rank=f.rank, host=host_name[int(lay.host_of(f.rank))], device=str(f.rank))
        elif f.kind in ("host", "nic"):
            entry.update(host=host_name[f.host], device=host_name[f.host])
        elif f.kind == "link":
            entry.update(hosts=[host_name[h] for h in f.hosts], device="+".join(host_name[h] for h in f.hosts))
        elif f.kind == "switch":
            entry.update(switch=f"tor-{f.switch}", device=f"tor-{f.switch}", scope=f.scope)
        elif f.kind == "stage":
            entry.update(stage=f.stage, device=f"pipeline stage {f.stage}")
        else:
            entry.update(device="data")
        faults.append(entry)
    return {"job": spec.name, "generator": "bench.altgen", "kind": spec.kind,
            "parallelism": {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "ep": lay.ep, "cp": 1},
            "layout": asdict(lay), "microbatches": spec.microbatches, "schedule": spec.schedule, "tp_comm": spec.tp_comm, "p2p": spec.p2p, "dp_mode": spec.dp_mode,
            "step_sync": spec.step_sync, "logging": spec.logging, "naming": spec.naming,
            "meta_groups": spec.meta_groups, "meta_parallelism": spec.meta_parallelism,
            "warmup_steps": spec.warmup_steps, "faults": faults, "world": lay.world,
            "unlogged_rank": f is not None and f.rank >= 0 and (
                (spec.logging.startswith("tp0") and f.rank % lay.tp != 0)
                or (spec.logging == "hosts75" and int(lay.host_of(f.rank)) in unlogged_hosts(spec))),
            "logged_steps": [spec.step0 + k for k in spec.logged], "step_ids": spec.step_ids,
            "step_time_s": [round(float(x), 6) for x in step_time],
            "clock_offsets_ns": {h: int(o * 1e9) for h, o in zip(host_name, offsets, strict=True)}}


def communicating_pairs(lay: Layout) -> list[tuple[int, int]]:
    """Inter-host pairs that carry traffic: p2p neighbours and ring neighbours of TP and DP groups."""
    H = lay.hosts()
    a = [H[:-1].ravel(), H.ravel(), np.moveaxis(H, 1, 2).ravel()]
    b = [H[1:].ravel(), np.roll(H, -1, axis=2).ravel(), np.roll(np.moveaxis(H, 1, 2), -1, axis=2).ravel()]
    x, y = np.concatenate(a), np.concatenate(b)
    on = x != y
    pairs = {(int(min(p, q)), int(max(p, q))) for p, q in zip(x[on], y[on], strict=True)}
    return sorted(pairs)


def fault_steps(pattern: str, steps: int, first: int, rng: np.random.Generator) -> list[int]:
    """Active steps of a pattern starting at `first`."""
    if pattern == "persistent":
        return list(range(first, steps))
    if pattern == "spike":
        return list(range(first, min(steps, first + int(rng.integers(2, 5)))))
    if pattern == "alternate":
        return list(range(first, steps, 2))
    later = np.arange(first + 1, steps)
    return [first, *later[rng.random(later.size) < 0.5].tolist()]


def random_spec(i: int, kind: str, seed: int, force: dict[str, str] | None = None) -> JobSpec:
    """One random job of the given fault kind, its variants drawn independently; `force` pins variants by name."""
    rng = np.random.default_rng([seed, i])
    force = force or {}

    def pick(key: str, drawn: Any) -> Any:
        if key not in force:
            return drawn
        value = force[key]
        return value.lower() in ("1", "true", "yes") if isinstance(drawn, bool | np.bool_) else type(drawn)(value)

    world = pick("world", int(rng.choice([64, 128, 256, 512, 1024], p=[0.35, 0.3, 0.2, 0.1, 0.05])))
    tp = pick("tp", int(rng.choice([2, 4, 8], p=[0.2, 0.3, 0.5])))
    pp = pick("pp", int(rng.choice([p for p in (2, 4, 8) if world // (tp * p) >= 2])))
    gph = pick("gph", int(rng.choice([8, 4], p=[0.8, 0.2])))
    n_hosts = world // gph
    hps = pick("hps", int(rng.choice([h for h in (4, 8, 16, 32) if n_hosts // h >= 2] or [max(1, n_hosts // 2)])))
    order = pick("order", str(rng.choice(["tp-dp-pp", "tp-pp-dp"], p=[0.7, 0.3])))
    placement = pick("placement", "block")  # (never drawn: pinned with --set placement=cyclic)
    lay = Layout(tp, pp, world // (tp * pp), gph, hps, order, placement=placement)
    logging = pick("logging", str(rng.choice(LOGGING, p=[0.4, 0.3, 0.15, 0.15])))
    steps = pick("steps", int(rng.integers(24, 41)) if logging in ("all", "tp0") else int(rng.integers(45, 61)))
    stage_extra = np.ones(pp)
    stage_extra[0] += rng.uniform(0, 0.05)
    stage_extra[-1] += rng.uniform(0, 0.12)
    costs = Costs(fwd_chunk_s=float(rng.uniform(1e-3, 4e-3)), tp_bytes=int(rng.uniform(8, 64) * 2**20),
                  act_bytes=int(rng.uniform(8, 64) * 2**20), grad_bytes=int(rng.uniform(0.25, 2) * 2**30),
                  nvlink_Bps=float(rng.uniform(200, 450) * 1e9), net_Bps=float(rng.uniform(12.5, 50) * 1e9),
                  latency_s=2e-5, compute_sigma=float(rng.uniform(0.03, 0.05)), net_sigma=0.05,
                  optimizer_s=float(rng.uniform(2e-3, 1e-2)), rank_sigma=float(rng.uniform(0.005, 0.02)),
                  stage_extra=tuple(float(x) for x in stage_extra))
    warmup = int(rng.integers(1, 4))
    if logging == "every3":
        logged = list(range(0, steps, 3))
    elif logging.endswith("random40"):
        logged = np.flatnonzero(rng.random(steps) < 0.4).tolist()
    else:
        logged = list(range(steps))
    fault = None
    if kind != "healthy":
        from_start = kind in ("slow_start", "stage")
        factor = float(rng.uniform(1.3, 3.0)) if not from_start else float(rng.uniform(1.5, 2.5))
        pattern = "from_start" if from_start else str(rng.choice(["persistent", "spike", "alternate", "random"]))
        pattern = pick("pattern", pattern) if not from_start else pattern
        first = 0 if from_start else int(rng.integers(warmup + 3, steps // 2 + 1))
        active = list(range(steps)) if from_start else fault_steps(pattern, steps, first, rng)
        fault = Fault(kind, factor, pattern, active)
        if kind in ("gpu", "slow_start"):
            fault.rank = int(rng.integers(lay.world))
        elif kind in ("host", "nic"):
            fault.host = int(rng.integers(n_hosts))
        elif kind == "link":
            pairs = communicating_pairs(lay)
            fault.hosts = pairs[int(rng.integers(len(pairs)))]
        elif kind == "switch":
            fault.switch = int(rng.integers(n_hosts // hps))
            fault.scope = pick("scope", str(rng.choice(["uplink", "whole"])))
        elif kind == "stage":
            fault.factor = float(rng.uniform(1.3, 1.8))  # (more layers on one stage: tens of percent)
            fault.stage = int(rng.integers(pp))
    spec = JobSpec(name=f"alt{i:03d}-{kind}", layout=lay, microbatches=int(rng.choice([4, 8, 12])), steps=steps,
                   p2p=pick("p2p", str(rng.choice(["rendezvous", "batched"]))),
                   dp_mode=pick("dp_mode", str(rng.choice(["all_reduce", "rs_ag"]))),
                   step_sync=pick("step_sync", str(rng.choice(["none", "mp", "barrier"], p=[0.3, 0.5, 0.2]))),
                   logging=logging, step0=pick("step0", int(rng.choice([0, 1000, 52_000], p=[0.6, 0.2, 0.2]))),
                   naming=pick("naming", str(rng.choice(["docs", "megatron", "opaque"], p=[0.4, 0.3, 0.3]))),
                   meta_groups=pick("meta_groups", bool(rng.random() < 0.6)),
                   meta_parallelism=pick("meta_parallelism", bool(rng.random() < 0.6)),
                   warmup_steps=warmup, warmup_factor=float(rng.uniform(1.3, 2.5)), costs=costs, fault=fault,
                   kind=kind, seed=int(rng.integers(2**31)), logged=logged)
    spec.step_ids = pick("step_ids", bool(rng.random() >= 0.12)) or logging in ("every3", "random40", "tp0-random40")
    spec.schedule = pick("schedule", "1f1b")  # (never drawn: a pinned variant leaves every seed's jobs as they were)
    spec.tp_comm = pick("tp_comm", "all_reduce")  # (never drawn, as the schedule)
    if spec.schedule == "interleaved":  # (Megatron runs it with microbatches in whole groups of pp)
        spec.microbatches = -(-spec.microbatches // pp) * pp
    if not spec.step_ids:
        spec.step0 = 0  # unnumbered rows: the reader counts iterations from 0
    ep = pick("ep", int(rng.choice([1, 2, 4], p=[0.7, 0.15, 0.15])))
    if ep > 1 and lay.dp % ep == 0:
        spec.layout = Layout(tp, pp, lay.dp, gph, hps, order, ep, placement)
        spec.costs.a2a_bytes = int(rng.uniform(8, 64) * 2**20)
    return spec


def fault_slowdown(spec: JobSpec, step_time: np.ndarray) -> float:
    """Mean step time in fault steps over normal steps (slow-from-start: over the same job without the fault)."""
    f = spec.fault
    if f is None:
        return 1.0
    active = np.zeros(spec.steps, dtype=bool)
    active[f.active] = True
    if f.kind in ("slow_start", "stage"):
        _, clean = simulate(spec, fault=False)
        return float(step_time[spec.warmup_steps:].mean() / clean[spec.warmup_steps:].mean())
    normal = ~active
    normal[: spec.warmup_steps] = False
    return float(step_time[active].mean() / step_time[normal].mean())


def device_of(c: dict[str, Any]) -> tuple[str, Any]:
    """A verdict candidate as (kind, device) in the truth's terms."""
    kind = c.get("kind", "")
    if kind == "gpu":
        return kind, c.get("rank")
    if kind in ("host", "nic"):
        return kind, c.get("host")
    if kind == "link":
        return kind, frozenset(c.get("hosts", []))
    if kind == "switch":
        return kind, c.get("switch")
    if kind == "config":
        return kind, c.get("stage")
    return kind, None


def truth_device(truth: dict[str, Any]) -> tuple[str, Any]:
    """The injected fault as (kind, device), comparable with device_of() of a candidate."""
    f = truth["faults"][0]
    if f["kind"] == "data":
        return "data", None
    if f["kind"] == "gpu":
        return "gpu", f["rank"]
    if f["kind"] == "link":
        return "link", frozenset(f["hosts"])
    if f["kind"] == "switch":
        return "switch", f["switch"]
    if f["kind"] == "config":
        return "config", f["stage"]
    return f["kind"], f["host"]


def score(truth: dict[str, Any], verdict: dict[str, Any]) -> dict[str, Any]:
    """Top-1 credit (1/k on a k-way tie at the top), false alarm and onset of one verdict against its truth."""
    cands = verdict.get("candidates", [])
    out: dict[str, Any] = {"status": verdict.get("status"), "onset": verdict.get("onset_step")}
    if not truth["faults"]:
        out["false_alarm"] = verdict.get("status") != "healthy"
        return out
    want = truth_device(truth)
    top = [c for c in cands if c.get("score") == cands[0].get("score")]
    k = max(len(top), int(cands[0].get("tie") or 1)) if cands else 1
    out["top1"] = (1.0 / k) if want in [device_of(c) for c in top] else 0.0
    logged = set(truth["logged_steps"])
    first = min(s for s in truth["faults"][0]["active_steps"] if s in logged)
    out["want_onset"] = first
    onset = verdict.get("onset_step")
    out["onset_ok"] = onset is not None and abs(int(onset) - first) <= 1
    return out


REPO = Path(__file__).resolve().parent.parent


def under_test(checkout: Path) -> str:
    """Which laggard code a run measures: the checkout and its commit (+ whether it has uncommitted changes)."""
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    return f"{checkout} @ {head.stdout.strip() or '?'}{' + uncommitted changes' if dirty.stdout.strip() else ''}"


def localize(trace: Path, timeout: float, checkout: Path = REPO, summary_first: bool = False) -> dict[str, Any]:
    """`laggard localize TRACE --format json` of the checkout's code, in a subprocess, as an outside evaluator runs it
    (`summary_first`: as the sidecars do, from per-host summaries)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        p = subprocess.run([sys.executable, "-m", "laggard", "localize", str(trace.resolve()), "--format", "json",
                            "--top", "100", *(["--summary-first"] if summary_first else [])],
                           capture_output=True, text=True, timeout=timeout, env=env, cwd=checkout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "candidates": []}
    if p.returncode not in (0, 1):
        return {"status": f"error rc={p.returncode}: {p.stderr.strip().splitlines()[-1:]}", "candidates": []}
    result: dict[str, Any] = json.loads(p.stdout)
    return result


def describe(c: dict[str, Any]) -> str:
    kind, dev = device_of(c)
    if isinstance(dev, frozenset):
        dev = "+".join(sorted(dev))
    tie = f" tie{c['tie']}" if c.get("tie") else ""
    return f"{kind}:{dev} {c.get('score', 0):.2f}{tie}"


def table(results: list[dict[str, Any]], by: str, values: list[Any]) -> list[str]:
    """Top-1 (faults) and false alarms (healthy) by fault kind x one variant."""
    lines = [f"{'kind':<11}" + "".join(f"{v!s:>16}" for v in values) + f"{'all':>16}"]
    for kind in FAULT_KINDS:
        cells = []
        for v in [*values, None]:
            rs = [r for r in results if r["kind"] == kind and (v is None or r.get(by) == v)]
            if not rs:
                cells.append(f"{'-':>16}")
            elif kind == "healthy":
                cells.append(f"{sum(r['false_alarm'] for r in rs):>8d}/{len(rs):<3d}FA  ")
            else:
                cells.append(f"{sum(r['top1'] for r in rs):>9.1f}/{len(rs):<6d}")
        lines.append(f"{kind:<11}" + "".join(cells))
    return lines


def run(n_jobs: int, seed: int, keep: Path | None, timeout: float, kinds: list[str] | None = None,
        force: dict[str, str] | None = None, checkout: Path = REPO, summary_first: bool = False) -> list[dict[str, Any]]:
    """Generate, localize and score n_jobs jobs (kinds in turn); print one line per job as it goes."""
    results: list[dict[str, Any]] = []
    skipped: dict[str, int] = defaultdict(int)
    root = keep or Path(tempfile.mkdtemp(prefix="altgen-"))
    i = 0
    while len(results) < n_jobs:
        cycle = kinds or FAULT_KINDS
        kind = cycle[len(results) % len(cycle)]
        spec = random_spec(i, kind, seed, force)
        i += 1
        if spec.fault is not None and not set(spec.fault.active) & set(spec.logged):
            skipped[f"{kind}: fault in no logged step"] += 1
            continue
        t0 = time.monotonic()
        rows, step_time = simulate(spec)
        slow = fault_slowdown(spec, step_time)
        if spec.fault is not None and slow < MIN_SLOWDOWN:
            skipped[f"{kind}: slowdown < {MIN_SLOWDOWN}"] += 1
            continue
        trace = root / spec.name
        write_trace(spec, trace, rows, step_time, slow)
        results.append(judge(trace, timeout, checkout, time.monotonic() - t0, summary_first))
    if keep is None:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    for why, n in sorted(skipped.items()):
        print(f"skipped {n}: {why}")
    return results


def judge(trace: Path, timeout: float, checkout: Path, gen_s: float = 0.0, summary_first: bool = False) -> dict[str, Any]:
    """Localize one kept trace and score the verdict against its truth.json; print one line."""
    truth = json.loads((trace / "truth.json").read_text())
    t0 = time.monotonic()
    verdict = localize(trace, timeout, checkout, summary_first)
    f = truth["faults"][0] if truth["faults"] else None
    r = {"name": truth["job"], "kind": truth["kind"], "p2p": truth["p2p"], "logging": truth["logging"],
         "naming": truth["naming"], "step_sync": truth["step_sync"], "step_ids": truth.get("step_ids", True),
         "ep": truth["parallelism"]["ep"], "order": truth["layout"]["order"],
         "gph": truth["layout"]["gpus_per_host"], "unlogged_rank": truth["unlogged_rank"], "world": truth["world"],
         "slowdown": truth["job_slowdown"], "trace": str(trace), "gen_s": gen_s, "loc_s": time.monotonic() - t0,
         "pattern": f["pattern"] if f else "-", "scope": f.get("scope", "-") if f else "-", **score(truth, verdict), "want": f["device"] if f else "healthy",
         "top3": [describe(c) for c in verdict.get("candidates", [])[:3]]}
    print(f"{r['name']:<18} {r['world']:>5}g {r['p2p']:<10} {r['logging']:<8} {r['naming']:<8} x{r['slowdown']:.2f} "
          f"gen {r['gen_s']:.1f}s loc {r['loc_s']:.1f}s -> {r['status']} {'; '.join(r['top3'])}", flush=True)
    return r


def report(results: list[dict[str, Any]]) -> None:
    print("\ntop-1 by fault kind x p2p semantics (healthy: false alarms)")
    print("\n".join(table(results, "p2p", ["rendezvous", "batched", "eager"])))
    print("\ntop-1 by fault kind x logging variant")
    print("\n".join(table(results, "logging", [*LOGGING, "tp0-random40", "hosts75"])))
    print("\ntop-1 by fault kind x fault pattern")
    print("\n".join(table(results, "pattern", ["persistent", "spike", "alternate", "random", "from_start"])))
    print("\ntop-1 of switch faults by scope (uplink: traffic leaving the rack slow; whole: inside the rack too)")
    print("\n".join(ln for ln in table(results, "scope", ["uplink", "whole"]) if ln.startswith(("kind", "switch"))))
    print("\ntop-1 by fault kind x step-end sync (mp: grad-norm all-reduce over the model-parallel group)")
    print("\n".join(table(results, "step_sync", ["none", "mp", "barrier"])))
    print("\ntop-1 by fault kind x expert parallelism (all_to_all over blocks of ep replicas)")
    print("\n".join(table(results, "ep", [1, 2, 4])))
    print("\ntop-1 by fault kind x rank order")
    print("\n".join(table(results, "order", ["tp-dp-pp", "tp-pp-dp"])))
    print("\ntop-1 by fault kind x step numbers in the rows (known / all -1)")
    print("\n".join(table(results, "step_ids", [True, False])).replace("True", "known").replace("False", "-1"))
    print("\ntop-1 by fault kind x group naming")
    print("\n".join(table(results, "naming", ["docs", "megatron", "opaque"])))
    faulty = [r for r in results if r["kind"] != "healthy"]
    healthy = [r for r in results if r["kind"] == "healthy"]
    print("\nonset within ±1 of the first logged fault step, by fault kind")
    for kind in FAULT_KINDS[1:]:
        rs = [r for r in faulty if r["kind"] == kind]
        if rs:
            print(f"{kind:<11}{sum(r['onset_ok'] for r in rs):>9d}/{len(rs):<6d}")
    print(f"\ntop-1 overall {sum(r['top1'] for r in faulty):.1f}/{len(faulty)}; "
          f"onset within ±1 {sum(r['onset_ok'] for r in faulty)}/{len(faulty)}; "
          f"false alarms {sum(r['false_alarm'] for r in healthy)}/{len(healthy)}")
    print("\nwrong jobs:")
    for r in results:
        if r.get("false_alarm") or r.get("top1", 1.0) < 1.0 or not r.get("onset_ok", True):
            unlogged = ", faulty rank not logged" if r["unlogged_rank"] else ""
            tie = f" [truth in the top tie: credit {r['top1']:.2f}]" if 0 < r.get("top1", 0) < 1 else ""
            print(f"  {r['name']} ({r['pattern']}, {r['p2p']}, {r['logging']}{unlogged}, {r['naming']}, "
                  f"sync {r['step_sync']}, {r['order']}, {r['gph']}/host, {r['world']}g, "
                  f"x{r['slowdown']:.2f}) want {r['kind']}:{r['want']} onset {r.get('want_onset', '-')}; "
                  f"got {r['status']} onset {r['onset']}; top3: {'; '.join(r['top3']) or '-'}{tie}  [{r['trace']}]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, default=None, help="write each trace directory under DIR")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per localize run")
    ap.add_argument("--json", type=Path, default=None, help="also write every job's result here")
    ap.add_argument("--laggard", type=Path, default=REPO, help="checkout whose laggard is measured (default: this one)")
    ap.add_argument("--rescore", type=Path, default=None,
                    help="generate nothing: localize and score every kept trace under DIR again (after a fix)")
    ap.add_argument("--kinds", default=None, help=f"comma-separated subset of {','.join(FAULT_KINDS)} (with --rescore: of the kept jobs)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="pin a variant in every job, e.g. logging=tp0 (or tp0-random40), step_sync=mp, gph=4, order=tp-pp-dp, "
                         "pattern=alternate, naming=opaque, meta_groups=false, world=256, steps=12, step_ids=false, schedule=gpipe (or interleaved), tp_comm=sp, "
                         "placement=cyclic")
    ap.add_argument("--summary-first", action="store_true",
                    help="localize as the sidecars do (`laggard localize --summary-first`): the other path's figures")
    args = ap.parse_args(argv)
    force = dict(kv.split("=", 1) for kv in args.set)
    print(f"laggard under test: {under_test(args.laggard.resolve())}", flush=True)
    if args.rescore:
        traces = sorted(p.parent for p in args.rescore.glob("*/truth.json"))
        if args.kinds:  # (job directories are named alt<i>-<kind>)
            traces = [t for t in traces if t.name.split("-", 1)[-1] in args.kinds.split(",")]
        results = [judge(t, args.timeout, args.laggard.resolve(), summary_first=args.summary_first) for t in traces]
    else:
        results = run(args.jobs, args.seed, args.keep, args.timeout, args.kinds.split(",") if args.kinds else None,
                      force, args.laggard.resolve(), args.summary_first)
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
