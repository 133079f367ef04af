"""diagnose(): turn a verdict into a diagnosis through three self-play rounds, probes and approval.

Round 1 extracts keys and evidence and proposes hypotheses from the knowledge base; round 2
critiques them and plans probes; round 3 runs the probes (stopping at the first confirmation)
and attributes the cause. The same loop serves the deterministic reasoner and an LLM; whatever
the LLM says is validated against the evidence, the whitelist and the inventory before it is
used, and every probe and remediation step is written to the audit log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from collector.trace.traceio import Trace
from explain.actions.backends import LocalBackend, ProbeBackend
from explain.actions.inventory import Inventory, InventoryError
from explain.actions.probes import CATALOG, ProbeRejected, ProbeResult, build_call, interpret
from explain.actions.remediation import AuditLog, Proposal, apply, build_proposal
from explain.knowledge import KnowledgeBase, load_kb
from explain.reasoning.dot import DiagramOfThought
from explain.reasoning.evidence import (
    EvidenceItem,
    alert_evidence,
    clip,
    log_evidence,
    valid_citation,
    verdict_evidence,
)
from explain.reasoning.extract import Keys, extract_keys
from explain.reasoning.llm import (
    SCHEMA_ATTRIBUTE,
    SCHEMA_CRITIQUE,
    SCHEMA_PROPOSE,
    SYSTEM,
    ChatModel,
    check,
    render_evidence,
    schema_attribute,
    schema_critique,
    schema_propose,
)
from explain.reasoning.reasoner import (
    Attribution,
    DeterministicReasoner,
    Hypothesis,
    PlannedProbe,
    attribute,
    confirming,
    fits_verdict,
    focus,
    settle_tie,
)
from explain.reasoning.tie import tie_of
from explain.retrieval import Retriever
from explain.story import Story
from localize.verdict import Candidate, Verdict

Approver = Callable[[Proposal], bool]


@dataclass
class Diagnosis:
    job: str
    status: str
    engine: str
    cause: dict[str, Any] | None
    confidence: float
    confirmed: bool
    device: str | None
    keys: dict[str, Any]
    evidence: list[dict[str, Any]]
    hypotheses: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    probes: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    remediation: list[dict[str, Any]]
    dot: dict[str, Any]
    dot_xml: str
    flags: list[str] = field(default_factory=list)
    backend: str = ""
    elapsed_s: float = 0.0
    simulated: bool = False  # probes answered by the simulator's virtual cluster (from truth.json), not a machine
    llm_rounds: list[int] = field(default_factory=list)  # rounds whose LLM reply was used (the rest: deterministic)
    story: dict[str, Any] = field(default_factory=dict)  # explain.story: the status line every surface shares
    tie: dict[str, Any] | None = None  # explain.reasoning.tie: the first candidate's tie and whether a probe decided it

    @property
    def confirmation(self) -> str:
        """How the cause was checked, in words every surface uses ("simulated" when no machine answered)."""
        if not self.confirmed:
            return "not confirmed by a probe"
        return "confirmed by simulated probes (virtual cluster)" if self.simulated else "confirmed by probes"

    @property
    def category(self) -> str | None:
        return self.cause["category"] if self.cause else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job, "status": self.status, "engine": self.engine, "backend": self.backend,
            "cause": self.cause, "category": self.category, "confidence": self.confidence,
            "confirmed": self.confirmed, "device": self.device, "keys": self.keys, "evidence": self.evidence,
            "hypotheses": self.hypotheses, "claims": self.claims, "probes": self.probes, "rejected": self.rejected,
            "remediation": self.remediation, "flags": self.flags, "dot": self.dot, "dot_xml": self.dot_xml,
            "elapsed_s": round(self.elapsed_s, 3), "simulated": self.simulated, "confirmation": self.confirmation,
            "llm_rounds": self.llm_rounds, "story": self.story, "tie": self.tie,
        }

    def cause_line(self) -> str:
        """Where the cause is, in words: the device, the device a probe picked out of a tie, or the tie itself."""
        tie = self.tie
        if tie and tie["decided"]:
            return f"on {self.device} ({tie['decision']})"
        if tie:
            return f"— {tie['words']} (none confirmed by a probe; they cannot be told apart)"
        return f"on {self.device}" if self.device else ""


@dataclass
class Context:
    """Everything the rounds share for one diagnosis."""

    kb: KnowledgeBase
    retriever: Retriever
    verdict: Verdict
    inventory: Inventory
    evidence: list[EvidenceItem]
    dot: DiagramOfThought
    backend: ProbeBackend
    audit: AuditLog
    flags: list[str] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    results: list[ProbeResult] = field(default_factory=list)
    llm_rounds: list[int] = field(default_factory=list)  # rounds in which the LLM's reply was used

    def known_ids(self) -> set[str]:
        return {e.id for e in self.evidence}


_SHARED: dict[str, Any] = {}


def shared_kb() -> tuple[KnowledgeBase, Retriever]:
    """Load the KB and fit the retriever once per process (the eval runs many diagnoses)."""
    if "kb" not in _SHARED:
        from explain.retrieval import load_dense_encoder

        kb = load_kb()
        _SHARED["kb"] = kb
        _SHARED["retriever"] = Retriever(kb, load_dense_encoder())
    return _SHARED["kb"], _SHARED["retriever"]


def diagnose(trace: Trace, verdict: Verdict, approve: bool = False, llm: ChatModel | None = None, *,
             backend: ProbeBackend | None = None, alert: str = "", audit: AuditLog | None = None,
             approver: Approver | None = None, kb: KnowledgeBase | None = None,
             retriever: Retriever | None = None, probe_timeout: float = 15.0) -> Diagnosis:
    """Explain a verdict. Probes run on `backend` (default: local dry run, nothing executes);
    remediation runs only if `approve` is True or `approver` says yes for that action."""
    t0 = time.perf_counter()
    if kb is None or retriever is None:
        kb, retriever = shared_kb()
    try:
        inv = Inventory.from_meta(trace.meta)
    except InventoryError as exc:  # refused before anything runs, and on record
        (audit or AuditLog()).append("inventory.refused", job=verdict.job, reason=str(exc))
        raise
    evidence = verdict_evidence(verdict)
    evidence += log_evidence(trace.log_files(), kb)
    evidence += alert_evidence(alert, kb)
    ctx = Context(kb, retriever, verdict, inv, evidence, DiagramOfThought(verdict.job),
                  backend or LocalBackend(dry_run=True), audit or AuditLog())
    keys = round1_keys(ctx, alert, trace)
    det = DeterministicReasoner(kb, retriever)

    def author(rnd: int) -> str:
        """Who wrote a round's nodes: the LLM only when its reply for that round was kept."""
        return llm.name if llm is not None and rnd in ctx.llm_rounds else det.name
    simulated = bool(getattr(ctx.backend, "simulated", False))

    # round 1: observation and hypotheses
    obs = ctx.dot.add("proposition", 1, text=f"{verdict.status}: " + evidence[0].text,
                      numbers={"slowdown": (verdict.slowdown, "x"), "irregular_steps": (len(verdict.irregular_steps), "steps")},
                      cites=[e.id for e in evidence if e.source in ("verdict", "candidate")][:3])
    hyps = det.propose(verdict, evidence)
    if llm is not None:
        hyps = llm_propose(ctx, llm, hyps, keys)
    hyp_nodes = {}
    for h in hyps:
        hyp_nodes[h.entry.id] = ctx.dot.add("proposition", 1, (obs,), text=f"{h.entry.title}: {h.why}",
                                            numbers={"score": (h.score, "")}, rules=[f"signature {h.entry.pattern}"],
                                            cites=h.cites, author=author(1))

    # round 2: critique and plan
    critiques, plan = det.plan(verdict, hyps, inv)
    if llm is not None:
        critiques, plan = llm_critique(ctx, llm, hyps, critiques, plan)
    crit_nodes = {}
    for h, text in critiques:
        planned = [p for p in plan if p.for_entry == h.entry.id]
        crit_nodes[h.entry.id] = ctx.dot.add(
            "critique", 2, (hyp_nodes[h.entry.id],), text=text, rules=[f"confirmed_by: {', '.join(h.entry.confirmed_by) or '-'}"],
            code=[" ".join(_argv(p, inv)) for p in planned if _argv(p, inv)], author=author(2))

    tie = tie_of(verdict, inv)
    if tie is not None and (note := tie.coverage_note()):
        ctx.flags.append(f"{tie.label()}: {note}")

    # round 3: probe, stop at the first confirmation, attribute
    run_plan(ctx, plan, hyps, crit_nodes, probe_timeout)
    att = attribute(kb, verdict, hyps, ctx.results)
    if llm is not None:
        att = llm_attribute(ctx, llm, hyps, att)
    att = settle_tie(att, verdict, ctx.results, inv)  # either engine: a tie is decided by a probe or said
    cand = focus(verdict)
    device = cand.device() if cand else None
    if att.tie is not None:
        device = att.tie.device()
        where = (f" on {device} ({att.tie.decision()})" if device
                 else f"; {att.tie.tie.label()}, no device chosen")
    else:
        where = ""
    parents = tuple(ctx.dot.nodes("verification")) or tuple(crit_nodes.values()) or (obs,)
    final = ctx.dot.add("refinement", 3, parents,
                        text=(f"cause: {att.entry.title} ({att.entry.category}){where}" if att.entry else "no cause attributed")
                        + ("; not confirmed by a probe" if not att.confirmed
                           else "; confirmed by simulated probes" if simulated else "; confirmed by probes"),
                        numbers={"confidence": (att.confidence, "")}, rules=[att.entry.cause] if att.entry else [],
                        cites=sorted({c for _, cs in att.claims for c in cs}), author=author(3))
    proposals = remediate(ctx, att, approve, approver, final)
    claims = [{"text": t, "evidence": c} for t, c in att.claims]
    return Diagnosis(
        job=verdict.job, status=verdict.status, engine=engine_name(det.name, llm, ctx.llm_rounds),
        cause=({"entry": att.entry.id, "title": att.entry.title, "category": att.entry.category,
                "text": att.entry.cause, "references": list(att.entry.references)} if att.entry else None),
        confidence=att.confidence, confirmed=att.confirmed, device=device,
        keys=keys.to_dict(), evidence=[e.to_dict() for e in ctx.evidence],
        hypotheses=[{"entry": h.entry.id, "title": h.entry.title, "score": h.score, "why": h.why} for h in hyps],
        claims=claims, probes=[r.to_dict() for r in ctx.results], rejected=ctx.rejected,
        remediation=[p.to_dict() for p in proposals], dot=ctx.dot.to_dict(), dot_xml=ctx.dot.to_xml(),
        flags=ctx.flags, backend=ctx.backend.name, elapsed_s=time.perf_counter() - t0, simulated=simulated,
        llm_rounds=list(ctx.llm_rounds), story=Story.of(verdict).to_dict(),
        tie=att.tie.to_dict() if att.tie is not None else None,
    )


