"""A hang end to end, all real: a 4-rank gloo job under torchrun whose rank 2 stops before its
collective of step 5, a node agent reporting the operators stuck for over 3 s, and a running
`laggard serve` that marks the job hung (`laggard_job_hang` = 1) and names rank 2 and the
operators the others wait in."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.verdict import JOB_SCRIPT, env, serve
from tests.conftest import REPO

pytestmark = pytest.mark.slow
JOB = "e2e-hang"


def test_a_rank_that_stops_entering_its_collective_is_named_hung(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with serve(tmp_path / "state.db", 1.0) as base, (tmp_path / "agent.log").open("w") as log:
        agent = subprocess.Popen([sys.executable, "-m", "laggard", "sidecar", "run", str(out), "--follow", "--post",
                                  base, "--poll", "0.5", "--window", "50", "--linger", "2", "--wait", "60",
                                  "--hang-after", "3", "--spool", str(tmp_path / "spool")],
                                 env=env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
        e = dict(env(), LAGGARD_COMMOPS_DIR=str(out), LAGGARD_COMMOPS_FLUSH_S="0.5",
                 LAGGARD_COMMOPS_SHARD_AGE_S="1", LAGGARD_JOB=JOB)
        job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                "4", "-m", "collector.commops.run", str(JOB_SCRIPT), "--steps", "30", "--hang-rank",
                                "2", "--hang-step", "5", "--timeout-s", "40"],
                               env=e, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        verdict: dict[str, Any] = {}
        seen: list[tuple[str, int | None]] = []
        hang_metric = None
        try:
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and job.poll() is None:
                r = httpx.get(f"{base}/v1/jobs/{JOB}", timeout=5)
                if r.status_code == 200:
                    verdict = r.json()
                    top = (verdict.get("candidates") or [{}])[0].get("rank")
                    if not seen or seen[-1] != (verdict["status"], top):
                        seen.append((verdict["status"], top))
                    if verdict["status"] == "hang" and top is not None:
                        hang_metric = next((ln for ln in httpx.get(base + "/metrics", timeout=5).text.splitlines()
                                            if ln.startswith(f'laggard_job_hang{{job_name="{JOB}"}}')), None)
                        break
                time.sleep(0.3)
        finally:
            if job.poll() is None:
                job.terminate()  # torchrun passes it to its workers
            job.wait(timeout=60)
            agent.wait(timeout=120)
    print("status over time:", seen, "\nverdict:", verdict.get("candidates", [{}])[:2], verdict.get("hang"))
    assert verdict.get("status") == "hang", (seen, (tmp_path / "agent.log").read_text()[-2000:])
    top = verdict["candidates"][0]
    assert top["rank"] == 2 and top["kind"] == "host", verdict
    assert any("rank 2 never" in e for e in top["evidence"]), top["evidence"]
    assert verdict["hang"]["stuck_ops"] and 2 not in verdict["hang"]["waiting_ranks"], verdict["hang"]
    assert hang_metric is not None and hang_metric.endswith(" 1.0"), hang_metric
    # a hang is a device too: no other rank was ever shown as the one that hangs
    assert all(t in (None, 2) for s, t in seen if s == "hang"), seen
