"""The hot path of the CommOps logger: wrappers around torch.distributed that time each operator.

Why it looks the way it does: every wrapper runs on the training thread for every operator, so
it only reads two clocks, bumps a per-group counter and drops one tuple into a preallocated ring
slot; naming groups, converting to columns and writing Parquet happen later on the writer thread.
Nothing here may raise into the training loop: bookkeeping errors are counted and reported once.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from collector.commops.cudatime import run_cuda
from collector.schema import OPS

OP_CODE = {name: i for i, name in enumerate(OPS)}
SEND, RECV = OP_CODE["send"], OP_CODE["recv"]

#: (torch function name, contract op, positional index of the payload tensor, positional index of the group)
COLLECTIVES: tuple[tuple[str, str, int, int], ...] = (
    ("all_reduce", "all_reduce", 0, 2),
    ("broadcast", "broadcast", 0, 2),
    ("reduce", "reduce", 0, 3),
    ("all_gather", "all_gather", 1, 2),
    ("all_gather_into_tensor", "all_gather", 1, 2),
    ("all_gather_single", "all_gather", 1, 2),
    ("reduce_scatter", "reduce_scatter", 1, 3),
    ("reduce_scatter_tensor", "reduce_scatter", 1, 3),
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


class Recorder:
    """Per-process state: group ids and sequence numbers, the step, the rings, in-flight ops."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        if capacity & (capacity - 1):
            raise ValueError("capacity must be a power of two")
        self.capacity = capacity
        self.mask = capacity - 1
        # main-thread ring: one producer (the training thread), read by the writer thread
        self.ring: list[tuple[tuple[int, ...], int] | None] = [None] * capacity
        self.pos = [0]  # records ever written to `ring`
        # completion ring for async ops: callbacks run on backend threads, so it takes a lock
        self.async_ring: list[tuple[tuple[int, ...], int] | None] = [None] * capacity
        self.async_pos = [0]
        self.async_lock = threading.Lock()
        self.step = [0]
        self.manual_step = False
        self.groups: dict[Any, int] = {}  # process group object (None = default) -> gid
        self.group_names: list[str] = []
        self.group_ranks: list[list[int]] = []
        self.seq: list[int] = []  # per gid, collectives
        self.p2p_seq: dict[tuple[int, int, int], int] = {}  # (gid, src, dst) -> last seq
        self.current: list[tuple[int, ...] | None] = [None]  # sync op in flight on the training thread
        self.in_flight: dict[int, tuple[int, ...]] = {}  # id(row) -> row: async ops not completed
        self.cuda_groups: set[int] = set()  # gids whose backend runs on CUDA: timed with events
        self.mixed_groups: set[int] = set()  # of those, gids that also serve CPU tensors
        self.cuda_rows: list[tuple[tuple[int, ...], Any, Any, Any]] = []  # (row, clock anchor, start, end event)
        self.gpu_clock: Any = None  # cudatime.GpuClock, made on the first CUDA op
        self.failed: list[tuple[int, ...]] = []  # ops that raised (timeouts): kept for hang attribution
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
        if name in self.group_names:  # two handles for the same group (None and WORLD)
            gid = self.group_names.index(name)
        else:
            gid = len(self.group_names)
            self.group_names.append(name)
            self.group_ranks.append(ranks)
            self.seq.append(0)
        self.groups[pg] = gid
        kind = _cuda_kind(pg)
        if kind:
            self.cuda_groups.add(gid)
            if kind == "mixed":
                self.mixed_groups.add(gid)
        return gid

    def global_peer(self, pg: Any, group_peer: int) -> int:
        import torch.distributed as dist

        return int(dist.get_global_rank(pg, group_peer)) if pg is not None else int(group_peer)

    def next_p2p_seq(self, gid: int, src: int, dst: int) -> int:
        key = (gid, src, dst)
        s = self.p2p_seq.get(key, 0) + 1
        self.p2p_seq[key] = s
        return s

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
            return timed_work(self, work, row)
        except Exception as exc:
            self.error(exc)
            return work
        # then(), not add_done_callback(): on gloo the latter made DDP's reducer wait on the GIL
        # (+20% step time in bench.sidecar); then() costs nothing measurable
        fut.then(lambda f: self.complete_async(row, f))
        return work


    def run_host(self, orig: Callable[..., Any], row: tuple[int, ...], args: Any, kwargs: Any) -> Any:
        """Host-clock timing for a CPU-tensor op on a group that also serves CUDA. The generated
        wrappers inline this same logic, where the extra call would cost too much."""
        self.current[0] = row
        try:
            out = orig(*args, **kwargs)
        except BaseException:
            self.current[0] = None
            self.failed.append(row)
            if self.on_failure is not None:
                self.on_failure()
            raise
        self.current[0] = None
        if out is None or out.__class__ is int:
            i = self.pos[0]
            self.ring[i & self.mask] = (row, _now())
            self.pos[0] = i + 1
            return out
        return self.watch(out, row)


