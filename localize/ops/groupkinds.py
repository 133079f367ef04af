"""The kind of every process group (dp/tp/pp/ep/cp/sync), for naming rank units.

The timeline stage infers kinds properly and is preferred (`hint`). Without it, a name that
says its kind ("tp-3", "dp_0") is believed; an opaque name ("pg-3f2a...") is judged from its
records: point-to-point streams are pipeline, all-to-all is expert parallel, a collective
that runs at most twice a step is data parallel (the gradient sync) unless its members are a
union of other groups (a sync, `timeline.groups.sync_groups`), anything more frequent is model
parallel (tp).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from collector.trace.groupnames import kind_in_name
from collector.trace.meta import JobMeta
from collector.trace.schema import OPS
from localize.ops.table import Ops
from timeline.groups import membership, sync_groups

KINDS = ("dp", "tp", "pp", "ep", "cp", "sync")


def group_kinds(ops: Ops, hint: dict[str, str] | None = None) -> dict[str, str]:
    """Group name -> kind, for every group in the records."""
    out: dict[str, str] = {}
    names = [str(g) for g in ops.groups]
    hint = hint or {}
    need = []
    for i, g in enumerate(names):
        if hint.get(g) in KINDS:
            out[g] = str(hint[g])
        elif (kind := kind_in_name(g)) is not None:
            out[g] = kind
        else:
            need.append(i)
    if not need:
        return out
    n_groups = len(names)
    gcode = ops.group_code
    p2p = np.bincount(gcode, weights=ops.inst_p2p[ops.inst].astype(np.float64), minlength=n_groups)
    a2a = np.bincount(gcode, weights=(ops.opcode == OPS.index("all_to_all")).astype(np.float64), minlength=n_groups)
    total = np.bincount(gcode, minlength=n_groups).astype(np.float64)
    per_step = pd.DataFrame({"g": gcode, "r": ops.rank, "s": ops.step}).groupby(["g", "r", "s"]).size().groupby("g").median()
    for i in need:
        if p2p[i] > 0.5 * total[i]:
            out[names[i]] = "pp"
        elif a2a[i] > 0.5 * total[i]:
            out[names[i]] = "ep"
        elif float(per_step.get(i, 0)) <= 2:
            out[names[i]] = "dp"
        else:
            out[names[i]] = "tp"
    if not any(out[names[i]] == "dp" for i in need):
        return out
    pg, pr = membership(gcode, ops.rank.astype(np.int64))
    sync = sync_groups(pg, pr, np.array([out[g] for g in names], dtype=object))
    for i in need:
        if sync[i]:
            out[names[i]] = "sync"
    return out


def observed_members(ops: Ops) -> dict[int, list[int]]:
    """Per group code: the ranks that logged rows of it, and the peers their point-to-point rows
    name (for groups the metadata does not list). A pipeline group whose middle stage logged
    nothing still has it: without, the last stage sat at the third place of four, beside the
    third stage's workers, and a healthy job's last stage (its loss) read as a slow GPU."""
    p2p = ops.inst_p2p
    ends = np.r_[ops.inst_src[p2p], ops.inst_dst[p2p]].astype(np.int64)
    g, r = membership(np.r_[ops.group_code, np.tile(ops.inst_group[p2p], 2)].astype(np.int64),
                      np.r_[ops.rank.astype(np.int64), ends])
    cut = np.flatnonzero(np.diff(g)) + 1
    return {int(gs[0]): rs.tolist() for gs, rs in zip(np.split(g, cut), np.split(r, cut), strict=True)}


def with_observed_groups(meta: JobMeta, ops: Ops) -> JobMeta:
    """`meta` with the groups it leaves out (the contract allows it) as the ranks that logged in
    them, so stages and model replicas can be laid out. Not for telling who was not logged."""
    missing = [i for i, g in enumerate(ops.groups) if str(g) not in meta.groups]
    if not missing:
        return meta
    seen = observed_members(ops)
    return replace(meta, groups={**{str(ops.groups[i]): seen[i] for i in missing if i in seen}, **meta.groups})
