"""Who waited on whom: per-rank operator wait and the wait graph, from CommOps rows.

The rank that arrives last at an operator waits least (docs/design.md), so a copy's wait is its
elapsed time minus the shortest elapsed time among the copies of the same instance, and the
copy with the shortest elapsed time is the one everybody waited for (its "blocker"). Only
durations are compared across ranks, never start times, because host clocks are not in sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from timeline.instances import instance_ids


@dataclass
class WaitMatrix:
    """Seconds each rank spent waiting in operators, per step (rows = ranks, columns = steps)."""

    ranks: np.ndarray
    steps: np.ndarray
    seconds: np.ndarray

    def total_by_rank(self) -> pd.Series:
        return pd.Series(self.seconds.sum(axis=1), index=self.ranks)


@dataclass
class PathHop:
    """One level of the wait graph: ranks that waited on the level below (level 0 = the root)."""

    level: int
    ranks: list[int]
    groups: list[str] = field(default_factory=list)  # group kinds the waits went through
    wait_s: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {"level": self.level, "n_ranks": len(self.ranks), "ranks": self.ranks[:32],
                "groups": self.groups, "wait_s": round(self.wait_s, 6)}


def annotate_waits(ops: pd.DataFrame) -> pd.DataFrame:
    """Add `elapsed_s`, `wait_s` and `blocker` to CommOps rows (vectorized over all rows).

    Copies are matched into instances as the timeline matches them (`timeline.instances.instance_ids`:
    (group, seq) for collectives, (group, src, dst, seq) for a send/recv pair, in order where a
    producer numbers the two ends apart).
    """
    df = ops.reset_index(drop=True)
    rank = df["rank"].to_numpy()
    inst = instance_ids(df)
    elapsed = (df["end_ns"].to_numpy() - df["start_ns"].to_numpy()).astype(np.float64) / 1e9
    n = int(inst.max()) + 1 if len(inst) else 0
    best = np.full(n, np.inf)
    np.minimum.at(best, inst, elapsed)
    # blocker: the rank of the first copy whose elapsed equals the instance minimum
    is_min = elapsed == best[inst]
    order = np.flatnonzero(is_min)
    blocker_of = np.full(n, -1, dtype=np.int64)
    blocker_of[inst[order[::-1]]] = rank[order[::-1]]
    out = df.copy()
    out["elapsed_s"] = elapsed
    out["wait_s"] = elapsed - best[inst]
    out["blocker"] = blocker_of[inst]
    return out


def wait_matrix(annotated: pd.DataFrame) -> WaitMatrix:
    """Sum each rank's wait per step into a dense rank × step matrix."""
    rows = annotated[annotated["step"] >= 0]
    table = rows.pivot_table(index="rank", columns="step", values="wait_s", aggfunc="sum", fill_value=0.0)
    return WaitMatrix(table.index.to_numpy(), table.columns.to_numpy(), table.to_numpy(dtype=np.float64))


def joined_wait_matrix(parts: list[WaitMatrix]) -> WaitMatrix:
    """One matrix from the matrices (at least one) of disjoint sets of steps (a rank absent from a
    part waited 0 there)."""
    frames = [pd.DataFrame(p.seconds, index=p.ranks, columns=p.steps) for p in parts]
    table = pd.concat(frames, axis=1).fillna(0.0).sort_index().sort_index(axis=1)
    return WaitMatrix(table.index.to_numpy(), table.columns.to_numpy(), table.to_numpy(dtype=np.float64))


def wait_edges(annotated: pd.DataFrame, group_kind: dict[str, str], steps: list[int] | None = None) -> pd.DataFrame:
    """Seconds each rank waited on each other rank (its blocker), per kind of group, in `steps`
    (all when None): what `wait_path` reads. Sums of disjoint sets of rows add up (`joined_edges`),
    so a trace can be read a chunk of steps at a time."""
    rows = annotated if steps is None else annotated[annotated["step"].isin(steps)]
    rows = rows[(rows["rank"] != rows["blocker"]) & (rows["wait_s"] > 0)]
    kind_of = {g: group_kind.get(g, _kind_from_name(g)) for g in rows["group"].unique()}
    return (rows[["rank", "blocker", "wait_s"]].assign(kind=rows["group"].map(kind_of).astype(object))
            .groupby(["rank", "blocker", "kind"], sort=False)["wait_s"].sum().reset_index())


def joined_edges(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """`wait_edges` of the union of the parts' rows."""
    frames = [p for p in parts if not p.empty]
    if not frames:
        return pd.DataFrame({"rank": [], "blocker": [], "kind": [], "wait_s": []})
    return pd.concat(frames).groupby(["rank", "blocker", "kind"], sort=False)["wait_s"].sum().reset_index()


def wait_path(edges: pd.DataFrame, roots: list[int], max_levels: int = 6) -> list[PathHop]:
    """Levels of ranks that waited, transitively, on the root ranks (level 0), from `wait_edges`.

    Each waiting rank is attached to the rank it waited on longest (its dominant blocker);
    level k holds the ranks whose dominant blocker is in level k-1.
    """
    if edges.empty or not roots:
        return [PathHop(0, sorted(roots))] if roots else []
    totals = edges.groupby(["rank", "blocker"], sort=False)["wait_s"].sum().reset_index()
    totals = totals.sort_values("wait_s", ascending=False, kind="stable").drop_duplicates("rank")
    edge_kinds = edges.groupby(["rank", "blocker"])["kind"].agg(lambda s: sorted(set(s))).to_dict()
    dominant = dict(zip(totals["rank"].to_numpy().tolist(), totals["blocker"].to_numpy().tolist(), strict=True))
    waited = dict(zip(totals["rank"].to_numpy().tolist(), totals["wait_s"].to_numpy().tolist(), strict=True))
    hops = [PathHop(0, sorted(roots))]
    seen = set(roots)
    frontier = set(roots)
    by_blocker = totals.groupby("blocker")["rank"].agg(list).to_dict()
    for level in range(1, max_levels + 1):
        nxt = sorted({r for b in frontier for r in by_blocker.get(b, []) if r not in seen})
        if not nxt:
            break
        groups = sorted({k for r in nxt for k in edge_kinds.get((r, dominant[r]), [])})
        hops.append(PathHop(level, nxt, groups, float(sum(waited[r] for r in nxt))))
        seen.update(nxt)
        frontier = set(nxt)
    return hops


def _kind_from_name(group: str) -> str:
    """'tp-3' -> 'tp': the simulator's and Megatron's naming, used when the timeline gives none."""
    return group.split("-", 1)[0]


def gantt_rows(annotated: pd.DataFrame, step: int, ranks: list[int]) -> pd.DataFrame:
    """Operators of some ranks in one step, as seconds since each rank's own step start."""
    rows = annotated[(annotated["step"] == step) & annotated["rank"].isin(ranks)]
    if rows.empty:
        return pd.DataFrame(columns=["rank", "op", "group", "t0", "t1", "wait_s"])
    t0 = rows.groupby("rank")["start_ns"].transform("min")
    return pd.DataFrame({
        "rank": rows["rank"].to_numpy(),
        "op": rows["op"].to_numpy(),
        "group": rows["group"].to_numpy(),
        "t0": (rows["start_ns"] - t0).to_numpy() / 1e9,
        "t1": (rows["end_ns"] - t0).to_numpy() / 1e9,
        "wait_s": rows["wait_s"].to_numpy(),
    })
