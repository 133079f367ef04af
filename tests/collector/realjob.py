"""Run the gloo test jobs as real multi-node torchrun jobs: jobs/pipeline_train.py (Megatron-shaped)
and jobs/data_parallel_train.py (FSDP2, HSDP, DDP).

One torchrun agent per "node", each started with its own LAGGARD_HOST (node-0, node-1, ...) and
--node-rank, static rendezvous on the first node, the CommOps logger attached by
collector.commops.run (no change to the script). Nodes are plain processes on this machine, or
network namespaces with their own NIC (tests/collector/netns_job.py's NetnsLab) when a test
needs a real network between them. `truth.json` beside meta.json records the injected fault.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.collector.cpulimit import CpuLimit
from tests.conftest import REPO

JOB = REPO / "tests" / "collector" / "jobs" / "pipeline_train.py"
DATA_PARALLEL = REPO / "tests" / "collector" / "jobs" / "data_parallel_train.py"
NICE = -10  # as root: the job's processes before the rest of this shared machine's work


@dataclass
class Fault:
    """What a run injects: compute of `ranks` x `factor` in [start, end), or a NIC, the path between
    two hosts or a switch's uplink throttled from `start`."""

    kind: str  # gpu | host | nic | link | switch | data | config (`ranks`: every rank of `stage`)
    start: int
    factor: float = 1.0
    ranks: list[int] = field(default_factory=list)
    host: str = ""
    rate: str = ""  # nic, link, switch: tc rate
    switch: str = ""  # switch: the top-of-rack switch whose uplink is throttled
    hosts: list[str] = field(default_factory=list)  # link: the two hosts whose traffic between them is throttled
    end: int | None = None  # exclusive; None: to the end of the run
    every: int = 1  # slow in every Nth step from `start` only (2: on and off)
    batches: float = 1.0  # data: from `start`, one model replica a step (a seeded draw) computes this many times longer
    stage: int | None = None  # config: the pipeline stage whose every rank computes `factor` x longer


