"""Realistic per-host training logs with injected failures (`laggard simulate --logs`).

Writes `logs/<host>.log` for the job in meta.json: launcher, NCCL INFO/WARN, framework
iteration lines (Megatron, DeepSpeed or torchtitan style, picked by seed), checkpoints,
kernel (dmesg) lines and benign noise, and, when asked, one failure with its cascade
(root lines on the faulty device, symptoms on peers, tracebacks, launcher errors). The
lines the failure caused are recorded in truth.json under "log_failures" as file:line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from collector.inputs.errors import UserError
from collector.trace.meta import JobMeta

#: failure name -> (category, candidate kind, stages it can happen in)
FAILURES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "gpu_xid": ("hardware", "gpu", ("training", "checkpoint")),
    "gpu_ecc": ("hardware", "gpu", ("training",)),
    "nic_cqe": ("network", "nic", ("training",)),
    "nic_flap": ("network", "nic", ("training", "checkpoint")),
    "host_down": ("hardware", "host", ("training",)),
    "host_oom": ("hardware", "host", ("training", "data loading")),
    "host_disk": ("hardware", "host", ("data loading", "training", "checkpoint")),
    "config_oom": ("user", "config", ("training",)),
    "config_parallel": ("user", "config", ("init",)),
    "config_path": ("user", "config", ("data loading",)),
    "config_version": ("user", "config", ("init",)),
    "config_timeout": ("user", "config", ("checkpoint",)),
    "config_ckpt_perm": ("user", "config", ("checkpoint",)),
    "framework_bug": ("framework", "config", ("training", "checkpoint", "data loading", "teardown")),
    "data_nan": ("user", "data", ("training",)),
}
CATEGORIES = ("hardware", "network", "user", "framework")
#: failures whose root is one machine: the faulty-node accuracy is measured on these
NODE_FAILURES = tuple(n for n, (_, kind, _) in FAILURES.items() if kind in ("gpu", "nic", "host"))

_BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_START = datetime(2026, 11, 22, 7, 0, 0, tzinfo=UTC).timestamp()


@dataclass
class _Rank:
    rank: int
    gpu: int
    pid: int


@dataclass(eq=False)
class _Host:
    name: str
    index: int
    ip: str
    ranks: list[_Rank]
    agent_pid: int
    boot: float  # seconds since boot at job start (kernel timestamps)
    skew: float  # clock offset, seconds
    lines: list[tuple[float, int, str, bool]] = field(default_factory=list)


class _Job:
    """Collects timestamped lines per host and renders them in each source's format."""

    def __init__(self, meta: JobMeta, rng: np.random.Generator, steps: int) -> None:
        self.meta = meta
        self.rng = rng
        self.steps = steps
        self.world = meta.world_size
        self.style = str(rng.choice(["megatron", "deepspeed", "titan"]))
        self.seq = 0
        by_host: dict[str, list[_Rank]] = {}
        for r, info in sorted(meta.ranks.items()):
            by_host.setdefault(info.host, []).append(_Rank(r, info.gpu, int(rng.integers(2000, 60000))))
        self.hosts: list[_Host] = []
        for i, name in enumerate(meta.hosts()):
            ranks = by_host[name]
            ip = meta.ranks[ranks[0].rank].ip or f"10.0.{i & 255}.10"
            self.hosts.append(_Host(name, i, ip, ranks, int(rng.integers(2000, 60000)),
                                    float(rng.uniform(3e3, 9e5)), float(rng.uniform(-0.5, 0.5))))
        self.host_of_rank = {rk.rank: h for h in self.hosts for rk in h.ranks}
        self.t = 0.0
        self.dataset = str(rng.choice(["/data/pile/pile_text_document", "/mnt/datasets/redpajama/rp_text",
                                       "/lustre/corpus/fineweb_edu_tokens"]))
        self.ckpt = str(rng.choice(["/mnt/ckpt/run", "/checkpoints/llama-exp", "/lustre/ckpt/job"])) + str(
            int(rng.integers(1, 99)))
        self.ckpt_every = int(rng.choice([25, 40, 50, 100]))
        self.step_t: dict[int, float] = {}
        self.custom = _Custom(rng)
        self.kernel = bool(rng.random() < 0.7)  # many platforms collect only the job's stdout, not dmesg

    # ---- rendering -------------------------------------------------------------
    def _stamp(self, h: _Host, t: float, fmt: str) -> str:
        ts = _START + t + h.skew
        dt = datetime.fromtimestamp(ts, UTC)
        if fmt == "py":  # python logging
            return dt.strftime("%Y-%m-%d %H:%M:%S,") + f"{dt.microsecond // 1000:03d}"
        if fmt == "glog":  # c10 / torchrun: E1122 07:51:02.123456
            return dt.strftime("%m%d %H:%M:%S.") + f"{dt.microsecond:06d}"
        if fmt == "syslog":
            return f"{_MONTHS[dt.month - 1]} {dt.day:2d} {dt.strftime('%H:%M:%S')}"
        return dt.isoformat()

    def add(self, h: _Host, t: float, text: str, failure: bool = False) -> None:
        self.seq += 1
        h.lines.append((t, self.seq, text, failure))

    def fw(self, h: _Host, rk: _Rank, t: float, msg: str, level: str = "INFO", failure: bool = False) -> None:
        """A framework (python logging) line of one rank, in this job's style."""
        ts = self._stamp(h, t, "py")
        if self.style == "titan":
            text = f"[rank{rk.rank}]:[titan] {ts} - root - {level} - {msg}"
        elif self.style == "deepspeed":
            text = f"[{ts}] [{level}] [rank{rk.rank}] {msg}"
        else:
            text = f"[rank{rk.rank}]: {ts} {level} {msg}"
        self.add(h, t, text, failure)

    def nccl(self, h: _Host, rk: _Rank, t: float, msg: str, level: str = "INFO", failure: bool = False) -> None:
        self.add(h, t, f"{h.name}:{rk.pid}:{rk.pid + 41} [{rk.gpu}] NCCL {level} {msg}", failure)

    def c10(self, h: _Host, rk: _Rank, t: float, msg: str, level: str = "E", src: str = "ProcessGroupNCCL.cpp:616",
            failure: bool = False) -> None:
        ts = self._stamp(h, t, "glog")
        self.add(h, t, f"[rank{rk.rank}]:[{level}{ts} {rk.pid} torch/csrc/distributed/c10d/{src}] {msg}", failure)

    def kern(self, h: _Host, t: float, msg: str, failure: bool = False, proc: str = "kernel") -> None:
        if not self.kernel:
            return
        ts = self._stamp(h, t, "syslog")
        if proc == "kernel":
            self.add(h, t, f"{ts} {h.name} kernel: [{h.boot + t:12.6f}] {msg}", failure)
        else:
            self.add(h, t, f"{ts} {h.name} {proc}: {msg}", failure)

    def agent(self, h: _Host, t: float, msg: str, level: str = "I", src: str = "api.py:869",
              failure: bool = False) -> None:
        ts = self._stamp(h, t, "glog")
        self.add(h, t, f"{level}{ts} {h.agent_pid} torch/distributed/elastic/multiprocessing/{src}] {msg}", failure)

    def traceback(self, h: _Host, rk: _Rank, t: float, frames: list[tuple[str, str]], last: str) -> None:
        """A Python traceback printed by one rank (every line is failure-indicating)."""
        p = f"[rank{rk.rank}]: "
        self.add(h, t, p + "Traceback (most recent call last):", True)
        for path, fn in frames:
            self.add(h, t, f'{p}  File "{path}", line {int(self.rng.integers(20, 2400))}, in {fn}', True)
        self.add(h, t, p + last, True)

    def pick(self, options: list[str]) -> str:
        return options[int(self.rng.integers(len(options)))]

    def write(self, out: Path) -> dict[str, list[int]]:
        """Write logs/<host>.log; returns host -> failure line numbers (1-based)."""
        out.mkdir(parents=True, exist_ok=True)
        flagged: dict[str, list[int]] = {}
        for h in self.hosts:
            h.lines.sort(key=lambda x: (x[0], x[1]))
            (out / f"{h.name}.log").write_text("".join(x[2] + "\n" for x in h.lines))
            idx = [i + 1 for i, x in enumerate(h.lines) if x[3]]
            if idx:
                flagged[h.name] = idx
        return flagged


