"""A Work wrapper that times an op when the caller waits for it, where the work's future cannot.

gloo's p2p works have no future; NCCL's coalesced batches (batch_isend_irecv) have one that is
complete as soon as the batch is enqueued, and its callback's stream does not wait for the batch.
Wrapped, the work is still an instance of dist.Work and behaves as the original.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_TimedWork: Any = None


def timed_work(work: Any, finish: Callable[[bool], None], polled: bool = True) -> Any:
    """`work`, calling `finish(ok)` once: when wait() returns or raises, or (`polled`) when
    is_completed() first says so. A CUDA op's end needs the caller's stream to have waited for it,
    so CUDA callers pass polled=False."""
    global _TimedWork
    if _TimedWork is None:
        import torch.distributed as dist

        class TimedWork(dist.Work):  # type: ignore[misc]
            def __init__(self, inner: Any, finish: Callable[[bool], None], polled: bool) -> None:
                super().__init__()
                self._inner, self._finish_cb, self._polled, self._done = inner, finish, polled, False

            def _finish(self, ok: bool) -> None:
                if not self._done:
                    self._done = True
                    self._finish_cb(ok)

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
                if done and self._polled:
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
    return _TimedWork(work, finish, polled)
