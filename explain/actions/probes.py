"""The probe toolkit: named, whitelisted, read-only commands, each with a parser for its output.

Every run ends in one typed outcome: `ok` (the tool answered, nothing wrong), `abnormal` (it
answered and reported a fault), `unreachable` (the host could not be reached: ssh's own failure),
`error` (the tool failed, timed out, is missing, or printed what its parser does not understand)
or `not-run` (dry run). Only ok and abnormal are evidence; the others carry no findings, so they
can neither confirm a cause nor count as "hardware clean".

A probe is never a shell string. Its argv is a fixed template whose placeholders are whole
tokens (`{gpu}`, `{iface}`) filled only after the arguments were checked against the job's
inventory; the host is not part of the argv at all (the backend decides how to reach it).
Parsers are pure functions from the command's text output to finding tags such as
`gpu.thermal` that knowledge-base entries cite in `confirmed_by`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from collector.inputs.names import nic_problem
from explain.actions.inventory import Inventory

Outcome = Literal["ok", "abnormal", "unreachable", "error", "not-run"]
#: outcomes that are an answer from the device, and so evidence
ANSWERED: tuple[Outcome, ...] = ("ok", "abnormal")
#: what OpenSSH (exit 255) and friends print when the host itself could not be reached
UNREACHABLE_RE = re.compile(
    r"(?im)^(?:ssh: |kex_exchange_identification|Connection (?:closed|reset) by)|connection refused|"
    r"could not resolve hostname|no route to host|connection timed out|network is unreachable|"
    r"host key verification failed|permission denied \(publickey")
#: nvidia-smi's own answer when a GPU is gone (non-zero exit, but the tool did answer)
GPU_LOST_RE = re.compile(r"(?i)unable to determine the device handle|gpu is lost|no devices were found")


@dataclass
class Parsed:
    """What a parser read from one probe's output."""

    findings: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    understood: bool = True  # False: the output is not what the tool prints, so it says nothing


Parser = Callable[[str, Mapping[str, Any]], Parsed]


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    summary: str
    argv: tuple[str, ...]
    params: tuple[str, ...]  # placeholders besides the host: "gpu", "iface"
    parser: Parser
    findings: tuple[str, ...]
    keep_raw: bool = True  # False where raw output may hold secrets (process environments)
    #: output by which the tool answers "device faulty" with a non-zero exit (else non-zero = error)
    answers_failure: re.Pattern[str] | None = None


class ProbeRejected(ValueError):
    """A probe request that is not on the whitelist or whose arguments fail validation."""


@dataclass
class ProbeCall:
    """A validated request: which probe, on which host, with which arguments, as an argv list."""

    name: str
    host: str
    args: dict[str, Any]
    argv: list[str]


@dataclass
class ProbeResult:
    id: str
    name: str
    host: str
    args: dict[str, Any]
    argv: list[str]
    rc: int
    findings: list[str]
    values: dict[str, Any]
    summary: str
    raw: str = ""
    outcome: Outcome = "ok"

    @property
    def healthy(self) -> bool:
        """The device answered and nothing was wrong (a failed probe is never healthy)."""
        return self.outcome == "ok"

    @property
    def answered(self) -> bool:
        return self.outcome in ANSWERED

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "probe": self.name, "host": self.host, "args": self.args, "argv": self.argv,
                "rc": self.rc, "outcome": self.outcome, "findings": self.findings, "values": self.values,
                "summary": self.summary}


# ---------------------------------------------------------------- parsers (pure)

def _num(text: str) -> float | None:
    text = text.strip().split()[0] if text.strip() else ""
    try:
        return float(text)
    except ValueError:
        return None


def _csv_rows(out: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip() and "," in line]


THROTTLE_BITS = {0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal",
                 0x40: "hw_thermal", 0x80: "hw_power_brake"}


