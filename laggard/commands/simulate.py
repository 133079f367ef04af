"""`laggard simulate`: build a training job, inject irregularities, write a trace with ground truth."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from collector.inputs.errors import UserError
from laggard.cliutil import emit, verb_parser
from simulator.config import (
    LOGGED_RANKS,
    P2P_MODES,
    SCENARIOS,
    FaultSpec,
    SimConfig,
    scenario_config,
)

EXAMPLES = """\
  laggard simulate --gpus 2048 --tp 8 --pp 8 --steps 50 --fault gpu:rank=77,factor=2 --out /tmp/t
  laggard simulate --scenario link-slow --seed 3 --out /tmp/link
  laggard simulate --gpus 128 --tp 2 --pp 2 --cp 2 --ep 4 --fault nic:host=node-3,factor=3,steps=5:19 --out /tmp/moe
  laggard simulate --gpus 64 --tp 8 --fault gpu:rank=5,factor=3,steps=4:12,pattern=spike --flows --logs --out /tmp/all
  laggard simulate --gpus 64 --tp 4 --pp 4 --p2p batched --mp-sync --logged-ranks one-per-tp --sample-steps 3 \
      --hosts-per-switch 16 --clock-skew-ms 100 --grad-overlap --fault gpu:rank=5,factor=2.3 --out /tmp/megatron-like

fault SPEC (several --fault at once are fine):
  gpu:rank=R,factor=F          slow compute on one GPU
  pcie:rank=R,factor=F         one GPU's PCIe path to its NIC is slow (its inter-host traffic)
  host:host=node-3,factor=F    CPU contention / launch jitter on every GPU of a host
  nic:host=node-3,factor=F     a host's NICs run F times slower
  link:hosts=node-2+node-6,factor=F   the path between two hosts is slow
  switch:switch=tor-1,factor=F        every flow through a ToR switch is slow
  stage:stage=S,factor=F       pipeline stage S has F times the work (configuration)
  seqlen:factor=F              some data-parallel replicas get F times longer sequences (data)
  each may add ,steps=A:B (inclusive window) and ,pattern=persistent|spike|fluctuation

