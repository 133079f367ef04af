from __future__ import annotations

import json

import pytest

from explain.actions.inventory import Inventory
from explain.actions.probes import CATALOG, FINDING_TAGS, ProbeRejected, build_call, interpret
from tests.explain.conftest import write_trace


@pytest.fixture
def inv(tmp_path) -> Inventory:
    from collector.trace.meta import JobMeta

    meta = JobMeta.load(write_trace(tmp_path / "t", []) / "meta.json")
    meta.topology["node-1"]["nics"] = ["ens1np0", "ens2np0"]
    return Inventory.from_meta(meta)


def test_argv_is_a_filled_template(inv: Inventory) -> None:
    call = build_call("gpu_clocks", "node-1", {"gpu": "5"}, inv)
    assert call.argv[0] == "nvidia-smi" and call.argv[-2:] == ["-i", "5"] and call.args == {"gpu": 5}
    assert build_call("nic_speed", "node-1", {"iface": "ens2np0"}, inv).argv == ["ethtool", "ens2np0"]


@pytest.mark.parametrize("name, host, args, why", [
    ("rm", "node-1", {}, "not a whitelisted probe"),
    ("gpu_clocks", "node-99", {"gpu": 1}, "not part of job"),
    ("gpu_clocks", "node-1; reboot", {"gpu": 1}, "not part of job"),
    ("gpu_clocks", "node-1", {"gpu": 9}, "not a GPU of node-1"),
    ("gpu_clocks", "node-1", {"gpu": "1 && rm -rf /"}, "not a GPU index"),
    ("gpu_clocks", "node-1", {}, "needs argument 'gpu'"),
    ("cpu_top", "node-1", {"flags": "-d"}, "takes no argument"),
    ("nic_speed", "node-1", {"iface": "$(reboot)"}, "not a known NIC"),
    ("nic_speed", "node-2", {"iface": "ens1np0"}, "not a known NIC"),
    (["gpu_clocks"], "node-1", {}, "not a whitelisted probe"),
])
def test_rejections(inv: Inventory, name, host, args, why) -> None:
    with pytest.raises(ProbeRejected, match=why.replace("(", r"\(").replace("$", r"\$")):
        build_call(name, host, args, inv)


def test_catalog_is_read_only_and_covers_the_issue_list() -> None:
    writers = {"rm", "reboot", "shutdown", "kill", "dd", "mkfs", "sh", "bash", "sudo", "tee"}
    for spec in CATALOG.values():
        assert spec.argv[0] not in writers
        assert not any(tok in ("--gpu-reset", "-r", "-rgc", "-lgc", "-pl") for tok in spec.argv)
    assert {"gpu_clocks", "kernel_xid", "gpu_pcie", "nic_link", "ib_port_errors", "cpu_top", "numa_stat", "io_stat",
            "nccl_env"} <= set(CATALOG)
    assert "gpu.thermal" in FINDING_TAGS


def _run(name: str, out: str, rc: int = 0, **args):
    from explain.actions.probes import ProbeCall

    return interpret(ProbeCall(name, "node-1", args, []), rc, out, "P1")


def test_gpu_clocks_parser() -> None:
    hot = _run("gpu_clocks", "5, 990, 1980, 91, 585.00, 700.00, 0x0000000000000060\n", gpu=5)
    assert {"gpu.thermal", "gpu.clock_low"} <= set(hot.findings)
    locked = _run("gpu_clocks", "2, 210, 1410, 40, 90.00, 400.00, 0x0000000000000000\n", gpu=2)
    assert "gpu.clocks_locked" in locked.findings and "gpu.thermal" not in locked.findings
    fine = _run("gpu_clocks", "2, 1410, 1410, 60, 300.00, 400.00, 0x0000000000000004\n", gpu=2)
    assert fine.healthy
    lost = _run("gpu_clocks", "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost\n", rc=15, gpu=3)
    assert lost.findings == ["gpu.missing"]


def test_kernel_log_parser() -> None:
    log = ("[Sun Nov 22 03:12:01 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
           "[Sun Nov 22 03:12:02 2026] pcieport 0000:00:01.0: AER: Corrected error received\n"
           "[Sun Nov 22 03:12:03 2026] Out of memory: Killed process 4242 (python3)\n")
    r = _run("kernel_xid", log)
    assert {"xid.79", "kernel.pcie_aer", "kernel.oom"} <= set(r.findings)


def test_network_parsers() -> None:
    links = [{"ifname": "lo", "link_type": "loopback", "flags": ["UP"], "operstate": "UNKNOWN"},
             {"ifname": "ens1np0", "flags": ["UP", "LOWER_UP"], "operstate": "UP", "mtu": 4200,
              "stats64": {"rx": {"errors": 0, "crc_errors": 0}, "tx": {"carrier_changes": 31}}},
             {"ifname": "ens2np0", "flags": ["UP"], "operstate": "DOWN", "mtu": 4200, "stats64": {"rx": {}, "tx": {}}}]
    r = _run("nic_link", json.dumps(links))
    assert r.findings == ["nic.down", "nic.flapping"]
    rd = _run("rdma_stats", "link mlx5_0/1 out_of_sequence 52000 packet_seq_err 10 np_ecn_marked_roce_packets 5 rp_cnp_handled 1\n")
    assert rd.findings == ["roce.retransmits"]
    pq = _run("ib_port_errors", "# Port counters: Lid 12 port 1\nPortSelect:......................1\nSymbolErrorCounter:..............4521\nLinkDownedCounter:...............2\n")
    assert pq.findings == ["ib.symbol_errors", "ib.link_downed"]
    et = _run("nic_speed", "Settings for ens1np0:\n\tSupported link modes: 100000baseCR4/Full 400000baseCR4/Full\n\tSpeed: 100000Mb/s\n", iface="ens1np0")
    assert et.findings == ["nic.speed_low"]


def test_host_parsers() -> None:
    top = ("top - 08:11:02 up 12 days\n%Cpu(s): 97.0 us,  1.2 sy,  0.0 ni,  1.5 id,  0.3 wa,  0.0 hi\n"
           "MiB Swap:  32768.0 total,  32768.0 free,      0.0 used.\n\n"
           "    PID USER      PR  NI    VIRT    RES    SHR S  %CPU  %MEM     TIME+ COMMAND\n"
           "   3117 root      20   0   1.2g   100m   10m R  2350.0  0.1  10:00.00 backup-agent\n"
           "  40000 train     20   0 120.3g  40.1g   2.1g R  101.0  2.0 812:01.11 python3\n")
    assert set(_run("cpu_top", top).findings) == {"host.cpu_saturated", "host.foreign_process"}
    io = ("Device r/s rkB/s r_await w/s wkB/s w_await aqu-sz %util\n"
          "nvme0n1 10.0 400.0 180.5 30.0 2400.0 220.0 9.1 99.5\n")
    assert _run("io_stat", io).findings == ["io.stall"]


def test_nccl_env_keeps_only_nccl_settings() -> None:
    r = _run("nccl_env", "python3 train.py NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO AWS_SECRET_ACCESS_KEY=hunter2\n")
    assert set(r.findings) == {"nccl.ib_disabled", "nccl.debug_verbose"}
    assert "hunter2" not in json.dumps(r.to_dict()) and r.raw == ""
