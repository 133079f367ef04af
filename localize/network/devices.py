"""Resolve slow communication to a device: a GPU's own path, a NIC, a link or a switch.

A slow transfer slows every operator whose ring (or p2p pair) crosses the faulty device, and
none that does not. So each device is scored by how well "the unit crosses this device"
matches "the unit's transfers were slow": recall over the slow units, precision over all the
units the device carries. Shared devices (a switch carries many groups) are not over-blamed:
every healthy unit they carry costs them precision.

Every member of a ring sees the ring's slowest edge, so a slow unit names the set of devices
its edges cross, never one edge; units that were slow and units that were not, intersected and
subtracted, narrow it down. Where they cannot (one ring over every host and nothing else on
the network, or rings that all cross the same hosts in the same order), several devices
explain the slow units exactly as well: `tied_best` returns them all so the verdict can say so.

A host's inside (its CPUs, memory and PCIe, the links among its GPUs) is on every transfer that
touches the host, the ones that never leave it included. A starved or throttled host slows
those too, which its NIC cannot: so the host is a device here, named where its own internal
transfers were slow with the ones through its NIC.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from collector.trace.meta import JobMeta
from localize.ops.grouping import group_quantile

KIND_ORDER = {"gpu": 0, "link": 1, "nic": 2, "host": 3, "switch": 4}


@dataclass
class NetCandidate:
    kind: str
    key: tuple[str, ...] | int  # rank for gpu, (host,) nic, (a, b) link, (switch,) switch
    score: float
    slow_units: int
    carried_units: int
    examples: list[str] = field(default_factory=list)
    carried: list[str] = field(default_factory=list)  # every unit it carries
    inside: list[str] = field(default_factory=list)  # host: its slow units that never left it

    def label(self) -> str:
        """The device's name as the verdict text writes it (rank 5, node-3, node-2<->node-3, tor-1)."""
        if self.kind == "gpu":
            return f"rank {self.key}"
        key = self.key if isinstance(self.key, tuple) else (str(self.key),)
        return "<->".join(key)


#: a switch's uplink to the rest of the fabric: only the traffic that leaves the switch crosses it
#: (a congested or degraded uplink slows that and spares the hosts' traffic among themselves)
UPLINK = "uplink"
#: a GPU's own path with its transfers inside the host: where they go over PCIe (no NVLink) a
#: downgraded link slows them too; over NVLink they are spared. Judged both ways, like a switch
GPU_WITH_INSIDE = "gpu+inside"


def unit_devices(members: list[int], meta: JobMeta, mesh: bool = False) -> set[tuple[str, object]]:
    """Devices one unit's transfers cross: for each edge, the inside of the hosts at its ends and
    both GPUs' own paths with the host's inside; for an edge that leaves a host, also both GPUs'
    paths to the network, both NICs, the link between the hosts and their switches.

    A ring (all-reduce, all-gather, reduce-scatter, p2p) sends to its ring neighbour; an
    all-to-all (`mesh`) sends from every member to every other.
    """
    devs: set[tuple[str, object]] = set()
    k = len(members)
    if k < 2:
        return devs
    if mesh:
        edges = [(members[i], members[j]) for i in range(k) for j in range(i + 1, k)]
    else:
        edges = [(members[i], members[(i + 1) % k]) for i in range(k if k > 2 else 1)]
    for a, b in edges:
        if a not in meta.ranks or b not in meta.ranks:
            continue
        ha, hb = meta.host_of(a), meta.host_of(b)
        devs.add(("host", (ha,)))
        devs.add(("host", (hb,)))
        devs.add((GPU_WITH_INSIDE, a))
        devs.add((GPU_WITH_INSIDE, b))
        if ha == hb:
            continue
        devs.add(("gpu", a))  # the GPU's own path to the network: its PCIe, its NIC port
        devs.add(("gpu", b))
        devs.add(("nic", (ha,)))
        devs.add(("nic", (hb,)))
        devs.add(("link", tuple(sorted((ha, hb)))))
        sa, sb = meta.switch_of(ha), meta.switch_of(hb)
        for sw in {sa, sb} - {None}:
            devs.add(("switch", (sw,)))
            if sa != sb:
                devs.add((UPLINK, (sw,)))
    return devs


