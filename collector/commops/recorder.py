"""The hot path of the CommOps logger: wrappers around torch.distributed that time each operator.

Why it looks the way it does: every wrapper runs on the training thread for every operator, so
it only reads two clocks, bumps a per-group counter and appends one flat tuple to a bounded
ring (a deque with maxlen: one C call, memory stays bounded); naming groups, converting to
columns and writing Parquet happen later on the writer thread. It keeps no in-flight marker:
the writer finds an op a thread is inside of on that thread's stack. Nothing here may raise
into the training loop: bookkeeping errors are counted and reported once.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from collector.commops.cudatime import has_cuda_tensor, run_cuda, run_cuda_batch
from collector.commops.works import timed_work
from collector.trace.groupnames import group_label
from collector.trace.schema import OPS

OP_CODE = {name: i for i, name in enumerate(OPS)}
SEND, RECV = OP_CODE["send"], OP_CODE["recv"]

#: (torch function name, contract op, positional index of the payload tensor, positional index of the group)
COLLECTIVES: tuple[tuple[str, str, int, int], ...] = (
    ("all_reduce", "all_reduce", 0, 2),
    ("broadcast", "broadcast", 0, 2),
    ("reduce", "reduce", 0, 3),
    ("all_gather", "all_gather", 1, 2),
    ("all_gather_into_tensor", "all_gather", 1, 2),
    ("_all_gather_base", "all_gather", 1, 2),
    ("all_gather_single", "all_gather", 1, 2),
    ("reduce_scatter", "reduce_scatter", 1, 3),
    ("reduce_scatter_tensor", "reduce_scatter", 1, 3),
    ("_reduce_scatter_base", "reduce_scatter", 1, 3),
    ("reduce_scatter_single", "reduce_scatter", 1, 3),
    ("all_to_all", "all_to_all", 1, 2),
    ("all_to_all_single", "all_to_all", 1, 4),
    ("barrier", "barrier", -1, 0),
)
#: (torch function name, contract op, keyword naming the peer, keyword naming the peer's group rank)
P2P: tuple[tuple[str, str, str, str], ...] = (
    ("send", "send", "dst", "group_dst"),
    ("isend", "send", "dst", "group_dst"),
    ("recv", "recv", "src", "group_src"),
    ("irecv", "recv", "src", "group_src"),
)

_now = time.time_ns


def payload_bytes(x: Any) -> int:
    """Bytes of a tensor or a list of tensors (all_gather/all_to_all lists); 0 when unknown."""
    if isinstance(x, (list, tuple)):
        return sum(payload_bytes(t) for t in x)
    try:
        return int(x.nbytes)
    except AttributeError:
        return 0


class Guard(threading.local):
    """`on` while this thread runs inside a wrapped operator; False in every new thread."""

    on = False


class Recorder:
    """Per-process state: group ids and sequence numbers, the step, the rings, in-flight ops."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        if capacity & (capacity - 1):
            raise ValueError("capacity must be a power of two")
        self.capacity = capacity
        self.mask = capacity - 1  # of the async ring
        # completed synchronous ops: a bounded ring (the oldest fall out when the writer falls
        # behind); one C-level append per op, drained by the writer with popleft
        self.ring: deque[tuple[int, ...]] = deque(maxlen=capacity)
        # completion ring for async ops: callbacks run on backend threads, so it takes a lock
        self.async_ring: list[tuple[tuple[int, ...], int] | None] = [None] * capacity
        self.async_pos = [0]
        self.async_lock = threading.Lock()
        self.step = [0]
        self.manual_step = False
        self.groups: dict[Any, int] = {}  # process group object (None = default) -> gid
        self.cpu_groups: dict[Any, int] = {}  # the same, for groups timed on the CPU (the wrappers' fast path)
        self.group_names: list[str] = []
        self.names: dict[Any, str] = {}  # process group -> name given by commops.name_group
        self.group_ranks: list[list[int]] = []
        self.seq: list[int] = []  # per gid, collectives
        self.send_seq: list[dict[int, int]] = []  # per gid: dst -> last seq of sends from this rank
        self.recv_seq: list[dict[int, int]] = []  # per gid: src -> last seq of receives
        self.current: list[tuple[int, ...] | None] = [None]  # slow-path sync op in flight (see in_flight_frames)
        self.fast_codes: dict[Any, int] = {}  # code object of each fast-path wrapper -> its op code
        self.in_flight: dict[int, tuple[int, ...]] = {}  # id(row) -> row: async ops not completed
        self.cuda_groups: set[int] = set()  # gids whose backend runs on CUDA: timed with events
        self.mixed_groups: set[int] = set()  # of those, gids that also serve CPU tensors
        self.cuda_rows: list[tuple[tuple[int, ...], Any, Any, Any]] = []  # (row, clock anchor, start, end event)
        self.gpu_clock: Any = None  # cudatime.GpuClock, made on the first CUDA op
        self.failed: list[tuple[int, ...]] = []  # ops that raised (timeouts): kept for hang attribution
        self.guard = Guard()  # per thread: inside a wrapped operator (see the wrapper templates)
        self.rank = -1
        self.errors = 0
        self.first_error = ""
        self.on_failure: Callable[[], None] | None = None

    # -- bookkeeping off the fast path ------------------------------------------------------
    def error(self, exc: BaseException) -> None:
        """Count a bookkeeping error; print the first one once, never raise."""
        self.errors += 1
        if self.errors == 1:
            self.first_error = f"{type(exc).__name__}: {exc}"
            print(f"laggard commops: recording error (counted, logging continues): {self.first_error}",
                  file=sys.stderr)

    def group_id(self, pg: Any) -> int:
        """Register a process group on first use: its name and global ranks."""
        gid = self.groups.get(pg)
        if gid is not None:
            return gid
        name, ranks = describe_group(pg)
        name = self.names.get(pg, name)
        if name in self.group_names:  # two handles for the same group (None and WORLD)
            gid = self.group_names.index(name)
        else:
            gid = len(self.group_names)
            self.group_names.append(name)
            self.group_ranks.append(ranks)
            self.seq.append(0)
            self.send_seq.append({})
            self.recv_seq.append({})
        self.groups[pg] = gid
        kind = _cuda_kind(pg)
        if kind:
            self.cuda_groups.add(gid)
            if kind == "mixed":
                self.mixed_groups.add(gid)
        else:
            self.cpu_groups[pg] = gid
        return gid

    def name_group(self, pg: Any, name: str) -> bool:
        """Name `pg` in the records; False if it already ran under another name (rows are out)."""
        gid = self.groups.get(pg)
        if gid is not None:
            return self.group_names[gid] == name
        self.names[pg] = name
        return True

    def failed_op(self, row: tuple[int, ...]) -> None:
        """An op raised (a timeout, a dead peer): keep it for hang attribution, then tell the logger."""
        self.failed.append(row)
        if self.on_failure is not None:
            self.on_failure()

    def in_flight_frames(self) -> list[tuple[int, ...]]:
        """Rows of the ops some thread is inside of on the fast path right now, read from the
        wrappers' frames (the fast path keeps no marker; a stuck op is still on its stack)."""
        rows: list[tuple[int, ...]] = []
        for frame in sys._current_frames().values():
            f: Any = frame
            while f is not None:
                code = self.fast_codes.get(f.f_code)
                if code is not None:
                    loc = f.f_locals
                    if "t0" in loc and "out" not in loc:
                        rows.append((loc["gid"], code, loc["s"], loc.get("peer", -1), loc["nbytes"], loc["t0"], loc["st"]))
                f = f.f_back
        return rows

    def run_host(self, orig: Callable[..., Any], row: tuple[int, ...], args: Any, kwargs: Any) -> Any:
        """Host-clock timing for a CPU-tensor op on a group that also serves CUDA (the slow path's
        CPU timing, `run_marked`)."""
        return run_marked(self, orig, row, False, args, kwargs)

    def global_peer(self, pg: Any, group_peer: int) -> int:
        import torch.distributed as dist

        return int(dist.get_global_rank(pg, group_peer)) if pg is not None else int(group_peer)

    def created(self) -> int:
        """Records ever begun: every one of them takes a sequence number (the writer derives the
        dropped count from this, so the hot path keeps no counter of its own)."""
        return sum(self.seq) + sum(sum(list(d.values())) for d in self.send_seq + self.recv_seq)

    def next_p2p_seq(self, gid: int, peer: int, send: bool) -> int:
        seqs = (self.send_seq if send else self.recv_seq)[gid]
        s = seqs[peer] = seqs.get(peer, 0) + 1
        return s

    def peer_of(self, pg: Any, peer: Any, group_peer: Any) -> int:
        """The global peer rank of a p2p call given either as a global rank or as a group rank."""
        if peer is not None:
            return int(peer)
        return -1 if group_peer is None else self.global_peer(pg, group_peer)

    def complete_async(self, row: tuple[int, ...], fut: Any) -> None:
        """Future callback: the op finished (or failed) now; time it here."""
        t1 = _now()
        try:
            ok = not _future_failed(fut)
            with self.async_lock:
                self.in_flight.pop(id(row), None)
                if ok:
                    self.async_ring[self.async_pos[0] & self.mask] = (row, t1)
                    self.async_pos[0] += 1
                else:
                    self.failed.append(row)
            if not ok and self.on_failure is not None:
                self.on_failure()
        except Exception as exc:
            self.error(exc)

    def watch(self, work: Any, row: tuple[int, ...]) -> Any:
        """Time an async op at completion: a future callback, or (gloo p2p works have no future)
        a Work wrapper that records when the caller's wait() returns. Returns the work to hand back."""
        with self.async_lock:
            if len(self.in_flight) >= self.capacity:  # works nobody waits for: forget the oldest
                self.in_flight.pop(next(iter(self.in_flight)))
            self.in_flight[id(row)] = row
        try:
            fut = work.get_future()
        except RuntimeError:  # "Work::getFuture not implemented"
            return timed_work(work, lambda ok: self.complete_async(row, None if ok else _FAILED))
        except Exception as exc:
            self.error(exc)
            return work
        # then(), not add_done_callback(): on gloo the latter made DDP's reducer wait on the GIL
        # (+20% step time in bench.sidecar); then() costs nothing measurable
        fut.then(lambda f: self.complete_async(row, f))
        return work


