"""What each process group is for (dp/tp/pp/ep/cp/sync), read from how its operators behave.

Names like `tp-3` are a hint only — real jobs call groups `pg17`. The physics: pipeline
stages talk by send/recv; expert parallelism by all_to_all; data parallelism runs one or two
large reduce-scatter/all-gather/all-reduce per step; tensor and context parallelism run many
small collectives per layer, tensor parallelism on adjacent ranks (inside one host), context
parallelism (all-gather of keys/values) on ranks a tensor-parallel group apart. A once-a-step
group over a union of others (Megatron's model-parallel grad-norm all-reduce, a world barrier)
is a sync: who talks to whom tells it from data parallelism (`sync_groups`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from collector.trace.groupnames import kind_in_name
from collector.trace.meta import PARALLEL_DIMS, JobMeta
from collector.trace.schema import P2P_OPS
from timeline.instances import host_codes

#: At most this many collectives per rank per step: the once-a-step data-parallel kind.
DP_MAX_PER_STEP = 4
#: Largest group × rank bitmap `membership` marks pairs in (bytes) before it sorts instead.
BITMAP_CELLS = 1 << 26
#: rows per chunk of `membership`'s keys
_CHUNK = 1 << 18


def group_features(df: pd.DataFrame, meta: JobMeta) -> pd.DataFrame:
    """One row per group: size, hosts spanned, rank stride, ops per rank per step, op mix, bytes.

    Needs columns rank, group, op, nbytes, step. Integer codes and bincounts only: linear,
    plus one sort of (group, rank) pairs.
    """
    if df.empty:
        return pd.DataFrame()
    g, names = _group_codes(df["group"])
    n_groups = len(names)
    rank = df["rank"].to_numpy(np.int64)
    host, _ = host_codes(meta, rank)
    op = df["op"]
    rows = np.bincount(g, minlength=n_groups).astype(np.float64)

    def share(mask: np.ndarray) -> np.ndarray:
        return np.bincount(g, weights=mask.astype(np.float64), minlength=n_groups) / np.maximum(rows, 1)

    pg, pr = membership(g, rank)
    size = np.bincount(pg, minlength=n_groups)
    gaps = np.where(pg[1:] == pg[:-1], np.diff(pr), np.iinfo(np.int64).max)
    stride = np.full(n_groups, np.iinfo(np.int64).max)
    np.minimum.at(stride, pg[1:], gaps)
    stride[stride == np.iinfo(np.int64).max] = 0
    hosts = np.bincount(membership(g, host)[0], minlength=n_groups)  # (group, host) pairs, as for ranks
    step = df["step"].to_numpy()
    n_steps = max(int(pd.unique(step[step >= 0]).size), 1)
    feat = pd.DataFrame(
        {
            "rows": rows,
            "size": size,
            "hosts": hosts,
            "nbytes": np.bincount(g, weights=df["nbytes"].to_numpy(np.float64), minlength=n_groups) / np.maximum(rows, 1),
            "p2p": share(np.asarray(op.isin(P2P_OPS).to_numpy(), dtype=bool)),
            "a2a": share(np.asarray((op == "all_to_all").to_numpy(), dtype=bool)),
            "ar": share(np.asarray((op == "all_reduce").to_numpy(), dtype=bool)),
            "ag": share(np.asarray((op == "all_gather").to_numpy(), dtype=bool)),
            "rs": share(np.asarray((op == "reduce_scatter").to_numpy(), dtype=bool)),
            "stride": stride,
        },
        index=pd.Index(names, name="group"),
    )
    feat = feat[feat["rows"] > 0]
    feat["per_step"] = feat["rows"] / feat["size"] / n_steps
    return feat.sort_index()


def membership(group: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique (group code, rank) pairs, sorted by group then rank: who is in each group.

    A group × rank bitmap where it is small (linear, no sort of every row; marked a chunk of
    rows at a time: no row-sized int64 keys beside the analysis's arrays), else a sort."""
    width = int(rank.max(initial=0)) + 1
    cells = (int(group.max(initial=0)) + 1) * width
    if cells <= BITMAP_CELLS:
        seen = np.zeros(cells, dtype=bool)
        for c in range(0, len(group), _CHUNK):
            seen[group[c:c + _CHUNK].astype(np.int64) * width + rank[c:c + _CHUNK]] = True
        pairs = np.flatnonzero(seen)
    else:
        pairs = np.unique(group.astype(np.int64) * width + rank)
    return pairs // width, pairs % width


def sync_groups(group: np.ndarray, rank: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Per group code: a once-a-step (`kind` "dp") group that is really a sync over other groups.

    A data-parallel group holds the ranks of one tensor/pipeline position, one per replica: it
    shares at most one rank with any tp or pp group, is no cp group and holds no other
    once-a-step group whole. Megatron's model-parallel group (a replica's tp × pp ranks) shares a
    whole tp group (or is the cp group, with context parallelism alone); a world group holds
    every dp group. A dp × cp gradient group holds whole cp groups and stays dp. Ranks only, never
    names; `group`, `rank`: membership pairs (`membership`); `kind`: per group code. Linear in
    the pairs: a rank is in a few groups.
    """
    kind = np.asarray(kind, dtype=object)
    out = np.zeros(len(kind), dtype=bool)
    size = np.bincount(group, minlength=len(kind))
    cand = kind[group] == "dp"
    other = np.isin(kind[group], ("tp", "pp", "cp", "dp"))
    if not cand.any() or not other.any():
        return out
    a = pd.DataFrame({"g": group[cand], "r": rank[cand]})
    b = pd.DataFrame({"h": group[other], "r": rank[other]})
    pairs = a.merge(b, on="r")
    pairs = pairs[pairs["g"] != pairs["h"]]
    shared = pairs.groupby(["g", "h"]).size()
    g = shared.index.get_level_values("g").to_numpy(np.int64)
    h = shared.index.get_level_values("h").to_numpy(np.int64)
    n = shared.to_numpy()
    crosses = np.isin(kind[h], ("tp", "pp")) & (n >= 2)
    is_cp = (kind[h] == "cp") & (n >= 2) & (n == size[g]) & (n == size[h])
    out[g[crosses | is_cp]] = True
    holds = (kind[h] == "dp") & ~out[h] & (n == size[h]) & (n >= 2) & (size[g] > size[h])
    out[g[holds]] = True
    return out


def _group_codes(col: pd.Series) -> tuple[np.ndarray, list[str]]:
    """Integer code of each row's group and the group names."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy(np.int64), [str(c) for c in col.cat.categories]
    codes, uniques = pd.factorize(col)
    return codes.astype(np.int64), [str(u) for u in uniques]


