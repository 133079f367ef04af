"""Turn a simulated trace into what its sidecars would post: per node, per window of steps.

The stand-in detector flags a copy whose wait (elapsed minus the instance's shortest elapsed)
is well above that rank's own typical wait in the same group, which is what the real detector
learns; it is test scaffolding, the service under test never sees the trace.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collector.traceio import Trace
from explain.report.waits import annotate_waits


def trace_summaries(trace: Trace, steps_per_window: int = 5) -> list[dict[str, Any]]:
    ops = annotate_waits(trace.commops())
    typical = ops.groupby(["rank", "group", "op"])["wait_s"].transform("quantile", 0.2)
    abnormal = (ops["wait_s"] > 3 * typical + 5e-4) & (ops["wait_s"] > 0.2 * ops["elapsed_s"])
    ops["score"] = np.where(abnormal, 0.9, 0.1)
    ops["node"] = ops["rank"].map(trace.meta.host_of)
    ops["window"] = ops["step"] // steps_per_window
    per_rank = ops.groupby(["rank", "step"]).agg(t0=("start_ns", "min"), t1=("end_ns", "max")).reset_index()
    per_rank["node"] = per_rank["rank"].map(trace.meta.host_of)
    step_time = (per_rank.assign(d=(per_rank["t1"] - per_rank["t0"]) / 1e9)
                 .groupby(["node", "step"])["d"].max().reset_index())
    out = []
    flagged = ops[abnormal]
    for (node, window), part in ops.groupby(["node", "window"]):
        ranks = sorted(int(r) for r in part["rank"].unique())
        groups = {g: m for g, m in trace.meta.groups.items() if set(m) & set(ranks)} if window == 0 else {}
        ab = flagged[(flagged["node"] == node) & (flagged["window"] == window)]
        st = step_time[(step_time["node"] == node) & step_time["step"].isin(part["step"].unique())]
        out.append({
            "job": trace.meta.job, "node": node, "window": int(window),
            "window_start_ns": int(part["start_ns"].min()), "window_end_ns": int(part["end_ns"].max()),
            "world_size": trace.meta.world_size, "ranks": ranks,
            "gpus": {r: trace.meta.ranks[r].gpu for r in ranks}, "groups": groups,
            "steps": [{"step": int(s), "duration_s": float(d)} for s, d in zip(st["step"], st["d"], strict=True)],
            "ops": [{"rank": int(r.rank), "group": r.group, "op": r.op, "seq": int(r.seq), "elapsed": float(r.elapsed_s),
                     "step": int(r.step), "score": float(r.score), "peer": int(r.peer)} for r in ab.itertuples()],
        })
    return out
