"""Small simulated traces with flows, built once per test session (shared by the flows tests)."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from simulator.config import P2P_MODES, FaultSpec, SimConfig
from simulator.flows import emit_flows
from simulator.writer import simulate_trace

_ROOT = Path(tempfile.mkdtemp(prefix="laggard-flows-tests-"))

#: name -> (config, faults); small layouts that still put every group kind on the network
CASES: dict[str, tuple[dict, list[str]]] = {
    "healthy": ({"gpus": 64, "tp": 8, "pp": 2}, []),
    "straggler": ({"gpus": 64, "tp": 8, "pp": 2}, ["gpu:rank=13,factor=2,steps=6:11"]),
    "nic": ({"gpus": 64, "tp": 8, "pp": 2}, ["nic:host=node-3,factor=3,steps=5:11"]),
    "link": ({"gpus": 64, "tp": 8}, ["link:hosts=node-2+node-3,factor=4,steps=5:11"]),
    "switch": ({"gpus": 128, "tp": 8, "pp": 2}, ["switch:switch=tor-1,factor=3,steps=5:11"]),
    "pcie": ({"gpus": 64, "tp": 8, "pp": 2}, ["pcie:rank=21,factor=4,steps=5:11"]),
    "small-a": ({"gpus": 32, "tp": 8, "job": "job-a"}, []),
    "small-b": ({"gpus": 32, "tp": 4, "pp": 2, "job": "job-b", "seed": 3}, []),
    "slow-from-start": ({"gpus": 128, "tp": 8, "pp": 2}, ["gpu:rank=21,factor=2"]),  # node-2, every step
    # (eager: the iterations come out cut into pieces and pairs, the slow host on time in the pieces)
    "slow-from-start-cut": ({"gpus": 32, "tp": 4, "pp": 2, "steps": 16, "seed": 21}, ["gpu:rank=13,factor=2"]),
    # (data-parallel rings of two hosts: the median of a ring holding the straggler is half its lateness)
    "slow-from-start-pairs": ({"gpus": 64, "tp": 8, "pp": 4, "steps": 16, "seed": 21}, ["gpu:rank=9,factor=1.5"]),
    "nic-from-start": ({"gpus": 128, "tp": 8, "pp": 2}, ["nic:host=node-3,factor=3"]),  # every step
    "pairs": ({"gpus": 32, "tp": 8, "pp": 2}, []),  # dp 2: data-parallel rings of two hosts, no longer ring
    "tp-across-hosts": ({"gpus": 64, "tp": 8, "gpus_per_host": 4}, []),  # each TP ring spans two hosts
}
#: every point-to-point semantics the simulator knows: flow recognition must not depend on one
SEMANTICS = P2P_MODES


@functools.cache
def sim_flows(name: str, pcap: bool = False, p2p: str = "rendezvous") -> Path:
    cfg, faults = CASES[name]
    out = _ROOT / (name + ("-pcap" if pcap else "") + "-" + p2p)
    base = {"steps": 12, "job": name, **cfg, "p2p": p2p}
    simulate_trace(SimConfig(**base, faults=[FaultSpec.parse(f) for f in faults]), out)
    emit_flows(out, pcap=pcap)
    return out