# ---- the healthy job ---------------------------------------------------------------
def _init(job: _Job) -> None:
    rng = job.rng
    master = job.hosts[0].name
    for h in job.hosts:
        t = float(rng.uniform(0, 2))
        job.kern(h, t, f"Started Session {int(rng.integers(1, 500))} of User root.", proc="systemd[1]")
        job.agent(h, t + 0.1, "", level="W", src="../run.py:793")
        job.agent(h, t + 0.1, "*****************************************", level="W", src="../run.py:793")
        job.agent(h, t + 0.1, "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, "
                  "to avoid your system being overloaded, please further tune the variable for optimal performance "
                  "in your application as needed.", level="W", src="../run.py:793")
        job.agent(h, t + 0.2, f"Starting elastic_operator with launch configs: entrypoint: pretrain_gpt.py "
                  f"min_nodes: {len(job.hosts)} max_nodes: {len(job.hosts)} nproc_per_node: {len(h.ranks)} "
                  f"rdzv_backend: c10d rdzv_endpoint: {master}:29500", src="../launcher/api.py:188")
        if rng.random() < 0.5:
            job.kern(h, t + 0.3, f"mlx5_core 0000:{_BUS[0]}:00.0: mlx5_pcie_event:301:(pid {rng.integers(100, 900)}): "
                     "PCIe slot advertised sufficient power (75W).")
        for rk in h.ranks:
            tr = t + 1 + float(rng.uniform(0, 1))
            if rng.random() < 0.3:  # benign: the store is not up yet, torch retries
                job.c10(h, rk, tr, f"[c10d] The client socket has failed to connect to [{master}]:29500 "
                        "(errno: 99 - Cannot assign requested address).", level="W", src="socket.cpp:663")
            if rk.rank == 0:
                job.fw(h, rk, tr, "> initializing torch distributed ...")
                job.fw(h, rk, tr, f"> initialized tensor model parallel with size {job.meta.parallelism.get('tp', 1)}")
                job.fw(h, rk, tr, f"> initialized pipeline model parallel with size {job.meta.parallelism.get('pp', 1)}")
            for text in job.custom.init:
                job.fw(h, rk, tr + 0.05, job.custom.render(rng, text))
            job.nccl(h, rk, tr + 0.1, f"Bootstrap : Using eth0:{h.ip}<0>")
            job.nccl(h, rk, tr + 0.1, "NET/Plugin: No plugin found (libnccl-net.so), using internal implementation")
            if rng.random() < 0.15:
                job.nccl(h, rk, tr + 0.1, "NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared "
                         "object file: No such file or directory : when loading libnccl-net.so", level="WARN")
            job.nccl(h, rk, tr + 0.2, f"NET/IB : Using [0]mlx5_{rk.gpu}:1/RoCE [RO]; OOB eth0:{h.ip}<0>")
            job.nccl(h, rk, tr + 0.2, "Using network IB")
            if rk.rank == 0:
                job.nccl(h, rk, tr + 0.2, "NCCL version 2.21.5+cuda12.4")
            comm = f"0x{int(rng.integers(1 << 40, 1 << 44)):x}"
            job.nccl(h, rk, tr + 0.3, f"comm {comm} rank {rk.rank} nranks {job.world} cudaDev {rk.gpu} nvmlDev "
                     f"{rk.gpu} busId {_BUS[rk.gpu % 8]}000 commId 0x{int(rng.integers(1 << 60)):x} - Init START")
            for c in range(int(rng.integers(2, 5))):
                job.nccl(h, rk, tr + 0.4, f"Channel {c:02d}/32 :    0   1   2   3   4   5   6   7")
            job.nccl(h, rk, tr + 0.5, f"Trees [0] {(rk.rank + 1) % job.world}/-1/-1->{rk.rank}->{rk.rank - 1} "
                     f"[1] {(rk.rank + 1) % job.world}/-1/-1->{rk.rank}->{rk.rank - 1}")
            job.nccl(h, rk, tr + 0.6, "Connected all rings")
            job.nccl(h, rk, tr + 0.6, "Connected all trees")
            job.nccl(h, rk, tr + 0.7, f"comm {comm} rank {rk.rank} nranks {job.world} cudaDev {rk.gpu} nvmlDev "
                     f"{rk.gpu} busId {_BUS[rk.gpu % 8]}000 commId 0x{int(rng.integers(1 << 60)):x} - Init COMPLETE")
            if rng.random() < 0.5:
                job.add(h, tr + 0.8, f"[rank{rk.rank}]: /usr/local/lib/python3.11/dist-packages/torch/utils/"
                        "checkpoint.py:464: UserWarning: torch.utils.checkpoint: the use_reentrant parameter should "
                        "be passed explicitly.")
                job.add(h, tr + 0.8, f"[rank{rk.rank}]:   warnings.warn(")
    job.t = 4.0


