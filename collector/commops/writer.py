"""The CommOps logger's background writer: drains the rings into per-rank Parquet shards.

It runs on its own daemon thread so the training loop never waits on disk; each flush writes
one shard (temp file, then atomic rename), the rank's pending operators and its self-description,
and rank 0 refreshes meta.json. All failures are counted on the recorder, never raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from collector.commops import cudatime, layout
from collector.commops.launcher import identity as launcher_identity
from collector.commops.recorder import Recorder
from collector.trace.schema import COMMOPS_SCHEMA, OPS

_OPS = pa.array(OPS, pa.string())
STUCK_NS = 1_000_000_000  # in flight this long at a flush: written to pending/ (localize.waits.hang waits longer)
SHARD_ROWS = 1 << 16  # periodic flushes buffer drained records and write a shard once this many are
SHARD_AGE_S = 30.0  # buffered, or once the oldest has waited this long (a Parquet write costs ms)
MAX_BUFFER_ROWS = 8 * SHARD_ROWS  # kept in memory (32 MB) while the directory cannot be written; older are dropped


def _say(text: str) -> None:
    """One line on the job's stderr, written unbuffered from the writer thread; never raises."""
    with contextlib.suppress(OSError):
        os.write(2, f"laggard commops: {text}\n".encode())


ENV_SHARD_AGE = "LAGGARD_COMMOPS_SHARD_AGE_S"  # lower it where a node agent posts live (time to verdict)


def shard_age_s() -> float:
    """$LAGGARD_COMMOPS_SHARD_AGE_S when it is a positive number, else SHARD_AGE_S (never an error:
    a flush that raised would keep every record in memory)."""
    try:
        age = float(os.environ.get(ENV_SHARD_AGE, SHARD_AGE_S))
    except ValueError:
        return SHARD_AGE_S
    return age if age > 0 else SHARD_AGE_S


