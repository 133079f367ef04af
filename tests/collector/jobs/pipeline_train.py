"""A Megatron-shaped gloo training job (CPU) for the real-job tests: TP x PP x DP, 1F1B, real p2p.

Rank order is Megatron's (tp fastest, then dp, then pp): rank = tp_i + tp * (dp_i + dp * pp_i),
so under torchrun with --nproc-per-node = tp each node holds one TP group, as a node's GPUs
would. Groups are named tp-k, dp-k, pp-k, mp-k (numbered by their lowest rank) via
new_group(group_desc=...).

Per step, on every rank:
  - a 1F1B pipeline schedule over --microbatches (Megatron's warm-up / steady / cool-down), with
    real activations and gradients of --act-mib between stages: single transfers by dist.send /
    dist.recv, the steady phase's paired ones (send_forward_recv_backward,
    send_backward_recv_forward) by dist.batch_isend_irecv. gloo does not buffer messages this
    large: a send completes only once its receiver has posted (rendezvous);
  - inside each layer, forward and backward: compute (--layer-ms of sleep forward, twice that
    backward, like a GPU kernel the host waits on), then an all-reduce of --tp-kib in the TP group;
  - at the end: the distributed optimizer's reduce_scatter_tensor + all_gather_into_tensor of
    --grad-mib in the DP group, a grad-norm all-reduce in the model-parallel group (--mp-sync),
    and optimizer.step() (which the CommOps logger counts as the step boundary).
    With --ep E (a mixture of experts; E divides dp, Megatron's expert parallelism inside the DP
    group) each layer is attention compute, the TP all-reduce, an all_to_all_single of --a2a-kib
    dispatching tokens among E consecutive replicas (group ep-k), the experts' compute, and the
    all_to_all_single that combines them back; the layer's compute is split between the two.
    With --overlap-grad the gradient sync overlaps the backward instead, as DDP and Megatron's
    overlap_grad_reduce do: during the last microbatch's backward each layer's share of the
    gradient is reduce-scattered (--overlap-op all_reduce: all-reduced, DDP's op) with
    async_op=True as soon as that layer is done, and the step waits for all of them at its end.

Faults: --slow-ranks 2,3 --slow-factor 1.6 --slow-from 20 [--slow-to 30] multiplies those ranks'
compute (one rank: a slow GPU; one node's ranks: a slow or contended host) in steps [from, to);
--slow-every 2: in every other step of them (a fault on and off).
--long-batches 1.8 --slow-from 20: from that step, each step one model replica (dp index), drawn by a
seeded draw every rank makes alike, computes 1.8x: it got the longest sequences (the data, no device).
--step-log FILE: rank 0 appends each finished step (tests act mid-run, e.g. throttle a NIC).
--log-dir DIR: each rank writes rank-R.jsonl, one line per step with its own start/end (ns).
--device cuda: NCCL on GPUs instead. Tensors live on the GPU and compute is a kernel that keeps the
GPU busy (torch.cuda._sleep, calibrated), queued before the layer's all-reduce as a real layer's
kernels are; --compute host keeps it a host sleep instead (a launch-bound job: the GPU idles until
the host enqueues). The host reads the grad norm at the end of each step, as Megatron does, which
bounds how far it runs ahead of its GPU. Ranks that share one GPU declare their own NCCL host
(NCCL_HOSTID): NCCL refuses two ranks of one host on one device, and between hosts its traffic takes
the network transport (sockets here), as between nodes.
Run it under the logger with no code change:
  LAGGARD_COMMOPS_DIR=/tmp/t torchrun --nproc-per-node 2 --nnodes 4 --node-rank H ... \\
      -m collector.commops.run tests/collector/jobs/pipeline_train.py --steps 40
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import time
from typing import Any

import torch
import torch.distributed as dist

from tests.collector.jobs.nccl_events import calibrate
from tests.collector.jobs.steplog import StepLog


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2, help="layers per stage")
    ap.add_argument("--layer-ms", type=float, default=8.0, help="forward compute per layer and microbatch")
    ap.add_argument("--act-mib", type=float, default=4.0, help="activation / gradient sent between stages")
    ap.add_argument("--tp-kib", type=float, default=256.0, help="TP all-reduce payload")
    ap.add_argument("--ep", type=int, default=1, help="expert parallel size (divides --dp); 1: dense layers")
    ap.add_argument("--a2a-kib", type=float, default=512.0, help="each expert all-to-all's payload")
    ap.add_argument("--grad-mib", type=float, default=2.0, help="DP reduce-scatter / all-gather payload")
    ap.add_argument("--overlap-grad", action="store_true",
                    help="launch each layer's DP gradient sync asynchronously during the last backward; wait at the end")
    ap.add_argument("--overlap-op", choices=("reduce_scatter", "all_reduce"), default="reduce_scatter",
                    help="the overlapped sync: the distributed optimizer's reduce_scatter, or DDP's all_reduce")
    ap.add_argument("--no-mp-sync", dest="mp_sync", action="store_false",
                    help="skip the iteration-end grad-norm all-reduce in the model-parallel group")
    ap.add_argument("--slow-ranks", default="", help="comma-separated ranks whose compute is slowed")
    ap.add_argument("--slow-factor", type=float, default=1.0)
    ap.add_argument("--slow-from", type=int, default=0)
    ap.add_argument("--slow-to", type=int, default=1 << 30)
    ap.add_argument("--slow-every", type=int, default=1, help="slow only every Nth step from --slow-from (on and off)")
    ap.add_argument("--long-batches", type=float, default=1.0,
                    help="from --slow-from, one replica a step (a seeded draw) computes this many times longer")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: gloo; cuda: NCCL on GPUs")
    ap.add_argument("--compute", choices=("device", "host"), default="device",
                    help="with --device cuda: compute as a GPU kernel (device) or a host sleep (host)")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--step-log", default="")
    ap.add_argument("--log-dir", default="")
    return ap.parse_args()


class Job:
    """This rank's place in the grid, its groups and buffers."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        timeout = datetime.timedelta(seconds=a.timeout_s)
        self.device = torch.device("cpu")
        if a.device == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
            if torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", "1")):
                os.environ["NCCL_HOSTID"] = f"laggard-rank-{os.environ.get('RANK', '0')}"
        dist.init_process_group("nccl" if a.device == "cuda" else "gloo", timeout=timeout)
        self.cycles_per_ms = calibrate() if a.device == "cuda" and a.compute == "device" else 0.0
        self.rank, world = dist.get_rank(), dist.get_world_size()
        if world != a.tp * a.pp * a.dp:
            raise SystemExit(f"world size {world} != tp*pp*dp = {a.tp * a.pp * a.dp}")
        if a.ep < 1 or a.dp % a.ep:
            raise SystemExit(f"--ep {a.ep} does not divide --dp {a.dp}")
        self.tp_i = self.rank % a.tp
        self.dp_i = self.rank // a.tp % a.dp
        self.stage = self.rank // (a.tp * a.dp)
        self.tp_g = self._groups("tp", lambda t, d, p: (d, p), timeout)
        self.dp_g = self._groups("dp", lambda t, d, p: (t, p), timeout)
        self.pp_g = self._groups("pp", lambda t, d, p: (t, d), timeout)
        self.mp_g = self._groups("mp", lambda t, d, p: (d,), timeout)
        self.ep_g = self._groups("ep", lambda t, d, p: (t, d // a.ep, p), timeout) if a.ep > 1 else None
        stride = a.tp * a.dp
        self.prev = self.rank - stride if self.stage > 0 else -1
        self.next = self.rank + stride if self.stage < a.pp - 1 else -1
        slow = {int(r) for r in a.slow_ranks.split(",") if r.strip()}
        self.slow = self.rank in slow
        n_act = int(a.act_mib * (1 << 20)) // 4
        dev = self.device
        self.act_out = [torch.full((n_act,), float(self.rank), device=dev) for _ in range(a.microbatches)]
        self.act_in = [torch.empty(n_act, device=dev) for _ in range(a.microbatches)]
        self.grad_out = [torch.full((n_act,), float(self.rank), device=dev) for _ in range(a.microbatches)]
        self.grad_in = [torch.empty(n_act, device=dev) for _ in range(a.microbatches)]
        self.tp_buf = torch.ones(int(a.tp_kib * 1024) // 4, device=dev)
        n_tokens = int(a.a2a_kib * 1024) // 4 // a.ep * a.ep
        self.tokens, self.routed = torch.ones(n_tokens, device=dev), torch.empty(n_tokens, device=dev)
        n_grad = int(a.grad_mib * (1 << 20)) // 4 // a.dp * a.dp
        self.grads = torch.ones(n_grad, device=dev)
        self.shard = torch.empty(n_grad // a.dp, device=dev)
        per_layer = n_grad // a.layers // a.dp * a.dp  # --overlap-grad: each layer's share, and its shard
        self.layer_grads = [self.grads[i * per_layer:(i + 1) * per_layer] for i in range(a.layers)]
        self.layer_shards = [torch.empty(per_layer // a.dp, device=dev) for _ in range(a.layers)]
        self.pending: list[Any] = []  # async gradient syncs in flight
        self.norm = torch.ones(1, device=dev)
        self.param = torch.nn.Parameter(torch.zeros(8))
        self.opt = torch.optim.SGD([self.param], lr=0.01)

    def _groups(self, kind: str, key: Any, timeout: datetime.timedelta) -> Any:
        """Create every group of this kind (all ranks must, in the same order); return ours."""
        a = self.a
        members: dict[tuple[int, ...], list[int]] = {}
        for r in range(a.tp * a.dp * a.pp):
            members.setdefault(key(r % a.tp, r // a.tp % a.dp, r // (a.tp * a.dp)), []).append(r)
        mine = None
        for k, ranks in enumerate(sorted(members.values())):
            g = dist.new_group(ranks, timeout=timeout, group_desc=f"{kind}-{k}")
            if self.rank in ranks:
                mine = g
        return mine

    def compute(self, ms: float, step: int) -> None:
        on = self.a.slow_from <= step < self.a.slow_to and (step - self.a.slow_from) % self.a.slow_every == 0
        f = self.a.slow_factor if self.slow and on else 1.0
        if on and self.a.long_batches != 1.0 and random.Random(f"batch-{step}").randrange(self.a.dp) == self.dp_i:
            f *= self.a.long_batches
        if self.cycles_per_ms:
            torch.cuda._sleep(int(ms * f * self.cycles_per_ms))  # type: ignore[attr-defined]
        else:
            time.sleep(ms * f / 1e3)

    def layers(self, step: int, backward: bool, last: bool = False) -> None:
        """This stage's layers, last first in the backward; `last`: the step's last backward, whose
        layers' gradients are final as each finishes (--overlap-grad launches their sync then)."""
        ms = self.a.layer_ms * (2 if backward else 1)
        for i in range(self.a.layers):
            if self.ep_g is None:
                self.compute(ms, step)
                dist.all_reduce(self.tp_buf, group=self.tp_g)
            else:  # attention, then the experts between a dispatch and a combine
                self.compute(ms / 2, step)
                dist.all_reduce(self.tp_buf, group=self.tp_g)
                dist.all_to_all_single(self.routed, self.tokens, group=self.ep_g)
                self.compute(ms / 2, step)
                dist.all_to_all_single(self.tokens, self.routed, group=self.ep_g)
            if last and self.a.overlap_grad:
                layer = self.a.layers - 1 - i
                if self.a.overlap_op == "all_reduce":
                    work = dist.all_reduce(self.layer_grads[layer], group=self.dp_g, async_op=True)
                else:
                    work = dist.reduce_scatter_tensor(self.layer_shards[layer], self.layer_grads[layer],
                                                      group=self.dp_g, async_op=True)
                self.pending.append(work)

    # -- Megatron's p2p helpers (p2p_communication.py), with its batched pairs ----------------
    def recv_forward(self, mb: int) -> None:
        if self.prev >= 0:
            dist.recv(self.act_in[mb], self.prev, group=self.pp_g)

    def send_forward(self, mb: int) -> None:
        if self.next >= 0:
            dist.send(self.act_out[mb], self.next, group=self.pp_g)

    def recv_backward(self, mb: int) -> None:
        if self.next >= 0:
            dist.recv(self.grad_in[mb], self.next, group=self.pp_g)

    def send_backward(self, mb: int) -> None:
        if self.prev >= 0:
            dist.send(self.grad_out[mb], self.prev, group=self.pp_g)

    def send_forward_recv_backward(self, mb: int) -> None:
        if self.next >= 0:
            self._batch([(dist.isend, self.act_out[mb], self.next), (dist.irecv, self.grad_in[mb], self.next)])

    def send_backward_recv_forward(self, mb_back: int, mb_fwd: int) -> None:
        if self.prev >= 0:
            self._batch([(dist.isend, self.grad_out[mb_back], self.prev), (dist.irecv, self.act_in[mb_fwd], self.prev)])

    def _batch(self, ops: list[tuple[Any, torch.Tensor, int]]) -> None:
        for w in dist.batch_isend_irecv([dist.P2POp(fn, t, peer, group=self.pp_g) for fn, t, peer in ops]):
            w.wait()

    def step(self, step: int) -> None:
        """One iteration: Megatron's forward_backward_pipelining_without_interleaving, then DP sync."""
        m = self.a.microbatches
        warmup = min(self.a.pp - self.stage - 1, m)
        fwd = bwd = 0
        for _ in range(warmup):
            self.recv_forward(fwd)
            self.layers(step, backward=False)
            self.send_forward(fwd)
            fwd += 1
        if m - warmup > 0:
            self.recv_forward(fwd)
        for i in range(m - warmup):
            self.layers(step, backward=False)
            self.send_forward_recv_backward(fwd)
            fwd += 1
            self.layers(step, backward=True, last=bwd == m - 1)
            if i == m - warmup - 1:
                self.send_backward(bwd)
            else:
                self.send_backward_recv_forward(bwd, fwd)
            bwd += 1
        for _ in range(warmup):
            self.recv_backward(bwd)
            self.layers(step, backward=True, last=bwd == m - 1)
            self.send_backward(bwd)
            bwd += 1
        if self.a.overlap_grad:  # DDP's finalize: wait for every bucket launched in the backward
            for work in self.pending:
                work.wait()
            self.pending = []
        else:
            dist.reduce_scatter_tensor(self.shard, self.grads, group=self.dp_g)
        if not (self.a.overlap_grad and self.a.overlap_op == "all_reduce"):  # DDP gathers nothing
            dist.all_gather_into_tensor(self.grads, self.shard, group=self.dp_g)
        if self.a.mp_sync:
            dist.all_reduce(self.norm, group=self.mp_g)
        if self.device.type == "cuda":
            self.norm.item()  # Megatron reads the grad norm on the host: the step waits for its GPU
        self.param.grad = torch.ones_like(self.param)
        self.opt.step()


def main() -> None:
    a = parse()
    torch.set_num_threads(1)
    job = Job(a)
    log = StepLog(a.log_dir, a.step_log, job.rank)
    dist.barrier()
    for step in range(a.steps):
        t0 = time.time_ns()
        job.step(step)
        log.done(step, t0)
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
