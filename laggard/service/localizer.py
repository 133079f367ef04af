"""Continuous localization from sidecar summaries (the central side of docs/design.md "Scale").

The service sees only abnormal operator copies, so it applies the Holmes root-cause rule on
them: in an instance where every present member but one was abnormal (waited), the one that
was not is the suspect; where every member was abnormal, the transfer itself is (blame goes
to the members' NICs). A suspect that was itself waiting elsewhere in the same step (or at the end of
the previous one) hands the blame on to whoever it waited for, followed by pointer jumping. All of it is pandas joins over
the abnormal rows, no per-operator Python loop. When localize/ provides a summary localizer,
this module should call it instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from localize.verdict import Candidate, Status, Verdict

DELTA = 1.1  # δ of δ-irregularity
BASELINE_Q = 0.25
MAX_HOPS = 8


def step_table(node_steps: pd.DataFrame, delta: float = DELTA) -> pd.DataFrame:
    """Per step: the slowest node's duration, a baseline, and δ-irregularity."""
    if node_steps.empty:
        return pd.DataFrame(columns=["step", "duration_s", "baseline_s", "ratio", "irregular", "pattern"])
    df = node_steps.groupby("step")["duration_s"].max().reset_index()
    # a low quantile of the steps so far: a persistent slowdown does not become the new normal
    prior = df["duration_s"].shift(1).expanding(min_periods=3).quantile(BASELINE_Q)
    df["baseline_s"] = prior.fillna(df["duration_s"].quantile(BASELINE_Q))
    df["ratio"] = df["duration_s"] / df["baseline_s"]
    df["irregular"] = df["ratio"] > delta
    df["pattern"] = np.where(df["irregular"], "", "")
    return df


@dataclass
class Batch:
    """Summaries as columns: what localization needs, parsed once per summary."""

    ops: pd.DataFrame  # rank, group, op, seq, elapsed, step, peer
    steps: pd.DataFrame  # step, duration_s (one row per node and step)
    ranks: pd.DataFrame  # rank, node, gpu
    posts: pd.DataFrame  # node, window

    @classmethod
    def concat(cls, parts: list[Batch]) -> Batch:
        return cls(*(pd.concat([getattr(b, f) for b in parts], ignore_index=True) for f in
                     ("ops", "steps", "ranks", "posts")))


def batch_from_summaries(summaries: list[dict[str, Any]]) -> Batch:
    """The one pass over posted JSON; everything after it is vectorized."""
    cols = ["rank", "group", "op", "seq", "elapsed", "step", "peer"]
    ops = pd.DataFrame([tuple(o.get(c, -1) for c in cols) for s in summaries for o in s.get("ops", [])], columns=cols)
    steps = pd.DataFrame([(t["step"], t["duration_s"]) for s in summaries for t in s.get("steps", [])],
                         columns=["step", "duration_s"])
    ranks = pd.DataFrame([(r, s["node"], int(s.get("gpus", {}).get(str(r), s.get("gpus", {}).get(r, -1))))
                          for s in summaries for r in s["ranks"]], columns=["rank", "node", "gpu"])
    posts = pd.DataFrame([(s["node"], s["window"]) for s in summaries], columns=["node", "window"])
    return Batch(ops.astype({"rank": np.int64, "seq": np.int64, "step": np.int64, "peer": np.int64,
                             "elapsed": np.float64}), steps, ranks, posts)