def engine_name(deterministic: str, llm: ChatModel | None, used: Sequence[int]) -> str:
    """The engine that actually decided: the LLM only for the rounds whose reply was kept."""
    if llm is None:
        return deterministic
    kept = sorted(set(used))
    if not kept:
        return f"{deterministic} (every {llm.name} reply discarded)"
    if len(kept) == 3:
        return llm.name
    rest = [r for r in (1, 2, 3) if r not in kept]
    return f"{llm.name} ({_rounds(kept)}) + {deterministic} ({_rounds(rest)})"


def _rounds(rs: list[int]) -> str:
    if len(rs) == 1:
        return f"round {rs[0]}"
    contiguous = rs == list(range(rs[0], rs[-1] + 1))
    return f"rounds {rs[0]}-{rs[-1]}" if contiguous else "rounds " + ", ".join(map(str, rs))


def _argv(p: PlannedProbe, inv: Inventory) -> list[str]:
    try:
        return build_call(p.name, p.host, p.args, inv).argv
    except ProbeRejected:
        return []


def round1_keys(ctx: Context, alert: str, trace: Trace) -> Keys:
    """Keys from the alert, the log lines found and the verdict's devices."""
    text = "\n".join([alert] + [e.text for e in ctx.evidence if e.source in ("log", "alert")])
    keys = extract_keys(text, ctx.inventory.hosts)
    for c in ctx.verdict.candidates[:3]:
        extra = Keys(hosts=[h for h in [c.host, *(c.hosts or [])] if h], ranks=[c.rank] if c.rank is not None else [])
        keys = keys.merge(extra)
    return keys