def parse_gpu_clocks(out: str, args: Mapping[str, Any]) -> Parsed:
    """`nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit,
    clocks_throttle_reasons.active --format=csv,noheader,nounits`."""
    p = Parsed()
    rows = {r[0]: r for r in _csv_rows(out) if len(r) >= 7}
    want = str(args.get("gpu")) if args.get("gpu") is not None else None
    if want is not None and GPU_LOST_RE.search(out):
        p.findings.append("gpu.missing")
        p.summary = f"GPU {want} did not answer"
        return p
    if want is not None and want not in rows:
        return Parsed(summary=f"no row for GPU {want} in the output", understood=False)
    notes = []
    for idx, r in rows.items():
        sm, mx, temp, power, limit = (_num(x) for x in r[1:6])
        try:
            reasons = int(r[6], 16)
        except ValueError:
            reasons = 0
        names = [n for bit, n in THROTTLE_BITS.items() if reasons & bit]
        p.values[idx] = {"sm_mhz": sm, "max_mhz": mx, "temp_c": temp, "power_w": power, "limit_w": limit,
                         "throttle": names}
        low = sm is not None and mx and sm < 0.75 * mx
        tags: list[str] = []
        if (reasons & 0x60) or (temp is not None and temp >= 87 and low):
            tags.append("gpu.thermal")
        if reasons & 0x80:
            tags.append("gpu.power_brake")
        if reasons & 0x8 and not reasons & 0x60:
            tags.append("gpu.hw_slowdown")
        if low and reasons & 0x4:
            tags.append("gpu.power_cap")
        if low and not tags:
            tags.append("gpu.clocks_locked")
        if low:
            tags.append("gpu.clock_low")
        p.findings += [t for t in tags if t not in p.findings]
        if tags:
            notes.append(f"GPU {idx}: SM {sm:.0f}/{mx:.0f} MHz, {temp:.0f} C, {power:.0f}/{limit:.0f} W, "
                         f"throttle={'+'.join(names) or 'none'}")
    p.summary = "; ".join(notes) if notes else f"{len(rows)} GPU(s) at normal clocks"
    return p


def parse_gpu_ecc(out: str, args: Mapping[str, Any]) -> Parsed:
    """`nvidia-smi --query-gpu=index,ecc.errors.uncorrected.volatile.total,
    ecc.errors.corrected.volatile.total,remapped_rows.pending`."""
    p = Parsed()
    for r in _csv_rows(out):
        if len(r) < 4:
            continue
        unc, cor = _num(r[1]) or 0, _num(r[2]) or 0
        pending = r[3].lower() in ("yes", "1", "true")
        p.values[r[0]] = {"uncorrected": unc, "corrected": cor, "remap_pending": pending}
        if unc > 0:
            p.findings.append("gpu.ecc_uncorrected")
        if cor > 1000:
            p.findings.append("gpu.ecc_corrected_high")
        if pending:
            p.findings.append("gpu.remap_pending")
    p.findings = sorted(set(p.findings))
    p.summary = ", ".join(f"GPU {k}: {v['uncorrected']:.0f} uncorrected / {v['corrected']:.0f} corrected ECC"
                          for k, v in p.values.items()) or "no ECC data"
    return p


def parse_gpu_pcie(out: str, args: Mapping[str, Any]) -> Parsed:
    """`nvidia-smi --query-gpu=index,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,
    pcie.link.width.max`."""
    p = Parsed()
    notes = []
    for r in _csv_rows(out):
        if len(r) < 5:
            continue
        gen, gmax, width, wmax = (_num(x) for x in r[1:5])
        p.values[r[0]] = {"gen": gen, "gen_max": gmax, "width": width, "width_max": wmax}
        if width and wmax and width < wmax:
            p.findings.append("pcie.width_downgraded")
            notes.append(f"GPU {r[0]}: PCIe x{width:.0f} of x{wmax:.0f}")
        if gen and gmax and gen < gmax:
            p.findings.append("pcie.gen_downgraded")
            notes.append(f"GPU {r[0]}: PCIe Gen{gen:.0f} of Gen{gmax:.0f}")
    p.findings = sorted(set(p.findings))
    p.summary = "; ".join(notes) or "PCIe links at full width and speed"
    return p


XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")
KERNEL_PATTERNS = {
    "kernel.pcie_aer": re.compile(r"(?i)pcie bus error|\bAER\b:.*(corrected|uncorrected)"),
    "kernel.soft_lockup": re.compile(r"(?i)soft lockup|rcu.*stall|blocked for more than"),
    "kernel.oom": re.compile(r"(?i)out of memory: kill"),
    "kernel.segfault": re.compile(r"\bsegfault at\b"),
    "nic.tx_timeout": re.compile(r"(?i)transmit queue \d+ timed out|mlx5.*(health compromised|cmd.*timeout)"),
}


