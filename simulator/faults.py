"""Injected faults as per-step multipliers: compute slow-downs per rank, slow-downs per network edge."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.cluster import Layout
from simulator.config import FaultSpec, SimConfig

NETWORK_KINDS = ("pcie", "nic", "link", "switch")
COMPUTE_KINDS = ("gpu", "host", "stage", "seqlen")


@dataclass
class ActiveFault:
    """A fault resolved against the layout, with its effective factor at every step (1 = off)."""

    spec: FaultSpec
    factor_by_step: np.ndarray  # [steps]
    ranks: np.ndarray  # ranks whose compute it slows (compute kinds)
    host: int = -1
    hosts: tuple[int, int] = (-1, -1)
    switch: int = -1
    rank: int = -1

    def active_steps(self) -> list[int]:
        return [int(s) for s in np.flatnonzero(self.factor_by_step > 1.0 + 1e-9)]

    def root(self, layout: Layout) -> dict[str, object]:
        """The verdict candidate a correct localizer should rank first for this fault."""
        k = self.spec.kind
        if k in ("gpu", "pcie"):
            r = self.rank
            return {"kind": "gpu", "rank": r, "host": layout.host_name(int(layout.host[r])),
                    "gpu": int(r % layout.cfg.gpus_per_host), **({"component": "pcie"} if k == "pcie" else {})}
        if k in ("host", "nic"):
            return {"kind": k, "host": layout.host_name(self.host)}
        if k == "link":
            return {"kind": "link", "hosts": [layout.host_name(h) for h in self.hosts]}
        if k == "switch":
            return {"kind": "switch", "switch": f"tor-{self.switch}"}
        if k == "stage":
            return {"kind": "config", "stage": self.spec.stage}
        return {"kind": "data"}


def resolve_faults(cfg: SimConfig, layout: Layout) -> list[ActiveFault]:
    """Turn specs into per-step factors; patterns draw from their own RNG so noise stays identical."""
    out: list[ActiveFault] = []
    stage_size = cfg.gpus // cfg.pp
    for i, spec in enumerate(cfg.faults):
        rng = np.random.default_rng([cfg.seed, 7919, i])
        lo, hi = spec.steps if spec.steps else (0, cfg.steps - 1)
        lo, hi = max(0, lo), min(cfg.steps - 1, hi)
        eff = np.ones(cfg.steps)
        if lo <= hi:
            window = np.arange(lo, hi + 1)
            if spec.pattern == "persistent":
                eff[window] = spec.factor
            elif spec.pattern == "spike":
                n = max(1, round(0.2 * window.size))
                eff[rng.choice(window, size=n, replace=False)] = spec.factor
            else:  # fluctuation: on and off, varying strength
                on = rng.random(window.size) < 0.6
                on[rng.integers(window.size)] = True
                strength = rng.uniform(0.5, 1.0, window.size)
                eff[window[on]] = 1.0 + (spec.factor - 1.0) * strength[on]
        af = ActiveFault(spec, eff, ranks=np.empty(0, dtype=np.int64))
        k = spec.kind
        if k in ("gpu", "pcie"):
            if spec.rank is None or not 0 <= spec.rank < cfg.gpus:
                from collector.inputs.errors import UserError

                raise UserError(f"--fault {k}: rank {spec.rank} is not in 0..{cfg.gpus - 1}", "pick a rank of the job")
            af.rank = spec.rank
            af.ranks = np.array([spec.rank]) if k == "gpu" else af.ranks
        elif k in ("host", "nic"):
            af.host = layout.host_index(spec.host or "")
            af.ranks = np.flatnonzero(layout.host == af.host) if k == "host" else af.ranks
        elif k == "link":
            a, b = spec.hosts or ("", "")
            af.hosts = (layout.host_index(a), layout.host_index(b))
        elif k == "switch":
            af.switch = layout.switch_index(spec.switch or "")
        elif k == "stage":
            if spec.stage is None or not 0 <= spec.stage < cfg.pp:
                from collector.inputs.errors import UserError

                raise UserError(f"--fault stage: stage {spec.stage} is not in 0..{cfg.pp - 1}", "pick a pipeline stage")
            af.ranks = np.arange(spec.stage * stage_size, (spec.stage + 1) * stage_size)
        out.append(af)
    return out


class FaultModel:
    """Answers, for one step: how slow is each rank's compute, and each network edge."""

    def __init__(self, cfg: SimConfig, layout: Layout, faults: list[ActiveFault]) -> None:
        self.cfg = cfg
        self.layout = layout
        self.faults = faults
        self.net = [f for f in faults if f.spec.kind in NETWORK_KINDS]
        self._seqlen_rng = np.random.default_rng([cfg.seed, 104729])
        self._dp_index = (np.arange(cfg.gpus) // (cfg.tp * cfg.cp)) % cfg.dp
        self._edge_masks: dict[tuple[str, object], list[np.ndarray]] = {}

    def compute_multiplier(self, step: int) -> np.ndarray:
        cfg = self.cfg
        progress = step / max(1, cfg.steps - 1)
        mult = np.full(cfg.gpus, 1.0 + cfg.drift * progress)
        for f in self.faults:
            eff = f.factor_by_step[step]
            if f.spec.kind == "seqlen":
                pick = self._seqlen_rng.integers(cfg.dp)  # drawn every step: same stream with or without the fault
                if eff > 1.0:
                    mult[self._dp_index == pick] *= eff
            elif f.spec.kind in COMPUTE_KINDS and eff > 1.0:
                mult[f.ranks] *= eff
        return mult

    def host_jitter_ranks(self, step: int) -> np.ndarray:
        """Ranks of hosts with active CPU contention: their launches jitter chunk to chunk."""
        parts = [f.ranks for f in self.faults if f.spec.kind == "host" and f.factor_by_step[step] > 1.0]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def _masks(self, key: tuple[str, object], a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
        """Per network fault: which (a[i], b[i]) edges it slows. Cached: layouts never change."""
        if key not in self._edge_masks:
            lay = self.layout
            ha, hb = lay.host[a], lay.host[b]
            inter = ha != hb
            masks = []
            for f in self.net:
                k = f.spec.kind
                if k == "pcie":
                    m = (a == f.rank) | (b == f.rank)
                elif k == "nic":
                    m = (ha == f.host) | (hb == f.host)
                elif k == "link":
                    x, y = f.hosts
                    m = ((ha == x) & (hb == y)) | ((ha == y) & (hb == x))
                else:
                    m = (lay.switch[a] == f.switch) | (lay.switch[b] == f.switch)
                masks.append(m & inter)
            self._edge_masks[key] = masks
        return self._edge_masks[key]

    def edge_factor(self, key: tuple[str, object], a: np.ndarray, b: np.ndarray, step: int) -> np.ndarray:
        """Slow-down of each edge a[i] -> b[i] at this step (max over active network faults)."""
        out = np.ones(a.shape)
        if not self.net:
            return out
        for f, m in zip(self.net, self._masks(key, a, b), strict=True):
            eff = f.factor_by_step[step]
            if eff > 1.0:
                np.maximum(out, np.where(m, eff, 1.0), out=out)
        return out

    def group_factor(self, kind: str, step: int) -> np.ndarray:
        """Slow-down of each group of a kind: its slowest edge (ring neighbours; all pairs for all_to_all)."""
        mem = self.layout.members[kind]
        if not self.net:
            return np.ones(mem.shape[0])
        if kind == "ep":
            k = mem.shape[1]
            ii, jj = np.triu_indices(k, 1)
            a, b = mem[:, ii], mem[:, jj]
        else:
            a, b = mem, np.roll(mem, -1, axis=1)
        return self.edge_factor(("group", kind), a, b, step).max(axis=1)
