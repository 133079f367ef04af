"""Small jobs of the second, independent generator (`bench.altgen`) for localizer tests, and both
paths' verdicts on them."""

from __future__ import annotations

from pathlib import Path

from bench.altgen import Costs, Fault, JobSpec, Layout, simulate, write_trace
from collector.trace.traceio import Trace
from localize.combine import localize_trace
from localize.summary import localize_from_summary, write_summaries
from localize.verdict import Verdict

COSTS = Costs(fwd_chunk_s=2e-3, tp_bytes=16 << 20, act_bytes=16 << 20, grad_bytes=1 << 30, nvlink_Bps=3e11,
              net_Bps=2.5e10, latency_s=2e-5, compute_sigma=0.03, net_sigma=0.05, optimizer_s=5e-3, a2a_bytes=8 << 20)


def altgen_job(name: str, layout: Layout, fault: Fault, steps: int, seed: int, logging: str = "all",
               step_sync: str = "mp", step0: int = 0, meta_groups: bool = True) -> JobSpec:
    """A job with rendezvous p2p, one warm-up step, every step logged."""
    return JobSpec(name=name, layout=layout, microbatches=4, steps=steps, p2p="rendezvous", dp_mode="all_reduce",
                   step_sync=step_sync, logging=logging, step0=step0, naming="megatron", meta_groups=meta_groups,
                   meta_parallelism=False, warmup_steps=1, warmup_factor=1.5, costs=COSTS, fault=fault,
                   kind=fault.kind, seed=seed, logged=list(range(steps)))


def written(spec: JobSpec, out: Path) -> Trace:
    """The job simulated and written to `out` as a trace."""
    rows, step_time = simulate(spec)
    write_trace(spec, out, rows, step_time)
    return Trace.open(out)


def both_paths(trace: Trace, top: int = 5) -> tuple[Verdict, Verdict]:
    """The verdicts from the full records and from the node summaries."""
    full = localize_trace(trace, ("commops",), top=top)
    write_summaries(trace)
    return full, localize_from_summary(trace, top=top)[0]
