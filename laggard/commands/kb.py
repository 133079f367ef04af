"""`laggard kb list|show|lint`: browse and check the knowledge base (shipped + LAGGARD_KB_PATH dirs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from collector.inputs.errors import UserError
from explain.knowledge import ENV_PATH, load_kb, search_path
from laggard.cliutil import add_format, emit, print_json, verb_parser


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "kb", "list, show or lint the diagnosis knowledge base",
        "The knowledge base maps evidence patterns to causes, probes and remediation. Entries ship in\n"
        f"explain/kb/; add your own YAML files in directories listed in ${ENV_PATH} (':'-separated)\n"
        "or with --dir; an entry with the id of a shipped one replaces it.",
        "  laggard kb list\n  laggard kb list --category nic\n  laggard kb show gpu-thermal-throttle\n"
        "  LAGGARD_KB_PATH=./site-kb laggard kb lint",
    )
    p.add_argument("--dir", type=Path, action="append", default=[], help="extra knowledge-base directory (repeatable)")
    kbsub = p.add_subparsers(dest="kb_cmd", metavar="CMD", required=True)
    pl = kbsub.add_parser("list", help="one line per entry")
    pl.add_argument("--category", help="only entries of this category")
    add_format(pl)
    ps = kbsub.add_parser("show", help="one entry in full")
    ps.add_argument("entry", help="entry id (see `laggard kb list`)")
    add_format(ps)
    pn = kbsub.add_parser("lint", help="validate every entry; exit 2 on problems")
    add_format(pn)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for d in args.dir:
        if not d.exists():
            raise UserError(f"--dir {d}: no such directory", "pass a directory of *.yaml entries")
    kb = load_kb(search_path(args.dir))
    if args.kb_cmd == "list":
        entries = [e for e in kb if not args.category or e.category == args.category]
        if args.format == "json":
            print_json([{"id": e.id, "title": e.title, "category": e.category, "pattern": e.pattern} for e in entries])
        else:
            for e in entries:
                emit(f"{e.id:34} {e.category:8} {e.pattern:18} {e.title}")
            emit(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}", file=sys.stderr)
        return 0
    if args.kb_cmd == "show":
        e = kb.get(args.entry)
        if args.format == "json":
            print_json(e.to_dict())
            return 0
        emit(f"{e.id}: {e.title}  [{e.category}, {e.pattern}, from {e.source}]")
        emit(f"\ncause: {e.cause}\n\nmatches verdict kinds: {', '.join(e.verdict_kinds)}")
        emit(f"keywords: {', '.join(e.keywords)}")
        if e.log_patterns:
            emit(f"log patterns: {'  '.join(e.log_patterns)}")
        emit(f"probes: {', '.join(e.probes) or '-'}   confirmed by: {', '.join(e.confirmed_by) or '-'}")
        emit("remediation:")
        for r in e.remediation:
            emit(f"  - {r.action}: {r.why}")
        emit("references:")
        for ref in e.references:
            emit(f"  - {ref}")
        return 0
    # lint
    if args.format == "json":
        print_json({"entries": len(kb), "problems": kb.problems})
    else:
        for prob in kb.problems:
            emit(prob, file=sys.stderr)
        emit(f"{len(kb)} entries, {len(kb.problems)} problem(s)")
    return 2 if kb.problems else 0
