"""A tiny hand-built trace, timeline, verdict and diagnosis for the report tests.

16 ranks on 2 hosts, tp groups of 4 and dp groups of 4, 20 steps; rank 5 computes slowly in
steps 10-14, so its tp peers wait on it and their dp peers wait on them.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from collector.trace.schema import COMMOPS_SCHEMA
from collector.trace.traceio import write_table
from localize.verdict import Candidate, Verdict

WORLD, STEPS, SLOW_RANK, SLOW_STEPS = 16, 20, 5, range(10, 15)
TP = {f"tp-{i}": list(range(4 * i, 4 * i + 4)) for i in range(4)}
DP = {f"dp-{i}": [i + 4 * k for k in range(4)] for i in range(4)}


def make_trace(path: Path, with_logs: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    meta = {"job": "toy", "world_size": WORLD,
            "ranks": {str(r): {"host": f"node-{r // 8}", "gpu": r % 8, "ip": f"10.0.{r // 8}.{10 + r % 8}"}
                      for r in range(WORLD)},
            "groups": {**TP, **DP}, "parallelism": {"dp": 4, "tp": 4, "pp": 1, "ep": 1, "cp": 1},
            "topology": {"node-0": {"switch": "tor-0"}, "node-1": {"switch": "tor-0"}}}
    (path / "meta.json").write_text(json.dumps(meta))
    rows = []
    t = np.zeros(WORLD)
    seq = dict.fromkeys([*TP, *DP], 0)
    for step in range(STEPS):
        compute = np.full(WORLD, 0.100)
        if step in SLOW_STEPS:
            compute[SLOW_RANK] = 0.300
        t = t + compute
        for groups, op, dur in ((TP, "all_reduce", 0.010), (DP, "reduce_scatter", 0.020)):
            for g, members in groups.items():
                end = t[members].max() + dur
                for r in members:
                    rows.append((r, g, op, seq[g], -1, 1 << 20, int(t[r] * 1e9) + 1_700_000_000_000_000_000,
                                 int(end * 1e9) + 1_700_000_000_000_000_000, step))
                t[members] = end
                seq[g] += 1
    cols = ["rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step"]
    write_table(pd.DataFrame(rows, columns=cols).astype({"rank": "int32", "peer": "int32", "step": "int32"}),
                path / "commops.parquet", COMMOPS_SCHEMA)
    if with_logs:
        (path / "logs").mkdir(exist_ok=True)
        (path / "logs" / "node-0.log").write_text("step 10 ok\n[WARN] GPU 5 clocks throttled (thermal)\nstep 11\n")
        (path / "logs" / "node-1.log").write_text("step 10 ok\nstep 11 ok\n")
    return path


def make_timeline() -> SimpleNamespace:
    duration = np.full(STEPS, 0.130)
    duration[list(SLOW_STEPS)] = 0.330
    irregular = np.isin(np.arange(STEPS), list(SLOW_STEPS))
    steps = pd.DataFrame({"step": np.arange(STEPS), "duration_s": duration, "baseline_s": 0.130,
                          "ratio": duration / 0.130, "irregular": irregular,
                          "pattern": np.where(irregular, "persistent", "")})
    return SimpleNamespace(job="toy", group_kind={**dict.fromkeys(TP, "tp"), **dict.fromkeys(DP, "dp")},
                           steps=steps, irregular_steps=list(SLOW_STEPS), slowdown=2.54, status="irregular",
                           expected_step_s=0.13, notes=[])


def make_verdict() -> Verdict:
    return Verdict("toy", "irregular", list(SLOW_STEPS), 2.54, [
        Candidate("gpu", 0.91, ["rank 5 was the last to arrive in 10/10 tp all_reduce instances"],
                  rank=5, host="node-0", gpu=5, source="commops"),
        Candidate("host", 0.22, ["node-0 hosts the slow rank"], host="node-0", source="commops"),
    ], onset_step=SLOW_STEPS[0])


def make_diagnosis() -> dict:
    """The shape of explain.diagnose.Diagnosis.to_dict() (the fields the report reads)."""
    return {"job": "toy", "status": "irregular", "confidence": 0.8, "confirmed": True,
            "cause": {"entry": "gpu-thermal-throttle", "title": "GPU thermal throttling", "category": "gpu",
                      "text": "GPU 5 on node-0 computes slowly (thermal throttling) and its peers wait on it."},
            "claims": [{"text": "clocks of GPU 5 are throttled", "evidence": ["E1"]}],
            "evidence": [{"id": "E1", "source": "verdict", "text": "job toy is irregular"},
                         {"id": "E2", "source": "logs", "text": "node-0: GPU 5 clocks throttled (thermal)"}],
            "probes": [{"id": "P1", "probe": "gpu_clocks", "host": "node-0", "args": {"gpu": 5},
                        "argv": ["nvidia-smi", "-q", "-d", "PERFORMANCE", "-i", "5"], "rc": 0,
                        "findings": ["SM clock 900 MHz of 1980 MHz: thermal slowdown active"], "summary": "throttled"}],
            "remediation": [{"action": "drain_slurm", "why": "take the node out of scheduling until the cooling is repaired",
                             "target": {"host": "node-0"}, "argvs": [["scontrol", "update", "NodeName=node-0", "State=DRAIN"]],
                             "status": "proposed"}]}
