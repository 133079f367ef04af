"""Collective instances matched across ranks, and per-host clock offsets estimated from them.

A collective instance is every rank's copy of one operator: same (group, seq). A point-to-point
instance pairs a send with its recv: same (group, src, dst, seq). Start times of copies on
different hosts are only compared after subtracting the estimated host clock offsets.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.meta import JobMeta
from collector.schema import P2P_OPS
from timeline.columns import codes

#: Columns the matching needs; read only these from a large trace.
COLUMNS = ("rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step")


def instance_ids(df: pd.DataFrame) -> np.ndarray:
    """Instance number of every row: (group, seq) for collectives, (group, src, dst, seq) for p2p."""
    rank = df["rank"].to_numpy(np.int64)
    peer = df["peer"].to_numpy(np.int64)
    p2p = _is_p2p(df["op"])
    send = _op_is(df["op"], "send")
    src = np.where(p2p, np.where(send, rank, peer), -1)
    dst = np.where(p2p, np.where(send, peer, rank), -1)
    keys = pd.DataFrame({"g": codes(df["group"]), "src": src, "dst": dst, "seq": df["seq"].to_numpy()})
    return keys.groupby(["g", "src", "dst", "seq"], sort=False).ngroup().to_numpy(np.int64)


def host_codes(meta: JobMeta, rank: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Host index of each rank (by the meta's rank table) and the host names."""
    hosts = meta.hosts()
    index = {h: i for i, h in enumerate(hosts)}
    size = max(max(meta.ranks, default=0), int(rank.max(initial=0))) + 1
    table = np.full(size, -1, dtype=np.int64)
    for r, info in meta.ranks.items():  # one entry per rank, not per row
        table[r] = index[info.host]
    return table[rank], hosts


def estimate_clock_offsets(df: pd.DataFrame, meta: JobMeta, max_iterations: int = 60,
                           tolerance_ns: float = 1000.0) -> pd.Series:
    """Per-host clock offset in ns (median host = 0), from when collectives complete.

    All copies of a collective finish at nearly the same true time (nobody finishes before the
    last rank arrives), and so do a send and its recv, so a host whose copies consistently end
    later on its own clock runs ahead by that much. Hosts that share no operator (directly
    or through others) cannot be related; each such island is centred on its own median. Alternating refinement removes the bias of mixed-host instance medians.
    """
    inst = instance_ids(df)
    host, names = host_codes(meta, df["rank"].to_numpy(np.int64))
    end = df["end_ns"].to_numpy(np.float64)
    n_hosts = pd.Series(host).groupby(inst).transform("nunique").to_numpy()
    keep = n_hosts > 1
    offsets = np.zeros(len(names))
    if not keep.any():
        return pd.Series(offsets.astype(np.int64), index=names, name="offset_ns")
    inst, host, end = inst[keep], host[keep], end[keep]
    seen = np.unique(host)
    for _ in range(max_iterations):
        corrected = end - offsets[host]
        ref = pd.Series(corrected).groupby(inst).transform("median").to_numpy()
        resid = pd.Series(corrected - ref).groupby(host).median()
        offsets[resid.index.to_numpy()] += resid.to_numpy()
        offsets[seen] -= np.median(offsets[seen])
        if np.abs(resid.to_numpy()).max() < tolerance_ns:
            break
    return pd.Series(np.round(offsets).astype(np.int64), index=names, name="offset_ns")


def match_instances(
    df: pd.DataFrame, meta: JobMeta, offsets_ns: pd.Series | None = None
) -> tuple[pd.DataFrame, np.ndarray]:
    """Per-instance table and each row's instance id.

    Table columns: instance, group, op, step, nbytes, participants, elapsed_min_ns,
    elapsed_median_ns, elapsed_max_ns, host_spread_ns (largest arrival spread among copies on
    one host: no clock assumption) and, when offsets are given, spread_ns (arrival spread
    across all copies after removing each host's clock offset).
    """
    inst = instance_ids(df)
    host, names = host_codes(meta, df["rank"].to_numpy(np.int64))
    start = df["start_ns"].to_numpy(np.int64)
    elapsed = df["end_ns"].to_numpy(np.int64) - start
    rows = pd.DataFrame(
        {
            "instance": inst,
            "group": df["group"].to_numpy(),
            "op": df["op"].to_numpy(),
            "step": df["step"].to_numpy(),
            "nbytes": df["nbytes"].to_numpy(),
            "elapsed": elapsed,
            "start": start,
            "host": host,
        }
    )
    by = rows.groupby("instance", sort=True)
    table = by.agg(
        group=("group", "first"),
        op=("op", "first"),
        step=("step", "max"),
        nbytes=("nbytes", "max"),
        participants=("elapsed", "size"),
        elapsed_min_ns=("elapsed", "min"),
        elapsed_median_ns=("elapsed", "median"),
        elapsed_max_ns=("elapsed", "max"),
    )
    per_host = rows.groupby(["instance", "host"], sort=False)["start"].agg(["min", "max"])
    spread = (per_host["max"] - per_host["min"]).groupby(level="instance").max()
    table["host_spread_ns"] = spread.reindex(table.index).to_numpy()
    if offsets_ns is not None:
        off = offsets_ns.reindex(names).fillna(0).to_numpy(np.int64)
        rows["arrival"] = start - off[host]
        arr = rows.groupby("instance", sort=True)["arrival"].agg(["min", "max"])
        table["spread_ns"] = (arr["max"] - arr["min"]).to_numpy()
    return table.reset_index(), inst


def _is_p2p(op: pd.Series) -> np.ndarray:
    return np.asarray(op.isin(P2P_OPS).to_numpy(), dtype=bool)


def _op_is(op: pd.Series, name: str) -> np.ndarray:
    return np.asarray((op == name).to_numpy(), dtype=bool)