class ShardWriter:
    """Flushes a Recorder to `root` every `interval` seconds (and on demand)."""

    def __init__(self, rec: Recorder, root: Path, rank: int, world: int, interval: float, job: str,
                 identity: dict[str, Any] | None = None) -> None:
        self.rec = rec
        self.root = root
        self.rank = rank
        self.world = world
        self.interval = interval
        self.job = job
        # where this rank runs and what the job declared (collector.commops.launcher), as written
        # to ranks/rank-R.json: host, host_from, gpu, node_rank, parallelism
        self.identity = identity if identity is not None else launcher_identity(os.environ)
        self.async_consumed = 0
        self.dropped = 0
        self.rows = 0
        self.shards = 0
        self.bytes = 0
        self.cpu_s = 0.0  # CPU time of the periodic flushes (the writer thread's cost while the job runs)
        self.known_groups = -1
        self.known_ranks = -1
        self.had_pending = False
        self.info_written: tuple[int, int, int] | None = None
        self.buffer: list[np.ndarray] = []  # drained records not written yet, (n, 8) int64 each
        self.buffered = 0
        self.buffered_since = 0.0
        self.write_failures = 0  # shard writes that failed (each flush retries)
        self.failing = False  # the last shard write failed: records are held, then dropped
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="laggard-commops-writer", daemon=True)

    def start(self) -> None:
        (self.root / "commops").mkdir(parents=True, exist_ok=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)
        self.flush(final=True)

    def _loop(self) -> None:
        while not self.stopped.is_set():
            woken = self.wake.wait(self.interval)  # woken: an op failed (or stop): write everything now
            self.wake.clear()
            if not self.stopped.is_set():
                self.flush(write=woken)

    # -- draining -------------------------------------------------------------------------
    def _drain_main(self) -> list[tuple[int, ...]]:
        """Records the training thread published since the last drain. Only this thread pops, and
        an append to a full ring drops from the left, so `n` pops always succeed."""
        pop = self.rec.ring.popleft
        return [pop() for _ in range(len(self.rec.ring))]

    def _drain_async(self) -> list[tuple[int, ...]]:
        rec, cap = self.rec, self.rec.capacity
        with rec.async_lock:
            n = rec.async_pos[0]
            lo = max(self.async_consumed, n - cap)
            done = [rec.async_ring[i & rec.mask] for i in range(lo, n)]
            self.async_consumed = n
            cuda = rec.cuda_rows
            rec.cuda_rows = []
        out = [(*r[0], r[1]) for r in done if r is not None]
        if not cuda:
            return out
        finished, keep = cudatime.drain_finished(rec, cuda)
        out += [(*row, end) for row, end in finished]
        rec.gpu_clock.renew()
        if keep:
            with rec.async_lock:
                over = len(keep) + len(rec.cuda_rows) - cap
                if over > 0:
                    keep = keep[over:]
                rec.cuda_rows = keep + rec.cuda_rows
        return out

    def flush(self, final: bool = False, write: bool = True) -> None:
        """Drain the rings; write a shard (always when `write`, else once enough is buffered),
        the pending operators, and what changed in the rank's description and meta.json."""
        if not self.lock.acquire(timeout=5):
            return
        t0 = time.thread_time()
        try:
            created = self.rec.created()  # before draining: every record counted here is drained or pending
            rows = self._drain_main() + self._drain_async()
            if rows:
                if not self.buffer:
                    self.buffered_since = time.monotonic()
                self.buffer.append(np.array(rows, dtype=np.int64))  # gid, op, seq, peer, nbytes, start, step, end
                self.buffered += len(rows)
            if self.buffer and (write or final or self.buffered >= SHARD_ROWS
                                or time.monotonic() - self.buffered_since >= shard_age_s()):
                try:
                    self._write_shard(np.concatenate(self.buffer))
                except OSError as exc:  # unwritable or full: hold a bounded backlog, retry next flush
                    self._shard_failed(exc, final)
                else:
                    self.buffer, self.buffered = [], 0
                    if self.failing:
                        self.failing = False
                        _say(f"writing to {self.root} again; {self.dropped} record(s) were dropped while it failed")
            pending = self._pending(final)
            # (CUDA ops stay in `in_flight` until the GPU passes their end event: pending, counted once)
            self.dropped = max(0, created - self.rows - self.buffered - len(pending))
            if final and self.failing and self.buffered:
                _say(f"{self.buffered} record(s) could not be written to {self.root} and are lost "
                     f"({self.dropped} dropped in all)")
            if not final:  # an op entered a moment ago is ordinary: only stuck or failed ops are evidence
                stale = time.time_ns() - STUCK_NS
                pending = [(r, f) for r, f in pending if f or r[5] <= stale]
            self._write_pending(pending)
            info = (len(self.rec.group_names), self.rec.errors, self.dropped)
            if final or info != self.info_written:  # what merge_meta reads; counters ride along
                self._write_rank_info()
                self.info_written = info
            if self.rank == 0 or final:  # whoever finishes last leaves the most complete meta.json
                self._write_meta(force=final)
        except Exception as exc:
            self.rec.error(exc)
        finally:
            if not final and not write:
                self.cpu_s += time.thread_time() - t0
            self.lock.release()

    def _shard_failed(self, exc: OSError, final: bool) -> None:
        """Say plainly, once per outage, that records are not being kept; drop the oldest past the cap."""
        self.write_failures += 1
        if not self.failing:
            self.failing = True
            _say(f"cannot write to {self.root} ({exc.strerror or exc}): holding at most {MAX_BUFFER_ROWS} records "
                 f"and retrying every {self.interval:g} s; records beyond that are DROPPED (counted in "
                 "ranks/*.json 'dropped'). Training is not affected.")
        while self.buffered > MAX_BUFFER_ROWS and len(self.buffer) > 1:
            self.buffered -= len(self.buffer.pop(0))
        if self.buffered > MAX_BUFFER_ROWS:  # one huge drain: keep its newest rows
            self.buffer = [self.buffer[0][-MAX_BUFFER_ROWS:]]
            self.buffered = MAX_BUFFER_ROWS

    def _pending(self, final: bool) -> list[tuple[tuple[int, ...], bool]]:
        """(row, failed) of the ops begun and not completed: async works in flight, sync ops some
        thread is inside of (not at the final flush), and ops that raised; one each."""
        rec = self.rec
        with rec.async_lock:
            rows = [(r, False) for r in rec.in_flight.values()]
        if not final:
            cur = rec.current[0]
            rows += [(r, False) for r in rec.in_flight_frames() + ([cur] if cur is not None else [])]
        rows += [(r, True) for r in list(rec.failed)]
        seen: dict[tuple[int, int, int], tuple[tuple[int, ...], bool]] = {}
        for r, failed in rows:  # an op that raised may still be on its thread's stack
            key = (r[0], r[1], r[2])
            if failed or key not in seen:
                seen[key] = (r, failed)
        return list(seen.values())

    def _record_columns(self, a: np.ndarray) -> list[pa.Array]:
        """rank, group, op, seq, peer, nbytes, start_ns from records (gid, op, seq, peer, nbytes, start, ...)."""
        names = pa.array(self.rec.group_names, pa.string())
        return [
            pa.array(np.full(len(a), self.rank, np.int32)),
            names.take(pa.array(a[:, 0])),
            _OPS.take(pa.array(a[:, 1])),
            pa.array(a[:, 2]),
            pa.array(a[:, 3].astype(np.int32)),
            pa.array(a[:, 4]),
            pa.array(a[:, 5]),
        ]

    def _write_shard(self, a: np.ndarray) -> None:
        table = pa.Table.from_arrays(
            [*self._record_columns(a), pa.array(a[:, 7]), pa.array(a[:, 6].astype(np.int32))],
            schema=COMMOPS_SCHEMA,
        )
        path = layout.shard_path(self.root, self.rank, self.shards)
        layout.atomic_write_table(path, table)
        self.shards += 1
        self.rows += len(a)
        self.bytes += path.stat().st_size

    def _write_pending(self, rows: list[tuple[tuple[int, ...], bool]]) -> None:
        path = self.root / "pending" / f"rank-{self.rank:05d}.parquet"
        if not rows:
            if self.had_pending:
                path.unlink(missing_ok=True)
                self.had_pending = False
            return
        a = np.array([r for r, _ in rows], dtype=np.int64)
        n = len(a)
        table = pa.Table.from_arrays(
            [
                *self._record_columns(a),
                pa.array(a[:, 6].astype(np.int32)),
                pa.array(np.full(n, time.time_ns(), np.int64)),
                pa.array([f for _, f in rows], pa.bool_()),
            ],
            schema=layout.PENDING_SCHEMA,
        )
        layout.atomic_write_table(path, table)
        self.had_pending = True

    def _write_rank_info(self) -> None:
        rec = self.rec
        info: dict[str, Any] = {
            "rank": self.rank, "world_size": self.world, "job": self.job, **self.identity, "pid": os.getpid(),
            "groups": dict(zip(rec.group_names, rec.group_ranks, strict=True)),
            "rows": self.rows, "shards": self.shards, "bytes": self.bytes,
            "dropped": self.dropped, "errors": rec.errors, "first_error": rec.first_error,
        }
        layout.atomic_write_bytes(self.root / "ranks" / f"rank-{self.rank:05d}.json", json.dumps(info).encode())

    def _write_meta(self, force: bool = False) -> None:
        n = len(list((self.root / "ranks").glob("rank-*.json")))
        groups = len(self.rec.group_names)
        if not force and (n, groups) == (self.known_ranks, self.known_groups) and n >= self.world:
            return
        layout.write_meta(self.root, layout.merge_meta(self.root, self.job))
        self.known_ranks, self.known_groups = n, groups

