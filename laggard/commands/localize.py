"""`laggard localize TRACE`: which device (or configuration) makes the job slow, ranked."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laggard.cliutil import add_format, parse_steps, print_json, verb_parser

if TYPE_CHECKING:
    from localize.verdict import Verdict


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "localize", "rank the devices that make a job slow (GPU, host, NIC, link, switch, config, data)",
        "Finds the irregular steps, then the root cause: from CommOps, the rank that arrived last while\n"
        "its peers waited, followed back through waiting across groups (TP -> PP -> DP) to where the\n"
        "delay began; slow transfers are resolved to the GPU path, NIC, link or switch they share.\n"
        "Without an evidence flag it uses every kind of evidence the trace has.",
        "  laggard localize traces/gpu-straggler\n"
        "  laggard localize /data/run7 --format json --top 3\n"
        "  laggard localize /data/run7 --commops --steps 400:450 --fail-on-irregular",
    )
    p.add_argument("trace", type=Path, help="trace directory (holds meta.json)")
    ev = p.add_argument_group("evidence (default: all the trace has)")
    for kind in ("commops", "flows", "logs"):
        ev.add_argument(f"--{kind}", action="append_const", const=kind, dest="evidence",
                        help=f"use {kind} evidence")
    add_format(p)
    p.add_argument("--steps", help="only steps A:B (inclusive)")
    p.add_argument("--top", type=int, default=5, help="how many candidates to list (default 5)")
    p.add_argument("--fail-on-irregular", action="store_true", help="exit 1 when the job is irregular or stuck")
    p.set_defaults(func=run)


def render_text(v: Verdict) -> str:
    """What a person needs first: is it slow, since when, by how much, which device, why."""
    from explain.story import Story

    story = Story.of(v)
    if v.status == "healthy":
        return story.status_line()
    lines = [story.status_line()]
    if not v.candidates:
        lines.append("  no device stands out")
    for i, c in enumerate(v.candidates, 1):
        lines.append(f"{'=>' if i == 1 else '  '} {i}. {c.kind:<7} {c.device():<40} score {c.score:.2f}")
        for e in c.evidence[: 3 if i == 1 else 1]:
            lines.append(f"       - {e}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        from collector.errors import UserError

        raise UserError(f"--top {args.top}", "give at least 1")
    from collector.traceio import Trace  # heavy (pandas, pyarrow): only when this verb runs
    from localize.combine import localize_trace

    trace = Trace.open(args.trace)
    evidence = tuple(dict.fromkeys(args.evidence)) if args.evidence else None
    verdict = localize_trace(trace, evidence, parse_steps(args.steps), args.top)
    if args.format == "json":
        print_json(verdict.to_dict())
    else:
        print(render_text(verdict))
    return 1 if args.fail_on_irregular and verdict.status != "healthy" else 0
