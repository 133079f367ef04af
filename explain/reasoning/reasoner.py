"""The deterministic reasoner: fills the three self-play rounds from the verdict, evidence and KB rules.

Round 1 proposes hypotheses (KB entries whose signature fits the verdict, ranked by prior,
retrieval similarity and log hits); round 2 critiques them and orders the probes that could
confirm them, cheapest-to-most-likely first; round 3 attributes the cause from probe findings.
The LLM reasoner (explain/reasoning/llm.py) answers the same three questions and is checked against this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from explain.actions.inventory import Inventory
from explain.actions.probes import CATALOG, ProbeResult
from explain.knowledge import Entry, KnowledgeBase
from explain.reasoning.evidence import EvidenceItem
from explain.reasoning.tie import Tie, TieOutcome, members, on_host, tie_of
from explain.retrieval import Retriever
from localize.verdict import Candidate, Verdict

#: words that describe each verdict kind, used as the retrieval query when no text is available
KIND_QUERY = {
    "gpu": "one gpu rank computes slowly straggler its peers wait clock",
    "pcie": "one gpu rank slow pcie link transfers",
    "host": "all gpus of one host slow cpu contention host",
    "nic": "network interface of one host slow nic link",
    "link": "link between two hosts slow path retransmit",
    "switch": "switch congestion every host under one switch slow",
    "config": "pipeline stage imbalance configuration layers",
    "data": "sequence length imbalance data parallel ranks",
}
KIND_PATTERN = {"gpu": "compute-slow-rank", "pcie": "compute-slow-rank", "host": "host-slow", "nic": "nic-slow",
                "link": "link-slow", "switch": "switch-slow", "config": "stage-slow", "data": "data-skew"}
MAX_HYPOTHESES = 5
MAX_PROBES = 5
MAX_HYPOTHESIS_PROBES = 3
#: when the hypotheses' probes find nothing, look one level out: a "slow GPU" may be its host,
#: a "slow host" its NIC, a "slow link" one end's NIC
RELATED = {"gpu": ("host",), "pcie": ("host",), "host": ("nic",), "nic": ("link",), "link": ("nic",),
           "switch": ("nic",), "config": (), "data": ("host",)}


@dataclass
class Hypothesis:
    entry: Entry
    score: float
    why: str
    cites: list[str] = field(default_factory=list)


@dataclass
class PlannedProbe:
    name: str
    host: str
    args: dict[str, Any]
    for_entry: str


@dataclass
class Attribution:
    entry: Entry | None
    confidence: float
    confirmed: bool
    claims: list[tuple[str, list[str]]]
    supported_by: list[str] = field(default_factory=list)  # probe result ids that confirm
    tie: TieOutcome | None = None  # set by settle_tie when the verdict's first candidate is tied


def focus(verdict: Verdict) -> Candidate | None:
    return verdict.candidates[0] if verdict.candidates else None


def from_the_start(verdict: Verdict) -> bool:
    """The suspect was slow from the first step (no change to detect), as a configuration imbalance is."""
    return bool(verdict.extra.get("persistent")) or (bool(verdict.irregular_steps) and min(verdict.irregular_steps) == 0)


def shared_host(verdict: Verdict) -> bool:
    """Several near-top GPU candidates on one host point at the host rather than at one GPU."""
    top = verdict.candidates[0].score if verdict.candidates else 0.0
    hosts = [c.host for c in verdict.candidates if c.kind == "gpu" and c.host and c.score >= 0.7 * top]
    return len(hosts) >= 3 and len(set(hosts)) == 1


def verdict_kinds(verdict: Verdict) -> set[str]:
    """Device kinds the localizer's verdict points at, and the kinds one level out (RELATED)."""
    cand = focus(verdict)
    if cand is None:
        return set()
    kinds = {cand.kind} | {c.kind for c in verdict.candidates[1:3] if c.score >= 0.8 * cand.score}
    kinds |= {c.kind for c in members(verdict)}  # any device of a tie may be the cause
    if cand.kind == "gpu" and shared_host(verdict):
        kinds.add("host")
    if from_the_start(verdict):
        kinds |= {"config", "data"}
    return kinds | {k for kind in list(kinds) for k in RELATED.get(kind, ())}


def fits_verdict(verdict: Verdict, entry: Entry) -> bool:
    """The entry explains what the localizer found (not only what some log line says)."""
    if verdict.status == "hang" and entry.pattern == "hang":
        return True
    return bool(verdict_kinds(verdict) & set(entry.verdict_kinds))


