"""`--cluster local|ADDRESS`: localize/distributed's tasks on Dask distributed (wiring only).

Dask, not Ray: pure-Python wheels (dask + distributed, a few MB with their deps) where Ray is a
~70 MB native runtime with its own object store; a `LocalCluster` gives worker processes each
with a memory limit its nanny enforces; it deploys where training platforms already run batch
work (Slurm via dask-jobqueue, Kubernetes via dask-kubernetes/dask-gateway) and reads Parquet
through the same pyarrow and fsspec layers the tasks use. Imported only when `--cluster` is
given: the engine is never loaded otherwise.
"""

from __future__ import annotations

import argparse
import logging
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from collector.inputs.errors import UserError

DEFAULT_WORKERS = 2
DEFAULT_MEMORY = "2GiB"


def add_cluster_args(p: argparse.ArgumentParser, summary_first: bool = True) -> None:
    g = p.add_argument_group("summary-first and distributed (Dask): per-host detection and row fetches as tasks")
    if summary_first:
        g.add_argument("--summary-first", action="store_true",
                       help="localize as the sidecars do, one host's rows at a time, in this process: memory "
                            "stays that of one host (what --cluster does on workers; the same verdict)")
    g.add_argument("--cluster", metavar="local|ADDRESS", default=None,
                   help="run the summary-first localizer's tasks on a Dask cluster: 'local' starts worker "
                        "processes here, or give a scheduler address (tcp://host:8786). The verdict is the "
                        "single-process summary-first one, byte for byte")
    g.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"--cluster local: worker processes (default {DEFAULT_WORKERS})")
    g.add_argument("--worker-memory", default=DEFAULT_MEMORY,
                   help=f"--cluster local: memory limit per worker, e.g. 1.5GiB (default {DEFAULT_MEMORY})")


class DaskRun:
    """`localize.distributed.Executor` on a Dask client: one task per item, results in order."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.result_bytes = 0
        self.stage_s: dict[str, float] = {}

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]]) -> list[Any]:
        from dask.sizeof import sizeof
        from distributed import KilledWorker

        t0 = time.perf_counter()
        futures = [self.client.submit(fn, *args, pure=False) for args in items]
        try:
            out = self.client.gather(futures)
        except KilledWorker as exc:
            raise UserError("a Dask worker died running a task (most often: over its memory limit)",
                            "give workers more memory (--worker-memory) or more of them") from exc
        finally:
            for f in futures:
                f.release()
        self.stage_s[fn.__name__] = self.stage_s.get(fn.__name__, 0.0) + time.perf_counter() - t0
        self.result_bytes += sum(int(sizeof(r)) for r in out)
        return list(out)

    def worker_stats(self) -> dict[str, dict[str, int]]:
        """Per worker: peak resident memory of its process, bytes it sent (to peers or results)."""

        def probe(dask_worker: Any) -> dict[str, int]:
            return {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                    "sent_bytes": int(dask_worker.transfer_outgoing_bytes_total),
                    "received_bytes": int(dask_worker.state.transfer_incoming_bytes_total
                                          if hasattr(dask_worker.state, "transfer_incoming_bytes_total") else 0)}

        return dict(self.client.run(probe))


@contextmanager
def open_cluster(spec: str, workers: int = DEFAULT_WORKERS, memory: str = DEFAULT_MEMORY) -> Iterator[DaskRun]:
    """A client on a new local cluster ('local') or on the scheduler at `spec`; closed on exit."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        raise UserError("--cluster needs Dask distributed", "pip install 'distributed>=2024.8'") from exc
    if spec == "local":
        if workers < 1:
            raise UserError(f"--workers {workers}", "give at least 1")
        try:
            from dask.utils import parse_bytes

            parse_bytes(memory)
        except ValueError as exc:
            raise UserError(f"--worker-memory {memory}: not a size", "e.g. 1.5GiB or 2000MB") from exc
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, memory_limit=memory,
                               dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
        try:
            yield DaskRun(client)
        finally:
            client.close()
            cluster.close()
        return
    try:
        client = Client(spec, timeout="5s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise UserError(f"--cluster {spec}: no Dask scheduler answers there ({type(exc).__name__})",
                        "give 'local' or the address `dask scheduler` printed, e.g. tcp://10.0.0.5:8786") from exc
    try:
        yield DaskRun(client)
    finally:
        client.close()