_FAILED = object()


def _cuda_kind(pg: Any) -> str:
    """"nccl" when the group's backend runs only CUDA ops, "mixed" when it serves CPU tensors too
    (e.g. "cpu:gloo,cuda:nccl": decided per call by the tensors), "" for CPU-only backends."""
    import torch.distributed as dist

    try:
        backend = str(dist.get_backend(pg))
    except Exception:
        return ""
    if "nccl" not in backend:
        return ""
    return "mixed" if "cpu" in backend else "nccl"


def _future_failed(fut: Any) -> bool:
    if fut is None:
        return False
    if fut is _FAILED:
        return True
    try:
        fut.value()
    except Exception:
        return True
    return False


def describe_group(pg: Any) -> tuple[str, list[int]]:
    """A stable, cross-rank name for a process group and its global ranks: "world" for the
    default group, else `collector.trace.groupnames.group_label` of torch's name and `group_desc`
    (e.g. new_group(..., group_desc="tp-0"); torch names groups identically on every rank).
    """
    import torch.distributed as dist

    default = dist.distributed_c10d._get_default_group()
    if pg is None or pg is default or pg is dist.GroupMember.WORLD:
        return "world", list(range(dist.get_world_size()))
    ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
    desc = str(getattr(pg, "group_desc", "") or "")
    return group_label(str(pg.group_name), "" if desc == "default_pg" else desc), ranks


