"""`laggard report TRACE --out FILE`: the one-page on-call irregularity report, and alerts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from collector.inputs.errors import UserError
from collector.inputs.text import safe_text
from laggard.cliutil import (
    add_fail_on_irregular,
    emit,
    exit_status,
    parse_steps,
    progress,
    verb_parser,
)
from laggard.cluster import add_cluster_args

SUFFIX_FORMAT = {".md": "md", ".markdown": "md", ".json": "json", ".html": "html", ".htm": "html"}


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "report", "write the on-call irregularity report (HTML, Markdown or JSON)",
        "Runs the whole pipeline (timeline, localization, diagnosis) and writes one page that answers:\n"
        "is the job irregular and since when, how much time is lost, which device is the root cause\n"
        "and how sure we are, the evidence, and what to check and do. The HTML page is self-contained\n"
        "(no network needed to view it). --notify also posts a compact alert to a Slack-compatible\n"
        "webhook or to Alertmanager (URL path /api/v2/alerts).",
        "  laggard report traces/gpu-straggler --out report.html\n"
        "  laggard report /data/run7 --out - --format md | less -R\n"
        "  laggard report /data/run7 --out run7.json --fail-on-irregular\n"
        "  laggard report /data/run7 --out r.html --notify http://alertmanager:9093/api/v2/alerts\n"
        "  laggard report /data/run7 --out r.html --cluster local   # localize on Dask workers",
    )
    p.add_argument("trace", type=Path, help="trace directory (holds meta.json)")
    p.add_argument("--out", required=True, help="file to write, or - for stdout (md and json only)")
    p.add_argument("--format", choices=("html", "md", "json"), default=None,
                   help="output format (default: from the --out suffix, else html)")
    p.add_argument("--notify", metavar="URL", help="post a compact alert to this webhook after writing")
    p.add_argument("--notify-format", choices=("auto", "slack", "alertmanager"), default="auto",
                   help="alert body format (default auto: alertmanager when the URL ends in /api/v2/alerts)")
    p.add_argument("--steps", help="only steps A:B (inclusive)")
    p.add_argument("--top", type=int, default=5, help="candidates to keep (default 5)")
    p.add_argument("--probes", choices=("auto", "virtual", "local", "ssh", "dry-run"), default="auto",
                   help="where the read-only probes run (default auto: a dry run that lists the commands); "
                        "local and ssh are opt-in; virtual answers from a simulated trace's truth.json, "
                        "labelled simulated")
    add_fail_on_irregular(p)
    add_cluster_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    fmt = args.format or SUFFIX_FORMAT.get(Path(args.out).suffix.lower(), "html")
    if args.out == "-" and fmt == "html":
        raise UserError("--out - writes to stdout, which suits md or json, not html", "give --format md|json or a file")
    steps = parse_steps(args.steps)
    if args.top < 1:
        raise UserError(f"--top {args.top} must be at least 1", "e.g. --top 5")
    if args.out != "-" and not Path(args.out).parent.exists():
        raise UserError(f"--out {args.out}: directory {Path(args.out).parent} does not exist",
                        "create it or choose another path")
    if args.notify:
        from laggard.notify import check_url

        check_url(args.notify)
    from collector.trace.traceio import Trace

    trace = Trace.open(args.trace)
    from laggard.backends import choose_backend

    backend = choose_backend(trace.path, args.probes)
    # the stages (and matplotlib) are imported here so that every `laggard` command starts fast
    from explain.diagnose import diagnose
    from explain.reasoning.tie import MAX_TIE_LISTED, complete, unlisted
    from explain.report.build import build_report
    from localize.combine import localize_trace
    from timeline.build import build_timeline

    large = args.cluster or args.summary_first
    if large:  # the whole-trace timeline is what does not fit one process: the report goes without it
        from laggard.commands.localize import cluster_verdict

        args.evidence = None
        verdict = cluster_verdict(args)
    with progress("building the timeline", total=4) as stages:
        timeline = build_timeline(trace, steps) if trace.has("commops") and not large else None
        stages.next("localizing the root cause")
        if not large:
            verdict = localize_trace(trace, None, steps, args.top)
        tied = verdict  # the diagnosis probes the whole tie; the page lists the verdict as localize does
        if not large and unlisted(verdict):
            tied = complete(verdict, localize_trace(trace, None, steps, len(verdict.candidates) + MAX_TIE_LISTED))
        stages.next("diagnosing")
        diagnosis = diagnose(trace, tied, backend=backend)
        stages.next("rendering the report")
        report = build_report(trace, timeline, verdict, diagnosis)
        # (the renderers, matplotlib's ~27 MB among them, load once the analysis is done: not on its peak)
        from explain.report.html import render_html
        from explain.report.markdown import render_markdown

        text = {"html": render_html, "md": render_markdown}.get(fmt, _json)(report)
    if args.out == "-":  # md or json: input text (job, hosts, log lines) reaches the terminal escaped
        sys.stdout.write(safe_text(text))
    else:
        out = Path(args.out)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
        emit(f"{report.headline()}\nreport: {out}", file=sys.stderr)
    if args.notify:
        from laggard.notify import notify

        link = None if args.out == "-" else Path(args.out).resolve().as_uri()
        notify(report, args.notify, args.notify_format, link)
    return exit_status(report.status, args)


def _json(report: Any) -> str:
    return json.dumps(report.to_dict(), indent=1, default=str) + "\n"
