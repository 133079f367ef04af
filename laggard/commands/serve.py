"""`laggard serve`: the always-on service next to the cluster (FastAPI + uvicorn)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from collector.errors import UserError
from laggard.cliutil import verb_parser


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "serve", "run the service: ingest sidecar summaries, localize, serve metrics and reports",
        "Sidecars POST abnormal-operator summaries to /v1/summaries; every --interval seconds each job\n"
        "with new summaries is localized again. Prometheus scrapes /metrics; the latest report of a job\n"
        "is at /v1/jobs/JOB/report (html, ?format=md or json). State lives in the SQLite --db file and\n"
        "survives restarts.",
        "  laggard serve --port 8750 --db /var/lib/laggard/state.db\n"
        "  curl -s localhost:8750/metrics | grep laggard_job_slowdown\n"
        "  curl -s 'localhost:8750/v1/jobs/llama-70b-run7/report?format=md'",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8750, help="port (default 8750)")
    p.add_argument("--db", type=Path, default=Path("laggard-state.db"), help="SQLite state file")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between localization rounds")
    p.add_argument("--max-body", type=int, default=4 << 20, help="largest accepted post, bytes")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise UserError(f"--port {args.port} is not a TCP port", "give 1..65535")
    if not args.db.parent.exists():
        raise UserError(f"--db {args.db}: directory {args.db.parent} does not exist", "create it first")
    import uvicorn

    from laggard.service.app import create_app

    app = create_app(args.db, interval_s=args.interval, max_body=args.max_body, isolate=True)
    print(f"laggard serve: http://{args.host}:{args.port} (state in {args.db})", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