def parse_kernel_log(out: str, args: Mapping[str, Any]) -> Parsed:
    """`dmesg --ctime`: NVIDIA XID codes plus PCIe AER, lockups, OOM kills, segfaults, NIC timeouts."""
    p = Parsed()
    xids: dict[str, int] = {}
    for line in out.splitlines():
        m = XID_RE.search(line)
        if m:
            xids[m.group(2)] = xids.get(m.group(2), 0) + 1
            continue
        for tag, rx in KERNEL_PATTERNS.items():
            if rx.search(line) and tag not in p.findings:
                p.findings.append(tag)
    p.findings += [f"xid.{code}" for code in sorted(xids, key=int)]
    if "74" in xids:
        p.findings.append("nvlink.down")
    p.values = {"xid_counts": xids}
    p.summary = ", ".join([f"Xid {c} x{n}" for c, n in xids.items()] + [t for t in p.findings if not t.startswith(("xid.", "nvlink."))]) \
        or "no GPU or kernel errors"
    return p


def parse_nvlink_status(out: str, args: Mapping[str, Any]) -> Parsed:
    """`nvidia-smi nvlink --status -i GPU`: `Link N: <speed>` or `<inactive>` per link."""
    p = Parsed()
    links = re.findall(r"Link (\d+): (.+)", out)
    down = [n for n, s in links if "inactive" in s.lower() or s.strip().startswith("0 ")]
    p.values = {"links": len(links), "down": down}
    if down:
        p.findings.append("nvlink.down")
    p.summary = f"{len(down)} of {len(links)} NVLinks down" if links else "no NVLink data"
    return p


TRAINING_COMMANDS = ("python", "python3", "pt_main_thread", "torchrun", "pt_elastic")


def parse_gpu_processes(out: str, args: Mapping[str, Any]) -> Parsed:
    """`nvidia-smi --query-compute-apps=pid,process_name,used_memory -i GPU`."""
    p = Parsed()
    procs = [r for r in _csv_rows(out) if len(r) >= 3]
    p.values = {"processes": [{"pid": r[0], "name": r[1], "mib": _num(r[2])} for r in procs]}
    if len(procs) > 1:
        p.findings.append("gpu.foreign_process")
    p.summary = f"{len(procs)} process(es) on the GPU: " + ", ".join(r[1].rsplit("/", 1)[-1] for r in procs)
    return p


def parse_gpu_topology(out: str, args: Mapping[str, Any]) -> Parsed:
    """`nvidia-smi topo -m`: a GPU whose every NIC is SYS crosses the CPU interconnect."""
    p = Parsed()
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if not lines:
        return Parsed(summary="no topology")
    header = lines[0].split()
    nic_cols = [i for i, h in enumerate(header) if h.startswith(("NIC", "mlx"))]
    far = []
    for ln in lines[1:]:
        cells = ln.split()
        if not cells or not cells[0].startswith("GPU") or len(cells) < len(header) + 1:
            continue
        links = [cells[i + 1] for i in nic_cols]
        if links and all(x == "SYS" for x in links):
            far.append(cells[0])
    if far:
        p.findings.append("pcie.cross_socket")
    p.values = {"gpus_without_near_nic": far}
    p.summary = f"{', '.join(far)} have no NIC on their socket" if far else "every GPU has a NIC on its socket"
    return p