_TimedWork: Any = None


def timed_work(rec: Recorder, work: Any, row: tuple[int, ...]) -> Any:
    """Wrap a Work without a future so its wait() marks completion; still an instance of dist.Work."""
    global _TimedWork
    if _TimedWork is None:
        import torch.distributed as dist

        class TimedWork(dist.Work):  # type: ignore[misc]
            def __init__(self, rec: Recorder, inner: Any, row: tuple[int, ...]) -> None:
                super().__init__()
                self._rec, self._inner, self._row, self._done = rec, inner, row, False

            def _finish(self, ok: bool) -> None:
                if not self._done:
                    self._done = True
                    self._rec.complete_async(self._row, None if ok else _FAILED)

            def wait(self, *args: Any, **kwargs: Any) -> Any:
                try:
                    out = self._inner.wait(*args, **kwargs)
                except BaseException:
                    self._finish(False)
                    raise
                self._finish(True)
                return out

            def is_completed(self) -> bool:
                done = bool(self._inner.is_completed())
                if done:
                    self._finish(bool(self._inner.is_success()) if hasattr(self._inner, "is_success") else True)
                return done

            def is_success(self) -> bool:
                return bool(self._inner.is_success())

            def exception(self) -> Any:
                return self._inner.exception()

            def source_rank(self) -> int:
                return int(self._inner.source_rank())

            def result(self) -> Any:
                return self._inner.result()

            def synchronize(self) -> None:
                self._inner.synchronize()

            def get_future(self) -> Any:
                return self._inner.get_future()

        _TimedWork = TimedWork
    return _TimedWork(rec, work, row)


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
    """A stable, cross-rank name for a process group and its global ranks.

    The user's `group_desc` when given (e.g. new_group(..., group_desc="tp-0")), "world" for the
    default group, else "pg-<torch group name>" (torch names groups identically on every rank).
    """
    import torch.distributed as dist

    default = dist.distributed_c10d._get_default_group()
    if pg is None or pg is default or pg is dist.GroupMember.WORLD:
        return "world", list(range(dist.get_world_size()))
    ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
    desc = str(getattr(pg, "group_desc", "") or "")
    if desc and desc not in ("undefined", "default_pg"):
        return desc, ranks
    return f"pg-{pg.group_name}", ranks


_COLLECTIVE_BODY = """
def {name}({decl}):
    try:
        gid = groups.get({group})
        if gid is None:
            gid = rec.group_id({group})
        s = seqs[gid] = seqs[gid] + 1
        row = (gid, code, s, -1, {nbytes}, now(), step[0])
    except Exception as exc:
        rec.error(exc)
        return orig({call})
    if gid in cuda:
        return run_cuda(rec, orig, row, ({call_tuple}), {{{call_kw}}})
    current[0] = row
    try:
        out = orig({call})
    except BaseException:
        current[0] = None
        rec.failed.append(row)
        if rec.on_failure is not None:
            rec.on_failure()
        raise
    current[0] = None
    if out is None:
        i = pos[0]
        ring[i & mask] = (row, now())
        pos[0] = i + 1
    else:
        out = rec.watch(out, row)
    return out
"""


