"""CommOps logger: records every collective and point-to-point operator of this rank.

    from collector import commops
    commops.attach("/data/run7")     # or set LAGGARD_COMMOPS_DIR and call attach()
    commops.attach("/data/run7", parallelism={"tp": 2, "pp": 2, "dp": 2})   # parallelism: optional
    commops.name_group(tp_group, "tp-0")   # optional: or new_group(..., group_desc="tp-0")
    for batch in loader:
        ...
        commops.step()               # optional: steps are detected from optimizer.step()

Without touching the script, under torchrun:
    LAGGARD_COMMOPS_DIR=/data/run7 LAGGARD_PARALLELISM=tp=2,pp=2,dp=2 \
        torchrun --nproc-per-node 8 -m collector.commops.run train.py ARGS

meta.json names each rank's host and the job from the launcher's environment (Slurm, Kubernetes,
torchrun; LAGGARD_HOST and LAGGARD_JOB override): see collector.commops.launcher.

What it wraps: torch.distributed collectives (all_reduce, all_gather[_into_tensor|_single],
_all_gather_base, reduce_scatter[_tensor|_single], _reduce_scatter_base, all_to_all[_single],
broadcast, reduce, barrier), send/recv/isend/irecv and batch_isend_irecv — each operator recorded
once whichever alias the job calls (the aliases call one another), DDP's gradient all-reduces (a comm hook installed on every DDP model),
and FSDP2's all-gathers/reduce-scatters (they call the wrapped functions). Async ops are timed at
completion by a future callback; NCCL groups are timed with CUDA events.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from collector.commops import launcher, patches
from collector.commops.recorder import Recorder
from collector.commops.writer import ShardWriter

ENV_DIR = "LAGGARD_COMMOPS_DIR"
ENV_FLUSH = "LAGGARD_COMMOPS_FLUSH_S"

_state: dict[str, Any] = {}


def attach(out_dir: str | os.PathLike[str] | None = None, flush_s: float | None = None,
           capacity: int = 1 << 16, job: str | None = None,
           parallelism: dict[str, int] | None = None) -> bool:
    """Start logging into `out_dir` (default $LAGGARD_COMMOPS_DIR). Returns False if neither is set.

    Safe to call before or after init_process_group; call it before building DDP models so
    their gradient all-reduces are captured too. `job` names the job (default: the launcher's
    job name); `parallelism` declares sizes, e.g. {"tp": 2, "pp": 2, "dp": 2} (default
    $LAGGARD_PARALLELISM): a bad value raises ValueError here, a bad variable is reported and ignored.
    """
    if _state:
        return True
    root = out_dir if out_dir is not None else os.environ.get(ENV_DIR)
    if not root:
        return False
    declared = launcher.parse_parallelism(parallelism) if parallelism is not None else _env_parallelism()
    rec = Recorder(capacity)
    interval = float(flush_s if flush_s is not None else os.environ.get(ENV_FLUSH, "5"))
    _state.update(rec=rec, root=Path(root), interval=interval, writer=None, fr_dumped=False,
                  job=job or launcher.job_of(os.environ, Path(root).name),
                  identity=launcher.identity(os.environ, declared))
    rec.on_failure = _on_failure
    patches.install(rec, _ensure_writer)
    atexit.register(detach)
    _install_sigterm()
    return True


def name_group(pg: Any, name: str) -> bool:
    """Name a process group in the trace (e.g. "tp-0", "dp-3"; unique per group across the job).

    Call it before the group's first operator. The name is kept as given; a `group_desc` is kept
    only when it names one group ("tp-0"), see `collector.trace.groupnames`.
    Returns False (and says why on stderr) when the logger is off or the group already ran
    under another name.
    """
    rec: Recorder | None = _state.get("rec")
    if rec is None:
        return False
    ok = rec.name_group(pg, str(name))
    if not ok:
        print(f"laggard commops: name_group({name!r}) ignored: the group already ran as "
              f"{rec.group_names[rec.groups[pg]]!r}; call name_group before its first operator", file=sys.stderr)
    return ok


def _env_parallelism() -> dict[str, int] | None:
    """$LAGGARD_PARALLELISM, or None; a malformed value is reported once and ignored (the job runs on)."""
    spec = os.environ.get(launcher.ENV_PARALLELISM, "").strip()
    if not spec:
        return None
    try:
        return launcher.parse_parallelism(spec)
    except ValueError as exc:
        print(f"laggard commops: {launcher.ENV_PARALLELISM} ignored: {exc}", file=sys.stderr)
        return None


def step(n: int | None = None) -> int:
    """Mark the start of the next training step (or set it to `n`); turns off auto-detection."""
    rec: Recorder | None = _state.get("rec")
    if rec is None:
        return -1
    rec.manual_step = True
    rec.step[0] = rec.step[0] + 1 if n is None else int(n)
    return rec.step[0]


def flush() -> None:
    """Write what is buffered now (the writer also does this every flush interval)."""
    w: ShardWriter | None = _state.get("writer")
    if w is not None:
        w.flush()


def stats() -> dict[str, Any]:
    """Rows written, shards, bytes, dropped records, bookkeeping errors and the CPU time of the
    writer's periodic flushes, of this rank."""
    rec: Recorder | None = _state.get("rec")
    w: ShardWriter | None = _state.get("writer")
    if rec is None:
        return {}
    return {"rank": rec.rank, "recorded": rec.created(), "rows": w.rows if w else 0,
            "shards": w.shards if w else 0, "bytes": w.bytes if w else 0,
            "dropped": w.dropped if w else 0, "write_failures": w.write_failures if w else 0, "errors": rec.errors,
            "writer_cpu_s": w.cpu_s if w else 0.0}


