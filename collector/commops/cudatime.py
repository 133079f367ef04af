"""GPU timing for NCCL operators: CUDA events placed around each op, mapped onto the wall clock.

Why: an NCCL call returns to Python as soon as it is enqueued, so CPU clocks say when the *host*
reached the op, not when the GPU did. A start event on the caller's stream fires when the GPU
reaches the op (this rank's arrival); an end event fires when the op's work is done. Events only
give durations between each other, so `GpuClock` anchors them: an event recorded on an idle side
stream while the host watches the wall clock. Anchors are renewed so that float-millisecond event
times keep microsecond resolution over a long job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from collector.commops.works import timed_work

if TYPE_CHECKING:
    from collector.commops.recorder import Recorder

#: renew the anchor this often: cudaEventElapsedTime is a float of milliseconds (about 1 us at 10 s)
REANCHOR_NS = 10_000_000_000
#: an anchor whose wall-clock bracket is wider than this is too imprecise to replace a good one
MAX_ANCHOR_ERROR_NS = 1_000_000


class GpuClock:
    """Wall-clock anchors for one device's CUDA events."""

    def __init__(self, device: int) -> None:
        import torch

        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.anchor: tuple[Any, int] = self._take()

    def _take(self) -> tuple[Any, int]:
        """Record an event on the idle side stream and bracket its completion with the wall clock."""
        import torch

        with torch.cuda.device(self.device):
            ev = torch.cuda.Event(enable_timing=True)
            t0 = time.time_ns()
            ev.record(self.stream)
            ev.synchronize()
            t1 = time.time_ns()
        return ev, (t0 + t1) // 2

    def renew(self) -> None:
        """Take a fresh anchor when the current one is old (called by the writer thread); keep the
        old one if the GPU was too slow to answer for the new one to be precise."""
        if time.time_ns() - self.anchor[1] >= REANCHOR_NS:
            ev, ns = self._take()
            if time.time_ns() - ns <= MAX_ANCHOR_ERROR_NS:
                self.anchor = ev, ns


def wall_ns(anchor: tuple[Any, int], event: Any) -> int:
    """Wall-clock ns at which `event` fired, from an anchor recorded before it."""
    ev, ns = anchor
    return ns + round(ev.elapsed_time(event) * 1e6)


def clock_for(rec: Recorder) -> GpuClock:
    """The recorder's GPU clock, made on first use on the device the training thread uses
    (one device per rank, as torchrun jobs run)."""
    if rec.gpu_clock is None:
        import torch

        rec.gpu_clock = GpuClock(torch.cuda.current_device())
    return rec.gpu_clock


def has_cuda_tensor(args: Any, kwargs: Any) -> bool:
    """Whether any tensor argument (or list of tensors) lives on a GPU: decides the timing path
    for groups whose backend serves both CPU and CUDA tensors (e.g. "cpu:gloo,cuda:nccl")."""
    for a in (*args, *kwargs.values()):
        first = a[0] if isinstance(a, (list, tuple)) and a else a
        if getattr(first, "is_cuda", False):
            return True
    return False


def start_event(rec: Recorder) -> tuple[tuple[Any, int], Any] | None:
    """The clock's anchor and a start event recorded on the current stream (it fires when the GPU
    reaches the op); None, with the error counted, when CUDA cannot make one: the op then runs
    untimed, since timing it is never worth the training step."""
    import torch

    try:
        anchor = clock_for(rec).anchor
        start = torch.cuda.Event(enable_timing=True)
        start.record()
    except Exception as exc:
        rec.error(exc)
        return None
    return anchor, start


def run_cuda(rec: Recorder, orig: Callable[..., Any], row: tuple[int, ...], args: Any, kwargs: Any) -> Any:
    """Run an op of a CUDA group between two events. Sync ops get their end event right after the
    call (the caller's stream already waits on NCCL's); async ops get it from the work's future."""
    if row[0] in rec.mixed_groups and not has_cuda_tensor(args, kwargs):
        return rec.run_host(orig, row, args, kwargs)
    began = start_event(rec)
    if began is None:
        return orig(*args, **kwargs)
    anchor, start = began
    with rec.async_lock:
        rec.in_flight[id(row)] = row  # until the GPU passes the end event: a hung NCCL op stays pending
    try:
        out = orig(*args, **kwargs)
    except BaseException:
        with rec.async_lock:
            rec.in_flight.pop(id(row), None)
        rec.failed_op(row)
        raise
    if out is None or out.__class__ is int:
        record_end(rec, row, anchor, start)
        return out
    return watch_cuda(rec, out, row, anchor, start)


