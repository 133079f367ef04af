"""Cross-iteration ranking: accumulate blame per device over the window, then name the unit.

Blame is the delay each root imposed on others (seconds of waiting it caused), summed over the
analysed steps, so a device that added more step time ranks higher. Blame that lands on ranks
is then explained by the smallest unit that carries it: one GPU; every GPU of one host (host);
every GPU of one pipeline stage across hosts (config: stage imbalance); whole model replicas
that take turns (data: sequence-length imbalance). A multi-rank unit is named only when most
of its members carry blame — otherwise the blame belongs to the individual GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collector.trace.meta import JobMeta

COVERAGE = 0.6  # share of a unit's ranks that must carry blame to name the unit
TURNS_MOST = 0.8  # data taking turns: the most turns one replica may hold when another held two strong ones
# a host's one logged rank, slow: its time in collectives with its unlogged peers fell under this
# share of its normal (it arrived last: its GPU alone), or rose over this many times (they were
# slow too: the host); between them its records cannot tell (`localize.ops.lone.wait_change`)
LAST_ARRIVER = 0.8
PEERS_SLOW = 1.3
MIN_SHARE = 0.08  # a further candidate must explain at least this share of the blame
#: a host's GPU computed longer with it when its growth was this share of its top GPU's or more: a host's
#: CPUs are shared unevenly (a real node under a CPU quota, its two ranks 328 and 159 ms a step longer
#: in the five steps the summary path judged, was named its first GPU's)
GREW_SHARE = 1 / 3
#: a rank's slowdown is its unlogged peers' where at least this share of it is time waiting on them:
#: a host slowed whole grows the rank's compute as much as its waits (each a half)
UNSEEN_SHARE = 2 / 3
QUIET_GPU = 0.6  # on a host that logged nothing, one GPU with this share of the host's blame is named
QUIET_NEAR = 0.8  # ... and other such hosts with this share of its blame or more are tied with it


@dataclass
class RankUnit:
    kind: str  # gpu, host, config, data (nic, link: only in a tie of devices its records cannot tell apart)
    ranks: list[int]
    share: float  # share of all rank blame it explains
    coverage: float
    label: str
    detail: dict[str, object] = field(default_factory=dict)
    also: list[RankUnit] = field(default_factory=list)  # devices its records cannot tell from it (a tie)
    via: int | None = None  # the logged rank whose records show it, when it logged nothing itself

    @property
    def witnesses(self) -> list[int]:
        """The logged ranks whose records show it."""
        if self.via is not None:
            return [self.via]
        return [int(self.detail["logged_rank"])] if "logged_rank" in self.detail else self.ranks  # type: ignore[call-overload]

    def tie_names(self) -> str:
        """It and the devices tied with it, as the evidence names them."""
        return ", ".join(f"{a.kind} {a.label}" for a in [self, *self.also])


def layout_units(meta: JobMeta, world: int, kinds: dict[str, str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Per rank: host index, pipeline stage, model replica (connected over tp/cp/pp/ep groups)."""
    hosts = meta.hosts()
    host = host_index(meta, world)
    stage, _ = pipeline_stages(meta, world, kinds)
    parent = np.arange(world)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for name, members in meta.groups.items():
        kind = kinds.get(name, "")
        mem = [m for m in members if 0 <= m < world]
        if kind in ("tp", "cp", "pp") and mem:
            root = find(mem[0])
            for m in mem[1:]:
                parent[find(m)] = root
    replica = np.array([find(r) for r in range(world)])
    return host, stage, np.unique(replica, return_inverse=True)[1], hosts


def host_index(meta: JobMeta, world: int) -> np.ndarray:
    """Per rank: its host's index in `meta.hosts()`; -1 where meta.json does not place it."""
    hidx = {h: i for i, h in enumerate(meta.hosts())}
    return np.array([hidx[meta.ranks[r].host] if r in meta.ranks else -1 for r in range(world)])