def _data(job: _Job) -> None:
    rng = job.rng
    for h in job.hosts:
        for rk in h.ranks:
            t = job.t + float(rng.uniform(0, 0.5))
            if rk.rank == 0 or job.style != "megatron":
                job.fw(h, rk, t, "> building train, validation, and test datasets ...")
            job.fw(h, rk, t + 0.1, f" > loading doc-idx mapping from {job.dataset}_train_indexmap_"
                   f"{int(rng.integers(1, 9)) * 1000}ns_2048sl_1234s_doc_idx.npy")
            job.fw(h, rk, t + 0.2, f"    loaded indexed file in {rng.uniform(0.001, 0.2):.3f} seconds")
            job.fw(h, rk, t + 0.3, f"    total number of samples: {int(rng.integers(1_000_000, 90_000_000))}")
            if rng.random() < 0.05:
                job.fw(h, rk, t + 0.3, "WARNING: could not find the metadata file "
                       f"{job.ckpt}/latest_checkpointed_iteration.txt", level="WARNING")
            job.fw(h, rk, t + 0.4, "> finished creating GPT datasets ...")
            job.fw(h, rk, t + 0.5, f"loading checkpoint from {job.ckpt} at iteration 0")
            job.fw(h, rk, t + 0.9, f"  successfully loaded checkpoint from {job.ckpt} [ t 0, p 0 ] at iteration 0")
    job.t += 3.0


def _step_line(job: _Job, h: _Host, rk: _Rank, t: float, step: int, dur: float, loss: float,
               nan: bool = False) -> None:
    rng = job.rng
    loss_s = "nan" if nan else f"{loss:.4f}"
    if job.style == "megatron":
        job.fw(h, rk, t, f"iteration {step:8d}/{job.steps + 1000:8d} | consumed samples: {step * 512:12d} | "
               f"elapsed time per iteration (ms): {dur * 1e3:.1f} | learning rate: {3e-4 * rng.uniform(0.9, 1):.6E} | "
               f"global batch size: 512 | lm loss: {loss_s} | loss scale: 1.0 | grad norm: {rng.uniform(0.2, 2):.3f} "
               f"| number of skipped iterations: 0 | number of nan iterations: {int(nan)} |")
    elif job.style == "deepspeed":
        job.fw(h, rk, t, f"step={step}, skipped=0, lr=[{3e-4 * rng.uniform(0.9, 1):.6e}], mom=[(0.9, 0.95)]")
        job.fw(h, rk, t, f"steps: {step} loss: {loss_s} iter time (s): {dur:.3f} samples/sec: {512 / dur:.2f}")
    else:
        job.fw(h, rk, t, f"step: {step:4d}  loss: {loss_s}  memory: {rng.uniform(50, 70):.2f}GiB"
               f"({rng.uniform(60, 88):.2f}%)  tps: {int(rng.integers(2000, 4000)):,}  mfu: {rng.uniform(25, 45):.2f}%")


def _checkpoint(job: _Job, step: int, fail: Callable[[float], None] | None = None) -> None:
    """All ranks save a distributed checkpoint; `fail` injects a failure while saving."""
    rng = job.rng
    t0 = job.t
    for h in job.hosts:
        for rk in h.ranks:
            job.fw(h, rk, t0 + float(rng.uniform(0, 0.1)), f"saving checkpoint at iteration {step:7d} to {job.ckpt}")
    if fail is not None:
        fail(t0 + 1.0)
        return
    dur = float(rng.uniform(5, 30))
    for h in job.hosts:
        if rng.random() < 0.08:  # benign: the first upload attempt fails, the retry succeeds
            rk = h.ranks[0]
            job.fw(h, rk, t0 + dur / 2, f"checkpoint shard upload to {job.ckpt} failed (attempt 1/5): "
                   "Connection timed out; retrying in 2s", level="ERROR")
        for rk in h.ranks:
            job.fw(h, rk, t0 + dur + float(rng.uniform(0, 0.2)),
                   f"  successfully saved checkpoint at iteration {step:7d} to {job.ckpt}")
    job.t += dur + 0.5