def parse_top(out: str, args: Mapping[str, Any]) -> Parsed:
    """`top -b -n 1 -w 512`: CPU split, swap use and the busiest processes."""
    p = Parsed()
    cpu = {}
    m = re.search(r"%Cpu\(s\):(.*)", out)
    if m:
        for val, key in re.findall(r"([\d.]+)\s*(us|sy|ni|id|wa|hi|si|st)", m.group(1)):
            cpu[key] = float(val)
    swap = re.search(r"(?:MiB|KiB) Swap:\s*([\d.]+)\s*total,\s*([\d.]+)\s*free,\s*([\d.]+)\s*used", out)
    procs: list[dict[str, Any]] = []
    lines = out.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("PID")), None)
    if start is not None:
        for ln in lines[start + 1:start + 11]:
            cells = ln.split()
            if len(cells) >= 12:
                try:
                    procs.append({"pid": cells[0], "cpu": float(cells[8]), "command": cells[11]})
                except ValueError:
                    continue
    p.values = {"cpu": cpu, "top": procs[:5]}
    if cpu and cpu.get("id", 100) < 10:
        p.findings.append("host.cpu_saturated")
    if cpu.get("wa", 0) > 20:
        p.findings.append("io.iowait_high")
    if cpu.get("sy", 0) > 30:
        p.findings.append("host.sys_time_high")
    if swap and float(swap.group(1)) > 0 and float(swap.group(3)) / float(swap.group(1)) > 0.1:
        p.findings.append("host.swapping")
    hogs = [x for x in procs if x["cpu"] >= 200 and not x["command"].startswith(TRAINING_COMMANDS)]
    if hogs:
        p.findings.append("host.foreign_process")
    parts = [f"idle {cpu.get('id', float('nan')):.0f}%, iowait {cpu.get('wa', 0):.0f}%"]
    if hogs:
        parts.append("busy non-training process: " + ", ".join(f"{h['command']} ({h['cpu']:.0f}% CPU)" for h in hogs))
    p.summary = "; ".join(parts)
    return p


def parse_numastat(out: str, args: Mapping[str, Any]) -> Parsed:
    """`numastat`: share of allocations served from a remote node."""
    rows = {}
    for ln in out.splitlines():
        cells = ln.split()
        if len(cells) >= 2 and cells[0] in ("numa_hit", "numa_miss", "local_node", "other_node"):
            rows[cells[0]] = sum(float(c) for c in cells[1:] if re.match(r"^[\d.]+$", c))
    local, other = rows.get("local_node", 0.0), rows.get("other_node", 0.0)
    share = other / (local + other) if local + other else 0.0
    p = Parsed(values={"remote_share": round(share, 3)}, summary=f"{share:.0%} of allocations on a remote NUMA node")
    if share > 0.2:
        p.findings.append("host.numa_remote")
    return p


def parse_governor(out: str, args: Mapping[str, Any]) -> Parsed:
    gov = out.strip().split()[0] if out.strip() else "unknown"
    p = Parsed(values={"governor": gov}, summary=f"CPU governor {gov}")
    if gov in ("powersave", "conservative"):
        p.findings.append("host.governor_powersave")
    return p


def parse_iostat(out: str, args: Mapping[str, Any]) -> Parsed:
    """`iostat -dxy 1 1`: devices that are saturated with long waits."""
    p = Parsed()
    header: list[str] = []
    slow = []
    for ln in out.splitlines():
        cells = ln.split()
        if cells and cells[0].startswith("Device"):
            header = cells
            continue
        if not header or len(cells) != len(header):
            continue
        row = dict(zip(header, cells, strict=True))
        util = _num(row.get("%util", "0")) or 0
        wait = max(_num(row.get("r_await", "0")) or 0, _num(row.get("w_await", "0")) or 0)
        p.values[cells[0]] = {"util": util, "await_ms": wait}
        if util > 90 and wait > 50:
            slow.append(f"{cells[0]} {util:.0f}% busy, {wait:.0f} ms wait")
    if slow:
        p.findings.append("io.stall")
    p.summary = "; ".join(slow) or "no saturated disks"
    return p


def parse_df(out: str, args: Mapping[str, Any]) -> Parsed:
    p = Parsed()
    full = []
    for ln in out.splitlines()[1:]:
        cells = ln.split()
        if len(cells) >= 6 and cells[4].endswith("%"):
            use = int(cells[4].rstrip("%") or 0)
            if use >= 98:
                full.append(f"{cells[5]} {use}%")
    if full:
        p.findings.append("storage.disk_full")
    p.values = {"full": full}
    p.summary = "full: " + ", ".join(full) if full else "no full filesystem"
    return p


