"""`laggard timeline TRACE`: per-step durations, δ-irregular steps and group kinds of a job."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from collector.inputs.errors import UserError
from collector.inputs.text import safe_text
from laggard.cliutil import add_format, emit, parse_steps, print_json, verb_parser

if TYPE_CHECKING:
    from timeline.model import Timeline


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "timeline", "per-step durations, irregular steps and process-group kinds of a job",
        "Reads the trace's CommOps, infers what each process group is (dp/tp/pp/ep/cp), measures\n"
        "every training step on clocks aligned across hosts, and flags δ-irregular steps: steps\n"
        "that ran δ times longer than the rolling median of recent normal steps.\n"
        "Step numbers are inferred when the trace has none.",
        "  laggard timeline traces/gpu-straggler\n"
        "  laggard timeline /data/run7 --steps 100:200 --delta 1.2\n"
        "  laggard timeline /data/run7 --format json | jq .irregular_steps",
    )
    p.add_argument("trace", help="trace directory (holds meta.json and commops)")
    add_format(p)
    p.add_argument("--steps", metavar="A:B", help="only steps A..B (inclusive)")
    p.add_argument("--delta", type=float, default=1.1, metavar="D",
                   help="a step is irregular at D times its baseline or more (default 1.1)")
    p.add_argument("--fail-on-irregular", action="store_true", help="exit 1 when any step is irregular")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.delta <= 1.0:
        raise UserError(f"--delta {args.delta} must be above 1", "use e.g. --delta 1.1 (10% slower than typical)")
    from collector.trace.traceio import Trace  # heavy (pandas, pyarrow): only when this verb runs
    from timeline.build import build_timeline
    from timeline.render import render_plain

    trace = Trace.open(args.trace)
    steps = parse_steps(args.steps)
    tl = build_timeline(trace, steps=steps, delta=args.delta)
    if tl.status == "healthy":  # steps alone cannot show a job slow from its first step: ranks can
        from localize.commops import COLUMNS, persistent_verdict
        from localize.ops.steps import with_steps

        durations = tl.steps.set_index("step")["duration_s"].astype(float) if len(tl.steps) else None
        v = persistent_verdict(with_steps(trace.commops(columns=COLUMNS, steps=steps)), trace.meta, 5, tl.group_kind,
                               durations)
        if v.status == "irregular" and v.candidates:
            tl.mark_slow_from_start(v.onset_step, v.slowdown, f"{v.candidates[0].device()} (see `laggard localize`)")
    other = [k for k in ("flows", "logs") if trace.has(k)]
    if "flows" in other:
        trace.table("flows")  # (not read here, but checked: what `validate` refuses, no verb accepts)
    if other:  # say what this view leaves out, so a different verdict from `localize` is no contradiction
        tl.notes.append(f"timeline reads CommOps step times only; this trace also has {' and '.join(other)}, "
                        "which `laggard localize` reads too")
    if args.format == "json":
        print_json(tl.to_dict())
    elif sys.stdout.isatty():
        _print_rich(tl)
    else:
        emit(render_plain(tl))
    return 1 if args.fail_on_irregular and tl.status == "irregular" else 0


def _print_rich(tl: Timeline) -> None:
    """Same content as the plain text, with a rich table on a terminal."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from timeline.render import HEADERS, step_rows, summary_lines

    console = Console()
    for i, line in enumerate(summary_lines(tl)):
        style = "bold red" if i == 1 and tl.status == "irregular" else ("bold green" if i == 1 else None)
        console.print(safe_text(line), style=style, highlight=False, markup=False)
    rows = step_rows(tl)
    if rows:
        table = Table(*HEADERS, box=None, pad_edge=False)
        for r in rows:
            table.add_row(*(Text(safe_text(c)) for c in r), style="red" if r[0].endswith("!") else None)
        console.print(table)
    for n in tl.notes:
        console.print(safe_text(f"note: {n}"), style="dim", highlight=False, markup=False)