# Wrappers are generated with the wrapped function's own signature: forwarding *args/**kwargs
# would cost more than everything else they do. Each has two paths:
#  - fast (a CPU-timed group seen before): one dict lookup, one seq update, the payload size,
#    two clock reads and one flat tuple (gid, op, seq, peer, nbytes, start_ns, step, end_ns)
#    appended to the ring. It keeps no in-flight marker: an op it is inside of is found by the
#    writer in the thread's frames (`in_flight_frames`), from these locals;
#  - slow (a group's first op, groups on CUDA): registers the group, marks the row in flight in
#    `current`, and times CUDA groups with events (`run_cuda`).
# Both hold this thread's `guard` while the wrapped function runs: torch's aliases call one
# another (all_gather_into_tensor and _all_gather_base call all_gather_single, send calls isend,
# batch_isend_irecv the isend/irecv it was given), and the operator is recorded once, by the
# outermost wrapper, whichever name the job called.
_FAST_COLLECTIVE = """
def {name}({decl}):
    if guard.on:
        return orig({call})
    try:
        gid = fast.get({group})
        if gid is not None:
            nbytes = {nbytes}
            s = seqs[gid] = seqs[gid] + 1
            st = step[0]
            t0 = now()
    except Exception as exc:
        rec.error(exc)
        return orig({call})
    if gid is None:
        return slow({call})
    guard.on = True
    try:
        out = orig({call})
    except BaseException:
        rec.failed_op((gid, code, s, -1, nbytes, t0, st))
        raise
    finally:
        guard.on = False
    if out is None:
        publish((gid, code, s, -1, nbytes, t0, st, now()))
    else:
        out = rec.watch(out, (gid, code, s, -1, nbytes, t0, st))
    return out
"""