def run_plan(ctx: Context, plan: Sequence[PlannedProbe], hyps: Sequence[Hypothesis], crit_nodes: dict[str, str],
             timeout: float) -> None:
    """Run planned probes in order through the backend; stop once one confirms a hypothesis."""
    cand = focus(ctx.verdict)
    tie = tie_of(ctx.verdict, ctx.inventory)
    kinds = ({cand.kind} if cand else set()) | ({c.kind for c in tie.members} if tie else set())
    wanted = {h.entry.id for h in hyps} | {e.id for k in kinds for e in ctx.kb.by_kind(k)} if cand else set()
    unreachable: set[str] = set()
    for p in plan:
        if p.host in unreachable:
            continue
        try:
            call = build_call(p.name, p.host, p.args, ctx.inventory)
        except ProbeRejected as exc:
            ctx.rejected.append({"probe": p.name, "host": p.host, "args": p.args, "reason": str(exc)})
            ctx.flags.append(f"probe request rejected: {exc}")
            ctx.audit.append("probe.rejected", job=ctx.verdict.job, probe=p.name, host=str(p.host), reason=str(exc))
            continue
        rc, out = ctx.backend.run(call.host, call.argv, timeout)
        res = interpret(call, rc, out, f"P{len(ctx.results) + 1}")
        if rc >= 0 and getattr(ctx.backend, "simulated", False):
            res.summary = f"simulated: {res.summary}"  # answered from truth.json, not observed on a machine
        ctx.results.append(res)
        ctx.audit.append("probe.run", job=ctx.verdict.job, probe=call.name, host=call.host, argv=call.argv,
                         rc=rc, outcome=res.outcome, findings=res.findings, backend=ctx.backend.name)
        if res.outcome == "unreachable":
            unreachable.add(call.host)
            ctx.flags.append(f"{res.summary}; {call.host} could not be probed, which confirms nothing and rules out nothing")
        elif res.outcome == "error":
            ctx.flags.append(f"probe {call.name} on {call.host} failed: {res.summary}; it confirms nothing")
        ctx.evidence.append(EvidenceItem(res.id, "probe", f"{call.name} on {call.host}: {res.summary}", host=call.host))
        parent = crit_nodes.get(p.for_entry)
        ctx.dot.add("verification", 3, (parent,) if parent else (), text=f"{call.name} on {call.host}: {res.summary}",
                    code=[" ".join(call.argv)], numbers={"exit_code": (rc, "")}, cites=[res.id],
                    rules=[f"outcome: {res.outcome}", f"findings: {', '.join(res.findings) or 'none'}"])
        if set(confirming(ctx.kb, [res])) & wanted:
            break


