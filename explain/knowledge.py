"""The knowledge base: YAML entries that map an evidence pattern to a cause, probes and remediation.

Entries ship in `explain/kb/`; users add their own directories through `LAGGARD_KB_PATH`
(os.pathsep-separated). A user entry with the id of a shipped one replaces it, so a site can
refine the wording or the probes without forking the package.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.inputs.errors import UserError

BUILTIN_DIR = Path(__file__).with_name("kb")
ENV_PATH = "LAGGARD_KB_PATH"

#: cause categories; the simulator's fault kinds map onto them (stage -> config, seqlen -> data)
CATEGORIES = ("gpu", "pcie", "host", "nic", "link", "switch", "config", "data", "storage")
#: evidence patterns a signature may name
PATTERNS = (
    "compute-slow-rank",  # one rank computes slowly; its peers wait
    "host-slow",  # every rank of one host is slow
    "nic-slow",  # groups leaving one host are slow
    "link-slow",  # groups spanning one host pair are slow
    "switch-slow",  # groups crossing one switch are slow
    "stage-slow",  # one pipeline stage is slow in every replica
    "data-skew",  # slow ranks move from step to step
    "periodic-stall",  # all ranks stall every N steps
    "job-wide-slow",  # everything is uniformly slower than expected
    "hang",  # a collective never completes
    "log-event",  # a specific log line names the cause
)
VERDICT_KINDS = ("gpu", "pcie", "host", "nic", "link", "switch", "config", "data")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{2,63}$")
TAG_RE = re.compile(r"^[a-z]+\.[a-z0-9_]+$")


@dataclass(frozen=True)
class Remedy:
    action: str
    why: str


@dataclass(frozen=True)
class Entry:
    """One piece of diagnostic knowledge."""

    id: str
    title: str
    category: str
    pattern: str
    verdict_kinds: tuple[str, ...]
    keywords: tuple[str, ...]
    cause: str
    probes: tuple[str, ...]
    confirmed_by: tuple[str, ...]
    remediation: tuple[Remedy, ...]
    references: tuple[str, ...]
    log_patterns: tuple[str, ...] = ()
    prior: float = 0.5
    source: str = ""

    def text(self) -> str:
        """What retrieval indexes: everything a person would search for."""
        return " ".join([self.title, self.title, self.category, self.pattern.replace("-", " "),
                         " ".join(self.keywords), " ".join(self.keywords), self.cause])

    def log_regexes(self) -> list[re.Pattern[str]]:
        return [re.compile(p) for p in self.log_patterns]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "title": self.title, "category": self.category,
            "signature": {"pattern": self.pattern, "verdict_kinds": list(self.verdict_kinds),
                          "keywords": list(self.keywords), "log_patterns": list(self.log_patterns)},
            "cause": self.cause, "probes": list(self.probes), "confirmed_by": list(self.confirmed_by),
            "remediation": [{"action": r.action, "why": r.why} for r in self.remediation],
            "references": list(self.references), "prior": self.prior, "source": self.source,
        }


@dataclass
class KnowledgeBase:
    entries: dict[str, Entry] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries.values())

    def get(self, entry_id: str) -> Entry:
        try:
            return self.entries[entry_id]
        except KeyError:
            raise UserError(f"no knowledge-base entry '{entry_id}'", "run `laggard kb list` to see the ids") from None

    def by_kind(self, kind: str) -> list[Entry]:
        return [e for e in self.entries.values() if kind in e.verdict_kinds]


def _strs(raw: Any, where: str, problems: list[str], required: bool = True) -> tuple[str, ...]:
    if raw is None:
        if required:
            problems.append(f"{where}: missing")
        return ()
    if not isinstance(raw, list) or not all(isinstance(x, str) and x.strip() for x in raw):
        problems.append(f"{where}: must be a list of non-empty strings")
        return ()
    return tuple(x.strip() for x in raw)


def parse_entry(raw: Any, source: str, known_probes: Sequence[str] = (), known_actions: Sequence[str] = (),
                known_tags: Sequence[str] = ()) -> tuple[Entry | None, list[str]]:
    """Validate one raw YAML mapping; return the entry (None if unusable) and the problems found.

    Probe names, remediation actions and finding tags are checked only when the caller passes the
    known sets, which keeps this function free of the toolkit import.
    """
    problems: list[str] = []
    if not isinstance(raw, dict):
        return None, [f"{source}: an entry must be a mapping"]
    eid = raw.get("id")
    where = f"{source}:{eid}" if isinstance(eid, str) else source
    if not isinstance(eid, str) or not ID_RE.match(eid):
        problems.append(f"{where}: id must be lower-case letters, digits and dashes (3-64 chars)")
    allowed = {"id", "title", "category", "prior", "signature", "cause", "probes", "confirmed_by", "remediation", "references"}
    for key in sorted(set(raw) - allowed):
        problems.append(f"{where}: unknown key '{key}'")
    for key in ("title", "cause"):
        if not isinstance(raw.get(key), str) or len(raw[key].strip()) < 5:
            problems.append(f"{where}: '{key}' must be a sentence")
    category = raw.get("category")
    if category not in CATEGORIES:
        problems.append(f"{where}: category '{category}' is not one of {', '.join(CATEGORIES)}")
    prior = raw.get("prior", 0.5)
    if not isinstance(prior, int | float) or not 0 <= float(prior) <= 1:
        problems.append(f"{where}: prior must be a number in [0, 1]")
        prior = 0.5
    sig = raw.get("signature")
    if not isinstance(sig, dict):
        problems.append(f"{where}: signature must be a mapping")
        sig = {}
    for key in sorted(set(sig) - {"pattern", "verdict_kinds", "keywords", "log_patterns"}):
        problems.append(f"{where}: unknown signature key '{key}'")
    pattern = sig.get("pattern")
    if pattern not in PATTERNS:
        problems.append(f"{where}: signature.pattern '{pattern}' is not one of {', '.join(PATTERNS)}")
    kinds = _strs(sig.get("verdict_kinds"), f"{where}: signature.verdict_kinds", problems)
    for k in kinds:
        if k not in VERDICT_KINDS:
            problems.append(f"{where}: verdict kind '{k}' is not one of {', '.join(VERDICT_KINDS)}")
    keywords = _strs(sig.get("keywords"), f"{where}: signature.keywords", problems)
    log_patterns = _strs(sig.get("log_patterns"), f"{where}: signature.log_patterns", problems, required=False)
    for p in log_patterns:
        try:
            re.compile(p)
        except re.error as exc:
            problems.append(f"{where}: log pattern {p!r} does not compile ({exc})")
    probes = _strs(raw.get("probes"), f"{where}: probes", problems) if raw.get("probes") != [] else ()
    tags = _strs(raw.get("confirmed_by"), f"{where}: confirmed_by", problems) if raw.get("confirmed_by") != [] else ()
    if known_probes:
        problems += [f"{where}: unknown probe '{p}'" for p in probes if p not in known_probes]
    for t in tags:
        if not TAG_RE.match(t):
            problems.append(f"{where}: finding tag '{t}' is not area.name")
        elif known_tags and t not in known_tags and not re.match(r"^xid\.\d+$", t):
            problems.append(f"{where}: no probe reports finding '{t}'")
    if probes and not tags:
        problems.append(f"{where}: probes listed but no confirmed_by finding")
    remedies: list[Remedy] = []
    rem = raw.get("remediation")
    if not isinstance(rem, list) or not rem:
        problems.append(f"{where}: remediation must be a non-empty list")
    else:
        for r in rem:
            if not isinstance(r, dict) or not isinstance(r.get("action"), str) or not isinstance(r.get("why"), str):
                problems.append(f"{where}: each remediation needs 'action' and 'why'")
                continue
            if known_actions and r["action"] not in known_actions:
                problems.append(f"{where}: unknown remediation action '{r['action']}'")
            remedies.append(Remedy(r["action"], r["why"].strip()))
    refs = _strs(raw.get("references"), f"{where}: references", problems)
    if problems:
        return None, problems
    return Entry(
        id=str(eid), title=raw["title"].strip(), category=str(category), pattern=str(pattern), verdict_kinds=kinds,
        keywords=keywords, cause=" ".join(raw["cause"].split()), probes=probes, confirmed_by=tags,
        remediation=tuple(remedies), references=refs, log_patterns=log_patterns, prior=float(prior),
        source=source,
    ), []


def search_path(extra: Sequence[Path] = ()) -> list[Path]:
    """Shipped entries first, then `LAGGARD_KB_PATH` directories, then explicit ones (later wins)."""
    dirs = [BUILTIN_DIR]
    env = os.environ.get(ENV_PATH, "")
    dirs += [Path(p) for p in env.split(os.pathsep) if p]
    dirs += list(extra)
    return dirs


def load_kb(dirs: Sequence[Path] | None = None, strict: bool = False) -> KnowledgeBase:
    """Load every *.yaml / *.yml file under the search path. Bad entries are skipped and reported
    in `problems` (strict=True raises instead, which `kb lint` and tests use)."""
    import yaml  # only where the knowledge base is read, so `laggard --help` stays fast

    from explain.actions.probes import CATALOG, FINDING_TAGS
    from explain.actions.remediation import ACTIONS

    kb = KnowledgeBase()
    for d in dirs if dirs is not None else search_path():
        if not d.exists():
            kb.problems.append(f"{d}: knowledge-base directory does not exist")
            continue
        files = [d] if d.is_file() else sorted([*d.glob("*.yaml"), *d.glob("*.yml")])
        seen_here: dict[str, str] = {}
        for f in files:
            try:
                docs = yaml.load(f.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            except yaml.YAMLError as exc:
                kb.problems.append(f"{f}: not valid YAML ({str(exc).splitlines()[0]})")
                continue
            if docs is None:
                continue
            if not isinstance(docs, list):
                kb.problems.append(f"{f}: expected a list of entries")
                continue
            for raw in docs:
                entry, probs = parse_entry(raw, f.name, tuple(CATALOG), tuple(ACTIONS), FINDING_TAGS)
                kb.problems += probs
                if entry is None:
                    continue
                if entry.id in seen_here:
                    kb.problems.append(f"{f.name}:{entry.id}: duplicate id (also in {seen_here[entry.id]})")
                    continue
                own = {t for p in entry.probes for t in CATALOG[p].findings}
                orphan = [t for t in entry.confirmed_by if t not in own and not (t.startswith("xid.") and "kernel_xid" in entry.probes)]
                if orphan:
                    kb.problems.append(f"{f.name}:{entry.id}: none of its probes reports {', '.join(orphan)}")
                    continue
                seen_here[entry.id] = f.name
                kb.entries[entry.id] = entry
    if strict and kb.problems:
        raise UserError(f"knowledge base has {len(kb.problems)} problem(s): {kb.problems[0]}",
                        "run `laggard kb lint` for the full list")
    return kb
