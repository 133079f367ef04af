"""A virtual cluster that answers read-only probes the way the injected fault would make real hosts answer.

It reads a simulated trace's meta.json and truth.json and emulates the output formats of the real
tools (nvidia-smi, dmesg, top, ip, rdma, ethtool, ...), so the same parsers read it as they read a
real machine. Each fault is realized by one concrete mechanism chosen from the trace's seed (a slow
GPU is thermal-throttled, power-capped or clock-locked; a slow NIC flaps or corrupts frames), and
the cluster shows the fault as it was while it was active. Approved remediation commands change its
state, so a re-probe can verify them. It has the `run(host, argv, timeout)` shape of explain's
ProbeBackend without importing explain/.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collector.inputs.safeio import read_json

MECHANISMS = {
    "gpu": ("thermal", "power_cap", "clocks_locked"),
    "pcie": ("width",),
    "host": ("cpu_hog", "swapping"),
    "nic": ("flapping", "rx_errors"),
    "link": ("retransmits",),
    "switch": ("ecn",),
    "stage": ("none",),
    "seqlen": ("none",),
}
MAX_SM_MHZ = 1980
GPUS_PER_HOST = 8


class VirtualCluster:
    """The hosts of one simulated job, with the trace's faults applied."""

    def __init__(self, trace_dir: Path | str) -> None:
        trace = Path(trace_dir)
        meta = read_json(trace / "meta.json")
        truth_path = trace / "truth.json"
        truth = read_json(truth_path) if truth_path.exists() else {"faults": []}
        self.name = "virtual"
        self.simulated = True  # answers come from truth.json: explain labels them simulated, never observed
        self.job = str(meta["job"])
        self.rank_host = {int(r): (str(v["host"]), int(v.get("gpu", 0))) for r, v in meta["ranks"].items()}
        self.hosts = sorted({h for h, _ in self.rank_host.values()}, key=_natural)
        self.gpus = {h: sorted(g for hh, g in self.rank_host.values() if hh == h) for h in self.hosts}
        self.switch_of = {h: str(t.get("switch")) for h, t in meta.get("topology", {}).items() if t.get("switch")}
        self.ran: list[tuple[str | None, list[str]]] = []
        self.fixed: set[tuple[str, int]] = set()
        self.drained: set[str] = set()
        rng = random.Random(int(truth.get("seed", 0)) * 7919 + 17)
        self.faults: list[dict[str, Any]] = []
        for f in truth.get("faults", []):
            if f.get("active_steps") == []:
                continue
            mech = rng.choice(MECHANISMS.get(str(f.get("kind")), ("none",)))
            self.faults.append({**f, "mechanism": mech})

    # ------------------------------------------------------------ fault lookups

    def _gpu_fault(self, host: str, gpu: int, kinds: tuple[str, ...]) -> dict[str, Any] | None:
        if (host, gpu) in self.fixed:
            return None
        for f in self.faults:
            if f.get("kind") in kinds and "rank" in f and self.rank_host.get(int(f["rank"])) == (host, gpu):
                return f
        return None

    def _host_fault(self, host: str, kinds: tuple[str, ...]) -> dict[str, Any] | None:
        for f in self.faults:
            if f.get("kind") not in kinds:
                continue
            if f.get("host") == host or host in (f.get("hosts") or []):
                return f
            if f.get("kind") == "switch" and self.switch_of.get(host) == f.get("switch"):
                return f
        return None

    # ------------------------------------------------------------ the backend method

    def run(self, host: str | None, argv: Sequence[str], timeout: float = 10.0) -> tuple[int, str]:
        argv = [str(a) for a in argv]
        self.ran.append((host, argv))
        if not argv:
            return 2, "empty command\n"
        if host is None:
            return self._control(argv)
        if host not in self.hosts:
            return 255, f"ssh: Could not resolve hostname {host}\n"
        handler = {
            "nvidia-smi": self._nvidia_smi, "dmesg": self._dmesg, "top": self._top, "numastat": self._numastat,
            "cat": self._cat, "iostat": self._iostat, "df": self._df, "ip": self._ip, "ethtool": self._ethtool,
            "rdma": self._rdma, "perfquery": self._perfquery, "ibstatus": self._ibstatus, "ps": self._ps,
        }.get(argv[0])
        if handler is None:
            return 127, f"bash: {argv[0]}: command not found\n"
        return handler(host, argv)

    def _control(self, argv: list[str]) -> tuple[int, str]:
        if argv[0] == "scontrol" and len(argv) >= 3 and argv[1] == "update":
            node = next((a.split("=", 1)[1] for a in argv if a.startswith("NodeName=")), None)
            if node:
                self.drained.add(node)
            return 0, ""
        if argv[0] in ("scontrol", "kubectl"):
            return 0, ""
        return 127, f"bash: {argv[0]}: command not found\n"

    # ------------------------------------------------------------ GPU tools

    def _gpu_row(self, host: str, gpu: int, fields: list[str]) -> str:
        f = self._gpu_fault(host, gpu, ("gpu",))
        p = self._gpu_fault(host, gpu, ("pcie",))
        factor = float(f.get("factor", 1.0)) if f else 1.0
        mech = f.get("mechanism", "") if f else ""
        sm = int(MAX_SM_MHZ / factor)
        temp = 91 if mech == "thermal" else 52 + gpu
        power = 280.0 if mech == "power_cap" else 610.0 - 5 * gpu
        limit = 300.0 if mech == "power_cap" else 700.0
        reasons = {"thermal": 0x40 | 0x20, "power_cap": 0x4, "clocks_locked": 0x0}.get(mech, 0x0)
        width = 4 if p and float(p.get("factor", 1.0)) >= 3 else (8 if p else 16)
        vals = {
            "index": gpu, "clocks.sm": sm, "clocks.max.sm": MAX_SM_MHZ, "temperature.gpu": temp,
            "power.draw": f"{power:.2f}", "power.limit": f"{limit:.2f}",
            "clocks_throttle_reasons.active": f"0x{reasons:016x}",
            "pcie.link.gen.current": 5, "pcie.link.gen.max": 5, "pcie.link.width.current": width,
            "pcie.link.width.max": 16, "ecc.errors.uncorrected.volatile.total": 0,
            "ecc.errors.corrected.volatile.total": 0, "remapped_rows.pending": "No",
        }
        return ", ".join(str(vals.get(k, "[N/A]")) for k in fields)

    def _nvidia_smi(self, host: str, argv: list[str]) -> tuple[int, str]:
        gpus = self.gpus[host]
        sel = gpus
        if "-i" in argv:
            idx = argv[argv.index("-i") + 1] if argv.index("-i") + 1 < len(argv) else ""
            if not idx.isdigit() or int(idx) not in gpus:
                return 6, "No devices were found\n"
            sel = [int(idx)]
        query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
        if query:
            return 0, "".join(self._gpu_row(host, g, query.split(",")) + "\n" for g in sel)
        if any(a.startswith("--query-compute-apps=") for a in argv):
            return 0, "".join(f"{40000 + g}, python3, 61234\n" for g in sel)
        if len(argv) > 1 and argv[1] == "nvlink":
            return 0, "".join(f"GPU {g}: NVIDIA H100 80GB HBM3\n" + "".join(f"\t Link {i}: 26.562 GB/s\n" for i in range(18)) for g in sel)
        if len(argv) > 1 and argv[1] == "topo":
            head = "\t" + "\t".join([f"GPU{g}" for g in gpus] + [f"NIC{g}" for g in gpus]) + "\tCPU Affinity\n"
            rows = "".join(f"GPU{g}\t" + "\t".join("X" if h == g else "NV18" for h in gpus) + "\t"
                           + "\t".join("PIX" if n == g else ("NODE" if n // 4 == g // 4 else "SYS") for n in gpus)
                           + f"\t{0 if g < 4 else 56}-{55 if g < 4 else 111}\n" for g in gpus)
            return 0, head + rows
        if "--reset-gpu-clocks" in argv or "-rgc" in argv or "--gpu-reset" in argv:
            for g in sel:
                f = self._gpu_fault(host, g, ("gpu",))
                if f and (f.get("mechanism", "") == "clocks_locked" or "--gpu-reset" in argv):
                    self.fixed.add((host, g))
            return 0, "".join(f"GPU {g}: reset done\n" for g in sel)
        return 0, "NVIDIA-SMI 550.54.15\n"

    def _dmesg(self, host: str, argv: list[str]) -> tuple[int, str]:
        lines = [f"[Sun Nov 22 07:{10 + i:02d}:00 2026] {msg}" for i, msg in enumerate([
            "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode",
            "mlx5_core 0000:1a:00.0: firmware version 28.39.1002",
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        ])]
        f = self._host_fault(host, ("nic",))
        if f and f.get("mechanism", "") == "flapping":
            lines += [f"[Sun Nov 22 08:0{i}:11 2026] mlx5_core 0000:1a:00.0 ens1np0: Link {'down' if i % 2 == 0 else 'up'}" for i in range(6)]
        return 0, "\n".join(lines) + "\n"

    # ------------------------------------------------------------ host tools

    def _top(self, host: str, argv: list[str]) -> tuple[int, str]:
        f = self._host_fault(host, ("host",))
        mech = f.get("mechanism", "") if f else ""
        idle = 1.5 if mech == "cpu_hog" else 62.0
        us = 97.0 if mech == "cpu_hog" else 35.0
        swap_used = 26000.0 if mech == "swapping" else 0.0
        procs = [(40000 + g, "python3", 101.0 + g) for g in self.gpus[host]]
        if mech == "cpu_hog":
            procs.insert(0, (3117, "backup-agent", 2350.0))
        out = [f"top - 08:11:02 up 12 days,  3:02,  0 users,  load average: {180.0 if mech == 'cpu_hog' else 24.1:.2f}, 20.0, 18.0",
               "Tasks: 812 total,   9 running, 803 sleeping,   0 stopped,   0 zombie",
               f"%Cpu(s): {us:4.1f} us,  1.2 sy,  0.0 ni, {idle:4.1f} id,  0.3 wa,  0.0 hi,  0.0 si,  0.0 st",
               "MiB Mem : 2063937.0 total, 1200000.0 free, 700000.0 used, 163937.0 buff/cache",
               f"MiB Swap:  32768.0 total, {32768.0 - swap_used:7.1f} free, {swap_used:7.1f} used. 1300000.0 avail Mem",
               "", "    PID USER      PR  NI    VIRT    RES    SHR S  %CPU  %MEM     TIME+ COMMAND"]
        out += [f"{pid:7d} train     20   0  120.3g  40.1g   2.1g R {cpu:5.1f}   2.0 812:01.11 {cmd}" for pid, cmd, cpu in procs]
        return 0, "\n".join(out) + "\n"

    def _numastat(self, host: str, argv: list[str]) -> tuple[int, str]:
        return 0, ("                           node0           node1\n"
                   "numa_hit             91234567890     90234567890\n"
                   "numa_miss                1234567         2345678\n"
                   "numa_foreign             2345678         1234567\n"
                   "interleave_hit             65432           65431\n"
                   "local_node           91134567890     90134567890\n"
                   "other_node             101234567       102345678\n")

    def _cat(self, host: str, argv: list[str]) -> tuple[int, str]:
        if argv[1:] == ["/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"]:
            return 0, "performance\n"
        return 1, f"cat: {' '.join(argv[1:])}: Permission denied\n"

    def _iostat(self, host: str, argv: list[str]) -> tuple[int, str]:
        return 0, ("Linux 6.5.0 (" + host + ")\t11/22/2026\t_x86_64_\t(224 CPU)\n\n"
                   "Device            r/s     rkB/s   rrqm/s  %rrqm r_await rareq-sz     w/s     wkB/s   wrqm/s  %wrqm w_await wareq-sz     d/s     dkB/s   drqm/s  %drqm d_await dareq-sz     f/s f_await  aqu-sz  %util\n"
                   "nvme0n1         12.00    480.00     0.00   0.00    0.21    40.00   30.00   2400.00     1.00   3.23    0.40    80.00    0.00      0.00     0.00   0.00    0.00     0.00    0.00    0.00    0.02   1.20\n\n")

    def _df(self, host: str, argv: list[str]) -> tuple[int, str]:
        return 0, ("Filesystem     1024-blocks      Used  Available Capacity Mounted on\n"
                   "/dev/nvme0n1p1   3750000000 900000000 2850000000      24% /\n"
                   "tmpfs             1031968768         0 1031968768       0% /dev/shm\n")

    # ------------------------------------------------------------ network tools

    def _nics(self, host: str) -> list[str]:
        return [f"ens{g + 1}np0" for g in self.gpus[host]]

    def _ip(self, host: str, argv: list[str]) -> tuple[int, str]:
        f = self._host_fault(host, ("nic",))
        mech = f.get("mechanism", "") if f else ""
        links: list[dict[str, Any]] = [{"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536,
                                        "operstate": "UNKNOWN", "link_type": "loopback", "stats64": {"rx": {}, "tx": {}}},
                                       {"ifindex": 2, "ifname": "eno1", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
                                        "mtu": 1500, "operstate": "UP", "link_type": "ether",
                                        "stats64": {"rx": {"errors": 0, "crc_errors": 0}, "tx": {"carrier_changes": 2}}}]
        for i, name in enumerate(self._nics(host)):
            bad = bool(f) and i == 0
            links.append({"ifindex": 3 + i, "ifname": name, "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
                          "mtu": 4200, "operstate": "UP", "link_type": "ether",
                          "stats64": {"rx": {"bytes": 10**12, "packets": 10**9, "errors": 48211 if bad and mech == "rx_errors" else 0,
                                             "dropped": 0, "crc_errors": 48211 if bad and mech == "rx_errors" else 0},
                                      "tx": {"bytes": 10**12, "packets": 10**9, "errors": 0,
                                             "carrier_changes": 38 if bad and mech == "flapping" else 2}}})
        return 0, json.dumps(links)

    def _ethtool(self, host: str, argv: list[str]) -> tuple[int, str]:
        iface = argv[-1]
        if iface not in self._nics(host):
            return 71, f"netlink error: no device matches name ({iface})\n"
        if "-S" in argv:
            return 0, "NIC statistics:\n     rx_prio3_pause: 12\n     tx_prio3_pause: 9\n"
        return 0, (f"Settings for {iface}:\n\tSupported link modes:   100000baseCR4/Full\n\t                        "
                   "200000baseCR4/Full\n\t                        400000baseCR4/Full\n\tSpeed: 400000Mb/s\n\tDuplex: Full\n\tLink detected: yes\n")

    def _rdma(self, host: str, argv: list[str]) -> tuple[int, str]:
        link = self._host_fault(host, ("link",))
        sw = self._host_fault(host, ("switch",))
        lines = []
        for g in self.gpus[host]:
            retrans = 25000 + 1000 * g if link else 3
            ecn = 900000 + 5000 * g if sw else 120
            lines.append(f"link mlx5_{g}/1 rx_write_requests 912345 rx_read_requests 1234 rx_atomic_requests 0 "
                         f"out_of_buffer 0 out_of_sequence {retrans} duplicate_request 0 rnr_nak_retry_err 0 "
                         f"packet_seq_err {retrans // 10} implied_nak_seq_err 0 local_ack_timeout_err {retrans // 100} "
                         f"resp_local_length_error 0 np_ecn_marked_roce_packets {ecn} np_cnp_sent {ecn // 2} "
                         f"rp_cnp_handled {ecn // 2} roce_adp_retrans 0")
        return 0, "\n".join(lines) + "\n"

    def _perfquery(self, host: str, argv: list[str]) -> tuple[int, str]:
        return 1, "ibwarn: [1234] mad_rpc_open_port: can't open UMAD port ((null):0)\n"

    def _ibstatus(self, host: str, argv: list[str]) -> tuple[int, str]:
        return 0, ""

    def _ps(self, host: str, argv: list[str]) -> tuple[int, str]:
        env = "NCCL_IB_HCA=mlx5 NCCL_SOCKET_IFNAME=eno1 NCCL_DEBUG=WARN CUDA_DEVICE_MAX_CONNECTIONS=1 HOME=/home/train"
        return 0, "".join(f"python3 pretrain_gpt.py --rank {g} {env}\n" for g in self.gpus[host])


def _natural(name: str) -> tuple[Any, ...]:
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