def parse_ip_link(out: str, args: Mapping[str, Any]) -> Parsed:
    """`ip -j -s -s link show`: link state, carrier changes, error counters and MTU per interface."""
    p = Parsed()
    try:
        links = json.loads(out or "[]")
    except (json.JSONDecodeError, RecursionError):
        return Parsed(summary="unreadable ip output", understood=False)
    notes, mtus = [], {}
    for link in links if isinstance(links, list) else []:
        name = str(link.get("ifname", "?"))
        if name == "lo" or link.get("link_type") == "loopback":
            continue
        stats = link.get("stats64", {})
        rx, tx = stats.get("rx", {}), stats.get("tx", {})
        changes = int(tx.get("carrier_changes", 0) or 0)
        errors = int(rx.get("errors", 0) or 0) + int(rx.get("crc_errors", 0) or 0)
        admin_up = "UP" in link.get("flags", [])
        p.values[name] = {"state": link.get("operstate"), "carrier_changes": changes, "rx_errors": errors,
                          "mtu": link.get("mtu")}
        if admin_up and link.get("operstate") == "DOWN":
            p.findings.append("nic.down")
            notes.append(f"{name} down")
        if changes > 4:
            p.findings.append("nic.flapping")
            notes.append(f"{name} lost carrier {changes} times")
        if errors > 1000:
            p.findings.append("nic.errors")
            notes.append(f"{name} {errors} receive errors")
        if admin_up and link.get("operstate") == "UP":
            mtus[name] = int(link.get("mtu", 0) or 0)
    if len(set(mtus.values())) > 1 and min(mtus.values()) < 4096 <= max(mtus.values()):
        small = [n for n, m in mtus.items() if m < 4096]
        # one small-MTU management port is normal; a mix among the fabric ports is not
        if len(small) > 1 and len(small) < len(mtus):
            p.findings.append("nic.mtu_small")
            notes.append(f"MTU mismatch: {', '.join(small)}")
    p.findings = sorted(set(p.findings))
    p.summary = "; ".join(notes) or f"{len(p.values)} interface(s) up without errors"
    return p


def parse_ethtool(out: str, args: Mapping[str, Any]) -> Parsed:
    """`ethtool IFACE`: current speed against the best supported mode."""
    speed = re.search(r"Speed:\s*(\d+)Mb/s", out)
    modes = [int(x) for x in re.findall(r"\b(\d+)base", out)]
    cur = int(speed.group(1)) if speed else None
    best = max(modes) if modes else None
    p = Parsed(values={"speed_mbps": cur, "max_mbps": best})
    if cur and best and cur < best:
        p.findings.append("nic.speed_low")
        p.summary = f"{args.get('iface')} at {cur // 1000} Gb/s of {best // 1000} Gb/s"
    else:
        p.summary = f"{args.get('iface')} at {cur // 1000 if cur else '?'} Gb/s"
    return p


def parse_ethtool_stats(out: str, args: Mapping[str, Any]) -> Parsed:
    """`ethtool -S IFACE`: priority flow control pause counters."""
    counters = {k: int(v) for k, v in re.findall(r"^\s*(\w*pause\w*):\s*(\d+)", out, re.M)}
    tx = sum(v for k, v in counters.items() if k.startswith("tx"))
    rx = sum(v for k, v in counters.items() if k.startswith("rx"))
    p = Parsed(values={"tx_pause": tx, "rx_pause": rx}, summary=f"{args.get('iface')}: {tx} pause frames sent, {rx} received")
    if tx > 100_000 or rx > 100_000:
        p.findings.append("roce.pfc_pause")
    return p


RETRANSMIT_KEYS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "roce_adp_retrans", "duplicate_request")
ECN_KEYS = ("np_ecn_marked_roce_packets", "rp_cnp_handled", "np_cnp_sent")


