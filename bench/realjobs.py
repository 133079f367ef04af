"""Try to break the localizer on real jobs: random variants of the real gloo jobs, both paths.

    python -m bench.realjobs                    # 6 runs, seed 0: compute faults (about 5 min)
    python -m bench.realjobs --quick            # 2 runs
    python -m bench.realjobs --runs 10 --seed 7
    python -m bench.realjobs --network          # (root) NIC, link and switch faults in network namespaces
    python -m bench.realjobs --cpu              # (root) a host under a kernel CPU quota (a cgroup)
    python -m bench.realjobs --moe              # mixture-of-experts pipeline jobs (with --network, --cpu too)
    python -m bench.realjobs --from-start       # slow from the first step: a GPU, a host, a stage, the data
    python -m bench.realjobs --mild             # a GPU or a host on and off at 1.25-1.45x: steps near δ

Each run draws a job and a fault nobody tuned on, runs it for real under torchrun (gloo, one agent
per node, the CommOps logger attached: tests/collector/realjob.py) and asks `laggard localize` and
`laggard sidecar localize` which device, since when. The jobs: the Megatron-shaped pipeline job
(tests/collector/jobs/pipeline_train.py; tp x pp x dp of 8 ranks, 4-8 microbatches, activations of
0.25-4 MiB, the DP sync at the step's end or overlapped as reduce-scatters or DDP's all-reduces, the
model-parallel sync on or off) and the data-parallel one (jobs/data_parallel_train.py: FSDP2, HSDP,
DDP). Compute faults: a GPU or a host at 1.5-2.5x from step 12-24, or a GPU on and off. Network
faults (--network, one node per namespace, on the pipeline job or HSDP with a rank per node): a
node's NIC, the path between two nodes, or a rack's uplink rate-limited from step 18. CPU faults
(--cpu): one node's processes in a cgroup whose CPU quota drops mid-run (`tests/collector/cpulimit.py`).
--moe: only pipeline jobs whose layers are experts (pipeline_train.py's --ep: each layer's tokens
dispatched and combined by all-to-alls among 2 or 4 replicas); with --network too, on 4 nodes.
--from-start: compute faults from the first step, so no step is normal: a GPU or a host (named),
on pipeline jobs also every rank of one stage (config: the split of layers) or one model replica a
step computing longer, whichever drew the longest sequences (data).
--mild: a GPU or a host 1.25-1.45x slow every other step from step 12-24, which may cost the job's
steps less than δ; it counts where the job lost 2% or more over those steps.

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

from bench.localize import top_credit
from tests.collector.cpulimit import CpuLimit
from tests.collector.netns_job import NetnsLab, ensure_tools
from tests.collector.realjob import (
    DataParallelJob,
    Fault,
    RealJob,
    run,
    run_cpu_limited,
    step_times,
)
from tests.localize.test_real_jobs import brief, disturbed, is_device, onset, verdicts

PIPELINE_LAYOUTS = [(2, 2, 2, 2), (1, 4, 2, 2), (2, 4, 1, 2), (1, 2, 4, 2), (4, 2, 1, 4)]  # tp, pp, dp, ranks per node
MOE_LAYOUTS = [(2, 2, 2, 2, 2), (1, 4, 2, 2, 2), (1, 2, 4, 2, 2), (1, 2, 4, 2, 4), (1, 2, 4, 4, 4)]  # ... and ep
STEPS = 36
HSDP_SHARE = 0.35  # of the network runs: HSDP, a rank per node, instead of the pipeline job
HSDP_PAIRS = [(0, 1), (2, 3), (0, 2), (1, 3)]  # the nodes HSDP's 2 x 2 mesh has exchange data


def draw_compute(rng: random.Random, moe: bool = False, from_start: bool = False) -> tuple[RealJob, Fault, str]:
    """A job and a compute fault (a GPU, a host, or a GPU on and off); `moe`: an expert-parallel
    pipeline job; `from_start`: from the first step, a GPU, a host, or on a pipeline job a stage or
    the data."""
    if moe:
        tp, pp, dp, nproc, ep = rng.choice(MOE_LAYOUTS)
        job: RealJob = RealJob(tp=tp, pp=pp, dp=dp, ep=ep, nproc=nproc, steps=STEPS,
                               microbatches=rng.choice([4, 6, 8]), act_mib=rng.choice([4.0, 1.0, 0.25]),
                               overlap_grad=rng.choice(["", "reduce_scatter"]))
        shape = (f"moe pipeline tp{tp} pp{pp} dp{dp} ep{ep} mb{job.microbatches} act {job.act_mib} MiB "
                 f"dp-sync {job.overlap_grad or 'at the end'}")
    elif rng.random() < 0.6:
        tp, pp, dp, nproc = rng.choice(PIPELINE_LAYOUTS)
        extra = ["--no-mp-sync"] if rng.random() < 0.4 else []
        job = RealJob(tp=tp, pp=pp, dp=dp, nproc=nproc, steps=STEPS, microbatches=rng.choice([4, 6, 8]),
                      overlap_grad=rng.choice(["", "", "reduce_scatter", "all_reduce"]), extra=extra,
                      act_mib=rng.choice([4.0, 1.0, 0.25]))
        shape = (f"pipeline tp{tp} pp{pp} dp{dp} mb{job.microbatches} act {job.act_mib} MiB "
                 f"dp-sync {job.overlap_grad or 'at the end'}{' no-mp-sync' if extra else ''}")
    else:
        mode = rng.choice(["fsdp", "hsdp", "ddp"])
        job = DataParallelJob(steps=STEPS, replicate=2 if mode == "hsdp" else 1, ddp=mode == "ddp")
        shape = f"data parallel {mode}, 4 ranks"
    if from_start:
        return _from_start(rng, job, shape)
    kind = rng.choice(["gpu", "gpu", "host", "gpu on and off"])
    start, factor = rng.randint(12, 24), round(rng.uniform(1.5, 2.5), 2)
    if kind == "host":
        node = rng.randrange(job.nodes)
        fault = Fault("host", start, factor, ranks=job.ranks_of(node), host=job.host(node))
    else:
        fault = Fault("gpu", start, factor, ranks=[rng.randrange(job.world)], every=2 if kind != "gpu" else 1)
    return job, fault, f"{shape} | {kind} {fault.ranks} x{factor} from {start}"


def draw_mild(rng: random.Random, moe: bool = False) -> tuple[RealJob, Fault, str]:
    """A job as `draw_compute` draws them and a GPU or a host slow every other step, mildly: its
    steps may run under δ, and only its compute beside its stage peers' shows it."""
    job, _, shape = draw_compute(rng, moe)
    kind = rng.choice(["gpu", "host"])
    start, factor = rng.randint(12, 24), round(rng.uniform(1.25, 1.45), 2)
    if kind == "host":
        node = rng.randrange(job.nodes)
        fault = Fault("host", start, factor, ranks=job.ranks_of(node), host=job.host(node), every=2)
    else:
        fault = Fault("gpu", start, factor, ranks=[rng.randrange(job.world)], every=2)
    return job, fault, f"{shape.split(' | ')[0]} | {kind} on and off {fault.ranks} x{factor} from {start}"