def localize_batch(job: str, batch: Batch, groups: dict[str, list[int]], top: int = 5,
                   delta: float = DELTA) -> tuple[Verdict, pd.DataFrame]:
    """A verdict from a job's summaries in columns (see `Batch`), and its step table."""
    steps = step_table(batch.steps, delta)
    last = batch.ranks.drop_duplicates("rank", keep="last")
    node_of = dict(zip(last["rank"].tolist(), last["node"].tolist(), strict=True))
    gpu_of = {r: g for r, g in zip(last["rank"].tolist(), last["gpu"].tolist(), strict=True) if g >= 0}
    irregular = [int(s) for s in steps.loc[steps["irregular"], "step"]] if len(steps) else []
    blame = _blame(_ops(batch.ops), groups, node_of, irregular)
    status: Status = "irregular" if irregular or (steps.empty and not blame.empty) else "healthy"
    slowdown = 1.0
    if irregular:
        irr = steps[steps["irregular"]]
        slowdown = float(irr["duration_s"].mean() / irr["baseline_s"].mean())
    cands: list[Candidate] = []
    if status == "irregular" and not blame.empty:
        total = float(blame["blame_s"].sum())
        for row in blame.head(top).to_dict(orient="records"):
            share, device = float(row["blame_s"]) / total, str(row["device"])
            ev = (f"{int(row['n'])} instance(s) in {row['groups']} groups waited on it, "
                  f"{float(row['blame_s']):.3f} s of waiting in steps {int(row['first'])}..{int(row['last'])}")
            if row["kind"] == "gpu":
                rank = int(device)
                cands.append(Candidate("gpu", share, [ev], rank=rank, host=node_of.get(rank), gpu=gpu_of.get(rank),
                                       source="summaries"))
            else:
                cands.append(Candidate("nic", share, ["every member waited: the transfer itself was slow; " + ev],
                                       host=device, source="summaries"))
    windows = batch.posts["window"]
    extra = {"source": "summaries", "nodes": int(batch.posts["node"].nunique()),
             "windows": [int(windows.min()), int(windows.max())], "summaries": len(batch.posts)}
    return Verdict(job, status, irregular, slowdown, cands, extra), steps


def _ops(df: pd.DataFrame) -> pd.DataFrame:
    """Abnormal rows keyed by operator instance: (group, seq) or, for send/recv, (group, seq, src, dst)."""
    if df.empty:
        return df
    p2p = df["peer"].to_numpy() >= 0
    send = df["op"].to_numpy() == "send"
    rank, peer = df["rank"].to_numpy(), df["peer"].to_numpy()
    df["src"] = np.where(p2p, np.where(send, rank, peer), -1)
    df["dst"] = np.where(p2p, np.where(send, peer, rank), -1)
    df = df.drop_duplicates(["group", "seq", "src", "dst", "rank"])
    df["inst"] = df.groupby(["group", "seq", "src", "dst"], sort=False).ngroup()
    return df


