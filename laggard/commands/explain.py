"""`laggard explain TRACE`: why the job is slow, how that was confirmed, and what to do about it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.inputs.errors import UserError
from collector.inputs.text import safe_text
from laggard.backends import MODES
from laggard.cliutil import add_format, emit, print_json, verb_parser

if TYPE_CHECKING:  # the heavy stages load only when the verb runs, so `laggard --help` stays fast
    from collector.trace.traceio import Trace
    from explain.actions.remediation import Proposal
    from explain.diagnose import Diagnosis
    from localize.verdict import Verdict


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "explain", "explain a verdict: cause, evidence, probes, remediation (LLM when configured)",
        "Localizes the trace (or reads --verdict), then reasons in three rounds — hypotheses from the\n"
        "knowledge base, critique and probe plan, probe results and attribution — kept as a Diagram of\n"
        "Thought. Probes are whitelisted read-only commands; remediation is only proposed unless you\n"
        "pass --approve (or --interactive and answer y). Every probe and action goes to the audit log.\n\n"
        "Probes (--probes): auto = a dry run that prints what would run; local = run on this machine;\n"
        "ssh = `ssh HOST -- argv`; virtual = the simulator's virtual cluster for a simulated trace\n"
        "(answers come from truth.json and are labelled simulated).\n"
        "LLM: set LAGGARD_LLM_BASE_URL and LAGGARD_LLM_MODEL (and LAGGARD_LLM_API_KEY) or a config\n"
        "file named by LAGGARD_LLM_CONFIG; without one, the deterministic reasoner runs.",
        "  laggard explain traces/gpu-straggler\n"
        "  laggard explain traces/gpu-straggler --probes virtual     # simulated probe answers\n"
        "  laggard explain /data/run7 --verdict verdict.json --probes ssh --format json\n"
        "  laggard explain /data/run7 --alert 'rank 12 on node-3 slow since 02:10' --probes local\n"
        "  laggard explain /tmp/t --approve --audit /var/log/laggard-audit.jsonl",
    )
    p.add_argument("trace", type=Path, help="trace directory (holds meta.json)")
    add_format(p)
    p.add_argument("--verdict", type=Path, help="verdict JSON from `laggard localize --format json` (skips localizing)")
    p.add_argument("--probes", choices=MODES, default="auto", help="where probes run (default auto)")
    p.add_argument("--ssh-user", help="user for --probes ssh")
    p.add_argument("--alert", default="", help=f"alert or chat text to extract keys from (at most {MAX_ALERT_BYTES >> 10} KiB); @FILE reads a file")
    p.add_argument("--approve", action="store_true", help="execute the proposed remediation (audited)")
    p.add_argument("--interactive", action="store_true", help="ask y/N for each proposed action")
    p.add_argument("--audit", type=Path, help="audit log (default $LAGGARD_AUDIT_LOG or ~/.local/state/laggard/audit.jsonl)")
    p.add_argument("--no-llm", action="store_true", help="use the deterministic reasoner even if an LLM is configured")
    p.add_argument("--dot", choices=("lines", "xml", "none"), default="lines", help="how to print the Diagram of Thought (text format)")
    p.set_defaults(func=run)


MAX_ALERT_BYTES = 64 << 10  # an alert or a chat thread is a few KiB; more is a whole log pasted by mistake


def read_alert(arg: str) -> str:
    """The --alert text, inline or from @FILE (a regular file), within MAX_ALERT_BYTES; bytes that are
    not UTF-8 are replaced, since an alert is only searched for keys."""
    if not arg.startswith("@"):
        data = arg.encode(errors="replace")
    else:
        from collector.inputs.safeio import check_regular

        path = Path(arg[1:])
        if not path.exists():
            raise UserError(f"--alert {arg[:80]}: no such file", "pass text, or @FILE with the alert text")
        check_regular(path)
        with path.open("rb") as fh:
            data = fh.read(MAX_ALERT_BYTES + 1)
    if len(data) > MAX_ALERT_BYTES:
        raise UserError(f"--alert: over {MAX_ALERT_BYTES} bytes", "pass the alert itself, not a whole log "
                        "(the trace's logs/ are read anyway)")
    return data.decode(errors="replace")


def load_verdict(args: argparse.Namespace, trace: Trace) -> Verdict:
    from localize.verdict import Verdict

    if args.verdict:
        from collector.inputs.limits import limits
        from collector.inputs.safeio import load_json, read_regular

        if not args.verdict.exists():
            raise UserError(f"--verdict {args.verdict}: no such file", "write one with `laggard localize TRACE --format json`")
        raw = load_json(read_regular(args.verdict, limits().meta_bytes, "meta_bytes"), args.verdict)
        try:
            verdict = Verdict.from_dict(raw)
            _check_verdict(verdict)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"--verdict {args.verdict}: not a verdict ({type(exc).__name__}: {str(exc)[:120]})",
                            "use `laggard localize --format json` output") from exc
        return verdict
    try:
        from localize.combine import localize_trace  # type: ignore[import-not-found]
    except ImportError:
        raise UserError("no localizer in this build", "pass --verdict FILE from `laggard localize --format json`") from None
    from explain.reasoning.tie import MAX_TIE_LISTED, complete, unlisted

    verdict = localize_trace(trace, None)
    if unlisted(verdict):  # a tie wider than the verdict's top: list its devices, so probes can decide among them
        verdict = complete(verdict, localize_trace(trace, None, top=len(verdict.candidates) + MAX_TIE_LISTED))
    return verdict  # type: ignore[no-any-return]


def _check_verdict(v: Verdict) -> None:
    """Types and ranges the diagnosis relies on (ValueError/TypeError name the first that is off)."""
    import math

    if v.status not in ("healthy", "irregular", "hang") or not isinstance(v.job, str):
        raise ValueError(f"status {str(v.status)[:20]!r} / job must be healthy|irregular|hang / a string")
    if not math.isfinite(float(v.slowdown)) or not all(isinstance(s, int) and not isinstance(s, bool) for s in v.irregular_steps):
        raise ValueError("slowdown must be finite and irregular_steps integers")
    for c in v.candidates:
        if not isinstance(c.kind, str) or not math.isfinite(float(c.score)):
            raise ValueError("candidate kind must be a string and score finite")
        for name in ("rank", "gpu", "tie"):
            val = getattr(c, name)
            if val is not None and (isinstance(val, bool) or not isinstance(val, int)):
                raise TypeError(f"candidate {name} {str(val)[:20]!r} is not an integer")
        if (c.host is not None and not isinstance(c.host, str)) or not isinstance(c.hosts or [], list):
            raise TypeError("candidate host must be a string and hosts a list")


def ask(prop: Proposal) -> bool:
    cmds = "; ".join(" ".join(a) for a in prop.argvs)
    sys.stderr.write(safe_text(f"run {prop.action} ({prop.why})?\n  {cmds}\n[y/N] "))
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def run(args: argparse.Namespace) -> int:
    from collector.trace.traceio import Trace
    from explain.actions.remediation import AuditLog
    from explain.diagnose import diagnose
    from explain.reasoning.llm import LLMConfig, OpenAIChat
    from laggard.backends import choose_backend

    trace = Trace.open(args.trace)
    verdict = load_verdict(args, trace)
    alert = read_alert(args.alert)
    backend = choose_backend(args.trace, args.probes, args.ssh_user)
    cfg = None if args.no_llm else LLMConfig.from_env()
    llm = OpenAIChat(cfg) if cfg else None
    approver = ask if args.interactive and sys.stdin.isatty() else None
    if args.interactive and approver is None:
        raise UserError("--interactive needs a terminal on stdin", "use --approve to execute without asking")
    diag = diagnose(trace, verdict, approve=args.approve, llm=llm, backend=backend, alert=alert,
                    audit=AuditLog(args.audit) if args.audit else None, approver=approver)
    if args.format == "json":
        print_json(diag.to_dict())
    else:
        print_text(diag, verdict, args.dot)
    return 0


def print_text(d: Diagnosis, v: Verdict, dot: str) -> None:
    from explain.story import Story

    probes = f"{d.backend}, simulated" if d.simulated else d.backend
    emit(f"{Story.of(v).status_line()}   [engine {d.engine}, probes {probes}]")
    if d.cause is None:
        emit("cause: none attributed" + (" (the job is healthy)" if d.status == "healthy" else ""))
    else:
        how = d.confirmation if d.confirmed else "NOT confirmed by a probe"
        emit(f"cause: {d.cause['title']} [{d.cause['category']}] {d.cause_line()} — confidence {d.confidence:.2f}, {how}")
        emit(f"  {d.cause['text']}")
    if d.claims:
        emit("why:")
        for c in d.claims:
            emit(f"  - {c['text']} [{', '.join(c['evidence'])}]")
    emit("evidence:")
    for e in d.evidence:
        emit(f"  {e['id']:4} {e['text']}")
    emit(f"probes run ({len(d.probes)}" + (", simulated: answered by the virtual cluster from truth.json):"
                                            if d.simulated else "):"))
    for pr in d.probes:
        args = " ".join(f"{k}={v}" for k, v in pr["args"].items())
        found = f" ({', '.join(pr['findings'])})" if pr["findings"] else ""
        emit(f"  {pr['id']:4} {pr['probe']} on {pr['host']} {args} -> {pr['outcome']}{found}: {pr['summary']}")
        emit(f"       $ {' '.join(pr['argv'])}")
    for r in d.rejected:
        emit(f"  rejected: {r['probe']} on {r['host']}: {r['reason']}")
    if d.remediation:
        pending = any(r["status"] == "proposed" for r in d.remediation)
        emit("remediation" + (" (proposed; run again with --approve or --interactive to execute):" if pending else ":"))
        for r in d.remediation:
            cmd = "; ".join(" ".join(a) for a in r["argvs"]) or "(no command: hand over)"
            emit(f"  - [{r['status']}] {r['action']}: {r['why']}\n       $ {cmd}")
    for f in d.flags:
        emit(f"flag: {f}")
    if dot == "xml":
        emit(d.dot_xml)
    elif dot == "lines":
        emit("diagram of thought:")
        for n in d.dot["nodes"]:
            text = next((s["value"] for s in n["sections"] if s["kind"] == "text"), "")
            cites = [s["ref"] for s in n["sections"] if s["kind"] == "cite"]
            emit(f"  r{n['round']} {n['id']:4} {n['type']:12} {text[:110]}" + (f" [{', '.join(cites)}]" if cites else ""))