def resolve_network(units: dict[str, list[int]], slow: dict[str, float], meta: JobMeta,
                    top: int = 5, mesh: set[str] | None = None,
                    partly: dict[str, float] | None = None, total: float | None = None) -> list[NetCandidate]:
    """Rank devices by how well they explain which units were slow (`slow`: unit -> weight).

    `units` maps every unit observed in the analysed window to its member ranks (ring order),
    including the units that were not slow: they are the evidence that clears a device.
    `mesh`: the units whose operator is all-to-all (every pair exchanges data).
    `partly`: units that slowed, but in too few of their copies to be called slow (unit -> how
    far towards slow, 0..1): they clear a device that carries them only that much less, and
    count towards its recall by the same fraction. `total`: the slowing to explain, when more
    than `slow` and `partly` hold (what `beyond_common_mode` took away is slowing no device
    explains).
    """
    if not slow:
        return []
    mesh = mesh or set()
    partly = partly or {}
    carried: dict[tuple[str, object], list[str]] = defaultdict(list)
    crossed: dict[str, set[tuple[str, object]]] = {}
    for name, members in units.items():
        crossed[name] = unit_devices(members, meta, name in mesh)
        for dev in crossed[name]:
            carried[dev].append(name)
    # a host whose transfers all leave it carries what its NIC carries: nothing tells its inside
    # from its NIC then, and the NIC, which a slow transfer is known to cross, stands for both
    for dev in [d for d in carried if d[0] == "host"]:
        if carried[dev] == carried.get(("nic", dev[1]), []):
            del carried[dev]
    # so does a host's only GPU: its own path to the network carries every transfer of the NIC,
    # which stands for both (another GPU of the host that logged nothing keeps them apart)
    alone = Counter(info.host for info in meta.ranks.values())
    for dev in [d for d in carried if d[0] in ("gpu", GPU_WITH_INSIDE)]:
        host = meta.host_of(int(dev[1]))  # type: ignore[call-overload]
        if alone[host] == 1 and carried[dev] == carried.get(("nic", (host,)), []):
            del carried[dev]
    total_w = max(sum(slow.values()) + SLOW_FRAC * sum(partly.values()), total or 0.0)
    # devices of each kind the job's transfers cross: with no prior on which kind fails, one
    # device of a scarce kind (a switch) is likelier than one of many (a link), when both
    # explain the slow transfers equally well
    per_kind: dict[str, int] = defaultdict(int)
    for kind, _ in carried:
        per_kind[kind] += 1
    out: list[NetCandidate] = []
    cand = {dev for name in slow for dev in crossed.get(name, set())}
    for dev in cand:
        names = carried.get(dev, [])
        if not names:
            continue
        hit = [n for n in names if n in slow]
        recall = (sum(slow[n] for n in hit) + SLOW_FRAC * sum(partly.get(n, 0.0) for n in names if n not in slow)) / total_w
        precision = (len(hit) + sum(partly.get(n, 0.0) for n in names if n not in slow)) / len(names)
        if recall <= 0:
            continue
        score = 2 * precision * recall / (precision + recall)
        kind, key = dev
        nkey: tuple[str, ...] | int = int(key) if isinstance(key, (int, np.integer)) else tuple(key)  # type: ignore[arg-type]
        inside = [n for n in hit if kind == "host" and n not in carried.get(("nic", key), [])]
        named = {UPLINK: "switch", GPU_WITH_INSIDE: "gpu"}.get(kind, kind)
        out.append(NetCandidate(named, nkey, score, len(hit), len(names),
                                sorted(hit, key=lambda n: -slow[n])[:3], names, sorted(inside, key=lambda n: -slow[n])))
    # a switch is named once, as whole or as its uplink, a GPU's path with or without its transfers
    # inside the host, whichever explains the transfers better
    best: dict[tuple[str, object], NetCandidate] = {}
    for c in out:
        if (c.kind, c.key) not in best or c.score > best[(c.kind, c.key)].score:
            best[(c.kind, c.key)] = c
    out = list(best.values())
    per_kind.pop(UPLINK, None)
    per_kind.pop(GPU_WITH_INSIDE, None)
    out.sort(key=lambda c: (-round(c.score, 6), per_kind[c.kind], c.carried_units, KIND_ORDER[c.kind], _natural(c.key)))
    return out[:top]


def _natural(key: tuple[str, ...] | int) -> tuple[object, ...]:
    """Sort key that puts node-2 before node-10 (and rank 2 before rank 10)."""
    parts = (key,) if isinstance(key, int) else key
    return tuple(int(p) if isinstance(p, int) else tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p))
                 for p in parts)


def tied_best(cands: list[NetCandidate]) -> list[NetCandidate]:
    """The devices that explain the slow transfers as well as the best one does."""
    return [c for c in cands if cands and c.score >= cands[0].score - 1e-6]


def _plural(kind: str, n: int) -> str:
    return kind if n == 1 else kind + ("es" if kind == "switch" else "s")


def tie_note(tie: list[NetCandidate]) -> str:
    """One evidence line that says CommOps cannot tell these devices apart, and names them."""
    by_kind: dict[str, list[str]] = defaultdict(list)
    for c in tie:
        by_kind[c.kind].append(c.label())
    parts = []
    for kind in sorted(by_kind, key=lambda k: len(by_kind[k])):
        names = by_kind[kind]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        parts.append(f"{len(names)} {_plural(kind, len(names))} ({shown})")
    return (f"CommOps cannot tell apart {len(tie)} devices that every slow transfer crosses and no normal one "
            f"does: {'; '.join(parts)}; listed scarcest kind first; flows or a probe can decide")


