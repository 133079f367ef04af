"""The localization worker's start-up, kept in a module with no heavy imports.

A spawned worker imports this module before anything else it runs, so it can tie its life to
the service's at once: the kernel kills it when the service dies (even by kill -9), and a
worker whose service died while it was still starting exits by itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Worker initializer: SIGKILL when the parent goes; exit now if it is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the service decides when its worker stops


def warm() -> None:
    """Import what a round needs once, at start-up, rather than in the first round."""
    import laggard.service.localizing  # noqa: F401