def parse_rdma_stats(out: str, args: Mapping[str, Any]) -> Parsed:
    """`rdma statistic show`: `link DEV/PORT key value ...` per RDMA port."""
    p = Parsed()
    retrans = ecn = 0
    for ln in out.splitlines():
        cells = ln.split()
        if len(cells) < 3 or cells[0] != "link":
            continue
        kv = {}
        for k, v in zip(cells[2::2], cells[3::2], strict=False):
            if v.isdigit():
                kv[k] = int(v)
        r = sum(kv.get(k, 0) for k in RETRANSMIT_KEYS)
        e = sum(kv.get(k, 0) for k in ECN_KEYS)
        p.values[cells[1]] = {"retransmit": r, "ecn_cnp": e}
        retrans += r
        ecn += e
    if retrans > 1000:
        p.findings.append("roce.retransmits")
    if ecn > 10_000:
        p.findings.append("roce.ecn_marks")
    p.summary = f"{len(p.values)} RDMA port(s): {retrans} retransmission events, {ecn} ECN marks/CNPs"
    return p


def parse_perfquery(out: str, args: Mapping[str, Any]) -> Parsed:
    """`perfquery`: InfiniBand port error counters (`Name:.....value`)."""
    counters = {k: int(v) for k, v in re.findall(r"^(\w+):\.*(\d+)\s*$", out, re.M)}
    p = Parsed(values=counters)
    if counters.get("SymbolErrorCounter", 0) > 100:
        p.findings.append("ib.symbol_errors")
    if counters.get("LinkDownedCounter", 0) > 0:
        p.findings.append("ib.link_downed")
    p.summary = (f"symbol errors {counters.get('SymbolErrorCounter', 0)}, link downed "
                 f"{counters.get('LinkDownedCounter', 0)}, rcv errors {counters.get('PortRcvErrors', 0)}")
    return p


def parse_ibstatus(out: str, args: Mapping[str, Any]) -> Parsed:
    """`ibstatus`: `rate: 100 Gb/sec (4X EDR)` per port; fewer than 4 lanes is degraded."""
    widths = [int(w) for w in re.findall(r"rate:.*\((\d+)X", out)]
    p = Parsed(values={"widths": widths})
    if any(w < 4 for w in widths):
        p.findings.append("ib.link_degraded")
    p.summary = "port widths " + ", ".join(f"{w}X" for w in widths) if widths else "no InfiniBand ports"
    return p


NCCL_TOKEN = re.compile(r"\b(NCCL_[A-Z0-9_]+)=(\S*)")


def parse_nccl_env(out: str, args: Mapping[str, Any]) -> Parsed:
    """`ps eww -C python3,python -o args=`: only NCCL_* settings are kept (environments hold secrets)."""
    env: dict[str, str] = {}
    for k, v in NCCL_TOKEN.findall(out):
        env.setdefault(k, v)
    p = Parsed(values={"nccl_env": env})
    if env.get("NCCL_IB_DISABLE") == "1":
        p.findings.append("nccl.ib_disabled")
    if env.get("NCCL_NET", "").lower() == "socket":
        p.findings.append("nccl.socket_transport")
    if env.get("NCCL_P2P_DISABLE") == "1" or env.get("NCCL_NET_GDR_LEVEL") in ("0", "LOC"):
        p.findings.append("nccl.p2p_disabled")
    if env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
        p.findings.append("nccl.debug_verbose")
    if "NCCL_ALGO" in env or "NCCL_PROTO" in env:
        p.findings.append("nccl.algo_forced")
    if env.get("NCCL_MAX_NCHANNELS", "").isdigit() and int(env["NCCL_MAX_NCHANNELS"]) < 8:
        p.findings.append("nccl.channels_limited")
    p.summary = " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "no NCCL_* settings"
    return p


# ---------------------------------------------------------------- the whitelist

def _spec(name: str, summary: str, argv: list[str], parser: Parser, findings: list[str],
          params: tuple[str, ...] = (), keep_raw: bool = True) -> ProbeSpec:
    lost = GPU_LOST_RE if argv[0] == "nvidia-smi" and "gpu" in params else None
    return ProbeSpec(name, summary, tuple(argv), params, parser, tuple(findings), keep_raw, lost)


