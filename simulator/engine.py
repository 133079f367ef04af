"""The timing engine: every rank's operators, step by step, with waiting that follows dependencies.

All ranks of a pipeline stage advance together as one array, so a step costs a few numpy calls per
operator slot rather than per operator instance. A collective completes when its last member arrives
plus the transfer time, so a late rank's own copy looks short while its peers' copies grow: the
"normal while others wait" signature that localization relies on.

Pipeline transfers follow `SimConfig.p2p`: eager sends end after their transfer whatever the receiver
does; rendezvous and batched transfers start only once both sides have posted, so a late receiver
shows up as a long send upstream and a short receive (see `_StageProgram`).

The data-parallel gradient sync follows `SimConfig.grad_overlap`: off, one blocking reduce-scatter
after the last chunk; on (Megatron's overlap_grad_reduce, DDP's buckets), `grad_buckets` reduce-scatters
launched asynchronously as the last microbatch's backward produces each bucket, run back to back on a
communication stream beside the compute, and waited for at the iteration's end. Their records start at
launch and end when the slowest replica's bucket has arrived and moved. `param_gather_overlap` does the
same for the parameter all-gather, waited for layer by layer by the next step's first forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from collector.trace.schema import OPS
from simulator.cluster import Layout
from simulator.config import SimConfig
from simulator.faults import FaultModel
from simulator.schedule import Chunk, has_downstream, stage_orders, upstream

OP_CODE = {op: i for i, op in enumerate(OPS)}
MB = 1 << 20
LATENCY_NS = 8_000.0  # per hop
MP_SYNC_BYTES = 8  # the iteration-end model-parallel all_reduce carries a norm or a loss: a few floats
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
        mp_hosts = layout.host[layout.members["mp"]]
        self.mp_inv_bw = np.where((mp_hosts == mp_hosts[:, :1]).all(axis=1), 1.0 / cfg.nvlink_gbps, 1.0 / cfg.net_gbps)
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
        # overlapped DP buckets: per stage, when each layer's gradients were final (this step), and when
        # each parameter all-gather bucket completed (last step)
        self.stage_layers = cfg.virtual_stages * cfg.layers_per_chunk
        self._grad_ready: list[list[np.ndarray]] = [[] for _ in range(pp)]
        self._gather_end: list[list[np.ndarray] | None] = [None] * pp

    def _draw(self, pool: np.ndarray, size: int) -> np.ndarray:
        self._next = (self._next + 1) & 0xFFFF
        at = int(self._offsets[self._next] * (_POOL - size))
        if self._next == 0:
            self._offsets = self.rng.random(1 << 16)
        return pool[at:at + size]

    # -- operators ---------------------------------------------------------------------------
    def _collective(self, kind: str, op: str, stage: int, tt: np.ndarray, nbytes: int, step: int,
                    seq: int, gfac: np.ndarray | None, free: np.ndarray | None = None) -> np.ndarray:
        """Members enter at `tt`; the data moves once the last one is in (and, for an asynchronous
        operator, once every member's communication stream is `free` of the previous one)."""
        shape, axis = self.shapes[kind]
        k = self.sizes[kind]
        coef = 2.0 * (k - 1) / k if op == "all_reduce" else (k - 1) / k
        arrive = (tt if free is None else np.maximum(tt, free)).reshape(shape)
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
        """Every stage advances through its boundaries until it needs a peer's post; repeat until done."""
        cfg = self.cfg
        cm_all = self.faults.compute_multiplier(step)
        jitter_ranks = self.faults.host_jitter_ranks(step)
        gf: dict[str, np.ndarray | None] = {}
        for k in self.kinds - {"pp"}:
            f = self.faults.group_factor(k, step)
            gf[k] = f if (f > 1.0).any() else None
        if step == 0 and self.cfg.param_gather_overlap and "dp" in self.kinds:
            # no optimizer step has launched a gather yet: the first forward's hooks launch it (Megatron's
            # finish_param_sync dispatches a bucket not yet dispatched), and wait for it layer by layer
            for s in range(cfg.pp):
                launch = self.t[self.stage_ranks[s]]
                self._gather_end[s] = self._bucket_chain("all_gather", s, [launch] * cfg.grad_buckets, 0, gf["dp"])
        p2p = _P2P(self, step)
        progs = [_StageProgram(self, s, p2p) for s in range(cfg.pp)]
        while not all(pr.done for pr in progs):
            progressed = False
            for pr in progs:
                while not pr.done and pr.advance():
                    if pr.run_chunk:
                        self._chunk(step, pr.s, pr.run_chunk, cm_all, jitter_ranks, gf)
                        pr.run_chunk = None
                    progressed = True
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked (simulator bug)")
        for s in range(cfg.pp):
            self._grad_sync(step, s, gf)
        if "mp" in self.kinds:
            self._mp_sync(step, gf["mp"])
        for s in range(cfg.pp):
            self._optimizer(step, s, cm_all, gf)
        self.step_end_ns[step] = self.t.max()

    def _chunk(self, step: int, s: int, ch: Chunk, cm_all: np.ndarray, jitter_ranks: np.ndarray,
               gf: dict[str, np.ndarray | None]) -> None:
        """One forward or backward chunk of one stage: compute and the stage's own collectives."""
        cfg, seq = self.cfg, self.seq
        R = self.stage_ranks[s]
        tt = self.t[R]
        mult = cm_all[R] * (2.0 if ch.phase == "B" else 1.0)
        if jitter_ranks.size:
            j = np.ones(cfg.gpus)
            j[jitter_ranks] = self.jitter_rng.lognormal(0.0, 0.35, size=jitter_ranks.size)
            mult = mult * j[R]
        last_bwd = cfg.grad_overlap and "dp" in self.kinds and ch.phase == "B" and ch.micro == cfg.microbatches - 1
        gather = self._gather_end[s] if ch.phase == "F" and ch.micro == 0 else None
        for layer in range(cfg.layers_per_chunk):
            if gather is not None:  # overlapped parameter all-gather: this layer's bucket must be in
                tt = np.maximum(tt, gather[(ch.vchunk * cfg.layers_per_chunk + layer) * len(gather) // self.stage_layers])
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
            if last_bwd:  # this layer's gradients are final
                self._grad_ready[s].append(tt)
        self.t[R] = tt
        if self.rec.rows >= self.flush_rows:
            self._pending.append(self.rec.flush())

    def _grad_sync(self, step: int, s: int, gf: dict[str, np.ndarray | None]) -> None:
        """Data-parallel gradient reduce-scatter of one stage: blocking at the end, or the overlapped
        buckets launched during the backward, waited for here."""
        if "dp" not in self.kinds:
            return
        R = self.stage_ranks[s]
        if not self.cfg.grad_overlap:
            self.t[R] = self._collective("dp", "reduce_scatter", s, self.t[R], self.grad_bytes, step, int(self.seq["dp"][s]), gf["dp"])
            self.seq["dp"][s] += 1
            return
        ready, B = self._grad_ready[s], self.cfg.grad_buckets
        # bucket b holds the gradients of the layers up to the (b+1)/B-th one the backward finished
        launches = [ready[-(-(b + 1) * len(ready) // B) - 1] for b in range(B)]
        ends = self._bucket_chain("reduce_scatter", s, launches, step, gf["dp"])
        self.t[R] = np.maximum(self.t[R], ends[-1])
        self._grad_ready[s] = []

    def _bucket_chain(self, op: str, s: int, launches: list[np.ndarray], step: int, gfac: np.ndarray | None) -> list[np.ndarray]:
        """Asynchronous DP buckets of one stage, one after another on each rank's communication stream."""
        ends: list[np.ndarray] = []
        nbytes = self.grad_bytes // len(launches)
        for launch in launches:
            ends.append(self._collective("dp", op, s, launch, nbytes, step, int(self.seq["dp"][s]), gfac,
                                         free=ends[-1] if ends else None))
            self.seq["dp"][s] += 1
        return ends

    def _mp_sync(self, step: int, gfac: np.ndarray | None) -> None:
        """The iteration-end all_reduce of each replica's model-parallel group (Megatron's grad-norm):
        every stage of a replica waits for the slowest one, a few bytes cross the network."""
        mem = self.lay.members["mp"]  # [dp, tp*cp*pp]
        k = mem.shape[1]
        arrive = self.t[mem]
        last = arrive.max(axis=1, keepdims=True)
        transfer = 2.0 * (k - 1) / k * MP_SYNC_BYTES * self.mp_inv_bw[:, None]
        if gfac is not None:
            transfer = transfer * gfac[:, None]
        done = last + transfer * self._draw(self._net_pool, last.size)[:, None] + LATENCY_NS * (k - 1)
        end = done + self._draw(self._jit_pool, arrive.size).reshape(arrive.shape)
        gid = np.repeat(np.arange(mem.shape[0], dtype=np.int32) + self.lay.offset["mp"], k)
        self.rec.add(mem.ravel(), gid, "all_reduce", step, MP_SYNC_BYTES, arrive.ravel(), end.ravel(), step)
        self.t[mem] = end

    def _optimizer(self, step: int, s: int, cm_all: np.ndarray, gf: dict[str, np.ndarray | None]) -> None:
        """The optimizer update, then the data-parallel parameter all-gather: blocking, or launched
        here in buckets that the next step's first forward waits for. Launched after optimizer.step(),
        they belong to the next step, as a logger that counts optimizer steps sees them (the last step
        launches none: no step follows)."""
        R, seq = self.stage_ranks[s], self.seq
        tt = self._compute(self.t[R], 4 * self.half_ns, cm_all[R])
        if "dp" in self.kinds and self.cfg.param_gather_overlap:
            if step + 1 < self.cfg.steps:
                self._gather_end[s] = self._bucket_chain("all_gather", s, [tt] * self.cfg.grad_buckets, step + 1, gf["dp"])
        elif "dp" in self.kinds:
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


class _P2P:
    """Pipeline transfers of one step: who posted when (true time), and when each transfer's data arrived.

    eager: the data moves as soon as the send is posted. rendezvous and batched: it moves once both
    sides have posted, so a late receiver holds its sender.
    """

    def __init__(self, engine: Engine, step: int) -> None:
        self.e = engine
        self.step = step
        self.eager = engine.cfg.p2p == "eager"
        self.send_post: dict[tuple[int, Chunk], tuple[np.ndarray, int, int]] = {}  # key -> (post, seq, dst)
        self.recv_post: dict[tuple[int, Chunk], np.ndarray] = {}
        self.arrival: dict[tuple[int, Chunk], np.ndarray] = {}

    def post_send(self, key: tuple[int, Chunk], dst: int, t: np.ndarray) -> None:
        if key in self.send_post:
            return
        pair = (key[0], dst)
        n = self.e.p2p_seq.get(pair, 0)
        self.e.p2p_seq[pair] = n + 1
        self.send_post[key] = (t.copy(), n, dst)

    def post_recv(self, key: tuple[int, Chunk], t: np.ndarray) -> None:
        if key not in self.recv_post:
            self.recv_post[key] = t.copy()

    def arrived(self, key: tuple[int, Chunk]) -> np.ndarray | None:
        """When the data of `key` is complete on both sides, or None while a side has not posted."""
        if key in self.arrival:
            return self.arrival[key]
        if key not in self.send_post or (not self.eager and key not in self.recv_post):
            return None
        e = self.e
        s = key[0]
        post, _, dst = self.send_post[key]
        start = post if self.eager else np.maximum(post, self.recv_post[key])
        R, peer = e.stage_ranks[s], e.stage_ranks[dst]
        factor = e.faults.edge_factor(("p2p", (s, dst)), R, peer, self.step)
        inv = np.where(e.lay.host[R] == e.lay.host[peer], 1.0 / e.cfg.nvlink_gbps, 1.0 / e.cfg.net_gbps)
        transfer = e.act_bytes * inv * factor * e._draw(e._net_pool, R.size)
        self.arrival[key] = start + transfer + LATENCY_NS
        return self.arrival[key]

    def record(self, key: tuple[int, Chunk], side: str, start: np.ndarray, end: np.ndarray) -> None:
        e = self.e
        s = key[0]
        _, n, dst = self.send_post[key]
        if side == "send":
            e.rec.add(e.stage_ranks[s], e.gid["pp"][s], "send", n, e.act_bytes, start, end, self.step,
                      peer=e.stage_ranks[dst])
        else:
            e.rec.add(e.stage_ranks[dst], e.gid["pp"][dst], "recv", n, e.act_bytes, start, end, self.step,
                      peer=e.stage_ranks[s])


class _StageProgram:
    """One stage's step as boundaries between chunks: at boundary b it posts receives, sends chunk b-1's
    output, waits for chunk b's input, then runs chunk b.

    Receives are posted as Megatron does: the next chunk's input at each boundary (1F1B), and one chunk
    ahead under the interleaved schedule, where Megatron overlaps p2p with compute by default
    (`overlap_p2p_comm`): that receive stays in flight while the stage computes. A rendezvous send blocks after the receives are posted
    (as gloo/NCCL do for large messages); batched mode posts sends and receives as one batch and waits
    for all of it (`batch_isend_irecv`). Both orders are deadlock-free for 1F1B and interleaved schedules.
    """

    def __init__(self, engine: Engine, s: int, p2p: _P2P) -> None:
        cfg = engine.cfg
        self.e, self.s, self.p2p, self.mode = engine, s, p2p, cfg.p2p
        self.R = engine.stage_ranks[s]
        order = engine.orders[s]
        self.order = order
        ahead = 2 if cfg.virtual_stages > 1 else 1
        self.up = [upstream(ch, s, cfg.pp, cfg.virtual_stages) for ch in order]
        self.posts: list[list[tuple[int, Chunk]]] = [[] for _ in range(len(order) + 1)]
        for j, key in enumerate(self.up):
            if key is not None:
                self.posts[max(0, j - ahead + 1)].append(key)
        self.down = [has_downstream(ch, s, cfg.pp, cfg.virtual_stages) for ch in order]
        self.b = 0
        self.phase = "post"
        self.done = False
        self.run_chunk: Chunk | None = None
        self.batch_post = np.empty(0)

    def _send(self) -> tuple[tuple[int, Chunk], int] | None:
        b = self.b
        if b == 0 or self.down[b - 1] is None:
            return None
        return (self.s, self.order[b - 1]), int(self.down[b - 1])  # type: ignore[arg-type]

    def advance(self) -> bool:
        """Take the next action of this stage; False when it must wait for a peer to post."""
        e, p2p, t = self.e, self.p2p, self.e.t
        R = self.R
        send = self._send()
        recv = self.up[self.b] if self.b < len(self.order) else None
        if self.phase == "post":
            if self.mode != "eager":
                for key in self.posts[self.b]:
                    p2p.post_recv(key, t[R])
            if self.mode == "batched":
                self.batch_post = t[R].copy()
                if send:
                    p2p.post_send(send[0], send[1], t[R])
                self.phase = "wait"
            else:
                self.phase = "send"
            return True
        if self.phase == "send":
            if send:
                p2p.post_send(send[0], send[1], t[R])
                arrival = p2p.arrived(send[0])
                if arrival is None:
                    return False
                post = p2p.send_post[send[0]][0]
                end = arrival if self.mode == "eager" else arrival + e._draw(e._jit_pool, R.size)
                p2p.record(send[0], "send", post, end)
                t[R] = end
            self.phase = "wait"
            return True
        # wait for this boundary's transfers, then run the chunk
        if self.mode == "batched":
            keys = [k for k in ((send[0] if send else None), recv) if k is not None]
            arrivals = [p2p.arrived(k) for k in keys]
            if any(a is None for a in arrivals):
                return False
            if keys:
                end = np.maximum(np.max(np.stack(arrivals), axis=0), t[R]) + e._draw(e._jit_pool, R.size)  # type: ignore[arg-type]
                if send:
                    p2p.record(send[0], "send", self.batch_post, end)
                if recv is not None:
                    p2p.record(recv, "recv", p2p.recv_post[recv], end)
                t[R] = end
        elif recv is not None:
            if self.mode == "eager":
                p2p.post_recv(recv, t[R])
            arrival = p2p.arrived(recv)
            if arrival is None:
                return False
            post = p2p.recv_post[recv]
            end = np.maximum(post, arrival) + e._draw(e._jit_pool, R.size)
            p2p.record(recv, "recv", post, end)
            t[R] = np.maximum(t[R], end)
        if self.b == len(self.order):
            self.done = True
        else:
            self.run_chunk = self.order[self.b]
            self.b += 1
            self.phase = "post"
        return True
