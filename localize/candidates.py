"""The CommOps verdict's candidates and the evidence sentences that say why each is named.

`localize.commops` finds who delayed whom (the analysis); this module turns its findings into
`Candidate`s: a rank unit that caused waits (`rank_candidate`), a network device that explains
slow transfers (`net_candidate`), a persistent imbalance among peers (`imbalance_verdict`), with
the devices their records cannot tell apart (`with_ties`), ranked and deduplicated (`merge`).
Kept apart so the words can change without touching the numbers; it never imports the analysis.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import cast

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta
from localize.network.devices import NetCandidate
from localize.ops.table import Ops
from localize.verdict import Candidate, Verdict
from localize.waits.persistent import Imbalance
from localize.waits.ranking import RankUnit
from localize.waits.waitgraph import WaitGraph


def with_ties(cand: Candidate, u: RankUnit, meta: JobMeta) -> list[Candidate]:
    """`cand` and the devices its unit's records cannot tell from it, at its score, marked a tie."""
    if not u.also:
        return [cand]
    others = [_bare_candidate(a, cand.score, meta) for a in u.also]
    for c in [cand, *others]:
        c.tie = 1 + len(u.also)
        c.evidence = c.evidence or cand.evidence
    return [cand, *others]


def rank_candidate(u: RankUnit, rank_frac: float, g: WaitGraph | None, ops: Ops | None, meta: JobMeta,
                   lone: np.ndarray | None = None) -> Candidate:
    """A rank unit's candidate at its share of the rank blame (`rank_frac`: the ranks' part of all
    the delay), with the evidence of the waits it caused: how many operators, in which groups, how
    many seconds, and what tells its kind from its neighbours'."""
    score = u.share * rank_frac
    ranks = np.asarray(u.witnesses)
    if g is None or ops is None:
        return _bare_candidate(u, score, meta)
    hit = (g.suspect | g.orphan) & np.isin(g.root_rank, ranks)
    direct = hit & (g.root_inst == np.arange(len(hit)))
    groups = Counter(str(ops.groups[x]) for x in ops.inst_group[direct][:5000])
    top_groups = ", ".join(f"{n} ({c})" for n, c in groups.most_common(3))
    waited = float(g.delay[hit].sum())
    ev = []
    if u.via is not None:
        ev.append(f"rank {u.via} was the last copy while its peers waited in {int(direct.sum())} prolonged operators "
                  f"({top_groups}), yet computed no longer than before: it waited in collectives whose other members "
                  "logged nothing (one rank per group logged)")
        ev.append(f"one of {u.tie_names()} was slow; the records cannot tell which; {waited:.3f} s of waiting caused")
        cand = _bare_candidate(u, score, meta)
        cand.evidence = ev
        return cand
    if "quiet_host" in u.detail:
        return _quiet_host_candidate(u, score, g, ops, meta)
    if u.kind == "gpu":
        r = int(ranks[0])
        info = meta.ranks.get(r)
        n_direct = int(direct.sum())
        ev.append(f"rank {r} was the normal copy while its peers waited in {n_direct} prolonged operators ({top_groups})")
        exc = g.excess_compute[direct]
        more_ms = float(np.median(exc)) * 1e3 if exc.size else 0.0
        if u.also:
            ev.append(f"it is the only rank of {u.also[0].label} that logged: a slow GPU there and the whole host "
                      "slowed show the same records")
        if "peer_wait" in u.detail:
            ev.append(f"it is the only rank of {info.host if info else 'its host'} that logged, and in the slow steps "
                      f"it waited {cast(float, u.detail['peer_wait']):.2f}x its normal time in the collectives it shares "
                      "with its unlogged peers: it arrived last and they waited on it, so they were not slow (the "
                      "GPU, not the host)")
        if exc.size and lone is not None and (lone & (ops.rank == r)).any() and np.median(exc) < 0.5 * np.median(g.delay[direct]):
            ev.append("its delay is its own or an unlogged peer's: it spent longer in operators of groups whose other "
                      "members were not logged (one rank per group logged), not in compute")
        elif exc.size and more_ms > 0:
            ev.append(f"its delay is its own: {more_ms:.2f} ms more compute than its peers before each of them")
        elif exc.size:
            ev.append(f"it computed no longer than its peers before them ({more_ms:+.2f} ms): it was already "
                      "late from its own earlier operators")
        if g.orphan[hit].any():
            ev.append(f"rank {r} logged no record of {int(g.orphan[hit].sum())} operators its peers waited in")
        ev.append(f"{int((hit & ~direct).sum())} more delays elsewhere trace back to it through waiting; {waited:.3f} s of waiting caused")
        return Candidate("gpu", score, ev, rank=r, host=info.host if info else None, gpu=info.gpu if info else None, source="commops")
    if u.kind == "host" and "peer_wait" in u.detail:
        r = cast(int, u.detail["logged_rank"])
        ev.append(f"rank {r}, the only rank of {u.label} that logged, delayed its peers ({top_groups}) computing "
                  f"longer, and in the slow steps it also waited {cast(float, u.detail['peer_wait']):.2f}x its normal time "
                  "in the collectives it shares with its unlogged peers on the host: they were slow too (the "
                  "host, not one GPU)")
        ev.append(f"{waited:.3f} s of waiting caused; the delay is compute on the host, not the network")
        return Candidate("host", score, ev, host=u.label, source="commops")
    if u.kind == "host":
        if "replicas" in u.detail:
            ev.append(f"the {u.detail['replicas']} model replicas {u.label} holds were each slow whole, and no replica "
                      f"elsewhere was ({top_groups})")
            ev.append("data taking turns would move between hosts: one host slows every replica it holds, the last of "
                      "them collecting the waits")
        elif "grew" in u.detail:
            ev.append(f"{u.detail['grew']} of the {u.detail['logged']} logged GPUs of {u.label} computed longer in the "
                      "slow steps than in the normal ones: the host, not one GPU")
            ev.append(f"each slow step's last arriver collected its waits: {u.detail['delayed']} of them delayed their "
                      f"peers ({top_groups})")
        else:
            ev.append(f"{_of_logged(u, ranks, ops)} GPUs of {u.label} each delayed their peers ({top_groups})")
        ev.append(f"{waited:.3f} s of waiting caused; the delay is compute on the host, not the network")
        return Candidate("host", score, ev, host=u.label, source="commops")
    if u.kind == "config":
        ev.append(f"{u.label}: {_of_logged(u, ranks, ops)} GPUs compute longer than the other stages; the next stages wait on them")
        ev.append("every data-parallel replica shows the same stage lagging: the split of layers, not a device")
        return Candidate("config", score, ev, source="commops", stage=_stage(u))
    if u.detail.get("replicas") == 1:
        hosts = sorted({meta.host_of(r) for r in ranks})
        if len(hosts) > 1:
            ev.append(f"one model replica, all its GPUs on {len(hosts)} hosts, computed longer in the slow steps")
            ev.append("no one device slows hosts it does not share: the replica's batch did (sequence-length imbalance)")
        else:
            ev.append(f"one model replica, {len(ranks)} GPUs of {hosts[0]}, computed longer in the slow steps; "
                      "the host's other GPUs did not")
            ev.append("no one GPU slows its peers' compute, and a slow host slows all its GPUs: the replica's batch did "
                      "(sequence-length imbalance)")
        return Candidate("data", score, ev, source="commops")
    ev.append(f"{u.label} take turns delaying their peers: whole replicas (all their GPUs) compute longer in different steps")
    ev.append("the delay moves with the data each replica gets, not with a device: sequence-length imbalance")
    return Candidate("data", score, ev, source="commops")


