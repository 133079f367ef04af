"""`laggard validate TRACE`: check a trace against the contract, one line per problem."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from laggard.cliutil import add_format, print_json, verb_parser


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "validate", "check a trace directory against the trace contract",
        "Checks meta.json and every evidence file (columns, types, ranks, times, duplicates).\n"
        "Prints one line per problem and exits 2 if there is any.",
        "  laggard validate traces/gpu-straggler\n  laggard validate /data/run7 --format json",
    )
    p.add_argument("trace", type=Path, help="trace directory (holds meta.json)")
    add_format(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from collector.validate import validate_trace

    problems = validate_trace(args.trace)
    if args.format == "json":
        print_json({"trace": str(args.trace), "valid": not problems,
                    "problems": [{"where": p.where, "what": p.what, "fix": p.fix} for p in problems]})
    elif problems:
        for p in problems:
            print(p.line(), file=sys.stderr)
    else:
        print(f"{args.trace}: valid")
    return 2 if problems else 0
