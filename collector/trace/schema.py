"""Record schemas of the trace contract (docs/traces.md).

The schemas are the single source of truth for column names and types; readers, writers,
validators and the simulator all take them from here.
"""

from __future__ import annotations

import pyarrow as pa

COLLECTIVE_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "barrier",
)
P2P_OPS = ("send", "recv")
OPS = COLLECTIVE_OPS + P2P_OPS

COMMOPS_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("group", pa.string(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("peer", pa.int32(), nullable=False),
        pa.field("nbytes", pa.int64(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
    ]
)

FLOWS_SCHEMA = pa.schema(
    [
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("src_ip", pa.string(), nullable=False),
        pa.field("dst_ip", pa.string(), nullable=False),
        pa.field("src_port", pa.int32(), nullable=False),
        pa.field("dst_port", pa.int32(), nullable=False),
        pa.field("proto", pa.string(), nullable=False),
        pa.field("qp", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("packets", pa.int64(), nullable=False),
    ]
)

FLOW_PROTOS = ("tcp", "udp", "roce")
ROCE_UDP_PORT = 4791

#: evidence kind -> (file stem, schema)
EVIDENCE = {
    "commops": ("commops", COMMOPS_SCHEMA),
    "flows": ("flows", FLOWS_SCHEMA),
}

#: kinds a verdict candidate may have (docs/verdict.md)
CANDIDATE_KINDS = ("gpu", "host", "nic", "link", "switch", "config", "data")