def _of_logged(u: RankUnit, ranks: np.ndarray, ops: Ops) -> str:
    """"k of n" for a unit's ranks that carry blame: its coverage counts only the ranks that logged,
    so where some did not, the count says of how many logged ones."""
    here = int(np.isin(ranks, np.unique(ops.rank)).sum())
    count = round(u.coverage * here)
    return f"{count} of {len(ranks)}" if here == len(ranks) else f"{count} of the {here} logged"


def _quiet_host_candidate(u: RankUnit, score: float, g: WaitGraph, ops: Ops, meta: JobMeta) -> Candidate:
    """A GPU or host that logged nothing, shown by its peers' waits in collectives short of its copies."""
    mine = set(u.ranks)
    names = np.array([bool(mine & set(meta.groups.get(str(n), ()))) for n in ops.groups])
    hit = g.orphan & (g.missing_rank < 0) & (g.root_inst == np.arange(ops.n_inst)) & names[ops.inst_group]
    groups = Counter(str(ops.groups[x]) for x in ops.inst_group[hit][:5000])
    top_groups = ", ".join(f"{n} ({c})" for n, c in groups.most_common(3))
    host = cast(str, u.detail["quiet_host"])
    ev = [f"{host} logged nothing; in {int(hit.sum())} prolonged collectives ({top_groups}) every logged copy "
          f"waited on members there, {float(g.delay[hit].sum()):.3f} s of waiting"]
    if u.kind == "gpu":
        ev.append(f"rank {u.ranks[0]} is the member most of those waits were on: that GPU, not the whole host")
    else:
        ev.append("its GPUs were waited on alike: the host's compute and its NIC's transfers look the same from "
                  "its peers' records (a logger there, or flows, would tell them apart)")
        if quiet := sorted({a.label for a in u.also if a.kind == "host"}):
            ev.append(f"{', '.join(quiet)} logged nothing either and share a group with it that no logged rank is in, "
                      "or were waited on nearly as long: the collectives that miss them both cannot say which was slow")
    cand = _bare_candidate(u, score, meta)
    cand.evidence = ev
    return cand


