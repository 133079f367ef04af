"""`laggard serve`: the always-on service next to the cluster (FastAPI + uvicorn)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from collector.inputs.errors import UserError
from laggard.cliutil import emit, verb_parser


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "serve", "run the service: ingest sidecar summaries, localize, serve metrics and reports",
        "Node agents (`laggard sidecar run TRACE --follow --post URL`) POST summaries to /v1/summaries;\n"
        "every --interval seconds each job with new summaries is localized again with localize/'s\n"
        "summary-first path, asking the agents for full records of the few ranks and steps it needs.\n"
        "Prometheus scrapes /metrics (rules: deploy/prometheus/rules.yml); the latest report of a job\n"
        "is at /v1/jobs/JOB/report (html, ?format=md or json); /healthz names jobs whose localization\n"
        "failed. State lives in --db (a SQLite file, or postgresql://... shared by replicas) and\n"
        "survives restarts.",
        "  laggard serve --port 8750 --db /var/lib/laggard/state.db\n"
        "  laggard serve --host 0.0.0.0 --notify http://alertmanager:9093/api/v2/alerts \\\n"
        "      --external-url http://laggard.example:8750\n"
        "  curl -s localhost:8750/metrics | grep laggard_job_irregular\n"
        "  curl -s 'localhost:8750/v1/jobs/llama-70b-run7/report?format=md'",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8750, help="port (default 8750)")
    p.add_argument("--db", default="laggard-state.db",
                   help="state: a SQLite file (default laggard-state.db) or a postgresql:// URL")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between localization rounds")
    p.add_argument("--max-body", type=int, default=4 << 20, help="largest accepted post, bytes")
    p.add_argument("--notify", metavar="URL", help="post an alert when a job turns irregular or recovers "
                   "(Alertmanager /api/v2/alerts or a Slack webhook), retried with backoff")
    p.add_argument("--external-url", default="", help="this service's URL as people reach it: alerts link to "
                   "URL/v1/jobs/JOB/report")
    p.add_argument("--job-ttl", type=float, default=3600.0,
                   help="seconds without posts before a job leaves /metrics (default 3600)")
    p.add_argument("--confirm-rounds", type=int, default=2,
                   help="consecutive localization rounds on new summaries that must name the same device before "
                        "it is published (default 2; until then the job shows as localizing; 1 = every round)")
    p.add_argument("--settle", type=float, default=30.0,
                   help="seconds the job's agents must be quiet before a still-unconfirmed device is published "
                        "anyway (no more evidence comes; default 30). Agents that saw their ranks exit say so, "
                        "and their job's device is published without this wait")
    p.add_argument("--workers", type=int, default=2, metavar="N",
                   help="jobs localized at once, each in a worker process of its own (default 2); a job whose "
                        "round stalls holds up only the jobs that share its worker")
    p.add_argument("--retention", default="7d", metavar="DURATION",
                   help="keep summaries this long (e.g. 36h, 7d, 90m, 600s; default 7d); a job with nothing newer "
                        "is forgotten, verdict included")
    p.add_argument("--max-rows-per-job", type=int, default=0, metavar="N",
                   help="also keep at most N summaries per job, the newest (default 0: no cap; the localizer "
                        "reads only the last few hundred steps of each node)")
    p.set_defaults(func=run)


UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def duration(text: str, flag: str) -> float:
    """Seconds of '7d', '36h', '90m', '600s' or a bare number of seconds."""
    t = text.strip().lower()
    num, unit = (t[:-1], t[-1]) if t and t[-1] in UNITS else (t, "s")
    try:
        v = float(num) * UNITS[unit]
    except ValueError:
        v = float("nan")
    if not v > 0 or v == float("inf"):
        raise UserError(f"{flag} '{text}' is not a duration", "give a positive number with s, m, h, d or w, e.g. 7d")
    return v


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UserError(f"--port {args.port} is not a TCP port", "give 1..65535")
    postgres = args.db.startswith(("postgresql://", "postgres://"))
    if not postgres and not Path(args.db).parent.exists():
        raise UserError(f"--db {args.db}: directory {Path(args.db).parent} does not exist", "create it first")
    for flag, v in (("--interval", args.interval), ("--job-ttl", args.job_ttl), ("--max-body", args.max_body),
                    ("--settle", args.settle)):
        if not v > 0:
            raise UserError(f"{flag} {v} must be positive", f"give {flag} a number above 0")
    retention = duration(args.retention, "--retention")
    if args.max_rows_per_job < 0:
        raise UserError(f"--max-rows-per-job {args.max_rows_per_job} is negative", "give 0 (no cap) or more")
    if not 1 <= args.workers <= 64:
        raise UserError(f"--workers {args.workers} is out of range", "give 1..64 (each worker is a process)")
    if not 1 <= args.confirm_rounds <= 10:
        raise UserError(f"--confirm-rounds {args.confirm_rounds} is out of range", "give 1..10 (default 2)")
    if args.notify and not args.notify.startswith(("http://", "https://")):
        raise UserError(f"--notify '{args.notify}' is not an http(s) URL", "give the Alertmanager or webhook URL")
    import uvicorn

    from laggard.service.app import create_app

    app = create_app(args.db, interval_s=args.interval, max_body=args.max_body, isolate=True,
                     notify_url=args.notify, external_url=args.external_url, ttl_s=args.job_ttl,
                     confirm_rounds=args.confirm_rounds, settle_s=args.settle, retention_s=retention,
                     max_rows_per_job=args.max_rows_per_job, workers=args.workers)
    where = args.db.split("@")[-1] if postgres else args.db  # never print a password
    emit(f"laggard serve: http://{args.host}:{args.port} (state in {where})", file=sys.stderr)
    # in-flight posts get 3 s to finish on SIGTERM; then the workers are killed (2 s to reap): the
    # whole stop stays well within 10 s on a loaded machine (a Kubernetes pod's grace period is 30)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=3)
    return 0