def infer_group_kinds(df: pd.DataFrame, meta: JobMeta, notes: list[str] | None = None) -> dict[str, str]:
    """Kind of every group seen in the records (dp/tp/pp/ep/cp/sync), from operator physics
    and who communicates with whom (`sync_groups`).

    Names only break a tie the physics leaves (tp vs cp with one kind of frequent group);
    disagreements between names and physics are reported in `notes`.
    """
    feat = group_features(df, meta)
    if feat.empty:
        return {}
    kind = pd.Series("", index=feat.index, dtype=object)
    kind[feat["p2p"] > 0] = "pp"
    kind[(kind == "") & (feat["a2a"] > 0)] = "ep"
    coll = kind == ""
    kind[coll & (feat["per_step"] <= DP_MAX_PER_STEP)] = "dp"
    frequent = feat.index[(kind == "").to_numpy()]
    if len(frequent):
        kind[frequent] = _tp_or_cp(feat.loc[frequent])
    hints = {g: k for g in feat.index if (k := kind_in_name(str(g))) is not None}
    if len(frequent):
        kind = _break_ties(kind, feat, hints)
    kind = _mark_sync(kind, df)
    out = {str(g): str(k) for g, k in kind.items()}
    if notes is not None:
        disagree = sorted(g for g, h in hints.items() if out.get(g) != h)
        if disagree:
            notes.append(
                f"{len(disagree)} group name(s) disagree with their operators (e.g. {disagree[0]} behaves as "
                f"{out[disagree[0]]}); kinds follow the operators"
            )
        _check_parallelism(out, feat, meta, notes)
    return out


def _mark_sync(kind: pd.Series, df: pd.DataFrame) -> pd.Series:
    """The once-a-step groups that sync a union of other groups, marked "sync" (`sync_groups`)."""
    g, names = _group_codes(df["group"])
    pg, pr = membership(g, df["rank"].to_numpy(np.int64))
    by_code = kind.reindex(names).fillna("").to_numpy(dtype=object)
    sync = sync_groups(pg, pr, by_code)
    if sync.any():
        kind = kind.copy()
        kind[[names[i] for i in np.flatnonzero(sync)]] = "sync"
    return kind


def _tp_or_cp(freq: pd.DataFrame) -> pd.Series:
    """Frequent intra-layer groups: the adjacent-rank family is tp, the strided family cp.

    With only one family: all-gather dominated (keys/values) is cp, all-reduce is tp.
    """
    families = freq.groupby(["size", "stride"]).size().index.tolist()
    out = pd.Series("tp", index=freq.index, dtype=object)
    if len(families) >= 2:
        tp_stride = min(s for _, s in families)
        out[freq["stride"] > tp_stride] = "cp"
        return out
    gathers = (freq["ag"] > freq["ar"]) & (freq["ar"] == 0)
    out[gathers.to_numpy()] = "cp"
    return out


def _break_ties(kind: pd.Series, feat: pd.DataFrame, hints: dict[str, str]) -> pd.Series:
    """Frequent groups leave ties the physics cannot break; names break them where a family's
    names consistently say so. Where only one frequent family exists, tp vs cp is ambiguous in
    sequence-parallel jobs. And a data-parallel sync in buckets of all-gathers and reduce-scatters
    (Megatron's overlapped gradient reduce-scatter and parameter all-gather, FSDP's) runs more
    than twice a step, as context parallelism's key/value gathers do: a family read as cp that
    its names call dp is dp. (An all-reducing family stays tp whatever its names say.)"""
    frequent = kind.isin(["tp", "cp"])
    fam = feat.loc[frequent, ["size", "stride"]].apply(tuple, axis=1)
    if fam.nunique() == 1:
        said = {hints.get(g) for g in kind.index[frequent]}
        if len(said) == 1 and (h := said.pop()) in ("tp", "cp"):
            kind[frequent] = h
    for family in fam.unique():
        members = fam.index[(fam == family).to_numpy()]
        if (kind[members] == "cp").all() and {hints.get(g) for g in members} == {"dp"}:
            kind[members] = "dp"
    return kind


def _check_parallelism(kinds: dict[str, str], feat: pd.DataFrame, meta: JobMeta, notes: list[str]) -> None:
    """Note when the inferred group sizes contradict meta's declared parallelism."""
    size: dict[Any, Any] = feat["size"].to_dict()
    for dim in PARALLEL_DIMS:
        want = meta.parallelism.get(dim)
        sizes = {int(size[g]) for g, k in kinds.items() if k == dim}
        if want and want > 1 and sizes and sizes != {want}:
            notes.append(f"meta says {dim}={want} but {dim} groups have {sorted(sizes)} ranks")
