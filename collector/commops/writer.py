"""The CommOps logger's background writer: drains the rings into per-rank Parquet shards.

It runs on its own daemon thread so the training loop never waits on disk; each flush writes
one shard (temp file, then atomic rename), the rank's pending operators and its self-description,
and rank 0 refreshes meta.json. All failures are counted on the recorder, never raised.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from collector.commops import cudatime, layout
from collector.commops.recorder import Recorder
from collector.schema import COMMOPS_SCHEMA, OPS

_OPS = pa.array(OPS, pa.string())


class ShardWriter:
    """Flushes a Recorder to `root` every `interval` seconds (and on demand)."""

    def __init__(self, rec: Recorder, root: Path, rank: int, world: int, interval: float, job: str) -> None:
        self.rec = rec
        self.root = root
        self.rank = rank
        self.world = world
        self.interval = interval
        self.job = job
        self.consumed = 0
        self.async_consumed = 0
        self.dropped = 0
        self.rows = 0
        self.shards = 0
        self.bytes = 0
        self.known_groups = -1
        self.known_ranks = -1
        self.had_pending = False
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
            self.wake.wait(self.interval)
            self.wake.clear()
            if not self.stopped.is_set():
                self.flush()

    # -- draining -------------------------------------------------------------------------
    def _drain_main(self) -> list[tuple[tuple[int, ...], int]]:
        """Records the training thread published since the last drain, minus any it overwrote."""
        rec, cap = self.rec, self.rec.capacity
        n1 = rec.pos[0]
        lo = max(self.consumed, n1 - cap)
        snap = _slice(rec.ring, lo, n1, rec.mask)
        n2 = rec.pos[0]
        valid = max(lo, n2 + 1 - cap)  # slots at or below this may have been overwritten meanwhile
        self.dropped += valid - self.consumed if valid > self.consumed else 0
        self.consumed = n1
        return [r for r in snap[valid - lo:] if r is not None]

    def _drain_async(self) -> list[tuple[tuple[int, ...], int]]:
        rec, cap = self.rec, self.rec.capacity
        with rec.async_lock:
            n = rec.async_pos[0]
            lo = max(self.async_consumed, n - cap)
            self.dropped += lo - self.async_consumed
            rows = [rec.async_ring[i & rec.mask] for i in range(lo, n)]
            self.async_consumed = n
            cuda = rec.cuda_rows
            rec.cuda_rows = []
        out = [r for r in rows if r is not None]
        if not cuda:
            return out
        done, keep = cudatime.drain_finished(rec, cuda)
        out += done
        rec.gpu_clock.renew()
        if keep:
            with rec.async_lock:
                over = len(keep) + len(rec.cuda_rows) - cap
                if over > 0:
                    self.dropped += over
                    keep = keep[over:]
                rec.cuda_rows = keep + rec.cuda_rows
        return out

    def flush(self, final: bool = False) -> None:
        if not self.lock.acquire(timeout=5):
            return
        try:
            rows = self._drain_main() + self._drain_async()
            if rows:
                self._write_shard(rows)
            self._write_pending(final)
            self._write_rank_info()
            if self.rank == 0 or final:  # whoever finishes last leaves the most complete meta.json
                self._write_meta(force=final)
        except Exception as exc:
            self.rec.error(exc)
        finally:
            self.lock.release()

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

    def _write_shard(self, entries: list[tuple[tuple[int, ...], int]]) -> None:
        a = np.empty((len(entries), 8), dtype=np.int64)  # gid, op, seq, peer, nbytes, start, step, end
        a[:, :7] = np.array([e[0] for e in entries], dtype=np.int64)
        a[:, 7] = np.fromiter((e[1] for e in entries), dtype=np.int64, count=len(entries))
        n = len(a)
        table = pa.Table.from_arrays(
            [*self._record_columns(a), pa.array(a[:, 7]), pa.array(a[:, 6].astype(np.int32))],
            schema=COMMOPS_SCHEMA,
        )
        path = layout.shard_path(self.root, self.rank, self.shards)
        layout.atomic_write_table(path, table)
        self.shards += 1
        self.rows += n
        self.bytes += path.stat().st_size

    def _write_pending(self, final: bool) -> None:
        rec = self.rec
        with rec.async_lock:
            rows = [(r, False) for r in rec.in_flight.values()]
        cur = rec.current[0]
        if cur is not None and not final:
            rows.append((cur, False))
        rows += [(r, True) for r in list(rec.failed)]
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
            "rank": self.rank, "world_size": self.world, "job": self.job,
            "host": socket.gethostname(), "gpu": int(os.environ.get("LOCAL_RANK", "0")), "pid": os.getpid(),
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


def _slice(ring: list[Any], lo: int, hi: int, mask: int) -> list[Any]:
    """ring[lo:hi] in logical indices, as at most two list slices (fast for large drains)."""
    a, b = lo & mask, hi & mask
    if hi - lo == 0:
        return []
    if a < b:
        return ring[a:b]
    return ring[a:] + ring[:b]
