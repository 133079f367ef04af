"""collector.network.flows.read_flow_records: flow-exporter CSV (IPFIX / nfdump names) -> flows contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.inputs.errors import UserError
from collector.network.flows import read_flow_records


def test_ipfix_columns(tmp_path: Path) -> None:
    p = tmp_path / "ipfix.csv"
    p.write_text(
        "flowStartMilliseconds,flowEndMilliseconds,sourceIPv4Address,destinationIPv4Address,"
        "sourceTransportPort,destinationTransportPort,protocolIdentifier,octetDeltaCount,packetDeltaCount\n"
        "1760000000000,1760000000005,10.0.0.10,10.0.1.10,49152,4791,17,4096000,1000\n"
        "1760000000001,1760000000002,10.0.1.10,10.0.0.10,5000,6000,6,1500,10\n")
    f = read_flow_records(p).to_pandas()
    assert list(f["proto"]) == ["roce", "tcp"]
    assert f.loc[0, "start_ns"] == 1_760_000_000_000_000_000 and f.loc[0, "end_ns"] == 1_760_000_000_005_000_000
    assert f.loc[0, "bytes"] == 4096000 and f.loc[0, "qp"] == -1  # no QP column: unknown


def test_short_names_and_iso_times(tmp_path: Path) -> None:
    p = tmp_path / "nf.csv"
    p.write_text("ts,te,sa,da,sp,dp,pr,ibyt,ipkt,dqp\n"
                 "2025-10-09T08:00:00Z,2025-10-09T08:00:01Z,10.0.0.1,10.0.0.2,1,4791,udp,100,2,77\n")
    f = read_flow_records(p).to_pandas()
    assert f.loc[0, "proto"] == "roce" and f.loc[0, "qp"] == 77
    assert f.loc[0, "end_ns"] - f.loc[0, "start_ns"] == 1_000_000_000


def test_missing_columns_name_what_is_missing(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="no column for start, src_ip, dst_ip, bytes"):
        read_flow_records(p)


@pytest.mark.parametrize("bad", ["node-7", "10.0.0.256", "10.0.0.1; rm -rf /", "1::2::3", "12"])
def test_an_address_that_is_not_an_ip_is_refused_with_one_line(tmp_path: Path, bad: str) -> None:
    p = tmp_path / "flows.csv"
    p.write_text(f"start_ns,sa,da,bytes\n1,10.0.0.1,fd00::2,100\n2,{bad},10.0.0.1,100\n")
    with pytest.raises(UserError, match=r"sa '.*' is not an IP address \(1 distinct") as exc:
        read_flow_records(p)
    assert "\n" not in str(exc.value)