def make_collective(rec: Recorder, orig: Callable[..., Any], op: str, tpos: int, gpos: int) -> Callable[..., Any]:
    """Wrap one collective. A ring entry is ((gid, op, seq, peer, nbytes, start_ns, step), end_ns):
    the row built before the call doubles as the in-flight marker, and is not copied after it.

    The wrapper is generated with the wrapped function's own signature: forwarding *args/**kwargs
    would cost more than everything else the wrapper does.
    """
    params = list(inspect.signature(orig).parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY) for p in params) or gpos >= len(params):
        raise TypeError(f"cannot wrap {op}: unexpected signature {inspect.signature(orig)}")
    defaults = [p.default for p in params]
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
    t = params[tpos].name if tpos >= 0 else ""
    name = orig.__name__ if orig.__name__.isidentifier() else "wrapper"
    src = _COLLECTIVE_BODY.format(
        name=name, decl=", ".join(decl), group=params[gpos].name, call=", ".join(call),
        call_tuple="".join(f"{x}, " for x in positional), call_kw=", ".join(keyword),
        nbytes=f"{t}.nbytes if {t}.__class__ is not list else payload_bytes({t})" if t else "0")
    env: dict[str, Any] = {
        "_d": defaults, "groups": rec.groups, "rec": rec, "seqs": rec.seq, "code": OP_CODE[op],
        "now": _now, "step": rec.step, "orig": orig, "cuda": rec.cuda_groups, "run_cuda": run_cuda,
        "current": rec.current, "pos": rec.pos, "ring": rec.ring, "mask": rec.mask, "payload_bytes": payload_bytes,
    }
    exec(compile(src, f"<laggard commops wrapper of {name}>", "exec"), env)
    wrapper = env[name]
    wrapper.__wrapped__ = orig
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__qualname__ = orig.__qualname__
    return wrapper  # type: ignore[no-any-return]


def make_p2p(rec: Recorder, orig: Callable[..., Any], op: str, peer_kw: str, group_peer_kw: str,
             batch_flag: list[bool]) -> Callable[..., Any]:
    """Wrap send/recv/isend/irecv; seq counts per (group, src, dst) so both sides agree."""
    code = OP_CODE[op]
    is_send = code == SEND
    sync = not orig.__name__.startswith("i")
    ring, pos, mask, current, step = rec.ring, rec.pos, rec.mask, rec.current, rec.step
    groups, cuda = rec.groups, rec.cuda_groups
    now = _now

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if batch_flag[0]:  # inside batch_isend_irecv: the batch wrapper records these
            return orig(*args, **kwargs)
        try:
            g = kwargs["group"] if "group" in kwargs else (args[2] if len(args) > 2 else None)
            gid = groups[g] if g in groups else rec.group_id(g)
            peer = kwargs[peer_kw] if peer_kw in kwargs else (args[1] if len(args) > 1 else None)
            if peer is None and kwargs.get(group_peer_kw) is not None:
                peer = rec.global_peer(g, kwargs[group_peer_kw])
            peer = -1 if peer is None else int(peer)
            me = rec.rank
            s = rec.next_p2p_seq(gid, me, peer) if is_send else rec.next_p2p_seq(gid, peer, me)
            t = args[0] if args else kwargs["tensor"]
            row = (gid, code, s, peer, t.nbytes, now(), step[0])
        except Exception as exc:
            rec.error(exc)
            return orig(*args, **kwargs)
        if gid in cuda:
            return run_cuda(rec, orig, row, args, kwargs)
        current[0] = row
        batch_flag[0] = sync  # send/recv are built on isend/irecv: record them once, here
        try:
            out = orig(*args, **kwargs)
        except BaseException:
            current[0] = None
            rec.failed.append(row)
            if rec.on_failure is not None:
                rec.on_failure()
            raise
        finally:
            batch_flag[0] = False
        current[0] = None
        if out is None or out.__class__ is int:  # send returns None, recv returns the source rank
            i = pos[0]
            ring[i & mask] = (row, now())
            pos[0] = i + 1
        else:
            out = rec.watch(out, row)
        return out

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(orig, "__name__", op)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    return wrapper


def make_batch_p2p(rec: Recorder, orig: Callable[..., Any], batch_flag: list[bool],
                   send_fns: tuple[Any, ...]) -> Callable[..., Any]:
    """Wrap batch_isend_irecv: one row per P2POp, each timed when its work (or the batch's) completes."""
    step = rec.step

    def wrapper(p2p_op_list: list[Any]) -> Any:
        rows: list[tuple[int, ...]] = []
        try:
            t0 = _now()
            for p in p2p_op_list:
                gid = rec.group_id(p.group)
                send = p.op in send_fns
                peer = int(p.peer)
                s = rec.next_p2p_seq(gid, rec.rank, peer) if send else rec.next_p2p_seq(gid, peer, rec.rank)
                rows.append((gid, SEND if send else RECV, s, peer,
                             p.tensor.nbytes, t0, step[0]))
        except Exception as exc:
            rec.error(exc)
            rows = []
        batch_flag[0] = True
        try:
            works = orig(p2p_op_list)
        except BaseException:
            rec.failed.extend(rows)
            raise
        finally:
            batch_flag[0] = False
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
