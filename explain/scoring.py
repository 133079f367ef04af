"""Seed 000's three metrics, as pure functions: A extraction, B probe planning, C attribution.

The eval command (laggard/commands/eval.py) produces the cases; this module only scores them.
Truth is read here because this is evaluation (docs/traces.md: nothing else reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from explain.knowledge import KnowledgeBase
from localize.verdict import Candidate, Verdict

#: simulator fault kind -> knowledge-base cause category
FAULT_CATEGORY = {"gpu": "gpu", "pcie": "pcie", "host": "host", "nic": "nic", "link": "link", "switch": "switch",
                  "stage": "config", "seqlen": "data"}
FIELDS = ("hosts", "ranks", "ports", "error_codes")


def score_extraction(pred: dict[str, Any], gold: dict[str, Any]) -> dict[str, tuple[int, int, int]]:
    """Per field (tp, fp, fn) by exact string match."""
    out = {}
    for f in FIELDS:
        p = {str(x) for x in pred.get(f, [])}
        g = {str(x) for x in gold.get(f, [])}
        out[f] = (len(p & g), len(p - g), len(g - p))
    return out


def summarize_extraction(scores: Sequence[dict[str, tuple[int, int, int]]]) -> dict[str, Any]:
    tp = sum(s[f][0] for s in scores for f in FIELDS)
    fp = sum(s[f][1] for s in scores for f in FIELDS)
    fn = sum(s[f][2] for s in scores for f in FIELDS)
    prec = tp / (tp + fp) if tp + fp else 1.0
    rec = tp / (tp + fn) if tp + fn else 1.0
    exact = sum(all(s[f][1] == 0 and s[f][2] == 0 for f in FIELDS) for s in scores)
    return {"messages": len(scores), "precision": round(prec, 4), "recall": round(rec, 4),
            "f1": round(2 * prec * rec / (prec + rec), 4) if prec + rec else 0.0,
            "exact": round(exact / len(scores), 4) if scores else 0.0}


def true_categories(truth: dict[str, Any]) -> set[str]:
    return {FAULT_CATEGORY.get(str(f.get("kind")), str(f.get("kind"))) for f in truth.get("faults", [])
            if f.get("active_steps", [1])}


def score_case(diag: dict[str, Any], truth: dict[str, Any], kb: KnowledgeBase) -> dict[str, Any]:
    """B: a probe finding confirms an entry of the true category (for config/data, where no probe can
    confirm, the probes must not point at hardware instead). C: the diagnosed category is a true one."""
    cats = true_categories(truth)
    probes = [p for p in diag["probes"]]
    confirmed_cats = {e.category for p in probes for e in kb
                      if p["probe"] in e.probes and set(e.confirmed_by) & set(p["findings"])}
    if cats & {"config", "data"} and not cats - {"config", "data"}:
        b = not confirmed_cats
    else:
        b = bool(confirmed_cats & cats)
    return {"truth": sorted(cats), "predicted": diag.get("category"), "attribution_ok": diag.get("category") in cats,
            "probes_confirm": b, "probes": len(probes), "confirmed": diag.get("confirmed", False)}


def summarize_cases(cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = len(cases)
    if not n:
        return {"cases": 0}
    return {"cases": n,
            "C_attribution": round(sum(c["attribution_ok"] for c in cases) / n, 4),
            "B_probes_confirm": round(sum(c["probes_confirm"] for c in cases) / n, 4),
            "probes_per_case": round(sum(c["probes"] for c in cases) / n, 3)}


COARSE_KIND = {"gpu": "gpu", "pcie": "gpu", "host": "host", "nic": "nic", "link": "link", "switch": "switch",
               "stage": "config", "seqlen": "data"}


def oracle_verdict(truth: dict[str, Any], ranks: dict[int, tuple[str, int]], switch_hosts: dict[str, list[str]]) -> Verdict:
    """A verdict that knows where the fault is but only what CommOps can tell about its kind
    (a slow PCIe link looks like a slow GPU): for scoring explain when no localizer is available."""
    cands = []
    for f in truth.get("faults", []):
        kind = str(f["kind"])
        c = Candidate(kind=COARSE_KIND.get(kind, kind), score=0.9, evidence=["oracle location (evaluation only)"], source="oracle")
        if "rank" in f:
            c.rank = int(f["rank"])
            c.host, c.gpu = ranks[c.rank]
        if f.get("host"):
            c.host = str(f["host"])
        if f.get("hosts"):
            c.hosts = [str(h) for h in f["hosts"]]
        if f.get("switch"):
            c.switch = str(f["switch"])
            c.hosts = switch_hosts.get(c.switch, [])
        cands.append(c)
    return Verdict(job=str(truth.get("job", "job")), status="irregular" if cands else "healthy", irregular_steps=list(truth.get("irregular_steps", [])),
                   slowdown=1.5, candidates=cands)
