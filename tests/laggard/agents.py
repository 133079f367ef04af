"""Node agents of a simulated job, driven in-process against a service (tests only).

The trace is laid out as the CommOps logger writes it (per-rank shards); each host gets a real
`laggard.agent.Agent` whose HTTP client is the service's test client, so what is posted is
exactly what the agent builds from the shards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from bench.sidecar import shard_like_logger
from collector.trace.meta import JobMeta
from laggard.agent import Agent, node_view
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace


def sharded_job(out: Path, job: str = "svc-job", root: int = 21, gpus: int = 32, steps: int = 30) -> Path:
    """A simulated job (tp=8, pp=2) with GPU `root` twice as slow from step 12, as logger shards."""
    cfg = SimConfig(gpus=gpus, tp=8, pp=2, steps=steps, seed=5, job=job,
                    faults=[FaultSpec("gpu", 2.0, rank=root, steps=(12, steps - 1))])
    simulate_trace(cfg, out / "sim")
    shard_like_logger(out / "sim", out / "trace")
    return out / "trace"


def agents(trace: Path, client: httpx.Client, spool: Path, url: str = "", window: int = 10) -> list[Agent]:
    out = []
    for host in JobMeta.load(trace / "meta.json").hosts():
        a = Agent(trace, host, url, spool / host, 1 << 26, window, client=client)
        a.view = node_view(trace, host)
        out.append(a)
    return out


def localize(client: httpx.Client, job: str, nodes: list[Agent], rounds: int = 4) -> dict[str, Any]:
    """Ask for a verdict; while the service fetches records, let the agents answer."""
    for _ in range(rounds):
        r = client.post(f"/v1/jobs/{job}/localize")
        if r.status_code == 200:
            return dict(r.json())
        assert r.status_code == 202, r.text
        for a in nodes:
            a.poll_fetch()
    raise AssertionError(f"no verdict after {rounds} rounds")
