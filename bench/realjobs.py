"""Try to break the localizer on real jobs: random variants of the real gloo jobs, both paths.

    python -m bench.realjobs                    # 6 runs, seed 0: compute faults (about 5 min)
    python -m bench.realjobs --quick            # 2 runs
    python -m bench.realjobs --runs 10 --seed 7
    python -m bench.realjobs --network          # (root) NIC, link and switch faults in network namespaces

Each run draws a job and a fault nobody tuned on, runs it for real under torchrun (gloo, one agent
per node, the CommOps logger attached: tests/collector/realjob.py) and asks `laggard localize` and
`laggard sidecar localize` which device, since when. The jobs: the Megatron-shaped pipeline job
(tests/collector/jobs/pipeline_train.py; tp x pp x dp of 8 ranks, 4-8 microbatches, activations of
0.25-4 MiB, the DP sync at the step's end or overlapped as reduce-scatters or DDP's all-reduces, the
model-parallel sync on or off) and the data-parallel one (jobs/data_parallel_train.py: FSDP2, HSDP,
DDP). Compute faults: a GPU or a host at 1.5-2.5x from step 12-24, or a GPU on and off. Network
faults (--network, one node per namespace): a node's NIC, the path between two nodes, or a rack's
uplink rate-limited from step 18.

A run is right when the fault's device is alone in first place and the onset is within one step; a
declared tie that holds it counts 1/k, as bench.matrix counts it.
Prints each run's answer beside the truth and the job's own step times, then how many each path got
right; a run this machine's other load disturbed is counted apart (a step 1.25x its neighbours).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.collector.netns_job import NetnsLab, ensure_tools
from tests.collector.realjob import DataParallelJob, Fault, RealJob, run, step_times
from tests.localize.test_real_jobs import brief, disturbed, is_device, onset, verdicts

PIPELINE_LAYOUTS = [(2, 2, 2, 2), (1, 4, 2, 2), (2, 4, 1, 2), (1, 2, 4, 2), (4, 2, 1, 4)]  # tp, pp, dp, ranks per node
STEPS = 36


def draw_compute(rng: random.Random) -> tuple[RealJob, Fault, str]:
    """A job and a compute fault (a GPU, a host, or a GPU on and off)."""
    if rng.random() < 0.6:
        tp, pp, dp, nproc = rng.choice(PIPELINE_LAYOUTS)
        extra = ["--no-mp-sync"] if rng.random() < 0.4 else []
        job: RealJob = RealJob(tp=tp, pp=pp, dp=dp, nproc=nproc, steps=STEPS, microbatches=rng.choice([4, 6, 8]),
                               overlap_grad=rng.choice(["", "", "reduce_scatter", "all_reduce"]), extra=extra,
                               act_mib=rng.choice([4.0, 1.0, 0.25]))
        shape = (f"pipeline tp{tp} pp{pp} dp{dp} mb{job.microbatches} act {job.act_mib} MiB "
                 f"dp-sync {job.overlap_grad or 'at the end'}{' no-mp-sync' if extra else ''}")
    else:
        mode = rng.choice(["fsdp", "hsdp", "ddp"])
        job = DataParallelJob(steps=STEPS, replicate=2 if mode == "hsdp" else 1, ddp=mode == "ddp")
        shape = f"data parallel {mode}, 4 ranks"
    kind = rng.choice(["gpu", "gpu", "host", "gpu on and off"])
    start, factor = rng.randint(12, 24), round(rng.uniform(1.5, 2.5), 2)
    if kind == "host":
        node = rng.randrange(job.nodes)
        fault = Fault("host", start, factor, ranks=job.ranks_of(node), host=job.host(node))
    else:
        fault = Fault("gpu", start, factor, ranks=[rng.randrange(job.world)], every=2 if kind != "gpu" else 1)
    return job, fault, f"{shape} | {kind} {fault.ranks} x{factor} from {start}"


def draw_network(rng: random.Random, tag: str) -> tuple[RealJob, Fault, str, NetnsLab, Callable[[], None]]:
    """A pipeline job, one node per namespace, and a NIC, link or uplink rate-limited from step 18."""
    tp, pp, dp, nproc = rng.choice(PIPELINE_LAYOUTS[:4])
    extra = ["--no-mp-sync"] if rng.random() < 0.4 else []
    job = RealJob(tp=tp, pp=pp, dp=dp, nproc=nproc, steps=STEPS, extra=extra,
                  overlap_grad=rng.choice(["", "reduce_scatter", "all_reduce"]))
    kind = rng.choice(["nic", "link", "switch"])
    racks = [[0, 1], [2], [3]] if kind == "switch" else None
    lab = NetnsLab(n=job.nodes, tag=tag, racks=racks)
    hosts = [lab.host(n) for n in range(lab.n)]
    start, rate = 18, "1gbit"
    act: Callable[[], None]
    if kind == "nic":
        node = rng.randrange(job.nodes)
        fault = Fault("nic", start, host=hosts[node], rate=rate)
        act = lambda: lab.throttle(node, rate)  # noqa: E731
    elif kind == "link":
        a, b = rng.sample(range(job.nodes), 2)
        fault = Fault("link", start, hosts=[hosts[a], hosts[b]], rate=rate)
        act = lambda: lab.throttle_path(a, b, rate)  # noqa: E731
    else:
        fault = Fault("switch", start, switch=lab.switch(0), rate=rate)
        act = lambda: lab.throttle_uplink(0, rate)  # noqa: E731
    shape = (f"pipeline tp{tp} pp{pp} dp{dp} dp-sync {job.overlap_grad or 'at the end'}{' no-mp-sync' if extra else ''}"
             f" | {kind} {fault.host or fault.hosts or fault.switch} at {rate} from {start}")
    return job, fault, shape, lab, act


def device_credit(cands: list[dict[str, Any]], fault: Fault) -> float:
    """1 when the fault's device is alone in first place; 1/k when it is one of k devices sharing the
    top score (a tie the verdict declares: CommOps cannot tell them apart), as bench.matrix counts."""
    top = [c for c in cands if c["score"] >= cands[0]["score"] * (1 - 1e-6)] if cands else []
    return 1.0 / len(top) if any(is_device(c, fault) for c in top) else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="2 runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--network", action="store_true", help="network faults in network namespaces (root)")
    ap.add_argument("--keep", type=Path, help="keep each run's trace under this directory")
    a = ap.parse_args()
    if a.network and os.geteuid() != 0:
        sys.exit("--network needs root (network namespaces and tc)")
    if a.network:
        ensure_tools()
    rng = random.Random(a.seed)
    runs = 2 if a.quick else a.runs
    work = Path(tempfile.mkdtemp(prefix="laggard-realjobs-"))
    right = {"localize": 0.0, "sidecar": 0.0}
    judged = skipped = 0
    try:
        for k in range(runs):
            name = f"real-{a.seed}-{k}"
            out = (a.keep or work) / name
            shutil.rmtree(out, ignore_errors=True)
            if a.network:
                job, fault, shape, lab, act = draw_network(rng, f"lgb{k % 10}")
                try:
                    lab.up()
                    trace = run(out, job, name, fault, wrap=lab.argv, master=lab.ip(0), name_hosts=False,
                                env={"GLOO_SOCKET_IFNAME": "eth0"}, at_step=[(fault.start - 1, act)])
                finally:
                    lab.down()
                if fault.kind == "switch":
                    meta = json.loads((trace / "meta.json").read_text())
                    (trace / "meta.json").write_text(json.dumps({**meta, "topology": lab.topology()}, indent=1))
            else:
                job, fault, shape = draw_compute(rng)
                trace = run(out, job, name, fault)
            answers = verdicts(trace)
            per_rank = step_times(out, job.world)
            steps = [max(r[i] for r in per_rank) for i in range(len(per_rank[0]))]
            why = disturbed(steps, fault, 1.1, steady=fault.every == 1)  # (on and off: only the steps before must be even)
            print(f"{name}: {shape}")
            for path, v in answers.items():
                credit = device_credit(v.get("candidates") or [], fault)
                got = onset(v)
                when = got is not None and abs(got - fault.start) <= 1
                right[path] += credit * (when and not why)
                said = "right" if credit == 1 and when else f"tie ({credit:.2f})" if credit and when else "WRONG"
                print(f"  {path:<8} {said}: {brief(v)}")
            print(f"  the job's own step times (s): {' '.join(f'{t:.2f}' for t in steps)}")
            if why:
                skipped += 1
                print(f"  (not counted: {why})")
            else:
                judged += 1
            sys.stdout.flush()
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nright on {judged} runs this machine's load left alone ({skipped} disturbed, not counted): "
          + ", ".join(f"{p} {n:g}/{judged}" for p, n in right.items()))


if __name__ == "__main__":
    main()
