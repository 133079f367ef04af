"""Write a simulated trace directory: meta.json, commops.parquet (row groups), truth.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from collector.trace.schema import COMMOPS_SCHEMA, OPS
from collector.trace.traceio import ChunkedParquetWriter
from simulator.cluster import Layout
from simulator.config import SimConfig
from simulator.engine import Engine, RowBatch
from simulator.faults import FaultModel, resolve_faults

#: the writer's schema: group and op dictionary-encoded (readers cast them to plain strings)
_WRITE_SCHEMA = pa.schema(
    [pa.field(f.name, pa.dictionary(pa.int32(), pa.string()), nullable=False) if f.name in ("group", "op") else f
     for f in COMMOPS_SCHEMA]
)
IRREGULAR_RATIO = 1.1  # a step is truly irregular when it runs >= 10% longer than without the faults


def clock_offsets(cfg: SimConfig, n_hosts: int) -> np.ndarray:
    """Per-host clock offsets (ns): host clocks are not synchronized."""
    rng = np.random.default_rng([cfg.seed, 3])
    return rng.uniform(-cfg.clock_skew_ms, cfg.clock_skew_ms, size=n_hosts) * 1e6


def _to_arrow(batch: RowBatch, layout: Layout, offsets: np.ndarray, cfg: SimConfig,
              keep_rank: np.ndarray | None, keep_step: np.ndarray | None, names: pa.Array, ops: pa.Array) -> pa.RecordBatch:
    rank = batch.rank
    off = offsets[layout.host[rank]]
    start = (cfg.start_ns + np.rint(batch.start + off)).astype(np.int64)
    end = (cfg.start_ns + np.rint(batch.end + off)).astype(np.int64)
    step = np.full(rank.size, -1, dtype=np.int32) if cfg.hide_steps else batch.step.astype(np.int32)
    cols = [
        pa.array(rank.astype(np.int32)),
        pa.DictionaryArray.from_arrays(pa.array(batch.group.astype(np.int32)), names),
        pa.DictionaryArray.from_arrays(pa.array(batch.op.astype(np.int32)), ops),
        pa.array(batch.seq.astype(np.int64)),
        pa.array(batch.peer.astype(np.int32)),
        pa.array(batch.nbytes.astype(np.int64)),
        pa.array(start),
        pa.array(end),
        pa.array(step),
    ]
    rb = pa.RecordBatch.from_arrays(cols, schema=_WRITE_SCHEMA)
    keep = _row_keep(cfg, rank.size, batch)
    if keep_rank is not None:
        keep &= keep_rank[rank]
    if keep_step is not None:
        keep &= keep_step[batch.step]
    return rb if keep.all() else rb.filter(pa.array(keep))


def _row_keep(cfg: SimConfig, n: int, batch: RowBatch) -> np.ndarray:
    if cfg.row_loss <= 0:
        return np.ones(n, dtype=bool)
    rng = np.random.default_rng([cfg.seed, 5, int(batch.step[0]), n])
    return rng.random(n) >= cfg.row_loss


def simulate_trace(cfg: SimConfig, out: Path, progress: Callable[[int], None] | None = None,
                   counterfactual: bool | None = None) -> dict[str, Any]:
    """Simulate `cfg` into directory `out`; returns the ground truth that was written."""
    cfg = cfg.resolved()
    out.mkdir(parents=True, exist_ok=True)
    layout = Layout.build(cfg)
    faults = resolve_faults(cfg, layout)
    model = FaultModel(cfg, layout, faults)
    engine = Engine(cfg, layout, model, record=True)
    n_hosts = int(layout.host.max()) + 1
    offsets = clock_offsets(cfg, n_hosts)
    keep_rank = cfg.logged_rank_mask()
    lost: list[int] = []
    if cfg.missing_ranks:
        lost = sorted(np.random.default_rng([cfg.seed, 4]).choice(cfg.gpus, cfg.missing_ranks, replace=False).tolist())
        keep_rank[lost] = False
    logged_steps = cfg.logged_steps()
    keep_step = np.zeros(cfg.steps, dtype=bool)
    keep_step[logged_steps] = True
    names = pa.array(layout.names)
    ops = pa.array(list(OPS))
    layout.meta().save(out / "meta.json")
    rows = 0
    with ChunkedParquetWriter(out / "commops.parquet", _WRITE_SCHEMA) as writer:
        for batch in engine.run():
            rb = _to_arrow(batch, layout, offsets, cfg, None if keep_rank.all() else keep_rank,
                           None if keep_step.all() else keep_step, names, ops)
            writer._writer.write_batch(rb, row_group_size=1 << 20)
            rows += rb.num_rows
            if progress:
                progress(len(batch))
    step_s = np.diff(np.concatenate([[0.0], engine.step_end_ns])) / 1e9
    truth: dict[str, Any] = {
        "job": cfg.job,
        "seed": cfg.seed,
        "parallelism": cfg.parallelism(),
        "config": cfg.truth_settings(),
        "faults": [{**f.spec.to_dict(), "active_steps": f.active_steps(), "root": f.root(layout)} for f in faults],
        "step_time_s": [round(float(x), 6) for x in step_s],
        "clock_offsets_ns": {layout.host_name(h): int(offsets[h]) for h in range(n_hosts)},
        "rows": rows,
        "missing_ranks": lost,
        "logged_ranks": cfg.logged_ranks,
        "logged_rank_count": int(keep_rank.sum()),
        "logged_steps": logged_steps,
    }
    if counterfactual is None:
        counterfactual = cfg.gpus <= 4096
    if faults and counterfactual:
        clean = Engine(cfg, layout, FaultModel(cfg, layout, []), record=False)
        for _ in clean.run():
            pass
        clean_s = np.diff(np.concatenate([[0.0], clean.step_end_ns])) / 1e9
        truth["clean_step_time_s"] = [round(float(x), 6) for x in clean_s]
        ratio = step_s / clean_s
        # a fault present from the first step makes the job slow, not irregular: there is no
        # normal iteration to compare with (it shows up as a config/expected-performance gap)
        timed = np.zeros(cfg.steps, dtype=bool)
        for f in faults:
            if f.factor_by_step[0] <= 1.0:
                timed[f.active_steps()] = True
        truth["irregular_steps"] = [int(s) for s in np.flatnonzero((ratio >= IRREGULAR_RATIO) & timed)]
        truth["slowdown_vs_clean"] = round(float(np.median(ratio)), 4)
    elif faults:
        truth["irregular_steps"] = sorted({s for f in faults if f.factor_by_step[0] <= 1.0 for s in f.active_steps()})
    else:
        truth["clean_step_time_s"] = truth["step_time_s"]
        truth["irregular_steps"] = []
    # a sampling logger writes some steps only: the irregular steps a localizer can report are those
    truth["irregular_steps"] = [s for s in truth["irregular_steps"] if keep_step[s]]
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    return truth