_SLOW_COLLECTIVE = """
def slow({decl}):
    try:
        gid = rec.group_id({group})
        nbytes = {nbytes}
        s = seqs[gid] = seqs[gid] + 1
        row = (gid, code, s, -1, nbytes, now(), step[0])
    except Exception as exc:
        rec.error(exc)
        return orig({call})
    guard.on = True
    try:
        return run_marked(rec, orig, row, gid in cuda, ({call_tuple}), {{{call_kw}}})
    finally:
        guard.on = False
"""

# p2p: seq counts per group, peer and direction (what (group, src, dst) is on this rank), so
# both sides agree.
_P2P_ROW = """
        {lookup}
        if gid is not None:
            peer = {peer}
            if peer.__class__ is not int:
                peer = rec.peer_of(group, peer, {group_peer})
            d = pseq[gid]
            nbytes = {nbytes}
            s = d[peer] = d.get(peer, 0) + 1
            st = step[0]
            t0 = now()
    except Exception as exc:
        rec.error(exc)
        return orig({call})"""

_FAST_P2P = """
def {name}({decl}):
    if guard.on:
        return orig({call})
    try:""" + _P2P_ROW.replace("{lookup}", "gid = fast.get(group)") + """
    if gid is None:
        return slow({call})
    guard.on = True
    try:
        out = orig({call})
    except BaseException:
        rec.failed_op((gid, code, s, peer, nbytes, t0, st))
        raise
    finally:
        guard.on = False
    if out is None or out.__class__ is int:  # send returns None, recv the source rank
        publish((gid, code, s, peer, nbytes, t0, st, now()))
    else:
        out = rec.watch(out, (gid, code, s, peer, nbytes, t0, st))
    return out
"""

_SLOW_P2P = """
def slow({decl}):
    try:""" + _P2P_ROW.replace("{lookup}", "gid = rec.group_id(group)") + """
    guard.on = True
    try:
        return run_marked(rec, orig, (gid, code, s, peer, nbytes, t0, st), gid in cuda, ({call_tuple}), {{{call_kw}}})
    finally:
        guard.on = False
"""


def run_marked(rec: Recorder, orig: Callable[..., Any], row: tuple[int, ...], gpu: bool, args: Any,
               kwargs: Any) -> Any:
    """The slow path's call: CUDA groups through `run_cuda`, others with `row` marked in flight."""
    if gpu:
        return run_cuda(rec, orig, row, args, kwargs)
    rec.current[0] = row
    try:
        out = orig(*args, **kwargs)
    except BaseException:
        rec.current[0] = None
        rec.failed_op(row)
        raise
    rec.current[0] = None
    if out is None or out.__class__ is int:
        rec.ring.append((*row, _now()))
    else:
        out = rec.watch(out, row)
    return out


def _generate(rec: Recorder, orig: Callable[..., Any], op: str, fast: str, slow: str, need: list[int],
              fields: dict[str, str], env: dict[str, Any]) -> Callable[..., Any]:
    """Compile the fast and slow templates into functions with `orig`'s signature. `need`:
    parameter positions the templates name; `fields` may name parameters as {p0}, {p1}, ..."""
    params = list(inspect.signature(orig).parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY) for p in params) or max(need) >= len(params):
        raise TypeError(f"cannot wrap {op}: unexpected signature {inspect.signature(orig)}")
    decl, call, positional, keyword = [], [], [], []
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and "*" not in decl:
            decl.append("*")
        decl.append(p.name if p.default is p.empty else f"{p.name}=_d[{i}]")
        if p.kind is p.KEYWORD_ONLY:
            call.append(f"{p.name}={p.name}")
            keyword.append(f"{p.name!r}: {p.name}")
        else:
            call.append(p.name)
            positional.append(p.name)
    names = {f"p{i}": p.name for i, p in enumerate(params)}
    name = orig.__name__ if orig.__name__.isidentifier() and orig.__name__ != "slow" else "wrapper"
    src = (slow + fast).format(
        name=name, decl=", ".join(decl), call=", ".join(call),
        call_tuple="".join(f"{x}, " for x in positional), call_kw=", ".join(keyword),
        **{k: v.format(**names) for k, v in fields.items()})
    env = {
        **env, "_d": [p.default for p in params], "rec": rec, "fast": rec.cpu_groups, "code": OP_CODE[op],
        "now": _now, "step": rec.step, "orig": orig, "cuda": rec.cuda_groups, "run_marked": run_marked,
        "publish": rec.ring.append, "guard": rec.guard,
    }
    exec(compile(src, f"<laggard commops wrapper of {name}>", "exec"), env)
    wrapper = env[name]
    rec.fast_codes[wrapper.__code__] = OP_CODE[op]
    wrapper.__wrapped__ = orig
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__qualname__ = getattr(orig, "__qualname__", name)
    return wrapper  # type: ignore[no-any-return]