def detach() -> None:
    """Flush everything, stop the writer and restore torch.distributed."""
    if not _state:
        return
    w: ShardWriter | None = _state.get("writer")
    if w is not None:
        w.stop()
    patches.uninstall()
    _state.clear()


def _ensure_writer(rec: Recorder) -> None:
    """Start the writer once the rank is known (the first operator runs after init_process_group)."""
    if _state.get("writer") is not None:
        return
    import torch.distributed as dist

    rec.rank = dist.get_rank()
    w = ShardWriter(rec, _state["root"], rec.rank, dist.get_world_size(), _state["interval"], _state["job"],
                    _state["identity"])
    _state["writer"] = w
    w.start()


def _on_failure() -> None:
    """An operator raised (a timeout, a dead peer): dump the Flight Recorder and flush now."""
    _dump_flight_recorder()
    w: ShardWriter | None = _state.get("writer")
    if w is not None:
        w.wake.set()


def _dump_flight_recorder() -> None:
    """gloo has no watchdog that dumps the Flight Recorder on timeout; do it for the user.

    Only when the Flight Recorder is on (TORCH_FR_BUFFER_SIZE) and a dump prefix is set
    (TORCH_FR_DUMP_TEMP_FILE, as torch uses for NCCL): writes PREFIX<rank> once.
    """
    size = os.environ.get("TORCH_FR_BUFFER_SIZE", os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0"))
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"))
    rec: Recorder | None = _state.get("rec")
    if not prefix or not size.isdigit() or int(size) <= 0 or rec is None or rec.rank < 0 or _state.get("fr_dumped"):
        return
    _state["fr_dumped"] = True
    try:
        import torch._C._distributed_c10d as c10d

        from collector.commops.layout import atomic_write_bytes

        atomic_write_bytes(Path(f"{prefix}{rec.rank}"), c10d._dump_fr_trace())  # type: ignore[attr-defined]
    except Exception as exc:
        rec.error(exc)


def _install_sigterm() -> None:
    """torchrun stops surviving workers with SIGTERM when one fails: flush (and dump) first."""
    if os.environ.get("LAGGARD_COMMOPS_SIGTERM", "1") == "0" or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return  # the job has its own handler; leave it alone

    def handler(signum: int, frame: Any) -> None:
        try:
            _dump_flight_recorder()
            detach()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError) as exc:
        print(f"laggard commops: no SIGTERM flush ({exc})", file=sys.stderr)
