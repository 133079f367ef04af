"""Time to verdict: from a rank's first slowed step to `laggard serve` naming that rank.

Each trial runs a real 4-rank gloo job under torchrun with the CommOps logger, one node agent
(`laggard sidecar run --follow --post`, started before the job, so it also waits for it to
appear) and a running `laggard serve`; rank R computes `--slow-ms` longer from step N on. The
clock starts when the slowed rank began step N (the end of its last operator of step N-1, from
its own records, this host's clock) and stops when `GET /v1/jobs/JOB` first names rank R first.

    python -m bench.verdict              # 10 trials
    python -m bench.verdict --quick      # 3 trials

Target (issue 15; Mycroft, SOSP'25, finds the root cause within 20 s in 60% of cases):
median <= 10 s, p90 <= 20 s, the right device every time.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.dataset as ds

REPO = Path(__file__).resolve().parents[1]
JOB_SCRIPT = REPO / "tests" / "collector" / "jobs" / "dist_train.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")


@contextmanager
def serve(db: Path, interval: float = 1.0, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """A `laggard serve` on loopback for the duration of the block; yields its URL."""
    port = free_port()
    log = db.with_suffix(".log").open("w")  # the service's own messages, shown when a trial goes wrong
    proc = subprocess.Popen([sys.executable, "-m", "laggard", "serve", "--port", str(port), "--db", str(db),
                             "--interval", str(interval), *extra], env=env(), cwd=REPO, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


@dataclass
class Trial:
    seconds: float | None  # None: the service never named the slowed rank first
    named: list[int | None]  # the top candidate's rank at each verdict change
    named_at: list[float]  # when (seconds after the first slowed step; negative: before it)
    steps: int
    agent_rc: int
    job_rc: int
    agent_log: str
    last: dict[str, Any]  # the service's last answer for the job ({} if it never had one)


def trial(base: str, out: Path, job: str, slow_rank: int = 1, slow_from: int = 40, steps: int = 160,
          slow_ms: float = 150.0, deadline_s: float = 180.0, linger_s: float = 8.0, after_end_s: float = 0.0) -> Trial:
    """One job, one agent, one verdict timed (the service is already running at `base`). A job that
    ends before its rounds agree is watched `after_end_s` longer once it and its agent have exited,
    for the device the service publishes when the agent said the job ended."""
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}-agent.log"
    with log.open("w") as agent_err:
        agent = subprocess.Popen([sys.executable, "-m", "laggard", "sidecar", "run", str(out), "--follow", "--post",
                                  base, "--poll", "0.5", "--window", "50", "--idle-exit", "10", "--linger", str(linger_s),
                                  "--wait", "60", "--spool", str(out.parent / f"{out.name}-spool")],
                                 env=env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=agent_err)
        e = dict(env(), LAGGARD_COMMOPS_DIR=str(out), LAGGARD_COMMOPS_FLUSH_S="0.5",
                 LAGGARD_COMMOPS_SHARD_AGE_S="1", LAGGARD_JOB=job)
        job_p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                  "4", "-m", "collector.commops.run", str(JOB_SCRIPT), "--steps", str(steps),
                                  "--slow-rank", str(slow_rank), "--slow-steps", f"{slow_from}:{steps}",
                                  "--slow-ms", str(slow_ms)],
                                 env=e, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        named: list[int | None] = []
        named_at: list[float] = []
        found_at: float | None = None
        last: dict[str, Any] = {}
        t_end = time.monotonic() + deadline_s
        quiet_until: float | None = None
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < t_end and found_at is None:
                r = client.get(f"{base}/v1/jobs/{job}")
                if r.status_code == 200:
                    last = r.json()
                    cands = last.get("candidates") or []
                    top = cands[0].get("rank") if cands else None
                    if not named or named[-1] != top:
                        named.append(top)
                        named_at.append(time.time())
                    if top == slow_rank and cands[0].get("kind") == "gpu":
                        found_at = time.time()
                        break
                if quiet_until is None and job_p.poll() is not None and agent.poll() is not None:
                    quiet_until = time.monotonic() + after_end_s
                if quiet_until is not None and time.monotonic() >= quiet_until:
                    break
                time.sleep(0.1)
        job_rc = job_p.wait(timeout=180)
        agent_rc = agent.wait(timeout=120)
    t_fault = fault_start(out, slow_rank, slow_from)
    return Trial(None if found_at is None else found_at - t_fault, named, [t - t_fault for t in named_at], steps,
                 agent_rc, job_rc, log.read_text(), last)


def fault_start(out: Path, rank: int, step: int) -> float:
    """When `rank` began step `step`: the end of its last operator of the step before (Unix seconds)."""
    files = sorted((out / "commops").glob(f"rank-{rank:05d}-*.parquet"))
    t = ds.dataset(files, format="parquet").to_table(columns=["end_ns"], filter=ds.field("step") == step - 1)
    return float(np.asarray(t["end_ns"]).max()) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="3 trials")
    ap.add_argument("--interval", type=float, default=1.0, help="the service's --interval (default 1)")
    args = ap.parse_args()
    n = 3 if args.quick else args.trials
    times: list[float] = []
    wrong = 0
    first_wrong = 0  # trials where a device was named before the right one (a page with the wrong device)
    with tempfile.TemporaryDirectory(prefix="laggard-bench-verdict-") as tmp:
        with serve(Path(tmp) / "state.db", args.interval) as base:
            for i in range(n):
                slow_rank = (1, 2, 3, 0)[i % 4]
                t = trial(base, Path(tmp) / f"run{i}", f"verdict-{i}", slow_rank=slow_rank)
                ok = t.seconds is not None
                wrong += not ok
                before = t.named[:t.named.index(slow_rank)] if slow_rank in t.named else t.named
                first_wrong += any(r is not None for r in before)
                if ok:
                    times.append(float(t.seconds or 0.0))
                print(f"trial {i + 1}: slowed rank {slow_rank}: "
                      + (f"named after {t.seconds:.1f} s" if ok else "NOT named within the deadline")
                      + " (top candidate over time: " + ", ".join(f"{r} at {a:+.1f} s" for r, a in zip(t.named, t.named_at,
                                                                                                strict=True))
                      + f"; job rc {t.job_rc}, agent rc {t.agent_rc})", flush=True)
        service_log = (Path(tmp) / "state.log").read_text()
    if wrong and service_log.strip():
        print("the service said:\n" + service_log[-3000:])
    print(f"time to verdict:      {len(times)}/{n} right; median {np.median(times):.1f} s, "
          f"p90 {np.percentile(times, 90):.1f} s, max {max(times):.1f} s (target: median <= 10 s, p90 <= 20 s, "
          f"right every time)" if times else f"time to verdict: 0/{n} right")
    print(f"wrong device first:   {first_wrong}/{n} trials named another device before the slowed rank")
    print(f"machine:              {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; service "
          f"--interval {args.interval:g} s, agent --poll 0.5 s, logger flush 0.5 s, "
          f"shards every 1 s")
    return 0 if times and not wrong and not first_wrong else 1


if __name__ == "__main__":
    sys.exit(main())