def _bare_candidate(u: RankUnit, score: float, meta: JobMeta) -> Candidate:
    """A unit's candidate without evidence (the caller adds it), its device named from meta.json."""
    if u.kind == "gpu":
        info = meta.ranks.get(u.ranks[0])
        return Candidate("gpu", score, [], rank=u.ranks[0], host=info.host if info else None,
                         gpu=info.gpu if info else None, source="commops")
    if u.kind in ("host", "nic"):
        return Candidate(u.kind, score, [], host=u.label, source="commops")
    if u.kind == "link":
        pair = u.detail.get("hosts")
        return Candidate("link", score, [], hosts=[str(h) for h in pair] if isinstance(pair, list) else None, source="commops")
    return Candidate(u.kind, score, [], source="commops", stage=_stage(u) if u.kind == "config" else None)


def _stage(u: RankUnit) -> int | None:
    """The pipeline stage a config unit names, if it names one."""
    st = u.detail.get("stage")
    return int(st) if isinstance(st, int) else None


def net_candidate(c: NetCandidate, score: float, meta: JobMeta, logged: np.ndarray) -> Candidate:
    """A network device's candidate, with the groups whose transfers were slow through it.
    `logged`: per rank, whether it logged any record (a GPU's path is told from its host's NIC
    only by the host's other GPUs)."""
    ex = ", ".join(c.examples)
    common = f"transfers slow in {c.slow_units} of the {c.carried_units} groups it carries (e.g. {ex}): every copy of a collective was slow, or a transfer's data arrived late while its sender was on time"
    if c.kind == "gpu":
        r = int(c.key)  # type: ignore[arg-type]
        info = meta.ranks.get(r)
        host = info.host if info else None
        others = [x for x, i in meta.ranks.items() if i.host == host and x != r and x < len(logged) and logged[x]]
        beside = ("other GPUs of the same host communicate normally" if others else
                  f"no other GPU of {host} logged: this GPU's own path and the host's NIC show the same records")
        return Candidate("gpu", score, [f"communication path of rank {r} (its PCIe and NVLink, its NIC port): {common}", beside],
                         rank=r, host=host, gpu=info.gpu if info else None, source="commops")
    key = c.key if isinstance(c.key, tuple) else (str(c.key),)
    if c.kind == "nic":
        return Candidate("nic", score, [f"NIC of {key[0]}: {common}"], host=key[0], source="commops")
    if c.kind == "host":
        inside = ([f"including transfers that never leave the host ({', '.join(c.inside[:3])}), which its NIC does not carry"]
                  if c.inside else [])
        return Candidate("host", score, [f"inside {key[0]} (CPUs, memory, PCIe, the links among its GPUs): {common}", *inside],
                         host=key[0], source="commops")
    if c.kind == "link":
        return Candidate("link", score, [f"link {key[0]}<->{key[1]}: {common}"], hosts=list(key), source="commops")
    return Candidate("switch", score, [f"switch {key[0]}: {common}"], switch=key[0], source="commops")


