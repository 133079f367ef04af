"""Cluster and job layout: Megatron rank order, hosts under ToR switches, process groups."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collector.trace.meta import JobMeta, RankInfo
from simulator.config import SimConfig

GROUP_KINDS = ("tp", "cp", "ep", "dp", "pp", "mp")  # mp: one model replica (tp x cp x pp), for the iteration-end sync


def _opaque(name: str, seed: int) -> str:
    """A process-group name that says nothing of its kind, as torch's default names do."""
    import hashlib

    return "pg-" + hashlib.sha1(f"{seed}:{name}".encode()).hexdigest()[:10]


def rank_ip(host_index: int, gpu: int) -> str:
    """One RoCE NIC per GPU (rail-optimized): 10.<hi>.<lo>.<10+gpu>."""
    return f"10.{(host_index >> 8) & 255}.{host_index & 255}.{10 + gpu}"


@dataclass
class Layout:
    """Where every rank sits, and which group of each kind it belongs to.

    Rank order is Megatron's tp-cp-ep-dp-pp: rank = tp_i + tp*(cp_i + cp*(dp_i + dp*pp_i)),
    and expert groups split the data-parallel axis as dp_i = ep_i + ep*edp_i. The model-parallel
    group (Megatron's `get_model_parallel_group`) holds one replica: every rank with the same dp_i.
    """

    cfg: SimConfig
    host: np.ndarray  # [N] host index of each rank
    switch: np.ndarray  # [N] switch index of each rank
    group_of: dict[str, np.ndarray]  # kind -> [N] group index
    members: dict[str, np.ndarray]  # kind -> [G, k] member ranks, in ring order
    names: list[str]  # all group names; global id = offset[kind] + index
    offset: dict[str, int]

    @classmethod
    def build(cls, cfg: SimConfig) -> Layout:
        n = cfg.gpus
        ranks = np.arange(n)
        tp_i = ranks % cfg.tp
        cp_i = (ranks // cfg.tp) % cfg.cp
        dp_i = (ranks // (cfg.tp * cfg.cp)) % cfg.dp
        pp_i = ranks // (cfg.tp * cfg.cp * cfg.dp)
        ep_i = dp_i % cfg.ep
        edp_i = dp_i // cfg.ep
        host = ranks // cfg.gpus_per_host
        switch = host // cfg.hosts_per_switch
        # each kind: the coordinate that varies inside a group, and a key for the others
        key = {
            "tp": ((cp_i * cfg.dp + dp_i) * cfg.pp + pp_i, tp_i),
            "cp": ((tp_i * cfg.dp + dp_i) * cfg.pp + pp_i, cp_i),
            "ep": (((tp_i * cfg.cp + cp_i) * (cfg.dp // cfg.ep) + edp_i) * cfg.pp + pp_i, ep_i),
            "dp": ((tp_i * cfg.cp + cp_i) * cfg.pp + pp_i, dp_i),
            "pp": ((tp_i * cfg.cp + cp_i) * cfg.dp + dp_i, pp_i),
            "mp": (dp_i, tp_i + cfg.tp * (cp_i + cfg.cp * pp_i)),
        }
        sizes = {"tp": cfg.tp, "cp": cfg.cp, "ep": cfg.ep, "dp": cfg.dp, "pp": cfg.pp, "mp": cfg.tp * cfg.cp * cfg.pp}
        group_of: dict[str, np.ndarray] = {}
        members: dict[str, np.ndarray] = {}
        names: list[str] = []
        offset: dict[str, int] = {}
        for kind in GROUP_KINDS:
            gkey, pos = key[kind]
            # renumber groups in order of their lowest rank, so tp-0 holds rank 0
            uniq, first = np.unique(gkey, return_index=True)
            order = np.argsort(first, kind="stable")
            renum = np.empty_like(order)
            renum[order] = np.arange(order.size)
            gidx = renum[np.searchsorted(uniq, gkey)]
            mem = np.empty((uniq.size, sizes[kind]), dtype=np.int64)
            mem[gidx, pos] = ranks
            group_of[kind] = gidx
            members[kind] = mem
            offset[kind] = len(names)
            names.extend(f"{kind}-{g}" for g in range(uniq.size))
        if cfg.opaque_groups:
            names = [_opaque(name, cfg.seed) for name in names]
        return cls(cfg, host, switch, group_of, members, names, offset)

    def active_kinds(self) -> list[str]:
        c = self.cfg
        sizes = {"tp": c.tp, "cp": c.cp, "ep": c.ep, "dp": c.dp, "pp": c.pp, "mp": c.tp * c.cp * c.pp if c.mp_sync else 1}
        return [k for k in GROUP_KINDS if sizes[k] > 1]

    def host_name(self, h: int) -> str:
        return f"node-{h}"

    def host_index(self, name: str) -> int:
        try:
            h = int(name.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            h = -1
        if not 0 <= h < int(self.host.max()) + 1:
            from collector.inputs.errors import UserError

            raise UserError(f"unknown host '{name}'", f"hosts are node-0..node-{int(self.host.max())}")
        return h

    def switch_index(self, name: str) -> int:
        try:
            s = int(name.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            s = -1
        if not 0 <= s < int(self.switch.max()) + 1:
            from collector.inputs.errors import UserError

            raise UserError(f"unknown switch '{name}'", f"switches are tor-0..tor-{int(self.switch.max())}")
        return s

    def meta(self) -> JobMeta:
        cfg = self.cfg
        ranks = {
            int(r): RankInfo(host=self.host_name(int(self.host[r])), gpu=int(r % cfg.gpus_per_host),
                             ip=rank_ip(int(self.host[r]), int(r % cfg.gpus_per_host)))
            for r in range(cfg.gpus)
        }
        groups: dict[str, list[int]] = {}
        for kind in self.active_kinds():
            for g, mem in enumerate(self.members[kind]):
                groups[self.names[self.offset[kind] + g]] = [int(x) for x in mem]
        n_hosts = int(self.host.max()) + 1
        topology = {self.host_name(h): {"switch": f"tor-{h // cfg.hosts_per_switch}"} for h in range(n_hosts)}
        return JobMeta(job=cfg.job, world_size=cfg.gpus, ranks=ranks, groups=groups,
                       parallelism={} if cfg.opaque_groups else cfg.parallelism(), topology=topology,
                       extra={"gpus_per_host": cfg.gpus_per_host, "schedule": "interleaved-1f1b" if cfg.virtual_stages > 1 else "1f1b",
                              "microbatches": cfg.microbatches, "virtual_stages": cfg.virtual_stages,
                              **({"group_kinds": {"mp": "model-parallel group (tp x cp x pp of one replica): "
                                                        "one all_reduce at each iteration's end"}}
                                 if cfg.mp_sync and not cfg.opaque_groups else {})})