def _blame(ops: pd.DataFrame, groups: dict[str, list[int]], node_of: dict[int, str],
           irregular: list[int] | None = None) -> pd.DataFrame:
    """Seconds of waiting each root (a rank, or a node's NIC) caused, most first; with irregular
    steps, only the excess over each device's usual per-step share."""
    out_cols = ["kind", "device", "blame_s", "n", "groups", "first", "last"]
    if ops.empty:
        return pd.DataFrame(columns=out_cols)
    members = pd.DataFrame([(g, r) for g, ms in groups.items() for r in ms], columns=["group", "member"])
    inst = ops.groupby("inst").agg(group=("group", "first"), step=("step", "first"), src=("src", "first"),
                                   dst=("dst", "first"), delay=("elapsed", "mean"), n_abn=("rank", "size"))
    p2p = inst["src"] >= 0
    # who should have been there: the group's members, or for send/recv just the pair
    coll = inst[~p2p].reset_index().merge(members, on="group")
    pair = inst[p2p].reset_index()
    pair = pd.concat([pair.assign(member=pair["src"]), pair.assign(member=pair["dst"])])
    expected = pd.concat([coll, pair], ignore_index=True)
    expected = expected[expected["member"].isin(node_of.keys())]  # only nodes that reported
    abn = ops[["inst", "rank"]].rename(columns={"rank": "member"}).assign(abnormal=True)
    expected = expected.merge(abn, on=["inst", "member"], how="left")
    expected["abnormal"] = expected["abnormal"].fillna(False).astype(bool)
    per = expected.groupby("inst").agg(n_present=("member", "size"), n_abn=("abnormal", "sum"))
    normal = expected[~expected["abnormal"]].groupby("inst")["member"].first()
    per["suspect"] = normal.reindex(per.index).fillna(-1).astype(np.int64)
    per = per.join(inst[["group", "step", "delay"]])
    one_normal = (per["n_present"] - per["n_abn"] == 1) & (per["n_abn"] >= 1)
    all_abn = (per["n_present"] == per["n_abn"]) & (per["n_present"] >= 2)
    sus = per[one_normal].reset_index()
    # follow back: a suspect that waited in the same step hands its blame to whom it waited for
    waited = ops.merge(sus[["inst", "suspect"]], on="inst")
    waited = waited[waited["suspect"] != waited["rank"]]
    # a wait at the end of step t (the DP gradient sync) makes the rank late early in step t+1
    waited = pd.concat([waited, waited.assign(step=waited["step"] + 1)])
    # hand it to whom the rank spent most of its waiting on in that step, summed over operators
    per_suspect = waited.groupby(["step", "rank", "suspect"])["elapsed"].sum().reset_index()
    most = per_suspect.sort_values("elapsed").drop_duplicates(["step", "rank"], keep="last")
    # only a rank that waited more than the one it waited on passes blame on: the root waits least
    # (this also breaks pipeline cycles, where stages wait on each other in turn)
    waits = ops.groupby(["step", "rank"])["elapsed"].sum()
    own = waits.reindex(pd.MultiIndex.from_arrays([most["step"], most["rank"]])).to_numpy()
    theirs = np.nan_to_num(waits.reindex(pd.MultiIndex.from_arrays([most["step"], most["suspect"]])).to_numpy())
    most = most[own > theirs]
    upstream = most.set_index(["step", "rank"])["suspect"]
    root = sus[["step", "suspect"]].rename(columns={"suspect": "root"})
    for _ in range(MAX_HOPS):
        nxt = upstream.reindex(pd.MultiIndex.from_arrays([root["step"], root["root"]])).to_numpy()
        nxt = np.where(np.isnan(nxt.astype(float)), root["root"].to_numpy(), nxt).astype(np.int64)
        if (nxt == root["root"].to_numpy()).all():
            break
        root["root"] = nxt
    sus["root"] = root["root"].to_numpy()
    kind_of = sus["group"].str.split("-", n=1).str[0]
    gpu = sus.assign(kind="gpu", device=sus["root"].astype(str), gk=kind_of)
    comm = per[all_abn].reset_index().merge(expected[["inst", "member"]], on="inst")
    comm["device"] = comm["member"].map(node_of)
    comm = comm.drop_duplicates(["inst", "device"])
    comm["delay"] = comm["delay"] / comm.groupby("inst")["device"].transform("size")
    nic = comm.assign(kind="nic", gk=comm["group"].str.split("-", n=1).str[0])
    both = pd.concat([gpu[["kind", "device", "delay", "gk", "step"]], nic[["kind", "device", "delay", "gk", "step"]]])
    if both.empty:
        return pd.DataFrame(columns=out_cols)
    if irregular:
        # blame is what a device added in the irregular steps beyond its usual share (pipeline
        # bubbles and noise make some ranks "waited on" in every step, fault or not)
        irr = both["step"].isin(irregular)
        n_normal = max(1, both.loc[~irr, "step"].nunique())
        usual = both[~irr].groupby(["kind", "device"])["delay"].sum() / n_normal
        both = both[irr]
        if both.empty:
            return pd.DataFrame(columns=out_cols)
    agg = both.groupby(["kind", "device"]).agg(blame_s=("delay", "sum"), n=("delay", "size"),
                                               groups=("gk", lambda s: ",".join(sorted(set(s)))),
                                               first=("step", "min"), last=("step", "max"))
    if irregular:
        excess = agg["blame_s"] - usual.reindex(agg.index).fillna(0.0) * len(set(irregular))
        agg["blame_s"] = excess.clip(lower=0.0)
        agg = agg[agg["blame_s"] > 0]
    return agg.reset_index().sort_values("blame_s", ascending=False)[out_cols]