def pipeline_stages(meta: JobMeta, world: int, kinds: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: its pipeline stage (its place in its pipeline group), and whether any group says it.

    A TP or CP group lies within one stage, so a rank of a pipeline group no kind was found for
    (none of its members logged, its name says nothing) takes its stage from its TP peers. Without
    pipeline groups every rank is stage 0, and known."""
    stage = np.zeros(world, dtype=np.int64)
    known = np.zeros(world, dtype=bool)
    for name, members in meta.groups.items():
        if kinds.get(name) == "pp":
            for pos, m in enumerate(members):
                if 0 <= m < world:
                    stage[m], known[m] = pos, True
    if not known.any():
        return stage, np.ones(world, dtype=bool)
    for name, members in meta.groups.items():  # one pass per group: stage-sharing groups lend theirs
        mine = np.asarray([m for m in members if 0 <= m < world], dtype=np.int64)
        if kinds.get(name) in ("tp", "cp") and mine.size and known[mine].any() and not known[mine].all():
            stage[mine[~known[mine]]] = stage[mine[known[mine]][0]]
            known[mine] = True
    return stage, known


def explain_rank_blame(blame: np.ndarray, meta: JobMeta, kinds: dict[str, str], top: int = 5,
                       logged: np.ndarray | None = None, static: bool = True,
                       unseen: np.ndarray | None = None, peers: dict[int, list[int]] | None = None,
                       by_step: np.ndarray | None = None, peer_wait: np.ndarray | None = None,
                       quiet: np.ndarray | None = None, grew: np.ndarray | None = None,
                       computed: np.ndarray | None = None) -> list[RankUnit]:
    """Greedy: repeatedly name the unit that best explains the remaining rank blame.

    `logged`: per rank, whether it logged any record; a unit's coverage counts only those (a job
    that logs one rank per TP group says nothing of the others). `static`: the blame may have a
    static cause (the window was slow from its first step); a split of layers does not change
    mid-run, so a slowdown with an onset is never named config. `unseen`: per rank, the part of
    its blame that is time it waited in collectives whose other members, `peers`, logged
    nothing: one of those was slow, and which one its records cannot say. `by_step`: the blame
    per rank in each slow step, where replicas taking turns show even when each turn's blame
    lands on the one stage its delay began at (`replica_turns`). `peer_wait`: per rank, its time in
    collectives with unlogged peers in the slow steps over before (`localize.ops.lone.wait_change`):
    for a host's one logged rank it tells its GPU from its host. `quiet`: per rank, known to have
    logged nothing at all (default: not `logged`; the summary path reads only some ranks' records).
    `grew`: per rank, how much its own compute grew in the slow steps (s): a host whose logged GPUs
    all computed longer is the host, however the blame for its waits fell among them (over a few
    slow steps, on one or two of its GPUs: each step's last arriver collects it). `computed`: per
    rank, 1 where its own compute grew materially in the slow steps, 0 where not, NaN where it logged
    nothing (`localize.commops.computed_longer`): a host whose logged ranks only waited on unlogged
    peers, none computing longer, is not slow whole (its logged GPUs would be slow too)."""
    world = len(blame)
    total = float(blame.sum())
    if total <= 0:
        return []
    seen = np.ones(world, dtype=bool) if logged is None else np.asarray(logged[:world], dtype=bool)
    # ranks known to have logged nothing at all (default: every rank not `logged`)
    silent = ~seen if quiet is None else np.asarray(quiet[:world], dtype=bool)

    def _coverage(b: np.ndarray, ranks: np.ndarray, top: float) -> float:
        """Share of the unit's logged ranks carrying a good part (30%) of the top rank's blame."""
        mine = ranks[seen[ranks]]
        return float((b[mine] >= 0.3 * top).mean()) if top > 0 and mine.size else 0.0

    def _grown(ranks: np.ndarray, r: int) -> float:
        """Share of the unit's logged ranks whose compute grew by GREW_SHARE of the top rank's or more."""
        mine = ranks[seen[ranks]]
        if grew is None or not mine.size or not grew[r] > 0:
            return 0.0
        return float((grew[mine] >= GREW_SHARE * grew[r]).mean())

    host, stage, replica, hosts = layout_units(meta, world, kinds)
    b = blame.astype(np.float64).copy()
    out: list[RankUnit] = []
    while len(out) < top and b.sum() > MIN_SHARE * total:
        options: list[RankUnit] = []
        r = int(np.argmax(b))
        top_b = float(b[r])
        h = host[r]
        hr = np.flatnonzero(host == h) if h >= 0 else np.array([r])
        alone = len(hr) > 1 and seen[hr].sum() == 1
        if unseen is not None and peers and peers.get(r) and unseen[r] > UNSEEN_SHARE * blame[r]:
            options.append(_unlogged_peer(r, peers[r], float(b[r]) / total, host, hosts, seen))
        elif h >= 0 and silent[hr].all():
            on = (host >= 0) & silent
            quiet_sums = np.bincount(host[on], weights=b[on], minlength=len(hosts))
            near = [int(x) for x in np.flatnonzero(quiet_sums >= QUIET_NEAR * quiet_sums[h]) if x != h and silent[host == x].all()]
            coupled = sorted(set(_coupled_quiet(hr, meta, ~silent, host)) | set(near))
            options.append(_quiet_host(r, hr, b, total, hosts, host, coupled))
        elif alone:
            # the host's one logged rank: a slow GPU there and the whole host slowed alike make it
            # compute longer; whether its unlogged peers kept it waiting tells them apart, if clearly
            change = float(peer_wait[r]) if peer_wait is not None else float("nan")
            gpu = RankUnit("gpu", [r], float(b[r]) / total, 1.0, f"rank {r}")
            whole = RankUnit("host", hr.tolist(), float(b[r]) / total, 1.0, hosts[h])
            if change < LAST_ARRIVER or change > PEERS_SLOW:
                decided = gpu if change < LAST_ARRIVER else whole
                decided.detail.update({"peer_wait": change, "logged_rank": r})
                options.append(decided)
            else:
                gpu.also = [whole]
                options.append(gpu)
        else:
            options.append(RankUnit("gpu", [r], float(b[r]) / total, 1.0, f"rank {r}"))
        host_grew = batch_grew = False
        if len(hr) > 1 and not alone:
            blamed, grown = _coverage(b, hr, top_b), _grown(hr, r)
            whole = RankUnit("host", hr.tolist(), float(b[hr].sum()) / total, max(blamed, grown), hosts[h])
            if grown > blamed:  # (its evidence then says what its GPUs did, not whom each delayed)
                logged_here = int(seen[hr].sum())
                whole.detail.update({"logged": logged_here, "grew": round(grown * logged_here),
                                     "delayed": round(blamed * logged_here)})
                host_grew = grown >= COVERAGE
            options.append(whole)
        if static and stage.max() > 0:
            sr = np.flatnonzero(stage == stage[r])
            if len(np.unique(host[sr])) > 1:
                options.append(RankUnit("config", sr.tolist(), float(b[sr].sum()) / total, _coverage(b, sr, top_b),
                                        f"pipeline stage {int(stage[r])}", {"stage": int(stage[r])}))
        n_rep = int(replica.max()) + 1
        if n_rep > 1:
            # a replica is whole when most of its ranks carry its own top rank's share: the replica
            # that got the longest sequences in most steps must not hide the others' turns
            rep_cov = np.array([_coverage(b, rr := np.flatnonzero(replica == k), float(b[rr].max(initial=0.0)))
                                for k in range(n_rep)])
            rep_sum = np.bincount(replica, weights=b, minlength=n_rep)
            # (or most of the top rank's replica computed longer, across hosts, and few ranks of other
            # replicas on those hosts did (a host would slow them too): the replica's batch, however
            # the waits fell among its GPUs -- a 2.05x batch on tp2 pp8, each replica two hosts, left
            # its blame on the last stages' host)
            mine = np.flatnonzero(replica == replica[r])
            beside = np.flatnonzero(np.isin(host, host[mine]) & (replica != replica[r]) & (host >= 0))
            if len(np.unique(host[mine])) > 1 and _grown(beside, r) < GREW_SHARE:
                replica_grown = _grown(mine, r)
                batch_grew = replica_grown >= COVERAGE
                rep_cov[replica[r]] = max(rep_cov[replica[r]], replica_grown)
            good = (rep_cov >= COVERAGE) & (rep_sum >= 0.1 * rep_sum.max())
            if by_step is not None and blamed_at_once(by_step, replica, np.flatnonzero(good)):
                good[:] = False  # every step's blame on all of them at once: nobody's turn, no one replica's batch
            several: tuple[np.ndarray, float] | None = None
            if good.sum() >= 2 and replica[r] in np.flatnonzero(good):
                several = np.flatnonzero(np.isin(replica, np.flatnonzero(good))), float(rep_cov[good].mean())
            elif by_step is not None and (turns := replica_turns(by_step, replica)) is not None and replica[r] in turns[0]:
                several = np.flatnonzero(np.isin(replica, turns[0])), turns[1]
            if several is not None:
                rr, cov = several
                n = len(np.unique(replica[rr]))
                if h >= 0 and (host[rr] == h).all() and (seen & (host != h)).any():
                    # the replicas are all one host's, and ranks elsewhere logged: a slow host slows
                    # every replica it holds, the last of them collecting the waits (seed 8686 job
                    # 26: a host spike read as two replicas taking turns)
                    options.append(RankUnit("host", hr.tolist(), float(b[hr].sum()) / total, cov, hosts[h],
                                            {"replicas": n}))
                else:
                    options.append(RankUnit("data", rr.tolist(), float(b[rr].sum()) / total, cov,
                                            f"{n} model replicas", {"replicas": n}))
            elif good[replica[r]] and (len(np.unique(host[rr := np.flatnonzero(replica == replica[r])])) > 1
                                       or (seen[hr] & ~np.isin(hr, rr)).any()):
                # one whole replica slow across several hosts, or a part of one host whose other
                # logged ranks were not: no one device slows just that, its batch does (a spike whose
                # few steps all fell to the same replica; four of a host's eight GPUs in one step)
                options.append(RankUnit("data", rr.tolist(), float(b[rr].sum()) / total, float(rep_cov[replica[r]]),
                                        "1 model replica", {"replicas": 1}))
        qualified = [o for o in options if o is options[0] or (o.coverage >= COVERAGE
                                                               and not _only_waited(options[0], o, seen, computed))]
        if batch_grew and any(o.kind == "data" for o in qualified):
            qualified = [o for o in qualified if o.kind != "host"]  # (its other hosts grew too: no one of them)
        if host_grew and options[0].kind == "gpu" and options[0].ranks == [r] and len(qualified) > 1:
            # its host's logged GPUs all computed longer: the host, though every wait fell to this
            # one (the last to arrive collects it; a real DDP job's slow host, read from six fetched
            # steps, had one GPU of two blamed for all of them)
            qualified = qualified[1:]
        # Occam: the smallest unit that explains nearly as much as the largest
        top_share = max(o.share for o in qualified)
        best = min((o for o in qualified if o.share >= 0.85 * top_share), key=lambda o: len(o.ranks))
        if best.share < MIN_SHARE and out:
            break
        out.append(best)
        b[best.ranks if best.via is None else [best.via]] = 0.0
        if "quiet_host" in best.detail:
            b[[x for a in best.also for x in a.ranks]] = 0.0  # (hosts tied with it: one finding)
    return out


def _only_waited(first: RankUnit, unit: RankUnit, seen: np.ndarray, computed: np.ndarray | None) -> bool:
    """Whether the top rank's blame is its wait on unlogged peers (`first` is named via it) and no
    logged rank of a larger `unit` (a host, a replica, a stage) computed longer: one unlogged GPU,
    not the unit, which would slow its logged GPUs too. With one rank logged per TP group, a slow
    GPU's expert all-to-all kept a second TP group of its host waiting, and both logged ranks'
    waits read as "the host" (seed 4242's 512-GPU tp4 pp2 ep2 job)."""
    if first.via is None or computed is None:
        return False
    ranks = np.asarray(unit.ranks)
    return none_longer(computed[ranks[seen[ranks]]])


def none_longer(computed: np.ndarray) -> bool:
    """Whether some of these ranks logged (`commops.computed_longer`: NaN where not) and none of
    them computed longer."""
    known = computed[~np.isnan(computed)]
    return len(known) > 0 and not known.any()


def replica_steps(by_step: np.ndarray, replica: np.ndarray) -> np.ndarray:
    """Replica × step: the blame (rank × step `by_step`) each model replica held in each slow step."""
    per = np.zeros((int(replica.max()) + 1, by_step.shape[1]))
    np.add.at(per, replica[: by_step.shape[0]], by_step)
    return per


def blamed_at_once(by_step: np.ndarray, replica: np.ndarray, chosen: np.ndarray) -> bool:
    """Whether the `chosen` replicas (three or more) carried each slow step's blame side by side:
    in the median step, more than half of them at once (the inverse Simpson count of their
    shares). A replica's data slows it in its own steps, one or two replicas a step; blame spread
    evenly over all of them in every step is the whole job waiting, not data (a link on a
    1,024-GPU job, judged with the sidecars' rule over four steps, left a little blame on every
    rank, and "64 model replicas" outscored the link)."""
    if len(chosen) < 3 or by_step.shape[1] == 0:
        return False
    per = replica_steps(by_step, replica)[chosen]
    total = per.sum(axis=0)
    live = total > 0
    if not live.any():
        return False
    at_once = total[live] ** 2 / np.maximum((per[:, live] ** 2).sum(axis=0), 1e-300)
    return float(np.median(at_once)) > 0.5 * len(chosen)


def replica_turns(by_step: np.ndarray, replica: np.ndarray) -> tuple[np.ndarray, float] | None:
    """The model replicas that take turns holding a slow step's blame (rank × step `by_step`), and
    the share of steps one replica held; None unless most steps' blame lies in one replica, at
    least two replicas had turns and none more than half of them (one that does is a device: a
    slow host that logged nothing held 5 of 8, its blame landing on another replica in the rest).
    Two slow steps are enough: a two-step spike on two replicas of 64 moved (each replica's blame
    was one stage's, so no replica read whole, and one GPU was named at 0.04)."""
    n_rep = int(replica.max()) + 1
    if n_rep < 2 or by_step.shape[1] < 2:
        return None
    per = replica_steps(by_step, replica)
    total = per.sum(axis=0)
    held = (total > 0) & (per.max(axis=0) >= 0.5 * total)
    if held.sum() < COVERAGE * max(int((total > 0).sum()), 1):
        return None
    owners = per.argmax(axis=0)[held]
    counts = np.bincount(owners, minlength=n_rep)
    if (counts > 0).sum() < 2:
        return None
    if counts.max() > 0.5 * len(owners):
        # one replica held most turns: still the data when another held two or more as strong as
        # a typical step's (a random batch with dp 2 falls 8 to 5), and that one no more than
        # TURNS_MOST; a device's blame landing elsewhere now and then is weak there
        size = per.max(axis=0)[held]
        strong = np.bincount(owners[size >= 0.5 * np.median(size)], minlength=n_rep)
        others = np.sort(strong)[-2]
        if others < 2 or counts.max() > TURNS_MOST * len(owners):
            return None
    return np.flatnonzero(counts), float(held.mean())


def _quiet_host(r: int, hr: np.ndarray, b: np.ndarray, total: float, hosts: list[str], host: np.ndarray,
                coupled: list[int]) -> RankUnit:
    """The top rank is on a host that logged nothing; its peers' records waited on its GPUs. One GPU
    that collected most of the host's blame is named; else the host, tied with its NIC (a transfer
    from it and its compute look the same to its peers), and with the hosts that logged nothing
    either and share a group with it or were waited on nearly as long (`coupled`): the groups that
    miss both say nothing of which was slow."""
    name = hosts[int(host[r])]
    mine = float(b[hr].sum())
    if b[r] >= QUIET_GPU * mine and not coupled:
        return RankUnit("gpu", [r], float(b[r]) / total, 1.0, f"rank {r}", {"quiet_host": name})
    also = [RankUnit("nic", hr.tolist(), mine / total, 1.0, name, {"quiet_host": name})]
    for h in coupled:
        ranks = np.flatnonzero(host == h).tolist()
        also += [RankUnit(k, ranks, mine / total, 1.0, hosts[h], {"quiet_host": hosts[h]}) for k in ("host", "nic")]
    return RankUnit("host", hr.tolist(), mine / total, 1.0, name, {"quiet_host": name}, also=also)


def _coupled_quiet(hr: np.ndarray, meta: JobMeta, seen: np.ndarray, host: np.ndarray) -> list[int]:
    """Other hosts that logged nothing and share with the ranks `hr` a group no member of which
    logged (a tensor-parallel group across two such hosts): no record tells them apart."""
    mine = set(hr.tolist())
    out: set[int] = set()
    for members in meta.groups.values():  # one per group
        if mine & set(members) and not any(seen[m] for m in members if 0 <= m < len(seen)):
            out |= {int(host[m]) for m in members if 0 <= m < len(host) and host[m] >= 0}
    return sorted(out - {int(host[hr[0]])})


def _unlogged_peer(r: int, peers: list[int], share: float, host: np.ndarray, hosts: list[str],
                   seen: np.ndarray) -> RankUnit:
    """A tie of the unlogged members rank `r` waited on and of the hosts none of whose GPUs logged:
    a host slowed whole there, or its NIC or a link its group's transfers cross where the group
    spans hosts (to `r`'s host, or between its members' hosts in ring order), would show the same
    (`r`'s own host or NIC would slow `r`'s records too)."""
    gpus = [RankUnit("gpu", [p], share, 1.0, f"rank {p}", via=r) for p in peers]
    quiet = sorted({int(host[p]) for p in peers if host[p] >= 0 and not seen[host == host[p]].any()})
    also = gpus[1:]
    pairs: list[tuple[int, int]] = []
    for h in quiet:
        mine = np.flatnonzero(host == h).tolist()
        also.append(RankUnit("host", mine, share, 1.0, hosts[h], via=r))
        if host[r] >= 0 and host[r] != h:
            also.append(RankUnit("nic", mine, share, 1.0, hosts[h], via=r))
            pairs.append((int(host[r]), h))
    ring = sorted([r, *peers])  # (a TP group spread over hosts, one GPU each: its ring's links)
    for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
        ends = (int(host[a]), int(host[b]))
        if min(ends) >= 0 and ends[0] != ends[1] and (ends[0] in quiet or ends[1] in quiet):
            pairs.append(ends)
    for a_h, b_h in dict.fromkeys(tuple(sorted(p)) for p in pairs):
        also.append(RankUnit("link", np.flatnonzero(np.isin(host, (a_h, b_h))).tolist(), share, 1.0,
                             f"{hosts[a_h]}<->{hosts[b_h]}", via=r, detail={"hosts": [hosts[a_h], hosts[b_h]]}))
    return RankUnit("gpu", gpus[0].ranks, share, 1.0, gpus[0].label, via=r, also=also)