def _noise(job: _Job, h: _Host, t: float, step: int) -> None:
    """Benign lines that healthy jobs print too (some rare, some not in every job)."""
    rng = job.rng
    u = rng.random()
    rk = h.ranks[int(rng.integers(len(h.ranks)))]
    if u < 0.25:
        job.kern(h, t, f"perf: interrupt took too long ({int(rng.integers(2501, 9000))} > 2500), lowering "
                 f"kernel.perf_event_max_sample_rate to {int(rng.integers(20000, 79000))}")
    elif u < 0.45:
        job.fw(h, rk, t, f"[Rank {rk.rank}] (after {step} iterations) memory (MB) | allocated: "
               f"{rng.uniform(1e4, 6e4):.1f} | max allocated: {rng.uniform(6e4, 7e4):.1f} | reserved: "
               f"{rng.uniform(7e4, 7.5e4):.1f} | max reserved: {rng.uniform(7.5e4, 7.8e4):.1f}")
    elif u < 0.6:
        job.fw(h, rk, t, f"Gradient overflow.  Skipping step, loss scale reduced to {2 ** int(rng.integers(10, 17))}.0",
               level="WARNING")
    elif u < 0.7:
        job.kern(h, t, f"Started Session {int(rng.integers(500, 9000))} of User root.", proc="systemd[1]")
    elif u < 0.78:
        job.kern(h, t, f"hrtimer: interrupt took {int(rng.integers(10000, 900000))} ns")
    elif u < 0.86:
        job.kern(h, t, "NFS: server storage-2 not responding, still trying")
        job.kern(h, t + 3, "NFS: server storage-2 OK")
    elif u < 0.93:
        job.kern(h, t, f"TCP: request_sock_TCP: Possible SYN flooding on port {int(rng.integers(29500, 29600))}. "
                 "Sending cookies.  Check SNMP counters.")
    elif u < 0.97:
        job.nccl(h, rk, t, f"NET/IB : Got async event : GID table change (port {int(rng.integers(1, 2))})")
    else:  # rare enough that a pool of successful jobs may never have seen it
        job.kern(h, t, job.pick([f"EDAC MC{int(rng.integers(0, 2))}: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1"
                                 f"_DIMM#{int(rng.integers(0, 2))} (channel:1 slot:0 page:0x{rng.integers(1 << 20):x})",
                                 "ACPI Error: No handler for Region [SYSI] (00000000ab12cd34) [IPMI] "
                                 "(20230331/evregion-130)",
                                 f"ib{int(rng.integers(0, 4))}: multicast join failed for ff12:401b:ffff::1, status -22",
                                 "nvidia-peermem: nv_mem_dma_map: dma map failed, retrying"]))


_WORDS = ("shard", "cache", "prefetch", "token", "bucket", "window", "packer", "sampler", "mixer", "router",
          "expert", "balance", "queue", "buffer", "stream", "pool", "gate", "aux", "curriculum", "replay")


class _Custom:
    """The job's own print statements: wording no other job shares (so no pool knows them)."""

    def __init__(self, rng: np.random.Generator) -> None:
        w = [str(x) for x in rng.choice(_WORDS, size=8, replace=False)]
        self.init = [f"{w[0]} {w[1]} config: {w[2]}_size=<n> {w[3]}_ratio=<f>", f"using {w[4]} {w[5]} with <n> slots"]
        self.every = int(rng.choice([5, 10, 20]))
        self.periodic = f"{w[6]} {w[7]} stats: hit=<f> miss=<f> n=<n>"
        self.rare = f"{w[1]} {w[4]} rebalanced after <n> tries"
        self.rate = float(rng.uniform(0.0, 0.01))

    def render(self, rng: np.random.Generator, text: str) -> str:
        while "<n>" in text or "<f>" in text:
            text = text.replace("<n>", str(int(rng.integers(1, 5000))), 1).replace("<f>", f"{rng.random():.3f}", 1)
        return text


def _train(job: _Job, until: int, fail_ckpt: Callable[[float], None] | None = None) -> None:
    """Iterations 0..until-1 (all hosts), with checkpoints and noise; `fail_ckpt` fails the last save."""
    rng = job.rng
    base = float(rng.uniform(0.6, 3.0))
    loss = float(rng.uniform(6, 9))
    noise_rate = float(rng.uniform(0.002, 0.02))
    for step in range(until):
        dur = base * float(rng.uniform(0.97, 1.05))
        job.t += dur
        job.step_t[step] = job.t
        loss *= 0.995
        for h in job.hosts:
            for rk in h.ranks:
                _step_line(job, h, rk, job.t + float(rng.uniform(0, 0.05)), step, dur, loss + rng.normal(0, 0.02))
            if rng.random() < noise_rate * len(h.ranks):
                _noise(job, h, job.t + float(rng.uniform(0, dur)), step)
            if step % job.custom.every == 0:
                for rk in h.ranks:
                    job.fw(h, rk, job.t + 0.06, job.custom.render(rng, job.custom.periodic))
            if rng.random() < job.custom.rate:
                job.fw(h, h.ranks[0], job.t + float(rng.uniform(0, dur)), job.custom.render(rng, job.custom.rare))
        if step > 0 and step % job.ckpt_every == 0:
            _checkpoint(job, step, fail_ckpt if step == until - 1 else None)


def _teardown(job: _Job) -> None:
    rng = job.rng
    job.t += 2.0
    for h in job.hosts:
        for rk in h.ranks:
            t = job.t + float(rng.uniform(0, 0.5))
            job.fw(h, rk, t, "[after training is done] datetime: " + datetime.fromtimestamp(
                _START + t, UTC).strftime("%Y-%m-%d %H:%M:%S"))
            job.nccl(h, rk, t + 0.2, f"comm 0x{int(rng.integers(1 << 40, 1 << 44)):x} rank {rk.rank} nranks "
                     f"{job.world} cudaDev {rk.gpu} busId {_BUS[rk.gpu % 8]}000 - Destroy COMPLETE")
        if rng.random() < 0.3:  # the famous benign dataloader message at exit
            rk = h.ranks[0]
            job.add(h, job.t + 1, f"[rank{rk.rank}]: Exception ignored in: <function _MultiProcessingDataLoaderIter."
                    "__del__ at 0x7f3c2a1b4040>")
        job.agent(h, job.t + 1.5, "[default] worker group successfully finished. Waiting 300 seconds for other "
                  "agents to finish.", src="../agent/server/api.py:864")
        job.agent(h, job.t + 1.6, "Local worker group finished (WorkerState.SUCCEEDED). Waiting 300 seconds for "
                  "other agents to finish", src="../agent/server/api.py:879")