@dataclass
class RealJob:
    """tp x pp x dp ranks, `nproc` per node; knobs of pipeline_train.py."""

    tp: int = 2
    pp: int = 2
    dp: int = 2
    nproc: int = 2
    steps: int = 40
    microbatches: int = 4
    layer_ms: float = 8.0
    act_mib: float = 4.0
    ep: int = 1  # expert parallel size, dividing dp (pipeline_train.py's --ep)
    overlap_grad: str = ""  # "", or the DP op overlapped with the backward: reduce_scatter | all_reduce
    extra: list[str] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def nodes(self) -> int:
        return self.world // self.nproc

    def host(self, node: int) -> str:
        return f"node-{node}"

    def ranks_of(self, node: int) -> list[int]:
        return list(range(node * self.nproc, (node + 1) * self.nproc))

    @property
    def script(self) -> Path:
        return JOB

    def args(self, fault: Fault | None) -> list[str]:
        out = ["--tp", str(self.tp), "--pp", str(self.pp), "--dp", str(self.dp), "--steps", str(self.steps),
               "--microbatches", str(self.microbatches), "--layer-ms", str(self.layer_ms),
               "--act-mib", str(self.act_mib), *(["--ep", str(self.ep)] if self.ep > 1 else []), *self.extra]
        if self.overlap_grad:
            out += ["--overlap-grad", "--overlap-op", self.overlap_grad]
        out += slow_args(fault)
        if fault is not None and fault.kind == "data":
            out += ["--long-batches", str(fault.batches), "--slow-from", str(fault.start)]
        return out

    def truth(self, job: str, fault: Fault | None) -> dict[str, object]:
        """The injected fault in the simulator's truth.json shape (kind, device, steps, factor)."""
        par = {"dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep, "cp": 1}
        faults = []
        if fault is not None:
            end = self.steps - 1 if fault.end is None else fault.end - 1
            root: dict[str, object] = {"kind": fault.kind}
            if fault.kind == "gpu":
                r = fault.ranks[0]
                root.update(rank=r, host=fault.host or self.host(r // self.nproc), gpu=r % self.nproc)
            elif fault.kind == "data":
                pass  # no device: the longest batches move between replicas
            elif fault.kind == "config":
                root["stage"] = fault.stage  # no device: the split of layers between stages
            elif fault.kind == "switch":
                root["switch"] = fault.switch
            elif fault.kind == "link":
                root["hosts"] = fault.hosts
            else:
                root["host"] = fault.host
            faults.append({"kind": fault.kind, "factor": fault.batches if fault.kind == "data" else fault.factor,
                           "pattern": "persistent" if fault.every == 1 else "alternate",
                           **({"rate": fault.rate} if fault.rate else {}), **{k: v for k, v in root.items() if k != "kind"},
                           "start_step": fault.start, "end_step": end, "root": root})
        return {"job": job, "source": f"real gloo job (tests/collector/jobs/{self.script.name})",
                "parallelism": par, "steps": self.steps, "microbatches": self.microbatches,
                "layer_ms": self.layer_ms, "act_mib": self.act_mib, "faults": faults,
                **({"overlap_grad": self.overlap_grad} if self.overlap_grad else {})}


@dataclass
class DataParallelJob(RealJob):
    """The data-parallel job (jobs/data_parallel_train.py): `dp` ranks, FSDP2 in `replicate` replica
    groups (HSDP when above 1), or DDP with `ddp`; no tp or pp."""

    tp: int = 1
    pp: int = 1
    dp: int = 4
    replicate: int = 1
    ddp: bool = False
    layers: int = 6

    @property
    def script(self) -> Path:
        return DATA_PARALLEL

    def args(self, fault: Fault | None) -> list[str]:
        return ["--steps", str(self.steps), "--layers", str(self.layers), "--layer-ms", str(self.layer_ms),
                "--replicate", str(self.replicate), *(["--ddp"] if self.ddp else []), *self.extra, *slow_args(fault)]


def slow_args(fault: Fault | None) -> list[str]:
    """A job script's flags for a fault that slows some ranks' compute."""
    if fault is None or not fault.ranks:
        return []
    out = ["--slow-ranks", ",".join(map(str, fault.ranks)), "--slow-factor", str(fault.factor),
           "--slow-from", str(fault.start)]
    if fault.end is not None:
        out += ["--slow-to", str(fault.end)]
    if fault.every > 1:
        out += ["--slow-every", str(fault.every)]
    return out


def last_step(log: Path) -> int:
    lines = log.read_text().split() if log.exists() else []
    return int(lines[-1]) if lines else -1


def run(out: Path, job: RealJob, name: str, fault: Fault | None = None,
        wrap: Callable[[int, list[str]], list[str]] | None = None, master: str = "127.0.0.1",
        env: dict[str, str] | None = None, at_step: list[tuple[int, Callable[[], None]]] | None = None,
        name_hosts: bool = True, port: int = 29611, timeout: float = 150.0) -> Path:
    """Run the job into `out`/trace (CommOps), `out`/steps (each rank's own step times); return the trace.

    `wrap(node, argv)` runs a node's agent elsewhere (a namespace); `at_step` actions run once
    rank 0 has finished that step. `name_hosts`: set LAGGARD_HOST=node-N (else the logger
    takes each node's hostname, e.g. a namespace's own).
    """
    trace, log = out / "trace", out / "rank0-steps.log"
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for node in range(job.nodes):
        e = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", LAGGARD_COMMOPS_DIR=str(trace),
                 LAGGARD_JOB=name, LAGGARD_PARALLELISM=f"tp={job.tp},pp={job.pp},dp={job.dp},ep={job.ep}", **(env or {}))
        e.pop("LAGGARD_HOST", None)
        if name_hosts:
            e["LAGGARD_HOST"] = job.host(node)
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(job.nodes),
                "--nproc-per-node", str(job.nproc), "--node-rank", str(node), "--master-addr", master,
                "--master-port", str(port), "--max-restarts", "0", "-m", "collector.commops.run", str(job.script),
                *job.args(fault), "--step-log", str(log), "--log-dir", str(out / "steps")]
        argv = wrap(node, argv) if wrap else argv
        if os.geteuid() == 0:  # the job's timing, not the other work on this machine, is under test
            argv = ["nice", "-n", str(NICE), *argv]
        procs.append(subprocess.Popen(argv, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    pending = sorted(at_step or [], key=lambda a: a[0])
    deadline = time.time() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if time.time() > deadline:
                raise TimeoutError(f"the job did not finish in {timeout:.0f} s")
            while pending and last_step(log) >= pending[0][0]:
                pending.pop(0)[1]()
            time.sleep(0.02)
    finally:
        stop(procs, str(log))
    bad = [(n, p.returncode, (p.stderr.read() if p.stderr else "")[-1500:]) for n, p in enumerate(procs) if p.returncode]
    if bad:
        raise RuntimeError(f"nodes failed: {bad}")
    (trace / "truth.json").write_text(json.dumps(job.truth(name, fault), indent=1))
    return trace


def stop(agents: list[subprocess.Popen[str]], marker: str) -> None:
    """End a run's agents, and with them its workers: torchrun stops its workers on SIGTERM; a
    worker in its own session outlives an agent killed outright and would load the machine (and
    write into a later run's trace) for the rest of the tests, so any process whose command line
    holds `marker` (the run's own --step-log) is killed too."""
    for p in agents:
        if p.poll() is None:
            p.terminate()
    deadline = time.time() + 10
    while any(p.poll() is None for p in agents) and time.time() < deadline:
        time.sleep(0.05)
    for p in agents:
        if p.poll() is None:
            p.kill()
            p.wait()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue


def run_cpu_limited(out: Path, job: RealJob, name: str, fault: Fault, node: int, quota: float, cpu: CpuLimit) -> Path:
    """`job` with `node`'s processes in the cgroup `cpu` (made: `CpuLimit.up`), its quota set to
    `quota` of a core once step `fault.start` - 1 is done and lifted at the last (the processes' exit
    at 5% took a minute); the cgroup removed after. `fault` says where, for truth.json: it slows
    nothing itself."""
    try:
        return run(out, job, name, fault, wrap=lambda n, argv: cpu.argv(argv) if n == node else argv, timeout=300,
                   at_step=[(fault.start - 1, lambda: cpu.limit(quota)), (job.steps - 1, lambda: cpu.limit(None))])
    finally:
        cpu.down()


def step_times(out: Path, world: int) -> list[list[float]]:
    """Each rank's own step durations (s), from the job's --log-dir."""
    res = []
    for r in range(world):
        rows = [json.loads(x) for x in (out / "steps" / f"rank-{r}.jsonl").read_text().splitlines()]
        res.append([(x["end_ns"] - x["start_ns"]) / 1e9 for x in rows])
    return res