def make_collective(rec: Recorder, orig: Callable[..., Any], op: str, tpos: int, gpos: int) -> Callable[..., Any]:
    """Wrap one collective (`tpos`: position of the payload, -1 for none; `gpos`: of the group)."""
    params = list(inspect.signature(orig).parameters)
    if tpos < 0:
        nbytes = "0"
    elif tpos < len(params) and params[tpos].endswith("list"):  # all_to_all, reduce_scatter: lists of tensors
        nbytes = f"payload_bytes({{p{tpos}}})"
    else:
        nbytes = f"{{p{tpos}}}.nbytes"
    return _generate(rec, orig, op, _FAST_COLLECTIVE, _SLOW_COLLECTIVE, [max(tpos, 0), gpos],
                     {"group": f"{{p{gpos}}}", "nbytes": nbytes}, {"seqs": rec.seq, "payload_bytes": payload_bytes})


def make_p2p(rec: Recorder, orig: Callable[..., Any], op: str, peer_kw: str, group_peer_kw: str) -> Callable[..., Any]:
    """Wrap send/recv/isend/irecv (the tensor first; the peer, `group` and `group_peer_kw` by name)."""
    params = list(inspect.signature(orig).parameters)
    if not params or peer_kw not in params or "group" not in params or group_peer_kw not in params:
        raise TypeError(f"cannot wrap {op}: unexpected signature {inspect.signature(orig)}")
    return _generate(rec, orig, op, _FAST_P2P, _SLOW_P2P, [params.index(peer_kw)],
                     {"peer": peer_kw, "group_peer": group_peer_kw, "nbytes": f"{params[0]}.nbytes"},
                     {"pseq": rec.send_seq if OP_CODE[op] == SEND else rec.recv_seq})


def make_batch_p2p(rec: Recorder, orig: Callable[..., Any], send_fns: tuple[Any, ...]) -> Callable[..., Any]:
    """Wrap batch_isend_irecv: one row per P2POp, each timed when its work (or the batch's) completes;
    on the GPU's own events when the group runs on CUDA (`run_cuda_batch`)."""
    step, guard = rec.step, rec.guard

    def wrapper(p2p_op_list: list[Any]) -> Any:
        if guard.on:
            return orig(p2p_op_list)
        rows: list[tuple[int, ...]] = []
        try:
            t0 = _now()
            for p in p2p_op_list:
                gid = rec.group_id(p.group)
                send = p.op in send_fns
                peer = int(p.peer)
                s = rec.next_p2p_seq(gid, peer, send)
                rows.append((gid, SEND if send else RECV, s, peer,
                             p.tensor.nbytes, t0, step[0]))
        except Exception as exc:
            rec.error(exc)
            rows = []
        gpu = bool(rows) and rows[0][0] in rec.cuda_groups and (
            rows[0][0] not in rec.mixed_groups or has_cuda_tensor([p.tensor for p in p2p_op_list], {}))
        guard.on = True
        try:
            if gpu:
                return run_cuda_batch(rec, orig, p2p_op_list, rows)
            works = orig(p2p_op_list)
        except BaseException:
            if not gpu:  # (`run_cuda_batch` marks its own)
                rec.failed.extend(rows)
            raise
        finally:
            guard.on = False
        if rows:
            if len(works) == len(rows):
                works = [rec.watch(w, r) for w, r in zip(works, rows, strict=True)]
            elif works:  # coalesced backends (NCCL) return one work for the whole batch
                for r in rows:
                    rec.watch(works[-1], r)
        return works

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__name__ = "batch_isend_irecv"
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    return wrapper