# ---- failure cascades -------------------------------------------------------------
def _watchdog(job: _Job, t: float, skip: set[int], timeout_ms: int, op: str | None = None,
              hosts: list[_Host] | None = None) -> None:
    """Every rank not in `skip` times out in its collective, aborts, and its agent reports it."""
    rng = job.rng
    seq = int(rng.integers(1000, 90000))
    op = op or job.pick(["ALLREDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE", "BROADCAST"])
    for h in job.hosts if hosts is None else hosts:
        ranks = [rk for rk in h.ranks if rk.rank not in skip]
        for rk in ranks:
            tr = t + timeout_ms / 1e3 + float(rng.uniform(0, 2))
            ran = timeout_ms + int(rng.integers(1, 900))
            if job.rng.random() < 0.5:
                job.c10(h, rk, tr, f"[Rank {rk.rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum="
                        f"{seq}, OpType={op}, NumelIn={int(rng.integers(100_000, 100_000_000))}, NumelOut="
                        f"{int(rng.integers(100_000, 100_000_000))}, Timeout(ms)={timeout_ms}) ran for {ran} milliseconds before "
                        "timing out.", failure=True)
            else:
                job.c10(h, rk, tr, f"[PG ID 0 PG GUID 0(default_pg) Rank {rk.rank}] Watchdog caught collective "
                        f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, Timeout(ms)={timeout_ms}) ran for "
                        f"{ran} milliseconds before timing out.", failure=True)
            job.c10(h, rk, tr + 0.01, f"[Rank {rk.rank}] Timeout at NCCL work: {seq}, last enqueued NCCL work: "
                    f"{seq}, last completed NCCL work: {seq - 1}.", src="ProcessGroupNCCL.cpp:1785", failure=True)
            job.c10(h, rk, tr + 0.02, f"[Rank {rk.rank}] To avoid data inconsistency, we are taking the entire process "
                    "down.", src="ProcessGroupNCCL.cpp:630", failure=True)
            job.add(h, tr + 0.03, f"[rank{rk.rank}]: terminate called after throwing an instance of "
                    "'c10::DistBackendError'", True)
        if ranks:
            _agent_fail(job, h, t + timeout_ms / 1e3 + 3, ranks[0], -6)


def _peer_reports(job: _Job, h: _Host, t: float) -> None:
    """Ring neighbours of a node whose process died see their connections to it break."""
    rng = job.rng
    n = len(job.hosts)
    for p in [x for x in dict.fromkeys([job.hosts[(h.index - 1) % n], job.hosts[(h.index + 1) % n]]) if x is not h]:
        if rng.random() < 0.6:
            rk = p.ranks[int(rng.integers(len(p.ranks)))]
            port = int(rng.integers(30000, 60000))
            u = rng.random()
            if u < 0.4:
                job.nccl(p, rk, t, f"NET/IB : Got completion from peer {h.ip}<{port}> with status=5 opcode=1 len=0 "
                         f"vendor err 249 (Recv) localGid ::ffff:{p.ip} remoteGids::ffff:{h.ip} hca mlx5_{rk.gpu}",
                         level="WARN", failure=True)
            elif u < 0.7:
                job.c10(p, rk, t, f"[c10d] sendBytes failed on SocketImpl(fd={int(rng.integers(20, 200))}, addr=[{p.name}]"
                        f":{port}, remote=[{h.name}]:29500): Broken pipe", level="W", src="socket.cpp:540",
                        failure=True)
            else:
                job.nccl(p, rk, t, f"socketProgress: Connection closed by remote peer {h.name}<{port}>", level="WARN",
                         failure=True)