def run_cuda_batch(rec: Recorder, orig: Callable[..., Any], ops: list[Any], rows: list[tuple[int, ...]]) -> Any:
    """batch_isend_irecv on a CUDA group, between events: the start event when the GPU reaches the
    batch (this rank's arrival), the end recorded once the caller's wait() has made its stream wait
    for the batch. Not the work's future: NCCL completes a coalesced batch's at enqueue, and its
    callback's stream does not wait for the transfers. A coalesced batch returns one work for all."""
    began = start_event(rec)
    if began is None:
        return orig(ops)
    anchor, start = began
    with rec.async_lock:
        for row in rows:
            rec.in_flight[id(row)] = row
    try:
        works = orig(ops)
    except BaseException:
        _ended(rec, rows, anchor, start)(False)
        raise
    if not works:
        _forget(rec, rows)
        return works
    if len(works) == len(rows):
        return [timed_work(w, _ended(rec, [row], anchor, start), polled=False) for w, row in zip(works, rows, strict=True)]
    return [*works[:-1], timed_work(works[-1], _ended(rec, rows, anchor, start), polled=False)]


def _ended(rec: Recorder, rows: list[tuple[int, ...]], anchor: tuple[Any, int], start: Any) -> Callable[[bool], None]:
    """What a batch's wait() does: end events on the (now waiting) current stream, or the rows failed."""
    def finish(ok: bool) -> None:
        if ok:
            for row in rows:
                record_end(rec, row, anchor, start)
            return
        _forget(rec, rows)
        rec.failed.extend(rows)
    return finish


def _forget(rec: Recorder, rows: list[tuple[int, ...]]) -> None:
    """No longer in flight: the GPU will never pass an end event of theirs."""
    with rec.async_lock:
        for row in rows:
            rec.in_flight.pop(id(row), None)


def record_end(rec: Recorder, row: tuple[int, ...], anchor: tuple[Any, int], start: Any) -> None:
    """Put the op's end event on the current stream and queue the op for the writer. It runs in the
    training call (or the caller's wait()): an event that fails is a counted error and the op is
    dropped, never raised into training nor left pending as if hung."""
    import torch

    try:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
    except Exception as exc:
        with rec.async_lock:
            rec.in_flight.pop(id(row), None)
        rec.error(exc)
        return
    with rec.async_lock:
        rec.cuda_rows.append((row, anchor, start, end))


def watch_cuda(rec: Recorder, work: Any, row: tuple[int, ...], anchor: tuple[Any, int], start: Any) -> Any:
    """Async CUDA op: the future's callback runs on a stream made to wait for the op's completion,
    so an event recorded there fires when the op is done on the GPU, whenever the caller waits."""
    try:
        work.get_future().then(lambda _: record_end(rec, row, anchor, start))
    except Exception as exc:  # no future: fall back to host-side completion timing
        with rec.async_lock:
            rec.in_flight.pop(id(row), None)
        rec.error(exc)
        return rec.watch(work, row)
    return work


def drain_finished(rec: Recorder, cuda_rows: list[tuple[tuple[int, ...], Any, Any, Any]]
                   ) -> tuple[list[tuple[tuple[int, ...], int]], list[tuple[tuple[int, ...], Any, Any, Any]]]:
    """Split recorded CUDA ops into finished records (start and end on the wall clock) and those
    the GPU has not reached yet. Runs on the writer thread."""
    done: list[tuple[tuple[int, ...], int]] = []
    waiting = []
    finished = []
    for entry in cuda_rows:
        row, anchor, start, end = entry
        if not end.query():
            waiting.append(entry)
            continue
        finished.append(id(row))
        done.append(((*row[:5], wall_ns(anchor, start), *row[6:]), wall_ns(anchor, end)))
    if finished:
        with rec.async_lock:
            for key in finished:
                rec.in_flight.pop(key, None)
    return done, waiting
