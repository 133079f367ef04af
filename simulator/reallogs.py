"""A log set in real-world vocabulary, to measure L4 on lines its kind rules were not written from.

simulator/logs.py writes the logs the localizer was developed on. This module writes other jobs, in the
words the real stack prints: NCCL/RCCL warnings, IB verbs completion statuses, NVIDIA driver Xid codes,
uncorrectable ECC, PCIe AER, the kernel OOM killer and machine checks, Slurm (slurmstepd, slurmctld) and
Kubernetes events, on journal-format kernel lines and a plain training loop. Logs come per host or,
in some jobs, as one aggregated Slurm output (`srun --label`) plus a cluster event log, so the node of
a line must be taken from the line.

Each failure has two dialects: "dev" phrasings (what tuning may look at) and "heldout" phrasings (other
Xid codes of the same class, other IB statuses, RCCL, UCX, cgroup-v2 OOM, AER before the Xid, other
Slurm and Kubernetes wordings). `python -m bench.reallogs` evaluates on the held-out dialect at seeds
never used in development. Truth (`truth.json` "log_failures") lists every line the failure caused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from collector.trace.meta import JobMeta

#: failure -> (category, kind of the root cause)
FAILURES: dict[str, tuple[str, str]] = {
    "ib_retry": ("network", "nic"),
    "ib_port": ("network", "nic"),
    "gpu_lost": ("hardware", "gpu"),
    "gpu_ecc": ("hardware", "gpu"),
    "gpu_nvlink": ("hardware", "gpu"),
    "gpu_gsp": ("hardware", "gpu"),
    "pcie_aer": ("hardware", "gpu"),
    "host_oom": ("hardware", "host"),
    "host_mce": ("hardware", "host"),
    "node_lost": ("hardware", "host"),
    "cuda_oom": ("user", "config"),
    "nan_loss": ("user", "data"),
    "nccl_timeout": ("user", "config"),
}
NODE_FAILURES = tuple(n for n, (_, k) in FAILURES.items() if k in ("gpu", "nic", "host"))
DIALECTS = ("dev", "heldout")
_BUS = ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")
_T0 = datetime(2026, 11, 22, 7, 0, 0, tzinfo=UTC).timestamp()


@dataclass
class _Node:
    name: str
    ip: str
    ranks: list[int]
    lines: list[tuple[float, str, bool, str]] = field(default_factory=list)  # (t, text, caused, stream)


class _Job:
    def __init__(self, meta: JobMeta, rng: np.random.Generator, dialect: str, aggregated: bool) -> None:
        self.rng, self.dialect, self.aggregated = rng, dialect, aggregated
        self.meta = meta
        self.nodes = [_Node(h, meta.ranks[min(r for r, i in meta.ranks.items() if i.host == h)].ip or f"10.0.0.{k}",
                            sorted(r for r, i in meta.ranks.items() if i.host == h)) for k, h in enumerate(meta.hosts())]
        self.node_of = {r: n for n in self.nodes for r in n.ranks}
        self.events: list[tuple[float, str, bool]] = []  # cluster event log (Slurm controller / Kubernetes)
        self.jobid = int(rng.integers(100_000, 999_999))
        self.k8s = bool(rng.random() < 0.5)

    def pick(self, dev: list[str], heldout: list[str]) -> str:
        opts = dev if self.dialect == "dev" else heldout
        return opts[int(self.rng.integers(len(opts)))]

    def ts(self, t: float, fmt: str = "iso") -> str:
        d = datetime.fromtimestamp(_T0 + t, UTC)
        if fmt == "journal":
            return d.strftime("%b %d %H:%M:%S")
        return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond:06d}+00:00"

    def kern(self, n: _Node, t: float, msg: str, caused: bool = False, proc: str = "kernel") -> None:
        body = f"[{1000 + t:11.6f}] {msg}" if proc == "kernel" else msg
        n.lines.append((t, f"{self.ts(t, 'journal')} {n.name} {proc}: {body}", caused, "sys"))

    def out(self, rank: int, t: float, msg: str, caused: bool = False) -> None:
        """A line a rank printed to stdout/stderr (srun --label prefixes its task id when aggregated)."""
        n = self.node_of[rank]
        n.lines.append((t, f"[{self.ts(t)[:19].replace('T', ' ')}] [rank{rank}] {msg}", caused, "out"))

    def event(self, t: float, msg: str, caused: bool = False) -> None:
        self.events.append((t, f"{self.ts(t)} {msg}", caused))

    def write(self, logs: Path) -> list[str]:
        """Write the files; returns the truth lines as file:line."""
        logs.mkdir(parents=True, exist_ok=True)
        truth: list[str] = []

        def dump(name: str, rows: list[tuple[float, str, bool]]) -> None:
            rows.sort(key=lambda x: x[0])
            (logs / name).write_text("".join(r[1] + "\n" for r in rows))
            truth.extend(f"logs/{name}:{i + 1}" for i, r in enumerate(rows) if r[2])

        agg: list[tuple[float, str, bool]] = []
        for n in self.nodes:
            own = [(t, x, c) for t, x, c, s in n.lines if not (self.aggregated and s == "out")]
            agg += [(t, f"{x.split('[rank', 1)[1].split(']', 1)[0]}: {x}", c)
                    for t, x, c, s in n.lines if self.aggregated and s == "out"]
            dump(f"{n.name}.log", own)
        if self.aggregated:
            dump(f"slurm-{self.jobid}.out", agg)
        if self.events:
            dump("k8s-events.log" if self.k8s else "slurmctld.log", list(self.events))
        return truth


# ---------------------------------------------------------------- the healthy job

def _healthy(job: _Job, steps: int) -> float:
    """Init, training loop and benign noise; returns the time training stopped."""
    rng = job.rng
    master = job.nodes[0]
    for n in job.nodes:
        job.kern(n, 0.1, "mlx5_core 0000:5e:00.0: mlx5_pcie_event:301:(pid 812): PCIe slot advertised sufficient power (75W).")
        job.kern(n, 0.2, "IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready")
        job.kern(n, 0.3, f"Started slurmd session for job {job.jobid}.", proc="systemd[1]")
        if job.k8s:
            job.event(0.05, f"Normal   Scheduled  pod/trainer-{n.name}  Successfully assigned ml/trainer-{n.name} to {n.name}")
        else:
            job.event(0.05, f"slurmctld: sched: _slurm_rpc_allocate_resources JobId={job.jobid} NodeList={n.name} usec=412")
        for r in n.ranks:
            t = 1 + float(rng.uniform(0, 1))
            job.out(r, t, f"{n.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL INFO Bootstrap : Using ib0:{n.ip}<0>")
            job.out(r, t + 0.1, f"{n.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB "
                    "[1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB ib0:" + n.ip)
            if rng.random() < 0.3:
                job.out(r, t + 0.2, f"{n.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL WARN Could not find real path of "
                        "/sys/class/net/bond0/device")
            job.out(r, t + 0.3, f"{n.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL INFO comm 0x{rng.integers(1 << 40):x} "
                    f"rank {r} nranks {job.meta.world_size} cudaDev {r % 8} busId {_BUS[r % 8]}000 - Init COMPLETE")
            if rng.random() < 0.2:
                job.out(r, t + 0.4, "UserWarning: TypedStorage is deprecated. It will be removed in the future and "
                        "UntypedStorage will be the only storage class.")
    if master.ranks:
        job.out(master.ranks[0], 2.5, f"loading dataset shards from /data/corpus ({int(rng.integers(64, 512))} files)")
    t = 3.0
    for s in range(steps):
        dt = float(rng.uniform(0.9, 1.1))
        t += dt
        for n in job.nodes:
            r = n.ranks[0]
            job.out(r, t, f"step {s}/{steps} | loss {3.2 - s * 0.004 + rng.normal(0, 0.02):.4f} | lr 3.0e-04 | "
                    f"{dt * 1000:.0f} ms/step | {rng.uniform(150, 160):.1f} TFLOPS")
            if rng.random() < 0.01:
                job.kern(n, t + 0.3, f"EDAC MC0: 1 CE memory read error on CPU_SrcID#0_MC#0_Chan#{rng.integers(4)}_DIMM#0 "
                         "(channel:0 slot:0 page:0x3f4a2 offset:0x0 grain:32 syndrome:0x0)")
            if rng.random() < 0.01:
                job.kern(n, t + 0.4, "pcieport 0000:00:01.0: AER: Corrected error received: 0000:00:01.0")
            if rng.random() < 0.01:
                job.kern(n, t + 0.5, f"perf: interrupt took too long ({rng.integers(2500, 9000)} > 2500), lowering "
                         "kernel.perf_event_max_sample_rate to 79750")
        if s and s % 50 == 0:
            job.out(0, t + 0.5, f"saving checkpoint at step {s} to /ckpt/run/step_{s}")
            job.out(0, t + 2.0, f"saved checkpoint at step {s} in 1.5 s")
            t += 2.0
    return t


def _finish(job: _Job, t: float) -> None:
    for n in job.nodes:
        job.out(n.ranks[0], t + 1, "training finished, exiting")
    job.event(t + 2, f"slurmctld: _job_complete: JobId={job.jobid} WEXITSTATUS 0" if not job.k8s
              else "Normal   Completed  job/trainer  Job completed")


# ---------------------------------------------------------------- failures (root lines, then the cascade)

def _watchdog(job: _Job, t: float, skip: set[int]) -> None:
    """Every other rank times out in its collective; torchrun and the scheduler report the crash."""
    seq = int(job.rng.integers(1000, 90000))
    for n in job.nodes:
        for r in n.ranks:
            if r in skip:
                continue
            job.out(r, t + 600, job.pick(
                [f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
                 f"NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600021 milliseconds before timing out."],
                [f"[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank {r}] Process group watchdog thread terminated with "
                 f"exception: [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
                 "OpType=_ALLGATHER_BASE, Timeout(ms)=600000) ran for 600094 milliseconds before timing out."]), True)
        job.out(n.ranks[0], t + 601, job.pick(
            [f"torch.distributed.elastic.multiprocessing.api: failed (exitcode: -6) local_rank: 0 (pid: {4000 + n.ranks[0]}) "
             "of binary: /usr/bin/python3"],
            [f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED (exitcode -6, "
             f"signal SIGABRT, rank {n.ranks[0]})"]), True)
    job.event(t + 602, job.pick(
        [f"slurmstepd: error: *** STEP {job.jobid}.0 ON {job.nodes[0].name} CANCELLED AT "
         f"{job.ts(t + 602)[:19]} ***"],
        [f"Warning  BackOff  pod/trainer-{job.nodes[0].name}  Back-off restarting failed container trainer"]), True)


def _inject(job: _Job, name: str, t: float) -> tuple[_Node | None, int | None]:
    rng = job.rng
    bad = job.nodes[int(rng.integers(len(job.nodes)))]
    rank = bad.ranks[int(rng.integers(len(bad.ranks)))]
    gpu = rank % 8
    bus = _BUS[gpu]
    hca = f"mlx5_{int(rng.integers(4))}"
    pid = 4000 + rank
    peers = [n for n in job.nodes if n is not bad] or [bad]
    if name in ("ib_retry", "ib_port"):
        if name == "ib_port":
            job.kern(bad, t, job.pick([f"mlx5_core 0000:5e:00.0 {hca}: Port module event[error]: module 0, Cable error, "
                                       "Bad cable", f"{hca}/1: port link down (ib_ipoib)"],
                                      ["mlx5_core 0000:5e:00.0: mlx5_port_module_event:1148:(pid 0): Port module "
                                       "event[error]: module 1, Cable error, Power budget exceeded",
                                       f"ib_srpt {hca}-1: PORT_ERR: received IB event IB_EVENT_PORT_ERR"]), True)
            for r in bad.ranks[:2]:
                job.out(r, t + 0.5, f"{bad.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL WARN NET/IB : Got async event : "
                        "port error", True)
        for p in peers[:3]:
            r = p.ranks[0]
            job.out(r, t + 1, job.pick(
                [f"{p.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL WARN NET/IB : Got completion from peer {bad.ip}<{rng.integers(30000, 60000)}> "
                 f"with status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:{p.ip} remoteGids::ffff:{bad.ip} hca {hca}"],
                [f"{p.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL WARN NET/IB : Got completion from peer {bad.ip}<{rng.integers(30000, 60000)}> "
                 f"with error 13, opcode 0, len 0, vendor err 136 (Recv) hca {hca}",
                 f"[{p.name}:{2000 + r}:0:{2200 + r}] ib_mlx5_log.c:179  Transport retry count exceeded on {hca}:1/IB "
                 f"(synd 0x15 vend 0x81 hw_synd 0/0) to {bad.ip}",
                 f"{p.name}:{2000 + r}:{2100 + r} [{r % 8}] RCCL WARN NET/IB : {hca}:1 ibv_poll_cq error: status=12 "
                 f"(transport retry counter exceeded) peer {bad.ip}"]), True)
            job.out(r, t + 1.1, f"{p.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL WARN NET/IB : Got completion with error "
                    "on the network (cuda device remains usable)" if job.dialect == "dev" else
                    f"{p.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL INFO transport/net.cc:1012 -> 6", True)
        _watchdog(job, t, set())
        return bad, None
    if name in ("gpu_lost", "gpu_ecc", "gpu_nvlink", "gpu_gsp", "pcie_aer"):
        if name == "pcie_aer":
            job.kern(bad, t - 0.2, f"pcieport 0000:{bus}:00.0: AER: Uncorrected (Fatal) error received: 0000:{bus}:00.0", True)
            job.kern(bad, t - 0.1, job.pick(
                [f"nvidia 0000:{bus}:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, "
                 "(Requester ID)"],
                [f"nvidia 0000:{bus}:00.0: AER: aer_status: 0x00004000, aer_mask: 0x00000000",
                 f"nvidia 0000:{bus}:00.0: AER:    [14] CmpltTO                (First)"]), True)
        xid = {"gpu_lost": (["79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."],
                            ["154, pid='<unknown>', name=<unknown>, GPU recovery action changed from 0x0 (None) to "
                             "0x2 (Node Reboot Required)", "79, pid=" + str(pid) + ", name=python3, GPU has fallen off the bus."]),
               "gpu_ecc": ([f"48, pid={pid}, name=python3, An uncorrectable double bit error (DBE) has been detected on "
                            "GPU in the framebuffer at partition 3, subpartition 0."],
                           [f"95, pid={pid}, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No",
                            f"94, pid={pid}, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
                            f"64, pid={pid}, name=python3, Row remapping failure (row remap table full)"]),
               "gpu_nvlink": ([f"74, pid={pid}, name=python3, NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, "
                               "0x0, 0x0, 0x0, 0x0)"],
                              [f"145, pid={pid}, name=python3, NVLink: NVLW Fatal Error on link 11 (0x00000008)",
                               f"74, pid={pid}, name=python3, NVLink: fatal error detected on link 14(0x0, 0x0, 0x0, "
                               "0x0, 0x0, 0x0, 0x8000)"]),
               "gpu_gsp": ([f"119, pid={pid}, name=python3, Timeout after 6s of waiting for RPC response from GPU{gpu} "
                            "GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8)."],
                           [f"120, pid={pid}, name=python3, GSP task timeout @ pc:0x4bd36ca, task: 1",
                            f"119, pid={pid}, name=python3, Timeout waiting for RPC from GSP{gpu}! Expected function 10 "
                            "(FREE) (0x5c000001 0x0)."]),
               "pcie_aer": (["79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."],
                            ["79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."])}[name]
        job.kern(bad, t, f"NVRM: Xid (PCI:0000:{bus}:00): " + job.pick(*xid), True)
        job.out(rank, t + 0.5, job.pick(["RuntimeError: CUDA error: unspecified launch failure",
                                         "RuntimeError: CUDA error: an illegal memory access was encountered"],
                                        ["torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered",
                                         "RuntimeError: CUDA error: unknown error\nCompile with `TORCH_USE_CUDA_DSA` to "
                                         "enable device-side assertions."]).split("\n")[0], True)
        job.out(rank, t + 0.6, f"{bad.name}:{pid}:{pid + 100} [{gpu}] NCCL WARN Cuda failure 'unspecified launch failure'"
                if job.dialect == "dev" else f"{bad.name}:{pid}:{pid + 100} [{gpu}] NCCL WARN Cuda failure 999 "
                "'unknown error'", True)
        _watchdog(job, t, {rank})
        return bad, rank
    if name == "host_oom":
        victim = 4000 + bad.ranks[0]
        job.kern(bad, t, job.pick(["python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), "
                                   "order=0, oom_score_adj=0"],
                                  ["pt_data_worker invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, "
                                   "oom_score_adj=0"]), True)
        job.kern(bad, t + 0.1, job.pick(
            [f"Out of memory: Killed process {victim} (python3) total-vm:812345678kB, anon-rss:498765432kB, "
             "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:980000kB oom_score_adj:0"],
            [f"Memory cgroup out of memory: Killed process {victim} (python3) total-vm:701234567kB, "
             "anon-rss:451234567kB, file-rss:81234kB, shmem-rss:0kB, UID:0 pgtables:901234kB oom_score_adj:900",
             f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,oom_memcg=/kubepods/pod1,"
             f"task_memcg=/kubepods/pod1/trainer,task=python3,pid={victim},uid=0"]), True)
        job.event(t + 1, job.pick(
            [f"slurmstepd: error: Detected 1 oom_kill event in StepId={job.jobid}.0 on {bad.name}. Some of the step "
             "tasks have been OOM Killed."],
            [f"Warning  OOMKilling  node/{bad.name}  Memory cgroup out of memory: Killed process {victim} (python3)",
             f"Warning  Evicted  pod/trainer-{bad.name}  The node {bad.name} was low on resource: memory. Threshold "
             "quantity: 100Mi, available: 51236Ki."]), True)
        _watchdog(job, t, set(bad.ranks))
        return bad, None
    if name == "host_mce":
        job.kern(bad, t, job.pick(
            ["mce: [Hardware Error]: Machine check events logged",
             "EDAC MC1: 1 UE memory read error on CPU_SrcID#1_MC#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x7d3a1 "
             "offset:0x0 grain:32)"],
            ["{1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 0",
             "mce: Uncorrected hardware memory error in user-access at 7d3a1b000"]), True)
        job.kern(bad, t + 0.1, job.pick(
            [f"Memory failure: 0x7d3a1: Sending SIGBUS to python3:{4000 + bad.ranks[0]} due to hardware memory corruption"],
            ["Memory failure: 0x7d3a1: recovery action for dirty LRU page: Recovered",
             "{1}[Hardware Error]: event severity: fatal"]), True)
        job.out(bad.ranks[0], t + 0.3, "Fatal Python error: Bus error", True)
        _watchdog(job, t, set(bad.ranks))
        return bad, None
    if name == "node_lost":
        job.event(t + 30, job.pick([f"slurmctld: error: Nodes {bad.name} not responding, setting DOWN"],
                                   [f"Warning  NodeNotReady  node/{bad.name}  Node {bad.name} status is now: NodeNotReady",
                                    f"slurmctld: Killing JobId={job.jobid} on failed node {bad.name}"]), True)
        for p in peers[:2]:
            r = p.ranks[0]
            job.out(r, t + 5, job.pick(
                [f"{p.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL WARN socketProgressOpt: Call to recv from {bad.ip}<43121> "
                 "failed : Connection reset by peer"],
                [f"{p.name}:{2000 + r}:{2100 + r} [{r % 8}] NCCL WARN Net : Connection closed by remote peer "
                 f"{bad.name}<51377>", f"[E socket.cpp:957] [c10d] The client socket has timed out after 600s while "
                 f"trying to connect to ({bad.name}, 29500)."]), True)
        _watchdog(job, t, set(bad.ranks))
        return bad, None
    if name == "cuda_oom":
        for n in job.nodes:
            for r in n.ranks[:2]:
                job.out(r, t, job.pick(
                    [f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {r % 8} has a total "
                     "capacity of 79.15 GiB of which 1.02 GiB is free."],
                    [f"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB (GPU {r % 8}; 79.11 "
                     "GiB total capacity; 75.3 GiB already allocated; 812.00 MiB free)"]), True)
        _watchdog(job, t, set())
        return None, None
    if name == "nan_loss":
        for n in job.nodes:
            job.out(n.ranks[0], t, job.pick(["Loss is nan, stopping training"],
                                            ["FloatingPointError: Minimum loss scale reached (0.0001). Your loss is "
                                             "probably exploding."]), True)
        return None, None
    if name == "nccl_timeout":
        _watchdog(job, t - 590, set())
        return None, None
    raise ValueError(name)


def emit_real_logs(trace_dir: Path, seed: int, failure: str | None, dialect: str = "heldout",
                   steps: int | None = None, aggregated: bool | None = None) -> dict[str, Any]:
    """Write logs/ for the job in trace_dir/meta.json; returns (and stores in truth.json) the failure truth.
    `aggregated`: stdout in one Slurm output instead of per host (default: drawn from the seed)."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect {dialect!r}")
    meta = JobMeta.load(trace_dir / "meta.json")
    rng = np.random.default_rng([seed, 97])
    drawn = bool(rng.random() < 0.35)
    job = _Job(meta, rng, dialect, aggregated=drawn if aggregated is None else aggregated)
    n_steps = steps or int(rng.integers(40, 120))
    at = int(rng.integers(n_steps // 2, n_steps)) if failure else n_steps
    t = _healthy(job, at)
    entry: dict[str, Any] = {}
    if failure:
        node, rank = _inject(job, failure, t + 0.5)
        category, kind = FAILURES[failure]
        entry = {"failure": failure, "category": category, "kind": kind, "step": at, "dialect": dialect,
                 "aggregated": job.aggregated, "host": node.name if node else None,
                 "rank": rank, "gpu": rank % 8 if rank is not None else None}
    else:
        _finish(job, t)
    lines = job.write(trace_dir / "logs")
    if entry:
        entry["lines"] = lines
    truth_path = trace_dir / "truth.json"
    truth: dict[str, Any] = json.loads(truth_path.read_text()) if truth_path.exists() else {}
    truth["log_failures"] = [entry] if entry else []
    truth_path.write_text(json.dumps(truth, indent=1))
    return entry