NVSMI_CSV = "--format=csv,noheader,nounits"
CATALOG: dict[str, ProbeSpec] = {s.name: s for s in [
    _spec("gpu_clocks", "GPU SM clock, temperature, power and throttle reasons",
          ["nvidia-smi", "--query-gpu=index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit,"
           "clocks_throttle_reasons.active", NVSMI_CSV, "-i", "{gpu}"], parse_gpu_clocks,
          ["gpu.thermal", "gpu.power_cap", "gpu.power_brake", "gpu.hw_slowdown", "gpu.clocks_locked",
           "gpu.clock_low", "gpu.missing"], ("gpu",)),
    _spec("gpu_ecc", "GPU memory ECC counters and pending row remaps",
          ["nvidia-smi", "--query-gpu=index,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.volatile.total,"
           "remapped_rows.pending", NVSMI_CSV, "-i", "{gpu}"], parse_gpu_ecc,
          ["gpu.ecc_uncorrected", "gpu.ecc_corrected_high", "gpu.remap_pending"], ("gpu",)),
    _spec("gpu_pcie", "PCIe link generation and width of a GPU",
          ["nvidia-smi", "--query-gpu=index,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
           "pcie.link.width.max", NVSMI_CSV, "-i", "{gpu}"], parse_gpu_pcie,
          ["pcie.width_downgraded", "pcie.gen_downgraded"], ("gpu",)),
    _spec("kernel_xid", "NVIDIA XID and other kernel errors (ECC, PCIe AER, OOM, lockups, NIC timeouts)",
          ["dmesg", "--ctime"], parse_kernel_log,
          ["kernel.pcie_aer", "kernel.soft_lockup", "kernel.oom", "kernel.segfault", "nic.tx_timeout", "nvlink.down"]),
    _spec("nvlink_status", "NVLink state of one GPU", ["nvidia-smi", "nvlink", "--status", "-i", "{gpu}"],
          parse_nvlink_status, ["nvlink.down"], ("gpu",)),
    _spec("gpu_processes", "processes running on one GPU",
          ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", NVSMI_CSV, "-i", "{gpu}"],
          parse_gpu_processes, ["gpu.foreign_process"], ("gpu",)),
    _spec("gpu_topology", "GPU-NIC PCIe/NUMA affinity matrix", ["nvidia-smi", "topo", "-m"], parse_gpu_topology,
          ["pcie.cross_socket"]),
    _spec("cpu_top", "CPU load split, swap and busiest processes", ["top", "-b", "-n", "1", "-w", "512"], parse_top,
          ["host.cpu_saturated", "host.foreign_process", "io.iowait_high", "host.sys_time_high", "host.swapping"]),
    _spec("numa_stat", "NUMA hit/miss counters", ["numastat"], parse_numastat, ["host.numa_remote"]),
    _spec("cpu_governor", "CPU frequency governor",
          ["cat", "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"], parse_governor, ["host.governor_powersave"]),
    _spec("io_stat", "disk utilisation and wait times", ["iostat", "-dxy", "1", "1"], parse_iostat, ["io.stall"]),
    _spec("disk_space", "filesystem fill levels", ["df", "-P"], parse_df, ["storage.disk_full"]),
    _spec("nic_link", "NIC link state, carrier changes, errors and MTU", ["ip", "-j", "-s", "-s", "link", "show"],
          parse_ip_link, ["nic.down", "nic.flapping", "nic.errors", "nic.mtu_small"]),
    _spec("nic_speed", "negotiated speed of one NIC", ["ethtool", "{iface}"], parse_ethtool, ["nic.speed_low"], ("iface",)),
    _spec("nic_pfc", "PFC pause counters of one NIC", ["ethtool", "-S", "{iface}"], parse_ethtool_stats,
          ["roce.pfc_pause"], ("iface",)),
    _spec("rdma_stats", "RoCE retransmission and congestion (ECN/CNP) counters", ["rdma", "statistic", "show"],
          parse_rdma_stats, ["roce.retransmits", "roce.ecn_marks"]),
    _spec("ib_port_errors", "InfiniBand port error counters", ["perfquery"], parse_perfquery,
          ["ib.symbol_errors", "ib.link_downed"]),
    _spec("ib_status", "InfiniBand port rate and width", ["ibstatus"], parse_ibstatus, ["ib.link_degraded"]),
    _spec("nccl_env", "NCCL settings of the running training processes",
          ["ps", "eww", "-C", "python3,python", "-o", "args="], parse_nccl_env,
          ["nccl.ib_disabled", "nccl.socket_transport", "nccl.p2p_disabled", "nccl.debug_verbose",
           "nccl.algo_forced", "nccl.channels_limited"], keep_raw=False),
]}