def remediate(ctx: Context, att: Attribution, approve: bool, approver: Approver | None, final: str) -> list[Proposal]:
    if att.entry is None:
        return []
    cand = blamed(ctx, att)
    target: dict[str, Any] = {}
    if cand is not None:
        host = cand.host or (cand.hosts[0] if cand.hosts else None)
        if att.tie is not None and cand.kind == "link":
            host = att.tie.host  # a link picked out of a tie: the end its probe found the fault on
        target = {"host": host, "gpu": cand.gpu}
    props = [p for r in att.entry.remediation
             if (p := build_proposal(r.action, r.why, target, ctx.inventory, att.entry.id)) is not None]
    why_not = actionable(ctx, att)
    if why_not:
        held = [p for p in props if p.argvs]
        props = [p for p in props if not p.argvs]
        if held:
            ctx.flags.append(f"remediation not offered ({', '.join(p.action for p in held)}): {why_not}")
            ctx.audit.append("remediation.withheld", job=ctx.verdict.job, cause=att.entry.id,
                             actions=[p.action for p in held], reason=why_not)
    decide = approver or ((lambda _p: True) if approve else None)
    apply(props, ctx.backend, ctx.audit, decide, ctx.verdict.job)
    if any(p.status == "executed" for p in props) and att.supported_by:
        recheck(ctx, att, final)
    return props


def blamed(ctx: Context, att: Attribution) -> Candidate | None:
    """The device a command may target: the verdict's first candidate, or, when it is tied, the tied
    device a probe decided on (None while the tie stands: no device was chosen)."""
    if att.tie is not None:
        return att.tie.decided[0] if att.tie.decided else None
    return focus(ctx.verdict)


