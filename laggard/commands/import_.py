"""`laggard import flight-recorder|kineto SRC --out TRACE`: turn PyTorch's own records into a trace."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from laggard.cliutil import Formatter, emit, verb_parser


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "import", "import PyTorch Flight Recorder dumps or profiler (Kineto) traces",
        "Converts records PyTorch already writes into a laggard trace (meta.json + commops.parquet).\n"
        "  flight-recorder: per-rank dumps (NCCL or gloo, pickle or JSON) written to\n"
        "    TORCH_FR_DUMP_TEMP_FILE<rank> when TORCH_FR_BUFFER_SIZE>0; pickles are read with a\n"
        "    restricted unpickler that refuses anything but plain data. Not-completed ops go to\n"
        "    pending.parquet, which `laggard localize` uses to name the ranks a hang waits on.\n"
        "  kineto: torch.profiler Chrome traces, .json or .json.gz (tensorboard_trace_handler's\n"
        "    *.pt.trace.json.gz), one or more per rank: NCCL kernels ncclDevKernel_*/ncclKernel_*,\n"
        "    record_param_comms, gloo:* annotations; steps from the profiler's ProfilerStep#N markers.\n"
        "    Ranks missing from the world size the traces declare are named, never passed off as the job.",
        "  laggard import flight-recorder /tmp/fr/ --out /tmp/hang-trace\n"
        "  laggard import flight-recorder /tmp/fr/ --world-size 64 --out /tmp/hang-trace\n"
        "  laggard import kineto ./profiles/ --out /tmp/prof-trace\n"
        "  laggard localize /tmp/hang-trace --format json",
    )
    kinds = p.add_subparsers(dest="source", metavar="SOURCE", required=True)
    fr = kinds.add_parser("flight-recorder", help="Flight Recorder dumps (a file or a directory of PREFIX<rank>)",
                          formatter_class=Formatter)
    fr.add_argument("src", type=Path, help="a dump file or the directory holding PREFIX<rank> dumps")
    fr.add_argument("--world-size", type=int, default=None,
                    help="ranks in the job, so ranks that wrote no dump still count as group members")
    kin = kinds.add_parser("kineto", help="torch.profiler Chrome-trace JSON (a file or a directory)",
                           formatter_class=Formatter)
    kin.add_argument("src", type=Path, help="a trace file or a directory of .json / .json.gz traces")
    for q in (fr, kin):
        q.add_argument("--out", type=Path, required=True, help="trace directory to write")
        q.add_argument("--job", default=None, help="job name for meta.json")
        q.set_defaults(func=run)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.source == "flight-recorder":
        from collector.importers.flight_recorder import import_flight_recorder

        meta = import_flight_recorder(args.src, args.out, world_size=args.world_size, job=args.job)
        dumped = meta.extra.get("dumped_ranks", [])
        missing = sorted(set(range(meta.world_size)) - set(dumped))
        emit(f"{args.out}: {len(dumped)} rank dump(s), world {meta.world_size}, groups {', '.join(meta.groups) or '-'}"
              + (f"; no dump from rank(s) {', '.join(map(str, missing))}" if missing else ""))
        done, pending = meta.extra.get("completed_ops", 0), meta.extra.get("pending_ops", 0)
        emit(f"{done:,} completed operator(s), {pending:,} entered and not completed"
              + ("; no operator completed: a hang snapshot, see `laggard localize`" if pending and not done else ""))
    else:
        from collector.importers.kineto import import_kineto
        from collector.trace.meta import coverage_note

        meta = import_kineto(args.src, args.out, job=args.job)
        present = meta.extra.get("ranks_present", [])
        emit(f"{args.out}: {len(present)} of {meta.world_size} rank(s) from "
              f"{', '.join(meta.extra.get('kineto_sources', []))}; steps {meta.extra.get('steps_from', 'not recorded')}")
        if note := coverage_note(meta):
            emit(f"note: {note}")
    return 0
