"""`laggard localize TRACE`: which device (or configuration) makes the job slow, ranked."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from laggard.cliutil import add_format, emit, parse_steps, print_json, verb_parser
from laggard.cluster import add_cluster_args

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
        "  laggard localize /data/run7 --commops --steps 400:450 --fail-on-irregular\n"
        "  laggard localize /data/run7 --cluster local --workers 2 --worker-memory 1.5GiB\n"
        "  laggard localize /data/run7 --summary-first       # one process, host by host as the sidecars do\n"
        "  laggard localize s3://bucket/run7 --cluster tcp://10.0.0.5:8786 --format json\n"
        "\n"
        "--cluster runs the summary-first localizer (the sidecar's: per-host abnormal-operator\n"
        "summaries, then full records of only the ranks and steps they point at) as Dask tasks\n"
        "that read the CommOps shards where they lie; its verdict is byte for byte the one the\n"
        "same method gives in one process (--summary-first, or localize.summary). A trace of more\n"
        "than LAGGARD_MAX_FULL_ROWS CommOps rows (5,000,000: ~100 bytes each in memory) is localized\n"
        "that way too, unless --steps narrows it; the output says so.",
    )
    p.add_argument("trace", help="trace directory (holds meta.json); with --cluster also a file:// or fsspec URL")
    ev = p.add_argument_group("evidence (default: all the trace has)")
    for kind in ("commops", "flows", "logs"):
        ev.add_argument(f"--{kind}", action="append_const", const=kind, dest="evidence",
                        help=f"use {kind} evidence")
    add_format(p)
    p.add_argument("--steps", help="only steps A:B (inclusive)")
    p.add_argument("--top", type=int, default=5, help="how many candidates to list (default 5)")
    p.add_argument("--fail-on-irregular", action="store_true", help="exit 1 when the job is irregular or stuck")
    add_cluster_args(p)
    p.set_defaults(func=run)


def render_text(v: Verdict) -> str:
    """What a person needs first: is it slow, since when, by how much, which device, why."""
    from explain.story import Story, tie_words

    story = Story.of(v)
    cov = v.extra.get("coverage")
    note = [f"note: {cov['note']}"] if isinstance(cov, dict) and cov.get("note") else []
    if isinstance(how := v.extra.get("summary_first"), str):
        note.append(f"note: {how}")
    if isinstance(also := v.extra.get("also"), str):
        note.append(f"note: {also}")
    if v.status == "healthy":
        return "\n".join([story.status_line(), *note])
    lines = [story.status_line()]
    if not v.candidates:
        why = v.extra.get("note")
        lines.append(f"  no device stands out: {why}" if isinstance(why, str) else "  no device stands out")
    for i, c in enumerate(v.candidates, 1):
        tie = f"  {tie_words(c)}" if c.tie else ""
        lines.append(f"{'=>' if i == 1 else '  '} {i}. {c.kind:<7} {c.device():<40} score {c.score:.2f}{tie}")
        for e in c.evidence[: 3 if i == 1 else 1]:
            lines.append(f"       - {e}")
    return "\n".join(lines + note)


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        from collector.inputs.errors import UserError

        raise UserError(f"--top {args.top}", "give at least 1")
    if args.cluster or args.summary_first:
        verdict = cluster_verdict(args)
    else:
        # heavy (pandas, pyarrow): only when this verb runs
        from collector.trace.traceio import Trace
        from localize.combine import localize_trace

        trace = Trace.open(args.trace)
        evidence = tuple(dict.fromkeys(args.evidence)) if args.evidence else None
        verdict = localize_trace(trace, evidence, parse_steps(args.steps), args.top)
    if args.format == "json":
        print_json(verdict.to_dict())
    else:
        emit(render_text(verdict))  # job and device names come from the trace: escaped
    return 1 if args.fail_on_irregular and verdict.status != "healthy" else 0


def cluster_verdict(args: argparse.Namespace) -> Verdict:
    """The summary-first verdict, its tasks on the cluster (or in this process with
    --summary-first alone); what the run did goes to stderr."""
    from collector.inputs.errors import UserError
    from laggard.cluster import open_cluster
    from localize.distributed import Serial, Source, Stats, localize_distributed

    if getattr(args, "steps", None):
        raise UserError("--steps does not combine with --cluster/--summary-first",
                        "drop --steps: the summaries pick the steps to fetch")
    if set(getattr(args, "evidence", None) or ()) - {"commops"}:
        raise UserError("--cluster/--summary-first localize from CommOps only", "drop --flows/--logs")
    src = Source.open(args.trace)
    stats = Stats()
    t0 = time.perf_counter()
    if not args.cluster:
        verdict, _ = localize_distributed(src, Serial(), args.top, stats)
        emit(f"summary-first in one process: {stats.hosts} host(s) summarized in {stats.map_tasks} read(s), {stats.fetch_tasks} fetch(es), "
             f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return verdict
    with open_cluster(args.cluster, args.workers, args.worker_memory) as run:
        verdict, _ = localize_distributed(src, run, args.top, stats)
        workers = run.worker_stats()
    peak = max((w["peak_rss_bytes"] for w in workers.values()), default=0)
    emit(f"cluster {args.cluster}: {len(workers)} worker(s), {stats.map_tasks} summary task(s) for {stats.hosts} host(s) "
         f"{run.stage_s.get('summarize_hosts', 0.0):.1f} s, {stats.fetch_tasks} fetch task(s) "
         f"{run.stage_s.get('fetch_rows', 0.0):.1f} s, {run.result_bytes:,} B of results, "
         f"peak worker RSS {peak / 2**20:.0f} MiB, {time.perf_counter() - t0:.1f} s in all", file=sys.stderr)
    return verdict