def _agent_fail(job: _Job, h: _Host, t: float, rk: _Rank, code: int) -> None:
    job.agent(h, t, f"failed (exitcode: {code}) local_rank: {rk.gpu} (pid: {rk.pid}) of binary: /usr/bin/python3",
              level="E", failure=True)
    job.add(h, t + 0.1, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", True)


def _cuda_crash(job: _Job, h: _Host, rk: _Rank, t: float, err: str) -> None:
    job.traceback(h, rk, t, [("/workspace/megatron/training/training.py", "train_step"),
                             ("/workspace/megatron/core/pipeline_parallel/schedules.py", "forward_backward_no_pipelining"),
                             ("/usr/local/lib/python3.11/dist-packages/torch/autograd/__init__.py", "backward")],
                  f"RuntimeError: CUDA error: {err}")
    job.add(h, t, f"[rank{rk.rank}]: CUDA kernel errors might be asynchronously reported at some other API call, so the "
            "stacktrace below might be incorrect.", True)
    job.add(h, t, f"[rank{rk.rank}]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1", True)


def _user_error(job: _Job, t: float, frames: list[tuple[str, str]], last: str, code: int = 1,
                ranks: list[int] | None = None) -> None:
    """The same Python exception on every rank (or the given ones): a user or framework fault."""
    for h in job.hosts:
        hit = [rk for rk in h.ranks if ranks is None or rk.rank in ranks]
        for rk in hit:
            job.traceback(h, rk, t + float(job.rng.uniform(0, 0.3)), frames, last)
        if hit:
            _agent_fail(job, h, t + 1, hit[0], code)


@dataclass
class _Plan:
    name: str
    stage: str
    step: int
    host: _Host | None = None
    rank: _Rank | None = None
    hosts: list[str] = field(default_factory=list)


def _inject(job: _Job, plan: _Plan, t: float) -> None:
    """Emit the failure's lines at time t (the cascade that follows included)."""
    rng = job.rng
    h, rk, name = plan.host, plan.rank, plan.name
    timeout = int(rng.choice([600000, 1800000, 300000]))
    if name in ("gpu_xid", "gpu_ecc"):
        assert h is not None and rk is not None
        bus = _BUS[rk.gpu % 8]
        if name == "gpu_xid":
            code, text, err = [
                (79, "GPU has fallen off the bus.", "unspecified launch failure"),
                (31, f"Ch 0000000{rng.integers(1, 9)}, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted "
                 "@ 0x7f2a_12340000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ", "an illegal memory access was "
                 "encountered"),
                (119, f"Timeout after 6s of waiting for RPC response from GPU{rk.gpu} GSP! Expected function 76 "
                 "(GSP_RM_CONTROL).", "unspecified launch failure"),
                (74, "NVLink: fatal error detected on link 3(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
                 "an illegal memory access was encountered"),
                (13, "Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address",
                 "an illegal instruction was encountered"),
                (62, "Internal micro-controller halt (PMU)", "unspecified launch failure"),
            ][int(rng.integers(6))]
            job.kern(h, t, f"NVRM: Xid (PCI:0000:{bus}:00): {code}, pid={rk.pid}, name=python3, {text}", True)
            if code == 79 and rng.random() < 0.6:
                job.kern(h, t + 0.01, f"NVRM: GPU at PCI:0000:{bus}:00: GPU-{rng.integers(1 << 32):08x}-"
                         f"{rng.integers(1 << 16):04x}", True)
                job.kern(h, t + 0.01, f"NVRM: GPU Board Serial Number: 1{rng.integers(100_000_000_000, 900_000_000_000):.0f}", True)
        else:
            code = int(rng.choice([48, 94, 95]))
            job.kern(h, t, f"NVRM: Xid (PCI:0000:{bus}:00): {code}, pid={rk.pid}, name=python3, "
                     + job.pick(["An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
                                 f"at physical address 0x{rng.integers(1 << 36):x}.",
                                 "Contained: SM (0x1). RST: No, D-RST: No",
                                 "Uncontained: FBHUB. RST: Yes, D-RST: No"]), True)
            err = "uncorrectable ECC error encountered"
        _cuda_crash(job, h, rk, t + 0.2, err)
        _agent_fail(job, h, t + 2, rk, -6 if rng.random() < 0.5 else 1)
        _peer_reports(job, h, t + 5)
        _watchdog(job, t, {rk.rank}, timeout)
    elif name in ("nic_cqe", "nic_flap"):
        assert h is not None and rk is not None
        dev = f"mlx5_{rk.gpu}"
        bus = _BUS[rk.gpu % 8]
        iface = job.pick([f"ens{rk.gpu + 1}f0np0", f"enp{int(bus, 16)}s0f0", f"rdma{rk.gpu}"])
        if name == "nic_flap":
            job.kern(h, t, f"mlx5_core 0000:{bus}:00.0 {iface}: Link down", True)
            if rng.random() < 0.6:
                job.kern(h, t + 0.01, f"mlx5_core 0000:{bus}:00.0: mlx5_port_module_event:1133:(pid 0): Port module "
                         f"event[error]: module {rk.gpu}, Cable error, Bus stuck (I2C or data shorted)", True)
            job.nccl(h, rk, t + 0.5, f"NET/IB : Got async event : port error (port {1})", level="WARN", failure=True)
        else:
            if rng.random() < 0.75:
                job.kern(h, t, f"mlx5_core 0000:{bus}:00.0: mlx5_eq_int:{int(rng.integers(400, 800))}:(pid 0): "
                         + job.pick([f"CQ error on CQN 0x{int(rng.integers(1 << 12)):x}, syndrome 0x1",
                                     "Unknown event type (0x2d)",
                                     f"hw_err_cnt increased (pcs_err_cnt={int(rng.integers(100, 9999))})"]), True)
            else:
                job.kern(h, t, f"infiniband {dev}: mlx5_handle_error_cqe:{int(rng.integers(300, 400))}:(pid "
                         f"{int(rng.integers(1000, 9000))}): WC error: 12, Message: transport retry counter exceeded",
                         True)
        # the faulty side and its ring neighbours see failed work completions
        n = len(job.hosts)
        peers = [job.hosts[(h.index - 1) % n], job.hosts[(h.index + 1) % n]] if n > 1 else []
        for side in [h, *dict.fromkeys(p for p in peers if p is not h)]:
            other = peers[0] if side is h and peers else h
            srk = side.ranks[rk.gpu % len(side.ranks)]
            status = int(rng.choice([12, 5, 13]))
            job.nccl(side, srk, t + 1, f"NET/IB : Got completion from peer {other.ip}<{int(rng.integers(30000, 60000))}>"
                     f" with status={status} opcode=0 len=0 vendor err {int(rng.choice([129, 244]))} (Send) localGid "
                     f"::ffff:{side.ip} remoteGids::ffff:{other.ip} hca {dev}", level="WARN", failure=True)
            job.nccl(side, srk, t + 1, f"transport/net.cc:1{int(rng.integers(100, 400))} -> 6", failure=True)
        _watchdog(job, t, set(), timeout)
    elif name == "host_down":
        assert h is not None
        h.lines = [x for x in h.lines if x[0] <= t]  # nothing after the node dies
        if rng.random() < 0.6:
            job.kern(h, t, job.pick(["mce: [Hardware Error]: CPU 12: Machine Check Exception: 5 Bank 1: "
                                     "b200000000070005",
                                     "Kernel panic - not syncing: Fatal hardware error!",
                                     "watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [python3:4242]",
                                     "NMI watchdog: Watchdog detected hard LOCKUP on cpu 14"]), True)
        others = [x for x in job.hosts if x is not h]
        for o in others[:2]:
            ork = o.ranks[0]
            job.nccl(o, ork, t + 5, f"NET/IB : Got completion from peer {h.ip}<{int(rng.integers(30000, 60000))}> with "
                     "status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:%s remoteGids::ffff:%s hca "
                     "mlx5_0" % (o.ip, h.ip), level="WARN", failure=True)
        if others:
            o = others[0]
            job.agent(o, t + 30, f"[c10d] {job.pick(['Keepalive heartbeat', 'Heartbeat'])} from node {h.name} "
                      f"({h.ip}) missed for 30 seconds; declaring it dead", level="W", src="../rendezvous/api.py:412",
                      failure=True)
        _watchdog(job, t, set(), timeout, hosts=others)
    elif name == "host_oom":
        assert h is not None and rk is not None
        job.kern(h, t, "python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, "
                 "oom_score_adj=0", True)
        job.kern(h, t, f"Out of memory: Killed process {rk.pid} (python3) total-vm:{int(rng.integers(100_000_000, 300_000_000))}kB, "
                 f"anon-rss:{int(rng.integers(100_000_000, 200_000_000))}kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:"
                 f"{int(rng.integers(100_000, 900_000))}kB oom_score_adj:0", True)
        job.agent(h, t + 1, f"Sending process {rk.pid} closing signal SIGTERM", level="W", src="api.py:719",
                  failure=True)
        _agent_fail(job, h, t + 2, rk, -9)
        _peer_reports(job, h, t + 5)
        _watchdog(job, t, {r.rank for r in h.ranks}, timeout)
    elif name == "host_disk":
        assert h is not None and rk is not None
        dev = job.pick(["nvme0n1", "nvme1n1", "sda"])
        job.kern(h, t, job.pick([f"blk_update_request: I/O error, dev {dev}, sector {int(rng.integers(1_000_000, 1_000_000_000))} op "
                                 "0x0:(READ) flags 0x80700 phys_seg 1 prio class 0",
                                 f"{dev}: I/O {int(rng.integers(1, 999))} QID {int(rng.integers(1, 60))} timeout, "
                                 "aborting",
                                 f"EXT4-fs error (device {dev}p1): ext4_find_entry:1455: inode #{int(rng.integers(100_000, 10_000_000))}"
                                 ": comm python3: reading directory lblock 0"]), True)
        job.kern(h, t + 0.5, f"Buffer I/O error on dev {dev}p1, logical block {int(rng.integers(100_000, 100_000_000))}, async "
                 "page read", True)
        job.traceback(h, rk, t + 1, [("/workspace/megatron/core/datasets/indexed_dataset.py", "__getitem__"),
                                     ("/usr/lib/python3.11/mmap.py", "read")],
                      f"OSError: [Errno 5] Input/output error: '{job.dataset}.bin'")
        _agent_fail(job, h, t + 2, rk, 1)
        _peer_reports(job, h, t + 5)
        _watchdog(job, t, {rk.rank}, timeout)
    elif name == "config_oom":
        for hh in job.hosts:
            for r in hh.ranks:
                job.traceback(hh, r, t + float(rng.uniform(0, 1)),
                              [("/workspace/megatron/core/transformer/attention.py", "forward"),
                               ("/usr/local/lib/python3.11/dist-packages/torch/nn/functional.py", "softmax")],
                              f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                              f"{rng.uniform(1, 9):.2f} GiB. GPU {r.gpu} has a total capacity of 79.11 GiB of which "
                              f"{rng.uniform(0.1, 1):.2f} GiB is free. Process {r.pid} has 78.4 GiB memory in use.")
            _agent_fail(job, hh, t + 2, hh.ranks[0], 1)
    elif name == "config_parallel":
        tp = int(rng.choice([3, 5, 6, 7]))
        _user_error(job, t, [("/workspace/pretrain_gpt.py", "<module>"),
                             ("/workspace/megatron/training/initialize.py", "initialize_megatron"),
                             ("/workspace/megatron/core/parallel_state.py", "initialize_model_parallel")],
                    job.pick([f"RuntimeError: world_size ({job.world}) is not divisible by tensor_model_parallel_size "
                              f"({tp}) x pipeline_model_parallel_size (1)",
                              f"AssertionError: num_attention_heads (64) must be a multiple of tensor model parallel "
                              f"size ({tp})",
                              f"ValueError: The ranktable or rank is invalid, Reason:[rank {job.world + tp} out of range]",
                              f"AssertionError: global batch size (1000) is not divisible by micro batch size ({tp}) "
                              f"times data parallel size ({max(1, job.world // 8)})"]))
    elif name == "config_path":
        _user_error(job, t, [("/workspace/megatron/core/datasets/blended_megatron_dataset_builder.py", "build"),
                             ("/workspace/megatron/core/datasets/indexed_dataset.py", "__init__")],
                    job.pick([f"FileNotFoundError: [Errno 2] No such file or directory: '{job.dataset}_v2.idx'",
                              f"AssertionError: missing index file {job.dataset}_v2.idx for dataset prefix",
                              f"PermissionError: [Errno 13] Permission denied: '{job.dataset}.bin'"]))
    elif name == "config_version":
        if rng.random() < 0.5:
            for hh in job.hosts:
                for r in hh.ranks:
                    job.nccl(hh, r, t, "Cuda failure 'CUDA driver version is insufficient for CUDA runtime version'",
                             level="WARN", failure=True)
        _user_error(job, t + 0.5, [("/workspace/pretrain_gpt.py", "<module>"),
                                   ("/usr/local/lib/python3.11/dist-packages/torch/cuda/__init__.py", "_lazy_init")],
                    job.pick(["RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please "
                              "update your GPU driver by downloading and installing a new version",
                              "ImportError: /usr/lib/x86_64-linux-gnu/libnccl.so.2: version `NCCL_2.21' not found "
                              "(required by torch/lib/libtorch_cuda.so)",
                              "RuntimeError: Stream mode cannot be set in current driver version"]))
    elif name == "config_timeout":
        # the user set a tiny collective timeout; rank 0 writes the checkpoint longer than that
        r0 = job.hosts[0].ranks[0]
        _watchdog(job, t, {r0.rank}, int(rng.choice([30000, 60000, 120000])), op="BARRIER")
    elif name == "config_ckpt_perm":
        r0h = job.hosts[0]
        job.traceback(r0h, r0h.ranks[0], t, [("/workspace/megatron/training/checkpointing.py", "save_checkpoint"),
                                             ("/usr/local/lib/python3.11/dist-packages/torch/serialization.py", "save")],
                      job.pick([f"PermissionError: [Errno 13] Permission denied: '{job.ckpt}/iter_{plan.step:07d}'",
                                f"OSError: [Errno 30] Read-only file system: '{job.ckpt}/iter_{plan.step:07d}'"]))
        _agent_fail(job, r0h, t + 1, r0h.ranks[0], 1)
        _watchdog(job, t, {r0h.ranks[0].rank}, timeout, op="BARRIER")
    elif name == "framework_bug":
        where = {"training": ("/workspace/megatron/core/optimizer/distrib_optimizer.py", "step_with_ready_grads"),
                 "checkpoint": ("/workspace/megatron/core/dist_checkpointing/strategies/torch.py", "save"),
                 "data loading": ("/workspace/megatron/core/datasets/gpt_dataset.py", "_build_document_sample_"
                                  "shuffle_indices"),
                 "teardown": ("/workspace/megatron/training/training.py", "_finish")}[plan.stage]
        _user_error(job, t, [("/workspace/pretrain_gpt.py", "<module>"), where],
                    job.pick(["TypeError: 'NoneType' object is not subscriptable",
                              "AttributeError: 'NoneType' object has no attribute 'shape'",
                              "KeyError: 'exp_avg_sq'",
                              "NotImplementedError: sharded state dict of type ShardedObject is not supported",
                              "IndexError: list index out of range"]))
    elif name == "data_nan":
        for hh in job.hosts:
            for r in hh.ranks:
                job.fw(hh, r, t, job.pick(["found NaN in local grad norm in backward pass before data-parallel "
                                           "communication collective.",
                                           f"Rank {r.rank}: found NaN in local forward loss calculation"]),
                       level="ERROR", failure=True)
            _agent_fail(job, hh, t + 1, hh.ranks[0], 1)
    else:  # pragma: no cover - guarded by emit_logs
        raise AssertionError(name)


def _precursor(job: _Job, plan: _Plan, t: float) -> None:
    """Warnings on the faulty device in the iterations before it fails (ECC, link flaps)."""
    h, rk = plan.host, plan.rank
    assert h is not None and rk is not None
    rng = job.rng
    if plan.name == "gpu_ecc":
        bus = _BUS[rk.gpu % 8]
        job.kern(h, t, job.pick([f"NVRM: Xid (PCI:0000:{bus}:00): 63, pid={rk.pid}, name=python3, Row Remapper: New "
                                 f"row (0x{rng.integers(1 << 30):08x}) marked for remapping, reset gpu to activate.",
                                 f"NVRM: Xid (PCI:0000:{bus}:00): 92, pid={rk.pid}, name=python3, High single-bit ECC "
                                 "error rate detected"]), True)
    else:
        bus = _BUS[rk.gpu % 8]
        job.kern(h, t, f"mlx5_core 0000:{bus}:00.0: Link down", True)
        job.kern(h, t + 2, f"mlx5_core 0000:{bus}:00.0: Link up", True)


def _plan(job: _Job, name: str) -> _Plan:
    rng = job.rng
    stage = job.pick(list(FAILURES[name][2]))
    if stage == "checkpoint":
        k = max(1, (job.steps - 1) // job.ckpt_every)
        step = job.ckpt_every * int(rng.integers(1, k + 1))
    elif stage == "training":
        step = int(rng.integers(min(15, job.steps - 1), job.steps))
        if name == "config_oom":
            step = int(rng.integers(0, 2))
    else:
        step = -1
    plan = _Plan(name, stage, step)
    if FAILURES[name][1] in ("gpu", "nic", "host"):
        plan.host = job.hosts[int(rng.integers(len(job.hosts)))]
        plan.rank = plan.host.ranks[int(rng.integers(len(plan.host.ranks)))]
        plan.hosts = [plan.host.name]
    return plan


def _run(job: _Job, failure: str | None) -> _Plan | None:
    plan = _plan(job, failure) if failure else None

    def fail_now() -> None:
        assert plan is not None
        _inject(job, plan, job.t + 1.0)

    _init(job)
    if plan and plan.stage == "init":
        fail_now()
        return plan
    _data(job)
    if plan and plan.stage == "data loading":
        fail_now()
        return plan
    until = job.steps if plan is None or plan.stage == "teardown" else plan.step + (plan.stage == "training")
    if plan and plan.stage == "checkpoint":  # train up to the checkpoint step, then fail while saving it
        _train(job, plan.step + 1, fail_ckpt=lambda t: _inject(job, plan, t))
        return plan
    if plan and plan.name in ("gpu_ecc", "nic_flap") and plan.stage == "training":
        _train(job, until)
        first = max(0, plan.step - int(job.rng.integers(3, 12)))
        _sprinkle(job, plan, first)
        _inject(job, plan, job.t + 0.5)
        return plan
    _train(job, until)
    if plan and plan.stage == "training":
        _inject(job, plan, job.t + 0.5)
        return plan
    if plan and plan.stage == "teardown":
        job.t += 2.0
        for h in job.hosts:
            for rk in h.ranks:
                job.fw(h, rk, job.t, "[after training is done] datetime: " + datetime.fromtimestamp(
                    _START + job.t, UTC).strftime("%Y-%m-%d %H:%M:%S"))
        fail_now()
        return plan
    _teardown(job)
    return None


def _sprinkle(job: _Job, plan: _Plan, first: int) -> None:
    """Precursor warnings at some of the iterations first..plan.step on the faulty host."""
    for s in range(first, plan.step + 1):
        if s in job.step_t and job.rng.random() < 0.6:
            _precursor(job, plan, job.step_t[s] + 0.3)


def emit_logs(trace_dir: Path, seed: int, failure: str | None) -> None:
    """Write logs/<host>.log for the job in trace_dir/meta.json and record "log_failures" in truth.json.

    `failure` is a name from FAILURES, a category (hardware, network, user, framework), "random",
    or None for a healthy run.
    """
    trace_dir = Path(trace_dir)
    meta = JobMeta.load(trace_dir / "meta.json")
    rng = np.random.default_rng([seed, 61])
    name = _resolve(failure, rng)
    truth_path = trace_dir / "truth.json"
    truth: dict[str, Any] = json.loads(truth_path.read_text()) if truth_path.exists() else {}
    steps = len(truth.get("step_time_s", [])) or int(rng.integers(60, 160))
    job = _Job(meta, rng, max(steps, 20))
    plan = _run(job, name)
    flagged = job.write(trace_dir / "logs")
    entries = []
    if plan is not None:
        category, kind, _ = FAILURES[plan.name]
        entry: dict[str, Any] = {"failure": plan.name, "category": category, "kind": kind, "stage": plan.stage,
                                 "step": plan.step, "framework": job.style}
        if plan.host is not None and plan.rank is not None:
            entry.update(host=plan.host.name, hosts=plan.hosts)
            if kind == "gpu":
                entry.update(rank=plan.rank.rank, gpu=plan.rank.gpu)
        entry["lines"] = [f"logs/{h}.log:{n}" for h, ns in sorted(flagged.items()) for n in ns]
        entries.append(entry)
    truth.setdefault("job", meta.job)
    truth["log_failures"] = entries
    truth_path.write_text(json.dumps(truth, indent=1))


def _resolve(failure: str | None, rng: np.random.Generator) -> str | None:
    if failure is None or failure in ("", "none", "healthy"):
        return None
    if failure in FAILURES:
        return failure
    pool = list(FAILURES) if failure == "random" else [n for n, f in FAILURES.items() if f[0] == failure]
    if not pool:
        raise UserError(f"unknown log failure '{failure}'",
                        f"use one of {', '.join(FAILURES)}, a category ({', '.join(CATEGORIES)}) or random")
    return pool[int(rng.integers(len(pool)))]
