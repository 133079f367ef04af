"""The timing engine: every rank's operators, step by step, with waiting that follows dependencies.

All ranks of a pipeline stage advance together as one array, so a step costs a few numpy calls per
operator slot rather than per operator instance. A collective completes when its last member arrives
plus the transfer time, so a late rank's own copy looks short while its peers' copies grow: the
"normal while others wait" signature that localization relies on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from collector.schema import OPS
from simulator.cluster import Layout
from simulator.config import SimConfig
from simulator.faults import FaultModel
from simulator.schedule import Chunk, has_downstream, stage_orders, upstream

OP_CODE = {op: i for i, op in enumerate(OPS)}
MB = 1 << 20
LATENCY_NS = 8_000.0  # per hop
_POOL = 1 << 21


@dataclass
class RowBatch:
    """Operator rows in true time (ns since job start); group is an index into Layout.names."""

    rank: np.ndarray
    group: np.ndarray
    op: np.ndarray
    seq: np.ndarray
    peer: np.ndarray
    nbytes: np.ndarray
    start: np.ndarray
    end: np.ndarray
    step: np.ndarray

    def __len__(self) -> int:
        return int(self.rank.size)


class _Recorder:
    """Collects per-slot arrays and flushes them as one batch; scalar columns expand by np.repeat."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.arrays: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []
        self.scalars: list[tuple[int, int, int, int]] = []
        self.rows = 0

    def add(self, ranks: np.ndarray, gids: np.ndarray, op: str, seq: int, nbytes: int,
            start: np.ndarray, end: np.ndarray, step: int, peer: np.ndarray | None = None) -> None:
        if not self.enabled:
            return
        self.arrays.append((ranks, gids, start, end, peer))
        self.scalars.append((OP_CODE[op], seq, nbytes, step))
        self.rows += ranks.size

    def flush(self) -> RowBatch | None:
        if not self.arrays:
            return None
        counts = np.fromiter((a[0].size for a in self.arrays), dtype=np.int64, count=len(self.arrays))
        sc = np.asarray(self.scalars, dtype=np.int64)
        total = int(counts.sum())
        peer = np.full(total, -1, dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        for i, a in enumerate(self.arrays):
            if a[4] is not None:
                peer[bounds[i]:bounds[i + 1]] = a[4]
        batch = RowBatch(
            rank=np.concatenate([a[0] for a in self.arrays]),
            group=np.concatenate([a[1] for a in self.arrays]),
            op=np.repeat(sc[:, 0], counts),
            seq=np.repeat(sc[:, 1], counts),
            peer=peer,
            nbytes=np.repeat(sc[:, 2], counts),
            start=np.concatenate([a[2] for a in self.arrays]),
            end=np.concatenate([a[3] for a in self.arrays]),
            step=np.repeat(sc[:, 3], counts),
        )
        self.arrays, self.scalars, self.rows = [], [], 0
        return batch


class Engine:
    """Simulates one job; `run()` yields row batches and fills `step_end_ns` (true time)."""

    def __init__(self, cfg: SimConfig, layout: Layout, faults: FaultModel, record: bool = True,
                 flush_rows: int = 2_000_000) -> None:
        self.cfg = cfg
        self.lay = layout
        self.faults = faults
        self.rng = np.random.default_rng([cfg.seed, 1])
        # noise comes from pre-drawn pools sliced at random offsets: one scalar draw per operator slot
        z = self.rng.standard_normal(_POOL)
        self._comp_pool = np.exp(cfg.compute_noise * z)
        self._net_pool = np.exp(cfg.net_noise * np.roll(z, _POOL // 3))
        self._jit_pool = np.abs(np.roll(z, 2 * _POOL // 3)) * 1500.0
        self._offsets = self.rng.random(1 << 16)
        self._next = 0
        self.jitter_rng = np.random.default_rng([cfg.seed, 2])
        self.rec = _Recorder(record)
        self.flush_rows = flush_rows
        n, pp = cfg.gpus, cfg.pp
        self.S = n // pp
        self.stage_ranks = [np.arange(s * self.S, (s + 1) * self.S) for s in range(pp)]
        self.t = np.zeros(n)
        self.step_end_ns = np.zeros(cfg.steps)
        self.orders = stage_orders(pp, cfg.microbatches, cfg.virtual_stages)
        self.kinds = set(layout.active_kinds())
        # per stage and kind: global group id of each rank, and 1/bandwidth (ns per byte) of its group
        self.gid: dict[str, list[np.ndarray]] = {}
        self.inv_bw: dict[str, list[np.ndarray]] = {}
        for kind in ("tp", "cp", "ep", "dp", "pp"):
            local = layout.group_of[kind]
            mem_hosts = layout.host[layout.members[kind]]
            intra = (mem_hosts == mem_hosts[:, :1]).all(axis=1)
            inv = np.where(intra, 1.0 / cfg.nvlink_gbps, 1.0 / cfg.net_gbps)
            self.gid[kind] = [(local[r] + layout.offset[kind]).astype(np.int32) for r in self.stage_ranks]
            self.inv_bw[kind] = [inv[local[r]] for r in self.stage_ranks]
        self.act_bytes = int(cfg.activation_mb * MB)
        self.grad_bytes = int(cfg.grad_mb * MB)
        self.half_ns = cfg.layer_fwd_ms * 1e6 / 2
        self.shapes = {
            "tp": ((self.S // cfg.tp, cfg.tp), 1),
            "cp": ((cfg.dp, cfg.cp, cfg.tp), 1),
            "dp": ((cfg.dp, cfg.cp * cfg.tp), 0),
            "ep": ((cfg.dp // cfg.ep, cfg.ep, cfg.cp * cfg.tp), 1),
        }
        self.sizes = {"tp": cfg.tp, "cp": cfg.cp, "dp": cfg.dp, "ep": cfg.ep}
        # sequence numbers run over the whole job: per stage for its groups, per (src, dst) for p2p
        self.seq = {k: np.zeros(pp, dtype=np.int64) for k in ("tp", "cp", "ep", "dp")}
        self.p2p_seq: dict[tuple[int, int], int] = {}

    def _draw(self, pool: np.ndarray, size: int) -> np.ndarray:
        self._next = (self._next + 1) & 0xFFFF
        at = int(self._offsets[self._next] * (_POOL - size))
        if self._next == 0:
            self._offsets = self.rng.random(1 << 16)
        return pool[at:at + size]

    # -- operators ---------------------------------------------------------------------------
    def _collective(self, kind: str, op: str, stage: int, tt: np.ndarray, nbytes: int, step: int,
                    seq: int, gfac: np.ndarray | None) -> np.ndarray:
        shape, axis = self.shapes[kind]
        k = self.sizes[kind]
        coef = 2.0 * (k - 1) / k if op == "all_reduce" else (k - 1) / k
        arrive = tt.reshape(shape)
        last = arrive.max(axis=axis, keepdims=True)
        per_rank = coef * nbytes * self.inv_bw[kind][stage]
        if gfac is not None:
            per_rank = per_rank * gfac[self.gid[kind][stage] - self.lay.offset[kind]]
        transfer = per_rank.reshape(shape).max(axis=axis, keepdims=True)
        noise = self._draw(self._net_pool, last.size).reshape(last.shape)
        done = last + transfer * noise + LATENCY_NS * (k - 1)
        end = (done + self._draw(self._jit_pool, tt.size).reshape(shape)).ravel()
        self.rec.add(self.stage_ranks[stage], self.gid[kind][stage], op, seq, nbytes, tt, end, step)
        return end

    def _compute(self, tt: np.ndarray, ns: float, mult: np.ndarray) -> np.ndarray:
        return tt + ns * mult * self._draw(self._comp_pool, tt.size)

    # -- one step -------------------------------------------------------------------------------
    def _step(self, step: int) -> None:
        cfg = self.cfg
        cm_all = self.faults.compute_multiplier(step)
        jitter_ranks = self.faults.host_jitter_ranks(step)
        gf: dict[str, np.ndarray | None] = {}
        for k in self.kinds - {"pp"}:
            f = self.faults.group_factor(k, step)
            gf[k] = f if (f > 1.0).any() else None
        seq, p2p_seq = self.seq, self.p2p_seq
        sent: dict[tuple[int, Chunk], tuple[np.ndarray, int, int]] = {}
        ptr = [0] * cfg.pp
        remaining = sum(len(o) for o in self.orders)
        while remaining:
            progressed = False
            for s in range(cfg.pp):
                order = self.orders[s]
                while ptr[s] < len(order):
                    ch = order[ptr[s]]
                    up = upstream(ch, s, cfg.pp, cfg.virtual_stages)
                    if up is not None and up not in sent:
                        break
                    inbound = sent.pop(up) if up is not None else None
                    self._chunk(step, s, ch, inbound, cm_all, jitter_ranks, gf, seq, p2p_seq, sent)
                    ptr[s] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked (simulator bug)")
        for s in range(cfg.pp):
            self._optimizer(step, s, cm_all, gf, seq)
        self.step_end_ns[step] = self.t.max()

    def _chunk(self, step: int, s: int, ch: Chunk, inbound: tuple[np.ndarray, int, int] | None,
               cm_all: np.ndarray, jitter_ranks: np.ndarray, gf: dict[str, np.ndarray | None],
               seq: dict[str, np.ndarray], p2p_seq: dict[tuple[int, int], int],
               sent: dict[tuple[int, Chunk], tuple[np.ndarray, int, int]]) -> None:
        cfg = self.cfg
        R = self.stage_ranks[s]
        tt = self.t[R]
        pp_gid = self.gid["pp"][s]
        if inbound is not None:
            ready, src, n = inbound  # the recv carries the seq of the send it matches
            end = np.maximum(tt, ready) + self._draw(self._jit_pool, tt.size)
            self.rec.add(R, pp_gid, "recv", n, self.act_bytes, tt, end, step, peer=self.stage_ranks[src])
            tt = end
        mult = cm_all[R] * (2.0 if ch.phase == "B" else 1.0)
        if jitter_ranks.size:
            j = np.ones(cfg.gpus)
            j[jitter_ranks] = self.jitter_rng.lognormal(0.0, 0.35, size=jitter_ranks.size)
            mult = mult * j[R]
        for _ in range(cfg.layers_per_chunk):
            if "cp" in self.kinds:
                op = "all_gather" if ch.phase == "F" else "reduce_scatter"
                tt = self._collective("cp", op, s, tt, self.act_bytes // 2, step, int(seq["cp"][s]), gf["cp"])
                seq["cp"][s] += 1
            tt = self._compute(tt, self.half_ns, mult)
            if "tp" in self.kinds:
                tt = self._collective("tp", "all_reduce", s, tt, self.act_bytes, step, int(seq["tp"][s]), gf["tp"])
                seq["tp"][s] += 1
            if "ep" in self.kinds:
                for part in range(2):
                    tt = self._collective("ep", "all_to_all", s, tt, self.act_bytes, step, int(seq["ep"][s]), gf["ep"])
                    seq["ep"][s] += 1
                    if part == 0:
                        tt = self._compute(tt, self.half_ns, mult)
            else:
                tt = self._compute(tt, self.half_ns, mult)
            if "tp" in self.kinds:
                tt = self._collective("tp", "all_reduce", s, tt, self.act_bytes, step, int(seq["tp"][s]), gf["tp"])
                seq["tp"][s] += 1
        dst = has_downstream(ch, s, cfg.pp, cfg.virtual_stages)
        if dst is not None:
            key = (s, dst)
            n = p2p_seq.get(key, 0)
            p2p_seq[key] = n + 1
            peer = self.stage_ranks[dst]
            factor = self.faults.edge_factor(("p2p", key), R, peer, step)
            inv = np.where(self.lay.host[R] == self.lay.host[peer], 1.0 / cfg.nvlink_gbps, 1.0 / cfg.net_gbps)
            transfer = self.act_bytes * inv * factor * self._draw(self._net_pool, tt.size)
            end = tt + transfer + LATENCY_NS
            self.rec.add(R, pp_gid, "send", n, self.act_bytes, tt, end, step, peer=peer)
            sent[(s, ch)] = (end, s, n)
            tt = end
        self.t[R] = tt
        if self.rec.rows >= self.flush_rows:
            self._pending.append(self.rec.flush())

    def _optimizer(self, step: int, s: int, cm_all: np.ndarray, gf: dict[str, np.ndarray | None],
                   seq: dict[str, np.ndarray]) -> None:
        R = self.stage_ranks[s]
        tt = self.t[R]
        if "dp" in self.kinds:
            tt = self._collective("dp", "reduce_scatter", s, tt, self.grad_bytes, step, int(seq["dp"][s]), gf["dp"])
            seq["dp"][s] += 1
        tt = self._compute(tt, 4 * self.half_ns, cm_all[R])
        if "dp" in self.kinds:
            tt = self._collective("dp", "all_gather", s, tt, self.grad_bytes, step, int(seq["dp"][s]), gf["dp"])
            seq["dp"][s] += 1
        self.t[R] = tt

    def run(self) -> Iterator[RowBatch]:
        """Simulate every step; yields row batches of bounded size as they fill."""
        self._pending: list[RowBatch | None] = []
        self.t = self.rng.uniform(0.0, 2e5, size=self.cfg.gpus)  # ranks start within 0.2 ms
        for step in range(self.cfg.steps):
            self._step(step)
            yield from (b for b in self._pending if b is not None)
            self._pending = []
            if self.rec.rows >= self.flush_rows // 4:
                batch = self.rec.flush()
                if batch is not None:
                    yield batch
        last = self.rec.flush()
        if last is not None:
            yield last