#: a unit is slow when its transfers were slow in this much more of its copies than in normal steps
SLOW_FRAC = 0.3


def slow_units(unit_of_inst: np.ndarray, unit_names: list[str], comm_inst: np.ndarray,
               analysed: np.ndarray, min_frac: float = SLOW_FRAC, normal: np.ndarray | None = None) -> dict[str, float]:
    """Units whose own transfers were slow in at least `min_frac` of their analysed instances
    more often than in their `normal` ones (instances of the reference steps).

    Returns unit -> that excess fraction: how consistently slow it became, not how much delay it
    caused downstream (that would favour units late in the step). A stream whose transfer time
    is noisy (a busy host, small messages) measures "slow" in normal steps too; only the change
    is evidence.
    """
    n_units = len(unit_names)

    def frac(hit: np.ndarray, seen: np.ndarray) -> np.ndarray:
        n = np.bincount(unit_of_inst[seen], minlength=n_units).astype(np.float64)
        return np.bincount(unit_of_inst[hit & seen], minlength=n_units) / np.maximum(n, 1)

    excess = frac(comm_inst, analysed)
    if normal is not None:
        excess = excess - frac(comm_inst, normal)
    return {unit_names[i]: float(excess[i]) for i in np.flatnonzero(excess >= min_frac)}


def beyond_common_mode(excess: dict[str, float], units: dict[str, list[int]], meta: JobMeta,
                       kind: dict[str, str]) -> dict[str, float]:
    """`slow_units`' excess of each unit that never leaves its host, less the median of the
    units of its kind (`kind`: unit -> tp, cp, pp...) that never leave theirs: what slows every
    host's inside at once (this machine's load under a real job, every TP ring waiting on a
    late peer's batched transfer) is no evidence against one host; one host's slowing beyond the
    others' is."""
    inside: dict[str, list[str]] = {}
    for n, m in units.items():
        if m and all(r in meta.ranks for r in m) and len({meta.host_of(r) for r in m}) == 1:
            inside.setdefault(kind.get(n, ""), []).append(n)
    base = {n: max(float(np.median([excess.get(x, 0.0) for x in names])), 0.0)
            for names in inside.values() if len(names) > 1 for n in names}
    moved = {n: x - base.get(n, 0.0) for n, x in excess.items()}
    return {n: x for n, x in moved.items() if x > 0 or n not in base}


#: a point-to-point unit slowed by less than this share of the most slowed one's time per byte is
#: collateral, not on the fault's path (a real link throttled to 1 Gbit/s: its transfers 16 ms/MiB
#: longer; those of one of its ends with a third host, in the same backlog, 0.6 ms/MiB): the devices
#: it crosses did not slow it, so it clears them as a normal unit does
COLLATERAL_SHARE = 0.1


def slowing_per_byte(unit_of_inst: np.ndarray, n_units: int, excess_s: np.ndarray, slow: np.ndarray,
                     nbytes: np.ndarray) -> np.ndarray:
    """Per unit: the median, over its `slow` instances, of how much longer each took than its path
    needs (`excess_s`) per byte it moved (`nbytes`, per unit); 0 where none was slow."""
    per = group_quantile(unit_of_inst[slow], n_units, excess_s[slow], 0.5)
    return np.nan_to_num(per) / np.maximum(nbytes, 1.0)


def discount_collateral(excess: dict[str, float], per_byte: dict[str, float]) -> dict[str, float]:
    """`excess` (unit -> how consistently slow) with each unit of `per_byte` (point-to-point units:
    its `slowing_per_byte`) under COLLATERAL_SHARE of the most slowed one's set to 0: not slow.

    A device short of bandwidth adds the same time per byte to every transfer it carries; a
    transfer it slowed by a twentieth of that is not its: what its slowing backs up (a host's other
    transfers, queued behind a throttled link's) is no evidence for the host's NIC, and a device
    that carries it would have slowed it as much. How consistently a unit was slow cannot tell
    these apart; how much it was slowed can. Collectives are left as they are: the bytes their
    algorithm puts on each path vary."""
    top = max((x for n, x in per_byte.items() if excess.get(n, 0.0) >= SLOW_FRAC), default=0.0)
    if top <= 0:
        return excess
    return {n: x * float(per_byte[n] >= COLLATERAL_SHARE * top) if n in per_byte else x for n, x in excess.items()}


def split_slow(excess: dict[str, float], min_frac: float = SLOW_FRAC) -> tuple[dict[str, float], dict[str, float]]:
    """Units that slowed (`slow_units` at `min_frac=0`) split into the slow ones and the partly
    slow ones, the latter weighted by how far they came towards `min_frac`: a group out of a
    throttled host whose small messages were late in a fifth of their copies is weak evidence
    for that host, not a clearing of it."""
    slow = {n: x for n, x in excess.items() if x >= min_frac}
    partly = {n: x / min_frac for n, x in excess.items() if 0 < x < min_frac}
    return slow, partly