scenarios: """ + ", ".join(SCENARIOS)


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "simulate", "simulate a training job with injected faults, writing a trace with ground truth",
        "Simulates every communication operator of every rank of a DP x TP x PP x CP x EP job (Megatron\n"
        "rank order, 1F1B or interleaved pipeline, 8 GPUs per host under ToR switches) with compute and\n"
        "bandwidth noise, slow drift and unsynchronized host clocks. Delays propagate through every\n"
        "dependency; pipeline transfers follow --p2p (rendezvous by default: a send waits for its receiver).\n"
        "Writes meta.json, commops.parquet and truth.json (the injected faults, logged steps and ranks).",
        EXAMPLES,
    )
    p.add_argument("--out", type=Path, required=True, help="trace directory to write")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), help="a named preset; other flags override it")
    p.add_argument("--gpus", type=int, help="world size (required without --scenario)")
    for dim, text in (("dp", "data"), ("tp", "tensor"), ("pp", "pipeline"), ("ep", "expert"), ("cp", "context")):
        p.add_argument(f"--{dim}", type=int, help=f"{text}-parallel size" + (" (default: gpus / (tp*pp*cp))" if dim == "dp" else " (default 1)"))
    p.add_argument("--steps", type=int, help="training steps (default 20)")
    p.add_argument("--seed", type=int, default=0, help="random seed; same seed and flags give the same trace")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC", help="inject a fault (see below)")
    p.add_argument("--microbatches", type=int, help="microbatches per step (default 2*pp, at least 4)")
    p.add_argument("--virtual-stages", type=int, help="model chunks per stage; >1 = interleaved 1F1B")
    p.add_argument("--p2p", choices=P2P_MODES,
                   help="pipeline send/recv semantics: rendezvous (default; a transfer starts once both sides posted, "
                        "as NCCL and gloo do for activations), eager (a send never waits for its receiver), batched "
                        "(Megatron's batch_isend_irecv: a stage's send and recv posted and waited together)")
    p.add_argument("--mp-sync", action="store_true",
                   help="end every iteration with an all_reduce over each model-parallel group (tp x cp x pp of one "
                        "replica, e.g. Megatron's grad-norm); groups mp-<i> in meta.json")
    p.add_argument("--grad-overlap", action="store_true",
                   help="overlap the data-parallel gradient reduce-scatter with the backward, as Megatron's "
                        "overlap_grad_reduce and PyTorch DDP do: --grad-buckets async reduce-scatters launched as the "
                        "last microbatch's backward produces them, waited for at the iteration's end")
    p.add_argument("--grad-buckets", type=int, help="gradient buckets per stage with --grad-overlap (default 3)")
    p.add_argument("--param-gather-overlap", action="store_true",
                   help="launch the parameter all-gather after the optimizer and let the next step's first forward "
                        "wait for it layer by layer (Megatron's overlap_param_gather)")
    p.add_argument("--drift", type=float, help="relative compute-time drift over the run, e.g. 0.2")
    p.add_argument("--clock-skew-ms", type=float,
                   help="host clock offsets are uniform in +- this (default 50; NTP-synced fleets see up to ~100)")
    p.add_argument("--logged-ranks", choices=LOGGED_RANKS,
                   help="which ranks write rows: all (default), or one-per-tp (tp rank 0 of each tensor-parallel group, "
                        "as many Megatron jobs log)")
    p.add_argument("--sample-steps", type=float, metavar="K|F",
                   help="write only sampled steps, as a sampling profiler does: K >= 2 every K-th step, or a fraction "
                        "F in (0, 0.5] of the steps at random, never two in a row (truth.json lists them)")
    p.add_argument("--missing-ranks", type=int, help="ranks whose logs are lost entirely")
    p.add_argument("--row-loss", type=float, help="fraction of rows the logger drops")
    p.add_argument("--hide-steps", action="store_true", help="write step=-1 (a logger without step markers)")
    p.add_argument("--opaque-groups", action="store_true",
                   help="name process groups pg-<hash> and leave parallelism out of meta (timeline must infer kinds)")
    p.add_argument("--gpus-per-host", type=int, help="GPUs per host (default 8)")
    p.add_argument("--hosts-per-switch", type=int, help="hosts under each ToR switch (default 4; real leaf switches hold 4-32)")
    p.add_argument("--job", help="job name in meta.json")
    p.add_argument("--flows", action="store_true", help="also write flows.parquet (network flow bursts)")
    p.add_argument("--pcap", action="store_true", help="also write capture.pcap: the whole job as RoCEv2 packets (implies --flows)")
    p.add_argument("--logs", action="store_true", help="also write logs/<host>.log training logs")
    p.add_argument("--log-failure", help="failure to inject into the logs (see simulator/logs.py)")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> SimConfig:
    overrides: dict[str, Any] = {
        "gpus": args.gpus, "dp": args.dp, "tp": args.tp, "pp": args.pp, "ep": args.ep, "cp": args.cp,
        "steps": args.steps, "seed": args.seed, "microbatches": args.microbatches,
        "virtual_stages": args.virtual_stages, "p2p": args.p2p, "mp_sync": args.mp_sync or None,
        "grad_overlap": args.grad_overlap or None, "grad_buckets": args.grad_buckets,
        "param_gather_overlap": args.param_gather_overlap or None, "drift": args.drift, "clock_skew_ms": args.clock_skew_ms,
        "logged_ranks": args.logged_ranks, "sample_steps": args.sample_steps,
        "missing_ranks": args.missing_ranks, "row_loss": args.row_loss, "job": args.job,
        "hide_steps": args.hide_steps or None, "opaque_groups": args.opaque_groups or None,
        "gpus_per_host": args.gpus_per_host, "hosts_per_switch": args.hosts_per_switch,
    }
    faults = [FaultSpec.parse(s) for s in args.fault]
    if args.scenario:
        cfg = scenario_config(args.scenario, **overrides)
        if faults:
            cfg.faults = faults
        return cfg
    if not args.gpus:
        raise UserError("--gpus is required without --scenario", "e.g. --gpus 64 --tp 8, or --scenario gpu-straggler")
    kw = {k: v for k, v in overrides.items() if v is not None}
    return SimConfig(faults=faults, **kw)


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args).resolved()
    from laggard.cliutil import progress

    est_rows = cfg.rows_estimate()
    from simulator.writer import simulate_trace  # heavy (numpy, pyarrow): only when this verb runs

    with progress("simulating", total=est_rows) as advance:
        truth = simulate_trace(cfg, args.out, progress=advance)
    if args.flows or args.pcap:
        from simulator.flows import emit_flows

        emit_flows(args.out, pcap=args.pcap)
    if args.logs:
        from simulator.logs import emit_logs

        emit_logs(args.out, seed=cfg.seed, failure=args.log_failure)
    par = " ".join(f"{k}={v}" for k, v in cfg.parallelism().items() if v > 1) or "dp=1"
    faults = "; ".join(f"{f['kind']} {f.get('rank', f.get('host', f.get('hosts', f.get('switch', f.get('stage', '')))))} x{f['factor']}"
                       for f in truth["faults"]) or "none"
    emit(f"wrote {args.out}: {cfg.gpus} GPUs ({par}), {cfg.steps} steps, {truth['rows']:,} operator rows; "
         f"faults: {faults}; irregular steps: {truth['irregular_steps'] or 'none'}", file=sys.stderr)
    return 0
