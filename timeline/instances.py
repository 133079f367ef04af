"""Collective instances matched across ranks, and per-host clock offsets estimated from them.

A collective instance is every rank's copy of one operator: same (group, seq). A point-to-point
instance pairs a send with its recv: same (group, src, dst, seq). Start times of copies on
different hosts are only compared after subtracting the estimated host clock offsets.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.trace.meta import JobMeta
from collector.trace.schema import P2P_OPS
from timeline.columns import codes
from timeline.graph import pairwise_least_squares

#: Columns the matching needs; read only these from a large trace.
COLUMNS = ("rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step")


def instance_ids(df: pd.DataFrame) -> np.ndarray:
    """Instance number of every row: (group, seq) for collectives, (group, src, dst, seq) for p2p.

    When most sends find no recv with the same seq (a producer that numbers the two sides of a
    pair differently), p2p copies are paired in FIFO order instead: the n-th send from src to
    dst in a group meets the n-th recv, which is how point-to-point channels deliver.
    """
    rank = df["rank"].to_numpy(np.int64)
    peer = df["peer"].to_numpy(np.int64)
    p2p = _is_p2p(df["op"])
    send = _op_is(df["op"], "send")
    src = np.where(p2p, np.where(send, rank, peer), -1)
    dst = np.where(p2p, np.where(send, peer, rank), -1)
    keys = pd.DataFrame({"g": codes(df["group"]), "src": src, "dst": dst, "seq": df["seq"].to_numpy()})
    ids = keys.groupby(["g", "src", "dst", "seq"], sort=False).ngroup().to_numpy(np.int64)
    if p2p.any():
        copies = np.bincount(ids[p2p])[ids[p2p]]
        if (copies == 2).mean() < 0.5:
            keys["side"] = send
            keys["seq"] = np.where(p2p, keys.sort_values("seq", kind="stable")
                                   .groupby(["g", "src", "dst", "side"], sort=False).cumcount()
                                   .reindex(keys.index).to_numpy(), keys["seq"].to_numpy())
            ids = keys.groupby(["g", "src", "dst", "seq"], sort=False).ngroup().to_numpy(np.int64)
    return ids


def host_codes(meta: JobMeta, rank: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Host index of each rank (by the meta's rank table) and the host names."""
    hosts = meta.hosts()
    index = {h: i for i, h in enumerate(hosts)}
    size = max(max(meta.ranks, default=0), int(rank.max(initial=0))) + 1
    table = np.full(size, -1, dtype=np.int64)
    for r, info in meta.ranks.items():  # one entry per rank, not per row
        table[r] = index[info.host]
    return table[rank], hosts


def estimate_clock_offsets(df: pd.DataFrame, meta: JobMeta) -> pd.Series:
    """Per-host clock offset in ns, from when operator copies complete.

    All copies of a collective finish at nearly the same true time (nobody finishes before the
    last rank arrives): per host pair, the median difference of their copies' ends is their
    clock offset. A recv never completes before its send, but may complete later (the receiver
    posted late), so per host pair the smallest recv-minus-send end difference is the offset.
    The pair estimates form a sparse least-squares system whose minimum-norm solution centres
    every connected set of hosts on zero (hosts sharing no operator cannot be related).
    """
    host, names = host_codes(meta, df["rank"].to_numpy(np.int64))
    p2p = _is_p2p(df["op"])
    pairs = pd.concat([_collective_pairs(df[~p2p], host[~p2p]), _p2p_pairs(df[p2p], host[p2p])])
    if pairs.empty:
        return pd.Series(np.zeros(len(names), dtype=np.int64), index=names, name="offset_ns")
    offsets = pairwise_least_squares(len(names), pairs["a"].to_numpy(np.int64), pairs["b"].to_numpy(np.int64),
                                     pairs["d"].to_numpy(np.float64), np.sqrt(pairs["n"].to_numpy(np.float64)))
    return pd.Series(np.round(offsets).astype(np.int64), index=names, name="offset_ns")


def _collective_pairs(df: pd.DataFrame, host: np.ndarray) -> pd.DataFrame:
    """Host pairs (a, b) with d ≈ offset[a] - offset[b]: each host's copy vs the instance's lowest host."""
    per = (
        pd.DataFrame({"inst": instance_ids(df), "host": host, "end": df["end_ns"].to_numpy(np.float64)})
        .groupby(["inst", "host"], sort=True)["end"].median().reset_index()
    )
    by = per.groupby("inst", sort=False)
    ref_host = by["host"].transform("first").to_numpy()
    ref_end = by["end"].transform("first").to_numpy()
    cross = per["host"].to_numpy() != ref_host
    return (
        pd.DataFrame({"a": per["host"].to_numpy()[cross], "b": ref_host[cross],
                      "d": per["end"].to_numpy()[cross] - ref_end[cross]})
        .groupby(["a", "b"], sort=False)["d"].agg(d="median", n="size").reset_index()
    )


def _p2p_pairs(df: pd.DataFrame, host: np.ndarray) -> pd.DataFrame:
    """Host pairs (a, b) with d ≈ offset[a] - offset[b]: where a recv and its send end, within
    what causality allows.

    Whatever the send semantics (eager, rendezvous, batched), a recv cannot complete before its
    send was posted, so recv end minus send start, minimised over a pair's transfers, bounds
    offset[recv host] - offset[send host] from above, and transfers the other way bound it from
    below. Within those bounds, the median difference of recv and send ends is the estimate:
    exact where the two end together (rendezvous); a batch that waits on another transfer, or an
    eager send done before its data lands, can only move it as far as the bounds.
    """
    inst = instance_ids(df)
    send = _op_is(df["op"], "send")
    rows = pd.DataFrame({"inst": inst, "host": host, "start": df["start_ns"].to_numpy(np.float64),
                         "end": df["end_ns"].to_numpy(np.float64)})
    both = rows[send].merge(rows[~send], on="inst", suffixes=("_s", "_r"))
    both = both[both["host_s"].to_numpy() != both["host_r"].to_numpy()]
    if both.empty:
        return pd.DataFrame({"a": [], "b": [], "d": [], "n": []})
    pairs = (
        pd.DataFrame({"a": both["host_r"].to_numpy(), "b": both["host_s"].to_numpy(),
                      "up": both["end_r"].to_numpy() - both["start_s"].to_numpy(),
                      "ends": both["end_r"].to_numpy() - both["end_s"].to_numpy()})
        .groupby(["a", "b"], sort=False).agg(up=("up", "min"), ends=("ends", "median"), n=("up", "size")).reset_index()
    )
    back = pairs.rename(columns={"a": "b", "b": "a", "up": "up_back", "n": "n_back"})[["a", "b", "up_back", "n_back"]]
    pairs = pairs.merge(back, on=["a", "b"], how="left")
    two_way = pairs["up_back"].notna().to_numpy()
    low = np.where(two_way, -pairs["up_back"].to_numpy(), -np.inf)
    d = np.clip(pairs["ends"].to_numpy(), low, pairs["up"].to_numpy())
    n = np.where(two_way, np.minimum(pairs["n"].to_numpy(), pairs["n_back"].fillna(0).to_numpy()), pairs["n"].to_numpy())
    return pd.DataFrame({"a": pairs["a"].to_numpy(), "b": pairs["b"].to_numpy(), "d": d, "n": n})


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

