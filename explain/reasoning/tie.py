"""Ties said, not guessed: devices the localizer cannot tell apart are probed as one set and named as one.

When the verdict's first candidate is tied (`Candidate.tie` = k > 1), any of the k devices may be the
cause. The probe plan then covers the hosts of every tied device the verdict lists (bounded by
MAX_TIE_HOSTS), and the cause names one device only when a probe on its host confirmed it; until
then it is "a tie of k", its confidence scaled by the share of the tie the cause could explain.
Pure functions: the verdict and the inventory in, names and hosts out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from explain.actions.inventory import Inventory
from explain.story import sources_in_words
from localize.verdict import Candidate, Verdict

#: hosts a tie's probe plan covers at most (each probe runs once per host, so this bounds the plan)
MAX_TIE_HOSTS = 8
#: tied devices explain asks the localizer for at most (the probe plan covers MAX_TIE_HOSTS hosts of them)
MAX_TIE_LISTED = 32
#: tied devices named per kind in a cause line (the JSON lists every one the verdict holds)
NAMES_PER_KIND = 4
#: when a probe confirms on a host, the kinds of tied device it may name, most specific first
HOST_PRECEDENCE = ("nic", "link", "switch", "host", "gpu", "pcie")
_PLURAL = {"switch": "switches", "nic": "NICs", "gpu": "GPUs", "pcie": "PCIe paths"}


@dataclass(frozen=True)
class Tie:
    """The devices tied with the verdict's first candidate, as far as the verdict lists them."""

    size: int  # k: devices tied at the top score, as the localizer counted them
    members: tuple[Candidate, ...]  # the tied devices the verdict lists (at most `size`)
    hosts: tuple[str, ...]  # hosts the probe plan covers (at most MAX_TIE_HOSTS)
    spanned: int  # hosts the listed members span in all
    source: str = ""  # which evidence could not tell them apart

    def label(self) -> str:
        return f"tie of {self.size}"

    def names(self) -> list[str]:
        return [c.device() for c in self.members]

    def words(self) -> str:
        """'tie of 18: switches tor-0, tor-1; links node-0<->node-1, ...; NICs node-0, ... and 4 more'."""
        by_kind: dict[str, list[str]] = {}
        for c in self.members:
            by_kind.setdefault(c.kind, []).append(_short(c))
        parts = []
        for kind, names in by_kind.items():
            shown = ", ".join(names[:NAMES_PER_KIND]) + (f" and {len(names) - NAMES_PER_KIND} more"
                                                          if len(names) > NAMES_PER_KIND else "")
            parts.append(f"{_PLURAL.get(kind, kind + 's') if len(names) > 1 else kind} {shown}")
        unlisted = self.size - len(self.members)
        if unlisted > 0:
            parts.append(f"{unlisted} more the verdict does not list")
        return f"{self.label()}: " + "; ".join(parts)

    def who(self) -> str:
        return sources_in_words(self.source, "the localizer")

    def coverage_note(self) -> str | None:
        """Said when the plan could not reach every tied device: more hosts, or devices the verdict omits."""
        notes = []
        if self.spanned > len(self.hosts):
            notes.append(f"the tied devices span {self.spanned} hosts; probes cover {len(self.hosts)} of them "
                         f"(at most {MAX_TIE_HOSTS})")
        if self.size > len(self.members):
            notes.append(f"the verdict lists {len(self.members)} of the {self.size} tied devices "
                         "(`laggard localize --top N` lists more)")
        return "; ".join(notes) or None


@dataclass
class TieOutcome:
    """What the probes made of a tie: decided (the devices on the confirming probe's host) or not."""

    tie: Tie
    decided: list[Candidate] = field(default_factory=list)
    probe: str | None = None  # id of the probe result that decided it
    host: str | None = None

    def device(self) -> str | None:
        return ", ".join(c.device() for c in self.decided) if self.decided else None

    def decision(self) -> str | None:
        """'probe P3 on node-2 broke a tie of 18', or '... narrowed a tie of 9 to 2' (both ends' links)."""
        if not self.decided:
            return None
        did = "broke a" if len(self.decided) == 1 else "narrowed a"
        rest = "" if len(self.decided) == 1 else f" to {len(self.decided)}"
        return f"probe {self.probe} on {self.host} {did} {self.tie.label()}{rest}"

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.tie.size, "listed": self.tie.names(), "source": self.tie.source or None,
                "hosts_probed": list(self.tie.hosts), "hosts_spanned": self.tie.spanned,
                "decided": bool(self.decided), "decided_by": {"probe": self.probe, "host": self.host} if self.decided else None,
                "device": self.device(), "decision": self.decision(), "words": self.tie.words()}


