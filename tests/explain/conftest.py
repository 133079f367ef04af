"""Small hand-built traces for the explain tests: meta.json, one CommOps row, truth.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localize.verdict import Candidate, Verdict


def write_trace(root: Path, faults: list[dict[str, Any]], hosts: int = 4, seed: int = 3, job: str = "t1",
                logs: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    ranks = {str(r): {"host": f"node-{r // 8}", "gpu": r % 8, "ip": f"10.0.{r // 8}.{10 + r % 8}"} for r in range(8 * hosts)}
    topo = {f"node-{h}": {"switch": f"tor-{h // 2}"} for h in range(hosts)}
    (root / "meta.json").write_text(json.dumps({"job": job, "world_size": 8 * hosts, "ranks": ranks, "topology": topo}))
    row = {"rank": 0, "group": "tp-0", "op": "all_reduce", "seq": 0, "peer": -1, "nbytes": 1, "start_ns": 1, "end_ns": 2, "step": 0}
    (root / "commops.jsonl").write_text(json.dumps(row) + "\n")
    (root / "truth.json").write_text(json.dumps({"job": job, "seed": seed, "faults": faults, "irregular_steps": [4, 5]}))
    for host, text in (logs or {}).items():
        (root / "logs").mkdir(exist_ok=True)
        (root / "logs" / f"{host}.log").write_text(text)
    return root


def gpu_verdict(rank: int = 13, kind: str = "gpu", score: float = 0.9, job: str = "t1") -> Verdict:
    return Verdict(job=job, status="irregular", irregular_steps=[4, 5], slowdown=1.8,
                   candidates=[Candidate(kind=kind, score=score, rank=rank, host=f"node-{rank // 8}", gpu=rank % 8,
                                         evidence=[f"rank {rank} normal while its peers wait"], source="commops")])


@pytest.fixture
def trace_factory(tmp_path: Path):
    def make(faults: list[dict[str, Any]], **kw: Any) -> Path:
        return write_trace(tmp_path / f"trace{len(list(tmp_path.iterdir()))}", faults, **kw)
    return make