def _from_start(rng: random.Random, job: RealJob, shape: str) -> tuple[RealJob, Fault, str]:
    """A compute fault from the first step on `job`: nothing before it is normal."""
    pipeline = not isinstance(job, DataParallelJob)  # (data: replicas to move between, dp 2 or more)
    kind = rng.choice(["gpu", "gpu", "host", *(["stage"] if pipeline else []), *(["data"] if pipeline and job.dp > 1 else [])])
    factor = round(rng.uniform(1.5, 2.5), 2)
    if kind == "host":
        node = rng.randrange(job.nodes)
        fault = Fault("host", 0, factor, ranks=job.ranks_of(node), host=job.host(node))
    elif kind == "stage":
        stage, width = rng.randrange(job.pp), job.tp * job.dp  # (Megatron's rank order: pp slowest)
        fault = Fault("config", 0, factor, ranks=list(range(stage * width, (stage + 1) * width)), stage=stage)
    elif kind == "data":
        fault = Fault("data", 0, batches=factor)
    else:
        fault = Fault("gpu", 0, factor, ranks=[rng.randrange(job.world)])
    what = {"stage": f"stage {fault.stage}'s ranks {fault.ranks}", "data": "one replica a step (data)"}.get(kind, f"{kind} {fault.ranks}")
    return job, fault, f"{shape} | {what} x{factor} from the first step"


def draw_cpu(rng: random.Random, moe: bool = False) -> tuple[RealJob, Fault, str, float]:
    """A job as `draw_compute` draws them and one node's processes under a CPU quota (a share of one
    core, 5-12%) from step 12-24: the kernel stops every thread of the node once the quota is used,
    computing or moving data, as a Kubernetes CPU limit does."""
    job, _, shape = draw_compute(rng, moe)
    node = rng.randrange(job.nodes)
    start, quota = rng.randint(12, 24), round(rng.uniform(0.05, 0.12), 3)
    fault = Fault("host", start, ranks=job.ranks_of(node), host=job.host(node))
    return job, fault, f"{shape.split(' | ')[0]} | host {job.host(node)} under a CPU quota of {quota:.1%} of a core from {start}", quota