def merge(primaries: list[Candidate], alternates: list[Candidate], top: int) -> list[Candidate]:
    """Independent findings first (one per fault), then other devices that could explain the
    slow transfers, each scored below every finding."""
    primaries = sorted(primaries, key=lambda c: -c.score)
    floor = min((c.score for c in primaries), default=1.0)
    for c in alternates:
        c.score = min(c.score, floor)
    ranked = _dedupe(primaries + sorted(alternates, key=lambda c: -c.score))
    # candidates that explain under 1% of the delay are noise, not suspects
    return [c for i, c in enumerate(ranked) if i == 0 or c.score >= 0.01 * ranked[0].score][:top]


def _dedupe(cands: list[Candidate]) -> list[Candidate]:
    """The first candidate of each device, in order (a device a second finding names again)."""
    seen: set[tuple[object, ...]] = set()
    out = []
    for c in cands:
        key = (c.kind, c.rank, c.host, tuple(c.hosts or ()), c.switch)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def step_times_past_warmup(table: pd.DataFrame | None) -> pd.Series | None:
    """A step table's step times (s) by step, less the warm-up's: no baseline for a slowdown."""
    if table is None or table.empty or "duration_s" not in table:
        return None
    if "pattern" in table:
        table = table[table["pattern"] != "warm-up"]
    return table.set_index("step")["duration_s"].astype(float)


def imbalance_verdict(meta: JobMeta, found: Imbalance, first_step: int | None, extra: dict[str, object] | None = None,
                      steps: np.ndarray | None = None, durations: pd.Series | None = None) -> Verdict:
    """The verdict of a job slow from `first_step`, or from `found.since`, by `found.units` (none:
    healthy). `steps`: the logged steps; `durations`: step times (s) by step."""
    more = dict(extra or {})
    units, x = found.units, found.ratio
    if not units:
        return Verdict(meta.job, "healthy", [], 1.0, [], {"source": "commops", **more})
    cands = []
    for u in units:
        cand = _bare_candidate(u, u.share, meta)
        cand.evidence = _persistent_evidence(u, x, found.since, found.on_off)
        cands += with_ties(cand, u, meta)
    workers = [float(np.median(x[np.asarray(u.witnesses)])) for u in units if u.kind in ("gpu", "host")]
    stages = [float(cast(float, u.detail["over"])) for u in units if u.kind == "config" and "over" in u.detail]
    slow = max(workers + stages[:1], default=1.0)  # (a stage: its compute over the fastest stage's)
    if found.since is not None and steps is not None:
        later = found.on_off or [int(s) for s in steps if s >= found.since]
        if durations is not None and len(durations):
            d = durations.dropna()
            before, after = d[d.index < found.since].iloc[1:], d[d.index.isin(later)]  # (the first holds warm-up)
            if len(before) and len(after):
                slow = float(after.median() / before.median())
        return Verdict(meta.job, "irregular", later, slow, cands,
                       {"source": "commops", "typical_compute_s": round(found.typical, 6), **more},
                       onset_step=found.since)
    return Verdict(meta.job, "irregular", [], slow, cands, {"source": "commops", "persistent": True,
                                                            "typical_compute_s": round(found.typical, 6), **more},
                   onset_step=first_step)


def _persistent_evidence(u: RankUnit, x: np.ndarray, began: int | None = None, on_off: list[int] | None = None) -> list[str]:
    """Why a unit slow beside its peers is named: how much longer it computed, and since when."""
    since = "in every step since the first: the job has been slow from the start, so no iteration is irregular against its neighbours"
    if u.kind in ("gpu", "host"):
        slower = float(np.median(x[np.asarray(u.witnesses)]) - 1)
        if began is not None:
            when = f"on and off ({len(on_off)} steps) since step {began}" if on_off else f"in every step since step {began}"
            since = f"{when}, and not before: its compute beside its peers' in the same steps shows when it began"
        if u.via is not None:
            return [f"rank {u.via} spent {slower:.0%} longer per step than its stage peers, waiting in collectives whose "
                    f"other members logged nothing (one rank per group logged): one of {u.tie_names()} is slow, and its "
                    "records cannot tell which", since]
        if "peer_wait" in u.detail:
            r, change = cast(int, u.detail["logged_rank"]), cast(float, u.detail["peer_wait"])
            told = ("it arrived last and they waited on it, so they are not slow (the GPU, not the host)" if u.kind == "gpu"
                    else "they are slow too (the host, not one GPU)")
            return [f"rank {r}, the only rank of its host that logged, computes {slower:.0%} longer per step than its "
                    f"peers of the same pipeline stage, and waits {change:.2f}x as long as they do in the collectives "
                    f"it shares with its unlogged peers: {told}", since]
        return [f"{u.label}: {slower:.0%} more compute per step than its peers of the same pipeline stage", since]
    if u.kind == "config":
        if u.also:  # (a stage that is one host's: `persistent._host_of_stage`)
            return [f"{u.label} computes longer than the fastest stage on every worker of the stage, and every one of them "
                    f"is on {u.also[0].label}, which holds no other stage's: the split of layers or that host, which the "
                    "records cannot tell apart", since]
        return [f"{u.label} computes longer than the fastest stage on every worker of the stage: the split of layers, not a device",
                since]
    return [f"{u.label} take turns computing longer than their stage peers: the delay moves with the data each replica gets "
            "(sequence-length imbalance), not with a device"]


