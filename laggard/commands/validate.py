"""`laggard validate TRACE`: check a trace against the contract, one line per problem."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from laggard.cliutil import add_format, emit, print_json, verb_parser


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "validate", "check a trace directory against the trace contract",
        "Checks meta.json (numbers, ranks, host and NIC names), every evidence file (columns, types,\n"
        "ranks, peers, steps, times, duplicates) and logs/ (regular text files within the size caps).\n"
        "These are the checks every verb applies when it reads a trace: what validate accepts, no verb\n"
        "crashes on; what it refuses, no verb analyses. Prints one line per problem and exits 2 if any.\n"
        "Caps (raise for a genuinely larger job): LAGGARD_MAX_WORLD_SIZE (131072), LAGGARD_MAX_STEP,\n"
        "LAGGARD_MAX_STEP_CELLS (steps spanned x ranks, 10M; or analyse a window with --steps A:B),\n"
        "LAGGARD_MAX_LOG_BYTES, LAGGARD_MAX_GZIP_RATIO (100), LAGGARD_MAX_LOG_LINES, LAGGARD_MAX_LINE_BYTES,\n"
        "LAGGARD_MAX_JSON_DEPTH (64), LAGGARD_MAX_DUMP_BYTES, LAGGARD_MAX_META_BYTES, LAGGARD_MAX_OBJECTS.",
        "  laggard validate traces/gpu-straggler\n  laggard validate /data/run7 --format json",
    )
    p.add_argument("trace", type=Path, help="trace directory (holds meta.json)")
    add_format(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from collector.trace.validate import validate_trace

    problems = validate_trace(args.trace)
    if args.format == "json":
        print_json({"trace": str(args.trace), "valid": not problems,
                    "problems": [{"where": p.where, "what": p.what, "fix": p.fix} for p in problems]})
    elif problems:
        for p in problems:
            emit(p.line(), file=sys.stderr)
    else:
        emit(f"{args.trace}: valid")
    return 2 if problems else 0