def probe_targets(probe: str, cand: Candidate, inv: Inventory, tie: Tie | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Hosts (and GPU / NIC arguments) a probe should run on to test a candidate device; for a tied
    candidate, the hosts of every tied device (`tie.hosts`), so that a probe, not a name, decides."""
    spec = CATALOG[probe]
    hosts: list[str] = []
    if tie is not None:
        hosts = list(tie.hosts)
    elif cand.kind == "link" and cand.hosts:
        hosts = list(cand.hosts)
    elif cand.kind == "switch" and cand.switch:
        hosts = list(inv.switches.get(cand.switch, ()))[:2]
    elif cand.host:
        hosts = [cand.host]
    elif cand.hosts:
        hosts = list(cand.hosts)
    out: list[tuple[str, dict[str, Any]]] = []
    for h in hosts:
        if h not in inv.hosts:
            continue
        if "gpu" in spec.params:
            own = [c.gpu for c in (tie.members if tie else [cand]) if c.gpu is not None and (tie is None or c.host == h)]
            gpus = list(dict.fromkeys(own)) or list(inv.gpus.get(h, ()))[:1]
            out += [(h, {"gpu": g}) for g in gpus if g is not None]
        elif "iface" in spec.params:
            out += [(h, {"iface": n}) for n in inv.nics.get(h, ())[:2]]
        else:
            out.append((h, {}))
    return out


class DeterministicReasoner:
    name = "deterministic"

    def __init__(self, kb: KnowledgeBase, retriever: Retriever) -> None:
        self.kb = kb
        self.retriever = retriever

    def propose(self, verdict: Verdict, evidence: Sequence[EvidenceItem]) -> list[Hypothesis]:
        cand = focus(verdict)
        text_items = [e for e in evidence if e.source in ("log", "alert")]
        kinds = [cand.kind] if cand else []
        kinds += [c.kind for c in verdict.candidates[1:3] if cand and c.score >= 0.8 * cand.score and c.kind not in kinds]
        kinds += list(dict.fromkeys(c.kind for c in members(verdict) if c.kind not in kinds))
        if cand and cand.kind == "gpu" and shared_host(verdict):
            kinds.append("host")
        if verdict.status == "hang":
            pool = [e for e in self.kb if e.pattern == "hang" or any(k in e.verdict_kinds for k in kinds)]
        else:
            pool = [e for e in self.kb if any(k in e.verdict_kinds for k in kinds)]
        hit_entries = {eid for it in text_items for eid in it.entries}
        pool += [self.kb.entries[eid] for eid in hit_entries if eid in self.kb.entries and self.kb.entries[eid] not in pool]
        if not pool:
            return []
        query = " ".join([KIND_QUERY.get(k, k) for k in kinds] + [it.text for it in text_items])
        sims = dict(zip([e.id for e in self.retriever.entries], self.retriever.scores(query), strict=True))
        top_sim = max((sims.get(e.id, 0.0) for e in pool), default=0.0) or 1.0
        # the localizer's own words about the suspect (e.g. "its PCIe and NVLink, its NIC port") weigh in separately
        said = " ".join(cand.evidence[:3]) if cand else ""
        said_sims = dict(zip([e.id for e in self.retriever.entries], self.retriever.scores(said), strict=True))
        top_said = max((said_sims.get(e.id, 0.0) for e in pool), default=0.0) or 1.0
        want = KIND_PATTERN.get(kinds[0]) if kinds else None
        hyps = []
        for e in pool:
            cites = [it.id for it in text_items if e.id in it.entries]
            kind_rank = next((i for i, k in enumerate(kinds) if k in e.verdict_kinds), None)
            score = (0.45 * e.prior + 0.35 * sims.get(e.id, 0.0) / top_sim + 0.3 * said_sims.get(e.id, 0.0) / top_said
                     + (0.2 if want and e.pattern == want else 0.0)
                     + (0.1 if kind_rank == 0 else 0.0)
                     # text proposes: a log hit lifts an entry that fits the verdict, and barely one that does not
                     + ((0.5 if fits_verdict(verdict, e) else 0.1) if cites else 0.0)
                     + (0.3 if verdict.status == "hang" and e.pattern == "hang" else 0.0)
                     - (0.3 if verdict.status != "hang" and e.pattern == "hang" else 0.0))
            why = []
            if kind_rank is not None:
                why.append(f"fits a {kinds[kind_rank]} verdict")
            if want and e.pattern == want:
                why.append(f"pattern {e.pattern}")
            if cites:
                why.append(f"log/alert lines {', '.join(cites)} match its signature")
            cand_cites = [ev.id for ev in evidence if ev.source in ("verdict", "candidate")][:2]
            hyps.append(Hypothesis(e, round(score, 4), "; ".join(why) or "retrieved by similarity", cand_cites + cites))
        hyps.sort(key=lambda h: (-h.score, h.entry.id))
        hyps = hyps[:MAX_HYPOTHESES]
        if cand and cand.kind in ("gpu", "pcie", "host") and from_the_start(verdict) \
                and not any(h.entry.category in ("config", "data") for h in hyps):
            stage = [e for e in self.kb.by_kind("config") if e.pattern == "stage-slow"]
            if stage:
                best = max(stage, key=lambda e: (e.prior, e.id))
                hyps.append(Hypothesis(best, round(0.45 * best.prior, 4),
                                       "slow since the first step and not a degradation: a device that always does "
                                       "more work (an unbalanced pipeline stage) fits if the hardware checks are clean",
                                       [ev.id for ev in evidence if ev.source in ("verdict", "candidate")][:2]))
        return hyps

    def plan(self, verdict: Verdict, hyps: Sequence[Hypothesis], inv: Inventory) -> tuple[list[tuple[Hypothesis, str]], list[PlannedProbe]]:
        """Critique each hypothesis; order the probes that could confirm them (most likely first)."""
        cand = focus(verdict)
        # slow from the first step: a configuration cause is as likely as a device, so check less
        budget = MAX_HYPOTHESIS_PROBES if from_the_start(verdict) else MAX_PROBES
        per_hypotheses = MAX_HYPOTHESIS_PROBES
        tie = tie_of(verdict, inv)
        related = list(RELATED.get(cand.kind, ())) if cand else []
        if tie is not None:  # one probe on every tied host, then (unless slow from the start) one more
            per_hypotheses = max(per_hypotheses, len(tie.hosts))
            budget = max(budget, len(tie.hosts) * (1 if from_the_start(verdict) else 2))
            related += [c.kind for c in tie.members if c.kind not in related]
        critiques = []
        plan: list[PlannedProbe] = []
        seen: set[tuple[str, str, str]] = set()
        for h in hyps:
            e = h.entry
            if not e.probes:
                critiques.append((h, f"no read-only probe can confirm '{e.title}'; it rests on the traffic pattern "
                                     "alone, so hardware causes must be ruled out first"))
                continue
            targets = [(p, t) for p in e.probes for t in (probe_targets(p, cand, inv, tie) if cand else [])]
            if not targets:
                critiques.append((h, f"'{e.title}' needs {', '.join(e.probes)} but the inventory gives no target"))
                continue
            critiques.append((h, f"'{e.title}' is confirmed only if {' or '.join(e.probes)} reports "
                                 f"{' or '.join(e.confirmed_by)}"))
            for p, (host, args) in targets:
                key = (p, host, str(sorted(args.items())))
                if key not in seen and len(plan) < per_hypotheses:
                    seen.add(key)
                    plan.append(PlannedProbe(p, host, args, e.id))
        for kind in related:
            for e in sorted(self.kb.by_kind(kind), key=lambda x: (-x.prior, x.id)):
                for p in e.probes:
                    for host, args in probe_targets(p, cand, inv, tie) if cand else []:
                        key = (p, host, str(sorted(args.items())))
                        if key not in seen and len(plan) < budget:
                            seen.add(key)
                            plan.append(PlannedProbe(p, host, args, e.id))
        return critiques, plan

    def attribute(self, verdict: Verdict, hyps: Sequence[Hypothesis], results: Sequence[ProbeResult]) -> Attribution:
        return attribute(self.kb, verdict, hyps, results)


def confirming(kb: KnowledgeBase, results: Sequence[ProbeResult]) -> dict[str, list[str]]:
    """entry id -> ids of probe results whose findings are in the entry's confirmed_by."""
    out: dict[str, list[str]] = {}
    for r in results:
        if r.outcome != "abnormal":
            continue
        for e in kb:
            if set(e.confirmed_by) & set(r.findings) and e.probes and r.name in e.probes:
                out.setdefault(e.id, []).append(r.id)
    return out


def attribute(kb: KnowledgeBase, verdict: Verdict, hyps: Sequence[Hypothesis], results: Sequence[ProbeResult]) -> Attribution:
    cand = focus(verdict)
    if verdict.status == "healthy" or (cand is None and not hyps):
        return Attribution(None, 0.0, False, [("the job is healthy; nothing to explain", ["E1"])])
    cscore = float(cand.score) if cand else 0.5
    conf = confirming(kb, results)
    rank = {h.entry.id: i for i, h in enumerate(hyps)}
    if conf:
        best = min(conf, key=lambda eid: (not fits_verdict(verdict, kb.entries[eid]), rank.get(eid, len(rank)),
                                          -kb.entries[eid].prior, eid))
        e = kb.entries[best]
        ids = conf[best]
        findings = sorted({f for r in results if r.id in ids for f in r.findings if f in e.confirmed_by})
        claims = [(f"{e.title}: probe(s) {', '.join(ids)} report {', '.join(findings)}", ids)]
        if cand:
            blamed = cand.device() if not cand.tie or cand.tie < 2 else f"a tie of {cand.tie} devices"
            claims.append((f"the localizer blamed {blamed} (score {cscore:.2f})", ["E2"]))
        return Attribution(e, round(min(0.99, 0.55 + 0.4 * cscore + 0.05 * len(ids)), 2), True, claims, ids)
    if not hyps:
        return Attribution(None, 0.0, False, [("no knowledge-base entry fits this verdict", ["E1"])])
    unprobed = [h for h in hyps if not h.entry.probes]
    ran_any = any(r.answered for r in results)
    if unprobed and (ran_any or hyps[0].entry is unprobed[0].entry):
        h = unprobed[0]
        healthy = [r.id for r in results if r.healthy]
        claims = [(f"{h.entry.title}: the traffic pattern fits ({h.why})", h.cites or ["E2"])]
        if healthy:
            claims.append(("hardware probes found nothing wrong, which rules out a device fault", healthy))
        return Attribution(h.entry, round(min(0.9, 0.45 + 0.4 * cscore), 2), False, claims, healthy)
    h = hyps[0]
    claims = [(f"{h.entry.title} is the most likely cause but no probe confirmed it", h.cites or ["E2"])]
    failed = [r for r in results if r.outcome in ("unreachable", "error")]
    if failed:
        hosts = sorted({r.host for r in failed})
        claims.append((f"{len(failed)} probe(s) on {', '.join(hosts)} failed ({failed[0].summary}); "
                       "a failed probe confirms nothing", [r.id for r in failed]))
    return Attribution(h.entry, round(0.25 * cscore + 0.1, 2), False, claims)


def settle_tie(att: Attribution, verdict: Verdict, results: Sequence[ProbeResult], inv: Inventory) -> Attribution:
    """What the probes made of a tie, applied to either engine's attribution: a cause confirmed on one
    host names the tied device(s) of that host and says the probe broke the tie; an unconfirmed one
    names no device, says the tie, and keeps only the share of confidence its kinds explain."""
    tie = tie_of(verdict, inv)
    if tie is None or att.entry is None:
        return att
    outcome = TieOutcome(tie)
    kinds = att.entry.verdict_kinds
    by_id = {r.id: r for r in results}
    for rid in att.supported_by if att.confirmed else []:
        r = by_id.get(rid)
        found = on_host(tie, r.host, inv, kinds, r.args.get("gpu")) if r is not None and r.outcome == "abnormal" else []
        if r is not None and found:
            outcome.decided, outcome.probe, outcome.host = found, r.id, r.host
            break
    claims = list(att.claims)
    conf = att.confidence
    if outcome.decided:
        claims.insert(0, (f"{outcome.decision()}: {outcome.device()}", [str(outcome.probe)]))
        return Attribution(att.entry, conf, att.confirmed, claims, att.supported_by, outcome)
    claims.insert(0, (f"{tie.words()}: {tie.who()} cannot tell them apart and no probe decided which", ["E2"]))
    if att.confirmed:  # confirmed on a host that no listed tied device touches: the cause, not the device
        hosts = sorted({by_id[i].host for i in att.supported_by if i in by_id})
        claims.append((f"the confirming probe ran on {', '.join(hosts)}, where none of the listed tied devices is",
                       list(att.supported_by)))
    else:
        fits = [c for c in tie.members if c.kind in kinds]
        conf = round(max(0.01, conf * len(fits) / len(tie.members)), 2) if fits else min(conf, 0.01)
        claims.append((f"'{att.entry.title}' explains {len(fits)} of the {len(tie.members)} listed tied devices; "
                       "its confidence is that share", ["E2"]))
    return Attribution(att.entry, conf, att.confirmed, claims, att.supported_by, outcome)