#: a lasting worker excess outweighs a window's one irregular step when named this surely
LASTING_SCORE = 0.9
#: ... or a few irregular steps (at most this share of the window's), when it also cost the job
#: more time over the window than they lost
FEW_IRREGULAR = 0.1


def lost_seconds(steps: pd.DataFrame | None, irregular: Sequence[int]) -> float:
    """Time the given steps took beyond their baseline (a step table's duration_s over baseline_s)."""
    if steps is None or steps.empty or not {"step", "duration_s", "baseline_s"} <= set(steps.columns):
        return 0.0
    t = steps[steps["step"].isin(list(irregular))]
    return float(np.nansum(np.maximum(t["duration_s"].to_numpy(float) - t["baseline_s"].to_numpy(float), 0.0)))


def few_irregular(irregular: Sequence[int], steps: pd.DataFrame | None) -> bool:
    """Whether a window's irregular steps are few enough for a lasting worker excess to outweigh
    them: one, or up to FEW_IRREGULAR of the window's `steps` (a step table)."""
    n = len(irregular)
    return n == 1 or (n > 0 and steps is not None and n <= FEW_IRREGULAR * len(steps))


def lasting_over_few_steps(irregular: Verdict, lasting: Verdict, steps: pd.DataFrame | None = None) -> Verdict:
    """The verdict of a window with few irregular steps: theirs (`irregular`), unless a GPU or host
    computed longer than its stage peers in every step (`lasting`, the slow-from-the-start
    analysis), named more surely than anything the steps' waits named (or what they named: then
    slow since the first step, not since that one). One irregular step: a host at 1.9x from the
    first step slowed a sampled job's steps only 1.05x; one step measured 1.34x, and its waits
    alone named one of the host's GPUs at 0.54, since step 14. Two or more, up to FEW_IRREGULAR of
    the window's `steps`: only a device slow from the first step whose excess compute over the
    window outweighs the time those steps lost (a real MoE job's GPU at 2.37x from the first step,
    its steps drifting 1.12-1.17x for two steps late in the run: those steps' waits named a link)."""
    top = lasting.candidates[0] if lasting.candidates else None
    first = irregular.candidates[0] if irregular.candidates else None
    best = first.score if first is not None else 0.0
    same = first is not None and top is not None and first.device() == top.device()
    few = irregular.irregular_steps
    if not few_irregular(few, steps) or top is None or top.kind not in ("gpu", "host") or top.score < LASTING_SCORE or (best >= top.score and not same):
        return irregular
    if len(few) > 1 and not _outweighs(lasting, few, steps):
        return irregular
    said = f"step {few[0]}" if len(few) == 1 else f"steps {', '.join(map(str, few))}"
    lasting.extra["also"] = (f"{said} ran irregular too; {'its' if len(few) == 1 else 'their'} waits alone named "
                             + (f"{first.device()} at {best:.2f}" if first is not None else "nobody"))
    return lasting


def _outweighs(lasting: Verdict, few: Sequence[int], steps: pd.DataFrame | None) -> bool:
    """A device slow from the first step cost the window more than its few irregular steps lost."""
    if steps is None or not lasting.extra.get("persistent"):
        return False
    typical = float(cast(float, lasting.extra.get("typical_compute_s", 0.0)))
    return (lasting.slowdown - 1) * typical * len(steps) > lost_seconds(steps, few) > 0