FINDING_TAGS: tuple[str, ...] = tuple(sorted({t for s in CATALOG.values() for t in s.findings}))


def build_call(name: str, host: Any, args: Mapping[str, Any] | None, inventory: Inventory) -> ProbeCall:
    """Validate a probe request against the whitelist and the inventory and build its argv.

    Raises ProbeRejected with the reason; nothing from the request reaches the argv except
    values that were checked to be one of the job's own hosts, GPU indices or interface names.
    """
    spec = CATALOG.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ProbeRejected(f"'{name}' is not a whitelisted probe")
    if not isinstance(host, str) or host not in inventory.hosts or inventory.check_host(host):
        raise ProbeRejected(f"host {host!r} is not part of job {inventory.job}")
    args = dict(args or {})
    clean: dict[str, Any] = {}
    for key in sorted(set(args) - set(spec.params)):
        raise ProbeRejected(f"probe {name} takes no argument '{key}'")
    for param in spec.params:
        if param not in args:
            raise ProbeRejected(f"probe {name} needs argument '{param}'")
        val = args[param]
        if param == "gpu":
            if isinstance(val, bool) or not isinstance(val, int | str) or not re.fullmatch(r"[0-9]{1,4}", str(val)):
                raise ProbeRejected(f"gpu {val!r} is not a GPU index")
            if why := inventory.check_gpu(host, int(val)):
                raise ProbeRejected(why)
            clean[param] = int(val)
        elif param == "iface":
            if nic_problem(val) or inventory.check_nic(host, val):
                raise ProbeRejected(f"interface {val!r} is not a known NIC of {host}")
            clean[param] = val
    argv = [str(clean[tok[1:-1]]) if tok.startswith("{") and tok.endswith("}") else tok for tok in spec.argv]
    return ProbeCall(name, host, clean, argv)


def outcome_of(spec: ProbeSpec, rc: int, out: str) -> Outcome | None:
    """The outcome decided by the exit code and transport alone; None when the output must be parsed."""
    if rc == -1:
        return "not-run"
    if rc == 0:
        return None
    if UNREACHABLE_RE.search(out):
        return "unreachable"
    if spec.answers_failure is not None and spec.answers_failure.search(out):
        return None
    return "error"


def _first_line(out: str) -> str:
    line = next((ln.strip() for ln in out.splitlines() if ln.strip()), "")
    return "".join(c if c.isprintable() else "?" for c in line[:160])


def _parse(spec: ProbeSpec, out: str, args: Mapping[str, Any]) -> Parsed:
    """The parser's reading, or not understood when the host printed something of another shape
    (a JSON list of numbers, a counter that is not a number): what a host prints is input, and
    input a parser cannot read is a failed probe, never a crash of the diagnosis."""
    try:
        return spec.parser(out, args)
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        return Parsed(summary=f"{type(exc).__name__} reading it", understood=False)


def interpret(call: ProbeCall, rc: int, out: str, probe_id: str) -> ProbeResult:
    """Parse a finished probe into a typed outcome; only an answer (ok/abnormal) carries findings."""
    spec = CATALOG[call.name]
    outcome = outcome_of(spec, rc, out)
    if outcome == "not-run":
        parsed = Parsed(summary="not run (dry run)")
    elif outcome == "unreachable":
        parsed = Parsed(summary=f"{call.host} could not be reached (exit {rc}: {_first_line(out)})")
    elif outcome == "error":
        what = {124: "timed out", 127: "command not found"}.get(rc, f"exit {rc}")
        parsed = Parsed(summary=f"probe failed ({what}{': ' + _first_line(out) if out.strip() else ''})")
    else:
        parsed = _parse(spec, out, call.args)
        if not parsed.understood:
            outcome, parsed = "error", Parsed(summary=f"output not understood: {parsed.summary}")
        else:
            outcome = "abnormal" if parsed.findings else "ok"
    return ProbeResult(probe_id, call.name, call.host, call.args, call.argv, rc, parsed.findings, parsed.values,
                       parsed.summary, out[-4000:] if spec.keep_raw else "", outcome)
