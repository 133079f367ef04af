"""collector.network.pcap / collector.network.flows: packets from scapy-built captures become the right bursts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw
from scapy.utils import PcapNgWriter, wrpcap

from collector.inputs.errors import UserError
from collector.network.flows import pcap_to_flows
from collector.network.pcap import ReadStats, iter_packets, write_pcap

T0 = 1_760_000_000.0
ETH: dict[str, Any] = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}


def _packets() -> list:
    pk = []
    for i in range(50):  # one RoCEv2 burst, QP 0x1234, 10 us apart
        p = Ether(**ETH) / IP(src="10.0.0.10", dst="10.0.1.10") / UDP(sport=49152, dport=4791) \
            / BTH(opcode=4, dqpn=0x1234, psn=i) / Raw(b"x" * 1000)
        p.time = T0 + i * 1e-5
        pk.append(p)
    for i in range(20):  # TCP behind a VLAN tag, 100 us apart
        p = Ether(**ETH) / Dot1Q(vlan=5) / IP(src="10.0.1.10", dst="10.0.0.10") / TCP(sport=5000, dport=6000) / Raw(b"y" * 100)
        p.time = T0 + 0.01 + i * 1e-4
        pk.append(p)
    for i in range(5):  # IPv6 UDP, 10 ms apart: five bursts at a 1 ms gap
        p = Ether(**ETH) / IPv6(src="fd00::1", dst="fd00::2") / UDP(sport=1, dport=2) / Raw(b"z" * 10)
        p.time = T0 + 0.02 + i * 0.01
        pk.append(p)
    return sorted(pk, key=lambda p: p.time)


@pytest.fixture(scope="module")
def pcap(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pcap") / "mixed.pcap"
    wrpcap(str(path), _packets())
    return path


def test_bursts_by_protocol(pcap: Path) -> None:
    f = pcap_to_flows(pcap).table.to_pandas()
    roce = f[f["proto"] == "roce"]
    assert len(roce) == 1
    r = roce.iloc[0]
    assert (r["src_ip"], r["dst_ip"], r["dst_port"], r["qp"], r["packets"]) == ("10.0.0.10", "10.0.1.10", 4791, 0x1234, 50)
    assert r["end_ns"] - r["start_ns"] == pytest.approx(490_000, abs=2_000)
    assert r["bytes"] == 50 * len(_packets()[0])
    tcp = f[f["proto"] == "tcp"]
    assert len(tcp) == 1 and tcp.iloc[0]["packets"] == 20 and tcp.iloc[0]["qp"] == -1
    v6 = f[f["src_ip"] == "fd00::1"]
    assert len(v6) == 5 and set(v6["proto"]) == {"udp"}


def test_burst_gap_is_configurable(pcap: Path) -> None:
    assert len(pcap_to_flows(pcap, gap_ns=20_000_000).table) == 3  # the IPv6 packets join into one burst
    assert len(pcap_to_flows(pcap, gap_ns=50_000).table) == 1 + 20 + 5  # TCP packets 100 us apart split


def test_pcapng_reads_like_pcap(pcap: Path, tmp_path: Path) -> None:
    ng = tmp_path / "mixed.pcapng"
    w = PcapNgWriter(str(ng))
    for p in _packets():
        w.write(p)
    w.close()
    a = pcap_to_flows(pcap).table.to_pandas()
    b = pcap_to_flows(ng).table.to_pandas()
    assert a.drop(columns=["start_ns", "end_ns"]).equals(b.drop(columns=["start_ns", "end_ns"]))
    assert np.abs(a["start_ns"] - b["start_ns"]).max() < 1_000  # pcapng from scapy is microsecond


def test_truncated_capture_keeps_what_was_readable(pcap: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(pcap.read_bytes()[:-40])
    res = pcap_to_flows(cut)
    assert res.stats.records == len(_packets()) - 1
    assert len(res.stats.warnings) == 1 and "truncated" in res.stats.warnings[0]
    assert "\n" not in res.stats.warnings[0]


def test_corrupt_record_header_stops_with_warning(pcap: Path, tmp_path: Path) -> None:
    data = bytearray(pcap.read_bytes())
    # third record's captured length -> absurd
    pos = 24
    for _ in range(2):
        pos += 16 + int.from_bytes(data[pos + 8:pos + 12], "little")
    data[pos + 8:pos + 12] = (10**9).to_bytes(4, "little")
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(bytes(data))
    res = pcap_to_flows(bad)
    assert res.stats.records == 2
    assert "corrupt record header" in res.stats.warnings[0]


@pytest.mark.parametrize("content,what", [
    (b"", "empty capture"), (b"hello world, not a capture", "not a pcap"), (b"\xd4\xc3\xb2\xa1\x02\x00", "header truncated"),
])
def test_unreadable_files_are_user_errors(tmp_path: Path, content: bytes, what: str) -> None:
    p = tmp_path / "x.pcap"
    p.write_bytes(content)
    with pytest.raises(UserError, match=what):
        pcap_to_flows(p)


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such capture"):
        pcap_to_flows(tmp_path / "nope.pcap")


def test_fast_path_matches_packet_by_packet_parse(tmp_path: Path) -> None:
    """A long run of equal-size records goes through the structured view; fields must match scapy's."""
    rng = np.random.default_rng(0)
    frames, ts, want = [], [], []
    for i in range(100):
        src, dst, qp = f"10.0.{rng.integers(4)}.{10 + rng.integers(8)}", f"10.1.0.{10 + rng.integers(8)}", int(rng.integers(1, 1 << 24))
        proto = UDP(sport=int(rng.integers(49152, 65535)), dport=4791) / BTH(opcode=int(rng.integers(0, 24)), dqpn=qp)
        frames.append(bytes(Ether(**ETH) / IP(src=src, dst=dst) / proto / Raw(b"\0" * 4096))[:128])
        ts.append(1_760_000_000_000_000_000 + i * 1000)
        want.append((src, dst, qp))
    path = tmp_path / "run.pcap"
    write_pcap(path, np.asarray(ts), frames, wirelen=np.full(100, 4170), snaplen=128)
    stats = ReadStats()
    got = next(iter_packets(path, stats))
    assert stats.parsed == 100 and len(got) == 100
    assert np.array_equal(got.qp, [w[2] for w in want])
    assert np.array_equal(got.ts_ns, ts)
    assert set(got.wirelen.tolist()) == {4170}
    f = pcap_to_flows(path, gap_ns=10**9).table.to_pandas()
    assert f["packets"].sum() == 100 and set(f["proto"]) == {"roce"}
    pairs = set(zip(f["src_ip"], f["dst_ip"], f["qp"], strict=True))
    assert pairs == set(want)