def draw_network(rng: random.Random, tag: str, hsdp: bool,
                 moe: bool = False) -> tuple[RealJob, Fault, str, NetnsLab, Callable[[], None]]:
    """A pipeline job, or with `hsdp` an HSDP one (FSDP2 on a 2 x 2 mesh, a rank per node: its shard
    and replica groups cross different nodes), with `moe` an expert-parallel pipeline job, one node
    per namespace, and a NIC, link or uplink rate-limited from step 18. (The pipeline variant is
    drawn either way: a seed's pipeline runs stay what they were before HSDP runs were drawn.)"""
    tp, pp, dp, nproc = rng.choice(PIPELINE_LAYOUTS[:4])
    extra = ["--no-mp-sync"] if rng.random() < 0.4 else []
    job: RealJob = RealJob(tp=tp, pp=pp, dp=dp, nproc=nproc, steps=STEPS, extra=extra,
                           overlap_grad=rng.choice(["", "reduce_scatter", "all_reduce"]))
    shape = f"pipeline tp{tp} pp{pp} dp{dp} dp-sync {job.overlap_grad or 'at the end'}{' no-mp-sync' if extra else ''}"
    if moe:
        tp, pp, dp, nproc, ep = rng.choice([m for m in MOE_LAYOUTS if m[3] == 2])
        job = RealJob(tp=tp, pp=pp, dp=dp, ep=ep, nproc=nproc, steps=STEPS, overlap_grad=job.overlap_grad)
        shape = f"moe pipeline tp{tp} pp{pp} dp{dp} ep{ep} dp-sync {job.overlap_grad or 'at the end'}"
    elif hsdp:
        job = DataParallelJob(steps=STEPS, replicate=2, nproc=1)
        shape = "data parallel hsdp, 4 ranks, one per node"
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
        if hsdp:  # (a path the mesh's groups cross: shard pairs 0-1, 2-3, replica pairs 0-2, 1-3)
            a, b = HSDP_PAIRS[(a * job.nodes + b) % len(HSDP_PAIRS)]
        fault = Fault("link", start, hosts=[hosts[a], hosts[b]], rate=rate)
        act = lambda: lab.throttle_path(a, b, rate)  # noqa: E731
    else:
        fault = Fault("switch", start, switch=lab.switch(0), rate=rate)
        act = lambda: lab.throttle_uplink(0, rate)  # noqa: E731
    shape += f" | {kind} {fault.host or fault.hosts or fault.switch} at {rate} from {start}"
    return job, fault, shape, lab, act


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="2 runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--network", action="store_true", help="network faults in network namespaces (root)")
    ap.add_argument("--cpu", action="store_true", help="a host under a kernel CPU quota, a cgroup (root)")
    ap.add_argument("--moe", action="store_true", help="expert-parallel pipeline jobs only (with any of the above)")
    ap.add_argument("--from-start", action="store_true", help="compute faults from the first step (a GPU, a host, a stage, the data)")
    ap.add_argument("--mild", action="store_true", help="a GPU or a host on and off at 1.25-1.45x (steps near δ)")
    ap.add_argument("--keep", type=Path, help="keep each run's trace under this directory")
    a = ap.parse_args()
    if a.network and os.geteuid() != 0:
        sys.exit("--network needs root (network namespaces and tc)")
    if a.cpu and (why := CpuLimit.why_not()):
        sys.exit(f"--cpu: {why}")
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
                # (a side stream: the pipeline runs of seeds 1 and 2, measured before HSDP runs were drawn, stay theirs)
                hsdp = random.Random(a.seed * 1009 + k + 71271).random() < HSDP_SHARE
                job, fault, shape, lab, act = draw_network(rng, f"lgb{k % 10}", hsdp, a.moe)
                try:
                    lab.up()
                    trace = run(out, job, name, fault, wrap=lab.argv, master=lab.ip(0), name_hosts=False,
                                env={"GLOO_SOCKET_IFNAME": "eth0"}, at_step=[(fault.start - 1, act)])
                finally:
                    lab.down()
                if fault.kind == "switch":
                    meta = json.loads((trace / "meta.json").read_text())
                    (trace / "meta.json").write_text(json.dumps({**meta, "topology": lab.topology()}, indent=1))
            elif a.cpu:
                job, fault, shape, quota = draw_cpu(rng, a.moe)
                cpu = CpuLimit(f"laggard-realjobs-{os.getpid()}")
                cpu.up()
                trace = run_cpu_limited(out, job, name, Fault("host", fault.start, host=fault.host),
                                        fault.ranks[0] // job.nproc, quota, cpu)
            else:
                job, fault, shape = draw_mild(rng, a.moe) if a.mild else draw_compute(rng, a.moe, a.from_start)
                trace = run(out, job, name, fault)
            answers = verdicts(trace)
            per_rank = step_times(out, job.world)
            steps = [max(r[i] for r in per_rank) for i in range(len(per_rank[0]))]
            # (under a CPU quota, which stops the host wherever it runs out, the fault's own steps
            # vary by themselves: only the steps before must be even; a fault on and off is judged
            # over the steps it is on)
            why = disturbed(steps, fault, steady=not a.cpu, effect=1.02 if a.mild else 1.1)
            print(f"{name}: {shape}")
            for path, v in answers.items():
                cands = v.get("candidates") or []
                credit = top_credit([c["score"] for c in cands], [is_device(c, fault) for c in cands])
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