def actionable(ctx: Context, att: Attribution) -> str | None:
    """Why a cause may not lead to a command, or None: it must be confirmed by a probe that
    answered (ok/abnormal) on the blamed device, and proposed by the localizer, not by log text."""
    if not att.confirmed or not att.supported_by:
        return "the cause was not confirmed by a successful probe"
    by_id = {r.id: r for r in ctx.results}
    support = [by_id[i] for i in att.supported_by if i in by_id]
    if not support or not all(r.outcome == "abnormal" for r in support):
        return "the cause was not confirmed by a successful probe"
    if att.entry is not None and not fits_verdict(ctx.verdict, att.entry):
        return (f"'{att.entry.title}' was suggested by log or alert text, not by the localizer's verdict; "
                "log text may propose a cause, never confirm one")
    if att.tie is not None and not att.tie.decided:
        return f"{att.tie.tie.label()}: no probe decided which of the tied devices is at fault"
    cand = blamed(ctx, att)
    host = cand.host or (cand.hosts[0] if cand and cand.hosts else None) if cand else None
    if host is not None and not any(r.host == host or (cand and r.host in (cand.hosts or [])) for r in support):
        return f"the confirming probe ran on {support[0].host}, not on the blamed {host}"
    return None


def recheck(ctx: Context, att: Attribution, parent: str) -> None:
    """After an executed remediation, re-run the probe that confirmed the cause and record the outcome."""
    first = next(r for r in ctx.results if r.id == att.supported_by[0])
    call = build_call(first.name, first.host, first.args, ctx.inventory)
    rc, out = ctx.backend.run(call.host, call.argv, 15.0)
    res = interpret(call, rc, out, f"P{len(ctx.results) + 1}")
    if getattr(ctx.backend, "simulated", False):
        res.summary = f"simulated: {res.summary}"
    ctx.results.append(res)
    ctx.audit.append("probe.run", job=ctx.verdict.job, probe=call.name, host=call.host, argv=call.argv, rc=rc,
                     outcome=res.outcome, findings=res.findings, backend=ctx.backend.name, purpose="verify remediation")
    cleared = att.entry is not None and res.answered and not set(res.findings) & set(att.entry.confirmed_by)
    ctx.evidence.append(EvidenceItem(res.id, "probe", f"re-check {call.name} on {call.host}: {res.summary}", host=call.host))
    said = ("remediation verified: " if cleared else "remediation did not clear the fault: " if res.answered
            else "remediation could not be verified: ")
    ctx.dot.add("verification", 3, (parent,), text=said
                + res.summary, code=[" ".join(call.argv)], cites=[res.id])


# ---------------------------------------------------------------- LLM rounds (validated)

def _offered(ctx: Context, hyps: Sequence[Hypothesis]) -> list[str]:
    ids = [h.entry.id for h in hyps]
    query = " ".join(e.text for e in ctx.evidence[:6])
    ids += [h.entry.id for h in ctx.retriever.search(query, 6) if h.entry.id not in ids]
    return ids[:8]


def _ask(ctx: Context, llm: ChatModel, prompt: str, constrain: dict[str, Any], schema: dict[str, Any],
         what: str) -> dict[str, Any] | None:
    """Ask with the job's schema (`constrain`, enums of valid ids) and accept a reply that has at least the
    loose shape (`schema`): a server that ignores the constraint still gets each item judged on its own."""
    try:
        reply = llm.ask(SYSTEM, prompt, constrain)
    except Exception as exc:  # an unreachable or failing endpoint must not stop the diagnosis
        ctx.flags.append(f"llm {what}: request failed ({type(exc).__name__}: {clip(str(exc), 120)}); deterministic used")
        return None
    errs = check(reply, schema)
    if errs:
        ctx.flags.append(f"llm {what}: reply does not match the schema ({'; '.join(errs[:3])}); deterministic used")
        return None
    return reply  # type: ignore[no-any-return]


