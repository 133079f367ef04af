"""`laggard logs TRACE` (failure-indicating lines, suspicious nodes, stage, iteration) and
`laggard logs learn OK_TRACE...` (add successful jobs' events to the cross-job pool)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from collector.inputs.errors import UserError
from laggard.cliutil import add_format, emit, print_json, verb_parser
from localize.logs.pool import POOL_ENV, EventPool, user_pool_path


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "logs", "find the failure in a job's training logs (L4)",
        "Parses logs/<host>.log[.gz] with Drain, drops events also seen in successful jobs, ranks\n"
        "nodes whose logs differ (isolation forest), finds the iteration whose events depart from the\n"
        "previous ones (DTW) and the stage, and prints the failure-indicating lines as file:line.\n"
        f"`laggard logs learn OK_TRACE...` adds successful jobs to the pool (${POOL_ENV}, else\n"
        "~/.local/share/laggard/log_pool.json); a default pool ships with laggard. A pool is read\n"
        "and written only within LAGGARD_MAX_POOL_BYTES (64 MiB): learn from fewer jobs or raise it.",
        "  laggard logs /data/run7\n  laggard logs /data/run7 --format json --top 8\n"
        "  laggard logs learn /data/run5 /data/run6",
    )
    p.add_argument("trace", nargs="+", metavar="TRACE",
                   help="trace directory with logs/; or `learn` followed by traces of successful jobs")
    add_format(p)
    p.add_argument("--top", type=int, default=5, help="suspicious nodes to list (default 5)")
    p.add_argument("--lines", type=int, default=20, help="failure-indicating lines to print in text (default 20)")
    p.add_argument("--pool", type=Path, default=None,
                   help=f"use (or, with learn, write) this pool file instead of the default and ${POOL_ENV}")
    p.add_argument("--fail-on-irregular", action="store_true", help="exit 1 when a failure is found")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.trace[0] == "learn":
        return _learn([Path(t) for t in args.trace[1:]], args)
    if len(args.trace) != 1:
        raise UserError("laggard logs takes one trace", "run it once per trace, or use `laggard logs learn T...`")
    if args.top < 1:
        raise UserError(f"--top {args.top} must be at least 1", "e.g. --top 5")
    if args.lines < 0:
        raise UserError(f"--lines {args.lines} is negative", "e.g. --lines 20, or --lines 0 for none")
    from collector.trace.traceio import Trace  # heavy: only when this verb runs

    trace = Trace.open(args.trace[0])
    if not trace.has("logs"):
        raise UserError(f"{trace.path}: no logs/<host>.log", "put one log per host under logs/ (plain or .gz)")
    if args.pool and not args.pool.exists():
        raise UserError(f"{args.pool}: no such pool", "create it with `laggard logs learn OK_TRACE --pool FILE`")
    pool = EventPool.load(args.pool) if args.pool else None
    # scikit-learn loads slowly: import the localizer only when it runs
    from localize.logs.analysis import analyze_logs, verdict_of

    analysis = analyze_logs(trace, pool)
    verdict = verdict_of(trace, analysis, args.top)
    if args.format == "json":
        print_json(verdict.to_dict())
    else:
        _print_text(verdict.to_dict(), args.lines)
    return 1 if args.fail_on_irregular and verdict.status != "healthy" else 0


def _learn(paths: list[Path], args: argparse.Namespace) -> int:
    if not paths:
        raise UserError("laggard logs learn needs traces of successful jobs", "e.g. laggard logs learn /data/run5")
    from collector.logs import parse_logs
    from collector.trace.traceio import Trace

    target = args.pool or user_pool_path()
    pool = EventPool.load(target)
    added = 0
    for path in paths:
        trace = Trace.open(path)
        if not trace.has("logs"):
            raise UserError(f"{trace.path}: no logs/<host>.log to learn from", "pass traces that have logs/")
        added += pool.add(parse_logs(trace.log_files(), root=trace.path), trace.meta.job)
    pool.save(target)
    out = {"pool": str(target), "jobs_added": len(paths), "new_events": added, "events": len(pool),
           "jobs": len(pool.jobs)}
    if args.format == "json":
        print_json(out)
    else:
        emit(f"learned {len(paths)} successful job(s): {added} new event(s), {len(pool)} in {target} "
             f"({len(pool.jobs)} jobs)")
    return 0


def _print_text(v: dict[str, Any], max_lines: int) -> None:
    info = v["logs"]
    if v["status"] == "healthy":
        emit(f"job {v['job']}: no failure-indicating lines ({info['lines_total']} lines, "
             f"{info['suspect_lines']} unknown to successful jobs, pool of {info['pool_jobs']} jobs)")
        return
    kind = v["candidates"][0]["kind"] if v["candidates"] else "?"
    when = f"stage {info['stage']}" + (f", iteration {info['iteration']}" if info["iteration"] is not None else "")
    emit(f"job {v['job']}: failure ({kind}, {info['category']}) at {when}")
    emit(f"  {info['failure_lines']} failure-indicating lines of {info['lines_total']} "
         f"({len(info['events'])} events; {info['suspect_lines']} lines unknown to "
         f"{info['pool_jobs']} successful jobs)")
    if info["anomalous_iterations"]:
        emit(f"  anomalous iterations: {', '.join(map(str, info['anomalous_iterations'][:20]))}")
    emit("candidates:")
    for i, c in enumerate(v["candidates"], 1):
        where = c.get("host") or "whole job"
        gpu = f" gpu {c['gpu']} (rank {c['rank']})" if c.get("gpu") is not None else ""
        emit(f"  {i}. {c['kind']:6s} {where}{gpu}  score {c['score']:.2f}")
        for e in c["evidence"][:3]:
            emit(f"       {e}")
    emit("failure-indicating events (first line of each):")
    for e in info["events"][:max_lines]:
        nodes = e["nodes"]
        on = nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes"
        emit(f"  x{e['count']:<5d} on {on}: {e['first']}")
    if len(info["events"]) > max_lines:
        emit(f"  ... {len(info['events']) - max_lines} more events (--lines N, or --format json for all lines)")
