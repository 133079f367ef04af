"""`laggard sidecar run|localize TRACE`: node-local detection, then central progressive localization."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from laggard.cliutil import Formatter, add_format, emit, print_json, verb_parser
from laggard.cluster import add_cluster_args


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "sidecar", "node-local operator detection and progressive central localization",
        "run: on a node, read that node's CommOps shards (written by collector.commops) window by\n"
        "  window, flag abnormal operators against their own history and write a compact summary\n"
        "  to TRACE/summary/ (localize/summary's format). --follow keeps going while the job runs.\n"
        "localize: centrally, check for a hang, then localize from the summaries, fetching full\n"
        "  records only for the ranks and steps they point at; prints a verdict and the bytes moved.\n"
        "run --follow --post URL: the node agent of `laggard serve`: it waits for the\n"
        "  job's ranks on this host, posts each new run of finished steps, keeps unsent posts in a\n"
        "  bounded spool (replayed when the service is back), answers the service's requests for full\n"
        "  records, and exits once the job has ended.",
        "  laggard sidecar run /data/run7 --follow --post http://laggard:8750   # the node agent\n"
        "  laggard sidecar run /data/run7 --host node-3 --follow\n"
        "  laggard sidecar run /data/run7 --all-hosts          # every host, once (tests, replays)\n"
        "  laggard sidecar localize /data/run7 --format json\n"
        "  laggard sidecar localize /data/run7 --cluster local   # fetches as Dask tasks",
    )
    verbs = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    run_p = verbs.add_parser("run", help="summarize this node's shards", formatter_class=Formatter)
    run_p.add_argument("trace", type=Path, help="the CommOps logger's directory (shared or node-local)")
    who = run_p.add_mutually_exclusive_group()
    who.add_argument("--host", default=None,
                     help="host whose ranks to read (default: this node's name as the logger wrote it: "
                          "LAGGARD_HOST, SLURMD_NODENAME, NODE_NAME, else the hostname)")
    who.add_argument("--all-hosts", action="store_true", help="summarize every host in meta.json, one after another")
    run_p.add_argument("--window", type=int, default=20, help="steps per detection window (default 20)")
    run_p.add_argument("--follow", action="store_true", help="keep summarizing while the job writes shards")
    run_p.add_argument("--poll", type=float, default=5.0, help="seconds between looks in --follow (default 5)")
    run_p.add_argument("--idle-exit", type=float, default=60.0,
                       help="--follow stops after this many seconds without new shards (default 60)")
    run_p.add_argument("--post", metavar="URL", help="post summaries to `laggard serve` at URL (the node agent)")
    run_p.add_argument("--spool", type=Path, default=None,
                       help="with --post: where unsent posts wait (default TRACE/spool/HOST, or $LAGGARD_SPOOL)")
    run_p.add_argument("--spool-max-mb", type=float, default=64.0,
                       help="with --post: spool bound; beyond it the oldest posts are dropped (default 64)")
    run_p.add_argument("--wait", type=float, default=3600.0,
                       help="--follow: seconds to wait for the job to appear (default 3600)")
    run_p.add_argument("--linger", type=float, default=20.0,
                       help="with --post: seconds to keep answering fetch requests after the job ended (default 20)")
    run_p.add_argument("--hang-after", type=float, default=30.0,
                       help="with --post: an operator in flight this many seconds (or failed) is reported as stuck, "
                            "so the service can say which rank and operator hang (default 30)")
    run_p.set_defaults(func=run)
    loc = verbs.add_parser("localize", help="central localization from summaries", formatter_class=Formatter)
    loc.add_argument("trace", type=Path)
    loc.add_argument("--top", type=int, default=5, help="candidates to report (default 5)")
    add_format(loc)
    add_cluster_args(loc, summary_first=False)
    loc.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from collector.commops.launcher import host_of
    from collector.trace.meta import JobMeta
    from laggard.sidecar import central_localize, follow_node, summarize_node, wait_for_meta

    if args.action == "run":
        _positive((("--poll", args.poll), ("--window", args.window)))
    if args.action == "run" and args.post:
        return _agent(args)
    if args.action == "run":
        if args.follow:  # started beside the job: its logger may not have written anything yet
            wait_for_meta(args.trace, args.wait, args.poll)
        meta = JobMeta.load(args.trace / "meta.json")
        hosts = meta.hosts() if args.all_hosts else [args.host or host_of(os.environ)[0]]
        for h in hosts:
            if args.follow:
                n = follow_node(args.trace, h, args.window, args.poll, args.idle_exit)
            else:
                n = len(summarize_node(args.trace, h, args.window, final=True))
            emit(f"{h}: {n} window summary(ies) in {args.trace / 'summary'}")
        return 0
    if args.cluster:
        from laggard.cluster import open_cluster
        from localize.distributed import Source, fetcher

        src = Source.open(args.trace)
        with open_cluster(args.cluster, args.workers, args.worker_memory) as cluster:
            verdict, mv = central_localize(args.trace, top=args.top, fetch=fetcher(src, cluster))
    else:
        verdict, mv = central_localize(args.trace, top=args.top)
    if args.format == "json":
        print_json(verdict.to_dict())
        return 0
    d = mv.to_dict()
    emit(f"{verdict.job}: {verdict.status}" + (f", steps {verdict.irregular_steps[0]}..{verdict.irregular_steps[-1]}, "
         f"slowdown {verdict.slowdown:.2f}x" if verdict.irregular_steps else ""))
    for i, c in enumerate(verdict.candidates, 1):
        emit(f"  {i}. {c.device()}  score {c.score:.2f}")
        for e in c.evidence:
            emit(f"       - {e}")
    emit(f"  moved {d['moved_bytes']:,} B (summaries {d['summary_bytes']:,} + fetched {d['fetched_bytes']:,}) "
         f"of {d['full_bytes']:,} B of full logs: {d['reduction']:.1%} less")
    return 0


def _agent(args: argparse.Namespace) -> int:
    from collector.commops.launcher import host_of
    from collector.inputs.errors import UserError
    from laggard.agent import Agent, default_spool

    if not args.post.startswith(("http://", "https://")):
        raise UserError(f"--post '{args.post}' is not an http(s) URL", "give the service, e.g. http://laggard:8750")
    if not args.follow or args.all_hosts:
        raise UserError("--post runs the node agent of one host", "use it with --follow and without --all-hosts")
    _positive((("--spool-max-mb", args.spool_max_mb), ("--hang-after", args.hang_after)))
    host = args.host or host_of(os.environ)[0]  # the logger's rule: $LAGGARD_HOST, $SLURMD_NODENAME, ..., hostname
    agent = Agent(args.trace, host, args.post, args.spool or default_spool(args.trace, host),
                  int(args.spool_max_mb * (1 << 20)), args.window, hang_after_s=args.hang_after)
    n = agent.run(args.poll, args.wait, args.idle_exit, args.linger)
    emit(f"{host}: {n} summary(ies) posted, {agent.answered} fetch request(s) answered, "
         f"{agent.spool.dropped} dropped, {agent.refused} refused")
    return 0


def _positive(flags: tuple[tuple[str, float], ...]) -> None:
    """Refuse a flag that must be above 0 (a zero window or a negative poll would crash the loop)."""
    from collector.inputs.errors import UserError

    for flag, v in flags:
        if not v > 0:
            raise UserError(f"{flag} {v} must be positive", f"give {flag} a number above 0")