def _short(c: Candidate) -> str:
    """A tied device's name without its kind (the kind heads its group in `Tie.words`)."""
    if c.kind == "link" and c.hosts:
        return "<->".join(c.hosts)
    if c.kind == "switch":
        return str(c.switch)
    if c.kind == "gpu" and c.rank is not None:
        return f"rank {c.rank}"
    return c.host or c.device()


def members(verdict: Verdict) -> list[Candidate]:
    """The listed candidates tied with the first one (same score, marked tied), in the verdict's order;
    empty when the first candidate is not tied."""
    if not verdict.candidates:
        return []
    top = verdict.candidates[0]
    if not top.tie or top.tie < 2:
        return []
    return [c for c in verdict.candidates if c.tie and abs(float(c.score) - float(top.score)) <= 1e-6]


def hosts_of(c: Candidate, inv: Inventory) -> list[str]:
    """The job hosts whose probes can see a device: a NIC's host, a link's two ends, a switch's hosts."""
    if c.kind == "switch" and c.switch:
        found = list(inv.switches.get(c.switch, ()))
    elif c.kind == "link" and c.hosts:
        found = list(c.hosts)
    elif c.host:
        found = [c.host]
    else:
        found = list(c.hosts or ())
    return [h for h in found if h in inv.hosts]


def cover(tied: Sequence[Candidate], inv: Inventory, most: int = MAX_TIE_HOSTS) -> tuple[list[str], int]:
    """Hosts to probe for a tie, and how many the tied devices span: first one host for each device no
    chosen host sees yet (so a bounded plan reaches as many tied devices as it can), then the rest in
    the verdict's order."""
    per = [hosts_of(c, inv) for c in tied]
    chosen: list[str] = []
    for hs in per:
        if hs and not set(hs) & set(chosen) and len(chosen) < most:
            chosen.append(hs[0])
    spanned = list(dict.fromkeys(h for hs in per for h in hs))
    chosen += [h for h in spanned if h not in chosen][:max(0, most - len(chosen))]
    return chosen, len(spanned)


def tie_of(verdict: Verdict, inv: Inventory) -> Tie | None:
    """The first candidate's tie, or None when it stands alone."""
    tied = members(verdict)
    if not tied:
        return None
    hosts, spanned = cover(tied, inv)
    top = verdict.candidates[0]
    return Tie(int(top.tie or len(tied)), tuple(tied), tuple(hosts), spanned, top.source or "")


def on_host(tie: Tie, host: str, inv: Inventory, kinds: Sequence[str] = (), gpu: int | None = None) -> list[Candidate]:
    """The tied devices a confirming probe on `host` (and on `gpu`, for a GPU probe) points at: those of
    the first kind the confirmed cause explains (`kinds`, its verdict kinds) that touch the host, else
    the NIC of the host, else the tied links with that end, else the host's switch."""
    touching = [c for c in tie.members if host in hosts_of(c, inv) and (gpu is None or c.gpu in (None, gpu))]
    for kind in [*kinds, *HOST_PRECEDENCE]:
        found = [c for c in touching if c.kind == kind]
        if found:
            return found
    return []



def unlisted(verdict: Verdict) -> int:
    """How many more of the first candidate's tie a wider localization would list (0: all listed)."""
    tied = members(verdict)
    if not tied:
        return 0
    return max(0, min(int(verdict.candidates[0].tie or 0), MAX_TIE_LISTED) - len(tied))


def complete(verdict: Verdict, wider: Verdict) -> Verdict:
    """`verdict` with the tied devices only `wider` (the same trace localized with a larger top) lists
    appended: the verdict every other surface prints stays as it is, and the tie is whole."""
    tied = members(verdict)
    if not tied:
        return verdict
    top = verdict.candidates[0]
    have = {c.device() for c in verdict.candidates}
    extra = [c for c in members(wider) if abs(float(c.score) - float(top.score)) <= 1e-6 and c.device() not in have]
    room = max(0, MAX_TIE_LISTED - len(tied))
    return Verdict(verdict.job, verdict.status, list(verdict.irregular_steps), verdict.slowdown,
                   [*verdict.candidates, *extra[:room]], dict(verdict.extra), verdict.onset_step)