def _cites(ctx: Context, refs: Sequence[Any], what: str) -> list[str]:
    known = ctx.known_ids()
    good = [r for r in refs if valid_citation(r, known)]
    bad = [str(r) for r in refs if not valid_citation(r, known)]
    if bad:
        ctx.flags.append(f"llm {what}: cited unknown evidence {', '.join(clip(b, 20) for b in bad[:4])}")
    return good


def llm_propose(ctx: Context, llm: ChatModel, det_hyps: list[Hypothesis], keys: Keys) -> list[Hypothesis]:
    offered = _offered(ctx, det_hyps)
    entries = "\n".join(f"- {eid}: {ctx.kb.entries[eid].title}" for eid in offered)
    prompt = (f"Round 1. Evidence:\n{render_evidence(ctx.evidence)}\n\nKnowledge-base entries:\n{entries}\n\n"
              'Reply {"keys": {"hosts": [], "ranks": [], "ports": [], "error_codes": []}, '
              '"hypotheses": [{"entry": "<entry id>", "claim": "...", "evidence": ["E2"]}]} with up to 3 hypotheses.')
    constrain = schema_propose(offered, sorted(ctx.known_ids()), ctx.inventory.hosts)
    reply = _ask(ctx, llm, prompt, constrain, SCHEMA_PROPOSE, "round 1")
    if reply is None:
        return det_hyps
    out: list[Hypothesis] = []
    for h in reply.get("hypotheses", []):
        eid = h.get("entry")
        if eid not in offered:
            ctx.flags.append(f"llm round 1: dropped hypothesis with unknown entry {clip(str(eid), 40)!r}")
            continue
        cites = _cites(ctx, h.get("evidence", []), "round 1")
        if not cites:
            ctx.flags.append(f"llm round 1: dropped hypothesis {eid}: no valid evidence cited")
            continue
        if eid not in [x.entry.id for x in out]:
            det = next((d.score for d in det_hyps if d.entry.id == eid), 0.3)
            out.append(Hypothesis(ctx.kb.entries[eid], det, clip(str(h.get("claim", "")), 200), cites))
    if not out:
        ctx.flags.append("llm round 1: no valid hypothesis; deterministic hypotheses used")
        return det_hyps
    ctx.llm_rounds.append(1)
    return out


def llm_critique(ctx: Context, llm: ChatModel, hyps: Sequence[Hypothesis], det_crit: list[tuple[Hypothesis, str]],
                 det_plan: list[PlannedProbe]) -> tuple[list[tuple[Hypothesis, str]], list[PlannedProbe]]:
    relevant = [n for h in hyps for n in h.entry.probes]
    probes = "\n".join(f"- {n}({', '.join(['host', *CATALOG[n].params])}): {CATALOG[n].summary}" for n in dict.fromkeys(relevant))
    probes += "\nother probes: " + ", ".join(n for n in CATALOG if n not in relevant)
    hosts = ", ".join(ctx.inventory.hosts[:64])
    tie = tie_of(ctx.verdict, ctx.inventory)
    if tie is not None:  # the same hosts the deterministic plan covers, so that a probe can decide the tie
        hosts += (f"\nThe localizer's first candidate is a {tie.words()}: it cannot tell them apart; probe their "
                  f"hosts ({', '.join(tie.hosts)}) so that a probe on one of them decides")
    hyp_text = "\n".join(f"- {h.entry.id}: {h.entry.title}; confirmed by {', '.join(h.entry.confirmed_by) or 'nothing'} "
                         f"from {', '.join(h.entry.probes) or 'no probe'}" for h in hyps)
    prompt = (f"Round 2. Hypotheses:\n{hyp_text}\n\nEvidence:\n{render_evidence(ctx.evidence)}\n\n"
              f"Probes you may request:\n{probes}\nHosts of this job: {hosts}\n\n"
              'Reply {"critiques": [{"entry": "<id>", "critique": "...", "keep": true}], '
              '"probes": [{"probe": "<name>", "host": "<host>", "gpu": 0}]} with at most 2 probes.')
    gpus = sorted({g for gs in ctx.inventory.gpus.values() for g in gs})
    ifaces = sorted({n for ns in ctx.inventory.nics.values() for n in ns})
    constrain = schema_critique([h.entry.id for h in hyps], list(CATALOG), ctx.inventory.hosts, gpus, ifaces)
    reply = _ask(ctx, llm, prompt, constrain, SCHEMA_CRITIQUE, "round 2")
    if reply is None:
        return det_crit, det_plan
    by_id = {h.entry.id: h for h in hyps}
    crit = [(by_id[c["entry"]], clip(str(c["critique"]), 300)) for c in reply.get("critiques", []) if c.get("entry") in by_id]
    crit += [(h, t) for h, t in det_crit if h.entry.id not in {c[0].entry.id for c in crit}]
    plan: list[PlannedProbe] = []
    for req in reply.get("probes", []):
        extra = sorted(set(req) - {"probe", "host", "gpu", "iface"})
        args: dict[str, Any] = {k: req[k] for k in ("gpu", "iface") if k in req and k in CATALOG.get(str(req.get("probe")), CATALOG["cpu_top"]).params}
        try:
            call = build_call(req.get("probe"), req.get("host"), args, ctx.inventory)
        except ProbeRejected as exc:
            ctx.rejected.append({"probe": clip(str(req.get("probe")), 60), "host": clip(str(req.get("host")), 60),
                                 "reason": str(exc), "by": "llm"})
            ctx.flags.append(f"llm round 2: rejected probe request ({exc})")
            ctx.audit.append("probe.rejected", job=ctx.verdict.job, probe=clip(str(req.get("probe")), 60), reason=str(exc), by="llm")
            continue
        if extra:
            ctx.flags.append(f"llm round 2: ignored fields {extra} in a probe request")
        target = next((h.entry.id for h in hyps if call.name in h.entry.probes), hyps[0].entry.id if hyps else "")
        plan.append(PlannedProbe(call.name, call.host, call.args, target))
    if not plan and det_plan:
        ctx.flags.append("llm round 2: no valid probe requested; deterministic probe plan used")
        plan = det_plan
    elif plan or reply.get("critiques"):
        ctx.llm_rounds.append(2)
    return crit, plan


