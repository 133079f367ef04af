"""Install and remove the CommOps wrappers on torch.distributed, DDP and the optimizer step hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collector.commops.recorder import (
    COLLECTIVES,
    P2P,
    Recorder,
    make_batch_p2p,
    make_collective,
    make_p2p,
)

_saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)
_handles: list[Any] = []


def _set(owner: Any, name: str, value: Any) -> None:
    _saved.append((owner, name, getattr(owner, name)))
    setattr(owner, name, value)


def install(rec: Recorder, on_first_op: Callable[[Recorder], None]) -> None:
    """Wrap every operator function in torch.distributed (both the package and distributed_c10d,
    since FSDP2 and the DDP hooks look them up through `torch.distributed`)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    register = rec.group_id

    def group_id(pg: Any) -> int:
        if rec.rank < 0:
            on_first_op(rec)
        return register(pg)

    rec.group_id = group_id  # type: ignore[method-assign]
    wrapped: dict[str, Any] = {}
    for name, op, tpos, gpos in COLLECTIVES:
        if hasattr(c10d, name):
            try:
                wrapped[name] = make_collective(rec, getattr(c10d, name), op, tpos, gpos)
            except TypeError as exc:  # a torch whose signature we do not know: leave it unwrapped
                rec.error(exc)
    for name, op, peer_kw, group_peer_kw in P2P:
        try:
            wrapped[name] = make_p2p(rec, getattr(c10d, name), op, peer_kw, group_peer_kw)
        except TypeError as exc:
            rec.error(exc)
    wrapped["batch_isend_irecv"] = make_batch_p2p(
        rec, c10d.batch_isend_irecv, (c10d.isend, wrapped.get("isend", c10d.isend)))
    for name, fn in wrapped.items():
        orig = getattr(c10d, name)
        _set(c10d, name, fn)
        if getattr(dist, name, None) is orig:
            _set(dist, name, fn)
    _install_ddp_hook(rec)
    _install_step_hook(rec)


def uninstall() -> None:
    while _saved:
        owner, name, orig = _saved.pop()
        setattr(owner, name, orig)
    while _handles:
        _handles.pop().remove()


def _install_ddp_hook(rec: Recorder) -> None:
    """DDP's C++ reducer never calls the Python all_reduce: give every DDP model a comm hook that
    does (through the wrapped function), and let a user's own hook replace ours instead of failing."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    init = DDP.__init__
    register = DDP.register_comm_hook

    def hook(state: dict[str, Any], bucket: Any) -> Any:
        inner = state["inner"]
        if inner is not None:
            return inner[1](inner[0], bucket)
        return allreduce_hook(state["pg"], bucket)

    # DDP checks the hook's annotations at runtime (this module's are strings)
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}

    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        state = {"pg": self.process_group, "inner": None}
        try:
            register(self, state, hook)
        except Exception as exc:  # never break the user's model; their all-reduces go unlogged
            rec.error(exc)
            return
        self._laggard_hook_state = state

    def patched_register(self: Any, state: object, fn: Callable[..., Any]) -> None:
        ours = getattr(self, "_laggard_hook_state", None)
        if ours is None:
            register(self, state, fn)
        else:
            ours["inner"] = (state, fn)

    _set(DDP, "__init__", patched_init)
    _set(DDP, "register_comm_hook", patched_register)


def _install_step_hook(rec: Recorder) -> None:
    """Auto-detect steps: count the steps of the first optimizer that steps (unless commops.step() is used)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    first: list[int] = []

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        if rec.manual_step:
            return
        if not first:
            first.append(id(opt))
        if first[0] == id(opt):
            rec.step[0] += 1

    _handles.append(register_optimizer_step_post_hook(post))
