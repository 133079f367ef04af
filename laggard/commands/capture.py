"""`laggard capture`: a flows trace from the network alone (live, a capture file, or flow records)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from collector.inputs.errors import UserError
from laggard.cliutil import emit, verb_parser

#: shown in --help without importing collector.network.flows; tests check it equals collector.network.flows.DEFAULT_GAP_NS
DEFAULT_GAP_MS = 1.0


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "capture", "capture network flows into a trace (live, pcap/pcapng, or flow-exporter CSV)",
        "Turns packets into flow bursts (flows.parquet): RoCEv2 (UDP 4791, BTH destination QP) and TCP,\n"
        "one burst per 5-tuple/QP run with no pause longer than --burst-gap. Live capture runs tshark on\n"
        "--iface for --duration seconds; --read takes an existing .pcap/.pcapng (tcpdump -w) or a CSV of\n"
        "flow-exporter records (IPFIX/sFlow column names). Give --meta (a meta.json with each rank's host\n"
        "and ip, and the topology) so that endpoints map to hosts and switches; without it every address\n"
        "is its own host. A damaged capture keeps what was readable and says where it stopped.\n"
        "Then it says what the capture shows. Only collective communication makes a training job:\n"
        "RoCEv2, and TCP between unprivileged, non-service ports that repeats large bursts (NCCL and\n"
        "gloo sockets); SSH, TLS, DNS, HTTP and other services are set aside and counted. A capture\n"
        "holding fewer than 6 complete iterations is too short: `localize --flows` gives no verdict.",
        "  laggard capture --iface eth1 --duration 30 --out /tmp/run7-flows\n"
        "  laggard capture --read dump.pcap --meta run7/meta.json --out /tmp/run7-flows\n"
        "  laggard capture --read exporter.csv --out /tmp/fabric\n"
        "  laggard localize /tmp/run7-flows --flows",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--iface", help="network interface to capture on (needs tshark and capture rights)")
    src.add_argument("--read", type=Path, metavar="FILE", help="a .pcap/.pcapng capture or a flow-record .csv")
    p.add_argument("--duration", type=float, default=30.0, help="live capture length in seconds (default 30)")
    p.add_argument("--snaplen", type=int, default=128, help="bytes kept per packet (default 128: headers only)")
    p.add_argument("--burst-gap", type=float, default=None, metavar="MS",
                   help=f"pause that ends a burst, in ms (default {DEFAULT_GAP_MS:g})")
    p.add_argument("--meta", type=Path, help="meta.json giving each rank's host and ip (and the topology)")
    p.add_argument("--job", help="job name for meta.json when --meta is not given")
    p.add_argument("--keep-pcap", action="store_true", help="keep the live capture as capture.pcap in the trace")
    p.add_argument("--out", type=Path, required=True, help="trace directory to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # heavy (pandas, pyarrow, scapy): only when this verb runs
    from collector.inputs.safeio import read_json
    from collector.network.flows import (
        DEFAULT_GAP_NS,
        pcap_to_flows,
        read_flow_records,
        write_flows_trace,
    )
    from collector.network.live import capture_to_pcap

    if args.burst_gap is None:
        args.burst_gap = DEFAULT_GAP_NS / 1e6
    if args.burst_gap < 0:
        raise UserError(f"--burst-gap {args.burst_gap} is negative", "give a pause in ms, e.g. --burst-gap 1")
    gap_ns = int(args.burst_gap * 1e6)
    args.out.mkdir(parents=True, exist_ok=True)
    warnings: list[str] = []
    if args.iface:
        if args.keep_pcap:
            pcap = capture_to_pcap(args.iface, args.duration, args.out / "capture.pcap", args.snaplen)
            result = pcap_to_flows(pcap, gap_ns)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                pcap = capture_to_pcap(args.iface, args.duration, Path(tmp) / "capture.pcap", args.snaplen)
                result = pcap_to_flows(pcap, gap_ns)
        table, packets, warnings = result.table, result.stats.records, result.stats.warnings
        job = args.job or f"capture-{args.iface}"
    elif args.read.suffix.lower() == ".csv":
        table, packets = read_flow_records(args.read), None
        job = args.job or args.read.stem
    else:
        result = pcap_to_flows(args.read, gap_ns)
        table, packets, warnings = result.table, result.stats.records, result.stats.warnings
        job = args.job or args.read.stem
    meta = None
    if args.meta:
        if not args.meta.exists():
            raise UserError(f"{args.meta}: no such meta.json", "pass the job's meta.json or leave --meta out")
        meta = read_json(args.meta)
    summary = write_flows_trace(args.out, table, meta, job)
    for w in warnings:
        emit(f"laggard capture: warning: {w}", file=sys.stderr)
    read = f"{packets:,} packets -> " if packets is not None else ""
    emit(f"wrote {args.out}: {read}{summary['bursts']:,} bursts between {summary['endpoints']} endpoints")
    for line in _recognised(args.out):
        emit(line)
    return 0


def _recognised(trace_dir: Path) -> list[str]:
    """What the capture shows: the training job it recognises (or that there is none), and whether
    it holds enough iterations to be judged."""
    from collector.trace.traceio import Trace
    from timeline.flows import build_flow_timeline, too_short

    trace = Trace.open(trace_dir)
    tl = build_flow_timeline(trace.flows(), trace.meta)
    lines = [f"note: {n}" for n in tl.notes]
    job = tl.job(trace.meta.job)
    if job is None:
        return [*lines, "no training job found: nothing for `laggard localize --flows` to judge"]
    d = job.to_dict()
    groups = ", ".join(f"{k}={v}" for k, v in job.parallelism().items()) or "no ring or chain"
    typical = d["median_iteration_s"]
    lines.append(f"job {job.name}: {len(job.hosts)} host(s), {groups}, {d['iterations']} complete iteration(s)"
                 + (f" of ~{typical:.3g} s" if typical else ""))
    if (short := too_short(job)) is not None:
        lines.append(f"{short}: no verdict from this capture")
    return lines