def llm_attribute(ctx: Context, llm: ChatModel, hyps: Sequence[Hypothesis], det: Attribution) -> Attribution:
    results = "\n".join(f"- {r.id}: {r.name} on {r.host}: findings {', '.join(r.findings) or 'none'}" for r in ctx.results) or "none"
    prompt = (f"Round 3. Hypotheses: {', '.join(h.entry.id for h in hyps)}\nProbe results:\n{results}\n\n"
              f"Evidence:\n{render_evidence(ctx.evidence)}\n\n"
              'Reply {"cause": "<entry id>", "confidence": 0.0-1.0, "claims": [{"text": "...", "evidence": ["P1"]}]}.')
    causes = [h.entry.id for h in hyps] + sorted(confirming(ctx.kb, ctx.results))
    reply = _ask(ctx, llm, prompt, schema_attribute(causes, sorted(ctx.known_ids())), SCHEMA_ATTRIBUTE, "round 3")
    if reply is None:
        return det
    claims = []
    for c in reply.get("claims", []):
        cites = _cites(ctx, c.get("evidence", []), "round 3")
        if cites:
            claims.append((clip(str(c["text"]), 300), cites))
        else:
            ctx.flags.append(f"llm round 3: dropped claim without valid evidence: {clip(str(c.get('text')), 60)!r}")
    eid = reply.get("cause")
    confirmed = confirming(ctx.kb, ctx.results)
    if eid not in ctx.kb.entries:
        ctx.flags.append(f"llm round 3: cause {clip(str(eid), 40)!r} is not a knowledge-base entry; deterministic attribution used")
        return det
    if confirmed and eid not in confirmed:
        ctx.flags.append(f"llm round 3: cause {eid} contradicts probe findings; deterministic attribution used")
        return det
    if not confirmed and eid not in {h.entry.id for h in hyps}:
        ctx.flags.append(f"llm round 3: cause {eid} has no supporting evidence; deterministic attribution used")
        return det
    entry = ctx.kb.entries[eid]
    conf = float(reply.get("confidence", 0.0))
    cap = det.confidence if det.entry is not None and det.entry.id == eid else (0.6 if eid in confirmed else 0.4)
    conf = max(0.0, min(conf, cap))
    ctx.llm_rounds.append(3)
    return Attribution(entry, round(conf, 2), eid in confirmed, claims or det.claims, confirmed.get(eid, []))
