"""The localization workers: a bounded set of slots, each one process (or, in tests, a thread).

Each job has a home slot, kept for its life: its parsed posts and its open fetch request live
in that worker's memory, so its rounds run there one at a time. Jobs on other slots go on while
one job's round runs or stalls; a round past the time limit has its worker killed and replaced
(only the jobs at home there lose their parsed posts, which are read again from the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from laggard.service.worker import die_with_parent, warm

T = TypeVar("T")


class Workers:
    def __init__(self, slots: int, processes: bool) -> None:
        self.pools: list[ProcessPoolExecutor | None] = [_pool() if processes else None for _ in range(slots)]
        self.locks: list[asyncio.Lock] = [asyncio.Lock() for _ in range(slots)]
        self.home: dict[str, int] = {}

    def warm(self) -> None:
        """Start every worker now: its imports take seconds, done while the first posts arrive."""
        for p in self.pools:
            if p is not None:
                p.submit(warm)

    def slot(self, job: str) -> int:
        """The job's home: given once, to the slot with the fewest jobs."""
        if job not in self.home:
            load = Counter(self.home.values())
            self.home[job] = min(range(len(self.pools)), key=lambda i: (load[i], i))
        return self.home[job]

    def forget(self, job: str) -> None:
        self.home.pop(job, None)

    async def run(self, job: str, timeout_s: float, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the job's slot, after the job's previous call there; TimeoutError past
        `timeout_s` of running (waiting for the slot does not count), the worker replaced."""
        i = self.slot(job)
        async with self.locks[i]:
            pool = self.pools[i]
            if pool is None:
                return await asyncio.wait_for(run_in_threadpool(fn, *args), timeout_s)
            try:
                return await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(pool, fn, *args),
                                              timeout_s)
            except TimeoutError:
                _kill_pool(pool)
                self.pools[i] = _pool()
                raise

    def close(self) -> None:
        _kill_pools([p for p in self.pools if p is not None])


def _pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent,
                               initargs=(os.getpid(),))


def _kill_pool(pool: ProcessPoolExecutor) -> None:
    _kill_pools([pool])


def _kill_pools(pools: list[ProcessPoolExecutor]) -> None:
    """Stop the workers now, all at once: rounds in progress are abandoned (localized again later)."""
    procs = [p for pool in pools for p in (getattr(pool, "_processes", None) or {}).values()]
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
    for pool in pools:
        pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + 2
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout=max(0.0, deadline - time.monotonic()))
