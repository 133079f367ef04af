"""Node-local detection and progressive fetching (Holmes' data-movement design).

On each node, `summarize_node` reads only that node's CommOps shards, window by window of
steps, flags abnormal operators against each operator's own rolling history, and writes a
compact summary: the abnormal rows, per-step durations, and an index of the node's shards.
Centrally, `central_localize` reads the summaries, applies the root-cause rule (in an instance
where some copies waited and one did not, the one that did not is the suspect; a suspect that was
itself waiting just before passes the blame on), then fetches full shards only for the top
suspects' ranks and blamed steps, to confirm from their own clocks that they arrived late
because their compute ran long. Bytes moved are counted against shipping every shard.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from collector.commops.layout import atomic_write_bytes
from collector.errors import TraceError
from collector.meta import JobMeta
from collector.schema import COMMOPS_SCHEMA
from collector.traceio import Trace
from localize.hang import find_hang
from localize.verdict import Candidate, Verdict

SUMMARY_DIR = "summaries"
COLS = ["rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step"]


# -- placeholder detector --------------------------------------------------------------------
# PLACEHOLDER until localize/detector.py offers a node-local entry point: a robust own-history
# rule. An operator copy is abnormal when its elapsed time is far above the rolling median of
# the same (rank, group, op, nbytes, ordinal in step) slot: > ratio x median and > median + k x MAD, and at least
# `floor_ns` longer (so microsecond jitter of tiny ops never counts).
@dataclass
class SlotBaseline:
    """Per-slot medians carried from window to window (drift: updated from normal windows)."""

    median: dict[tuple[int, str, str, int, int], float] = field(default_factory=dict)
    mad: dict[tuple[int, str, str, int, int], float] = field(default_factory=dict)


def detect_abnormal(df: pd.DataFrame, base: SlotBaseline, ratio: float = 2.0, k: float = 6.0,
                    floor_ns: float = 5e5) -> tuple[np.ndarray, np.ndarray]:
    """(abnormal mask, expected elapsed ns) per row of one window; updates `base` from its normal rows."""
    if df.empty:
        return np.zeros(0, bool), np.zeros(0)
    el = (df["end_ns"] - df["start_ns"]).to_numpy(np.float64)
    # the same operator of the same rank in every step: its ordinal within the step tells a
    # pipeline's warm-up recv from its steady-state recv
    order = df.sort_values("start_ns", kind="stable").groupby(["rank", "group", "op", "step"]).cumcount()
    keys = df[["rank", "group", "op", "nbytes"]].assign(ordinal=order.reindex(df.index).to_numpy())
    code, index = pd.factorize(pd.MultiIndex.from_frame(keys))
    uniq = [(int(k[0]), str(k[1]), str(k[2]), int(k[3]), int(k[4])) for k in index]
    win_med = pd.Series(el).groupby(code).transform("median").to_numpy()
    dev = np.abs(el - win_med)
    win_mad = pd.Series(dev).groupby(code).transform("median").to_numpy()
    prev_med = np.array([base.median.get(u, np.nan) for u in uniq])[code]
    prev_mad = np.array([base.mad.get(u, np.nan) for u in uniq])[code]
    med = np.where(np.isnan(prev_med), win_med, np.fmin(prev_med, win_med))
    mad = np.where(np.isnan(prev_mad), win_mad, np.fmin(prev_mad, win_mad))
    abnormal = (el > ratio * med) & (el > med + k * np.maximum(mad, 0.02 * med)) & (el - med > floor_ns)
    # auto-tune: carry medians of this window's normal copies to the next window
    normal = pd.DataFrame({"code": code[~abnormal], "el": el[~abnormal], "dev": dev[~abnormal]})
    upd = normal.groupby("code").agg(m=("el", "median"), d=("dev", "median"))
    for c, m, d in zip(upd.index, upd["m"], upd["d"], strict=True):
        u = uniq[int(c)]
        old = base.median.get(u)
        base.median[u] = float(m) if old is None else 0.7 * old + 0.3 * float(m)
        base.mad[u] = float(d)
    return abnormal, med


# -- node side --------------------------------------------------------------------------------
def _shard_files(root: Path, ranks: list[int]) -> list[Path]:
    want = {f"rank-{r:05d}" for r in ranks}
    return sorted(p for p in (root / "commops").glob("rank-*.parquet") if p.name[:10] in want)


def shard_index(files: list[Path]) -> list[dict[str, Any]]:
    """Per shard: rank, step range and bytes, from Parquet footers (no data read)."""
    out = []
    for p in files:
        md = pq.ParquetFile(p).metadata
        lo, hi = 2**31, -1
        sidx = COMMOPS_SCHEMA.get_field_index("step")
        for i in range(md.num_row_groups):
            st = md.row_group(i).column(sidx).statistics
            if st is not None and st.has_min_max:
                lo, hi = min(lo, int(st.min)), max(hi, int(st.max))
        out.append({"file": p.name, "rank": int(p.name[5:10]), "bytes": p.stat().st_size,
                    "min_step": lo, "max_step": hi})
    return out


def summarize_node(root: Path, host: str, window: int = 10, final: bool = True) -> list[Path]:
    """Run detection on this host's ranks for every complete window not yet summarized.

    A window is complete once a later step has been logged (or `final`, at the end of the job).
    Returns the summary files written.
    """
    meta = JobMeta.load(root / "meta.json")
    ranks = sorted(r for r, i in meta.ranks.items() if i.host == host)
    if not ranks:
        raise TraceError(f"{root}: no ranks on host {host}", f"hosts in meta.json: {', '.join(meta.hosts())}")
    outdir = root / SUMMARY_DIR / host
    state_path = outdir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"next_step": 0}
    files = _shard_files(root, ranks)
    if not files:
        return []
    df = ds.dataset(files, format="parquet").to_table(
        columns=COLS, filter=ds.field("step") >= state["next_step"]).to_pandas()
    df = df[df["step"] >= 0]
    if df.empty:
        return []
    last = int(df["step"].max())
    end = last + 1 if final else last  # the last step may still be running
    base = _load_baseline(state)
    written = []
    index = shard_index(files)
    for w0 in range(int(state["next_step"]), end, window):
        w1 = min(w0 + window, end) - 1
        win = df[(df["step"] >= w0) & (df["step"] <= w1)].reset_index(drop=True)
        if win.empty:
            continue
        if not final and w1 + 1 > last:
            break
        t0 = time.perf_counter()
        mask, expected = detect_abnormal(win, base)
        ab = win[mask].assign(expected_ns=expected[mask].astype(np.int64))
        firsts = win.groupby(["rank", "step"])["start_ns"].min().unstack("rank")
        step_ns = firsts.diff(-1).abs().median(axis=1)  # per step: its duration on this host's ranks
        header = {
            "host": host, "ranks": ranks, "steps": [w0, w1], "rows": len(win),
            "detect_s": round(time.perf_counter() - t0, 4),
            "step_ns": {str(int(s)): int(v) for s, v in step_ns.dropna().items()},
            "shards": [s for s in index if s["max_step"] >= w0 and s["min_step"] <= w1],
        }
        path = outdir / f"w-{w0:07d}-{w1:07d}.parquet"
        _write_summary(path, ab, header)
        written.append(path)
        state["next_step"] = w1 + 1
    state["baseline"] = [[list(k), base.median[k], base.mad.get(k, 0.0)] for k in base.median]
    atomic_write_bytes(state_path, json.dumps(state).encode())
    return written


SUMMARY_SCHEMA = pa.schema([
    pa.field("rank", pa.int32()), pa.field("group", pa.dictionary(pa.int32(), pa.string())),
    pa.field("op", pa.dictionary(pa.int8(), pa.string())), pa.field("seq", pa.int64()),
    pa.field("peer", pa.int32()), pa.field("step", pa.int32()), pa.field("start_ns", pa.int64()),
    pa.field("elapsed_ns", pa.int64()), pa.field("expected_ns", pa.int64()),
])


def _write_summary(path: Path, ab: pd.DataFrame, header: dict[str, Any]) -> None:
    """Abnormal copies as compressed columns, the window's header in the file's metadata."""
    ab = ab.sort_values(["group", "seq", "rank"])
    table = pa.Table.from_pydict({
        "rank": ab["rank"].to_numpy(np.int32), "group": ab["group"].astype(str).tolist(),
        "op": ab["op"].astype(str).tolist(), "seq": ab["seq"].to_numpy(np.int64),
        "peer": ab["peer"].to_numpy(np.int32), "step": ab["step"].to_numpy(np.int32),
        "start_ns": ab["start_ns"].to_numpy(np.int64),
        "elapsed_ns": (ab["end_ns"] - ab["start_ns"]).to_numpy(np.int64),
        "expected_ns": ab["expected_ns"].to_numpy(np.int64),
    }, schema=SUMMARY_SCHEMA.with_metadata({"laggard": json.dumps(header, separators=(",", ":"))}))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd", compression_level=9, use_dictionary=True)
    tmp.replace(path)


def _load_baseline(state: dict[str, Any]) -> SlotBaseline:
    b = SlotBaseline()
    for key, med, mad in state.get("baseline", []):
        k = (int(key[0]), str(key[1]), str(key[2]), int(key[3]), int(key[4]))
        b.median[k], b.mad[k] = float(med), float(mad)
    return b


def follow_node(root: Path, host: str, window: int, poll_s: float, stop_after_idle_s: float) -> int:
    """The sidecar loop: summarize new windows as the job runs; stop once no shard changed for a while."""
    written, idle = 0, 0.0
    seen = -1
    while idle < stop_after_idle_s:
        n = sum(p.stat().st_mtime_ns for p in (root / "commops").glob("*.parquet"))
        written += len(summarize_node(root, host, window, final=False))
        idle = idle + poll_s if n == seen else 0.0
        seen = n
        time.sleep(poll_s)
    return written + len(summarize_node(root, host, window, final=True))


# -- central side -------------------------------------------------------------------------------
@dataclass
class Movement:
    summary_bytes: int = 0
    fetched_bytes: int = 0
    full_bytes: int = 0
    fetched_files: list[str] = field(default_factory=list)

    @property
    def moved(self) -> int:
        return self.summary_bytes + self.fetched_bytes

    def to_dict(self) -> dict[str, Any]:
        saved = 1 - self.moved / self.full_bytes if self.full_bytes else 0.0
        return {"summary_bytes": self.summary_bytes, "fetched_bytes": self.fetched_bytes,
                "moved_bytes": self.moved, "full_bytes": self.full_bytes,
                "reduction": round(saved, 5), "fetched_files": len(self.fetched_files)}


def load_summaries(root: Path, mv: Movement) -> tuple[pd.DataFrame, dict[int, list[int]], list[dict[str, Any]]]:
    files = sorted((root / SUMMARY_DIR).glob("*/w-*.parquet"))
    if not files:
        raise TraceError(f"{root}: no node summaries", "run `laggard sidecar run TRACE` on every node first")
    parts, step_ns, shards = [], defaultdict(list), []
    for p in files:
        mv.summary_bytes += p.stat().st_size
        t = pq.read_table(p)
        s = json.loads((t.schema.metadata or {})[b"laggard"])
        df = t.to_pandas()
        df["group"], df["op"] = df["group"].astype(str), df["op"].astype(str)
        df["end_ns"] = df["start_ns"] + df["elapsed_ns"]
        parts.append(df.drop(columns="elapsed_ns"))
        for k, v in s["step_ns"].items():
            step_ns[int(k)].append(int(v))
        shards += s["shards"]
    uniq = {d["file"]: d for d in shards}
    mv.full_bytes = sum(p.stat().st_size for p in (root / "commops").glob("*.parquet"))
    return pd.concat(parts, ignore_index=True), dict(step_ns), list(uniq.values())


def _blame(ab: pd.DataFrame, meta: JobMeta) -> tuple[dict[int, float], dict[int, set[int]], list[str]]:
    """Holmes' rule on the abnormal copies: per instance, members that did NOT wait are suspects."""
    blame: dict[int, float] = defaultdict(float)
    steps: dict[int, set[int]] = defaultdict(set)
    notes: list[str] = []
    if ab.empty:
        return blame, steps, notes
    flagged = set(zip(ab["rank"], ab["group"], ab["seq"], ab["peer"], strict=True))
    own = ab.sort_values("start_ns").groupby(["rank", "step"])
    first_wait = {k: g.iloc[0].to_dict() for k, g in own}  # each rank's first waiting op per step
    per_inst: dict[tuple[Any, ...], tuple[int, list[int]]] = {}
    weight: dict[tuple[Any, ...], float] = defaultdict(float)  # instance -> waited ms beyond normal
    for r in ab.to_dict("records"):
        excess = max(0.0, (r["end_ns"] - r["start_ns"] - r["expected_ns"]) / 1e6)
        if r["op"] in ("send", "recv"):
            weight[(r["group"], *((r["rank"], r["peer"]) if r["op"] == "send" else (r["peer"], r["rank"])), r["seq"])] += excess
        else:
            weight[(r["group"], r["seq"])] += excess
        if r["op"] in ("send", "recv"):
            src, dst = (r["rank"], r["peer"]) if r["op"] == "send" else (r["peer"], r["rank"])
            other = r["peer"]
            if other >= 0 and (other, r["group"], r["seq"], r["rank"]) not in flagged:
                per_inst[(r["group"], src, dst, r["seq"])] = (int(r["step"]), [int(other)])
        else:
            members = meta.groups.get(str(r["group"]), [])
            key = (r["group"], r["seq"])
            if key in per_inst:
                continue
            calm = [m for m in members if (m, r["group"], r["seq"], -1) not in flagged]
            if calm and len(calm) < len(members):
                per_inst[key] = (int(r["step"]), calm)
            elif not calm:
                notes.append(f"every member of {r['group']} waited in {r['op']} #{r['seq']}: the communication itself was slow")
    for key, (step, suspects) in per_inst.items():
        for s in suspects:
            # a suspect that itself waited earlier in this step is a victim: pass the blame back
            w = first_wait.get((s, step))
            target = [s]
            if w is not None:
                up = per_inst.get((w["group"], w["seq"])) if w["op"] not in ("send", "recv") else None
                if up is not None and s not in up[1]:
                    target = up[1]
            for t in target:
                blame[t] += weight[key] / (len(suspects) * len(target))
                steps[t].add(step)
    return blame, steps, notes


def central_localize(root: Path, top: int = 3, fetch: int = 2) -> tuple[Verdict, Movement]:
    """A hang first (pending operators); else summaries, then full shards only for the `fetch`
    top suspects' blamed steps."""
    meta = JobMeta.load(root / "meta.json")
    mv = Movement()
    hang = find_hang(Trace.open(root))
    if hang is not None:
        return hang, mv
    ab, step_ns, shards = load_summaries(root, mv)
    blame, blamed_steps, notes = _blame(ab, meta)
    step_time = pd.Series({s: float(np.median(v)) for s, v in step_ns.items()}).sort_index()
    irregular = sorted({int(s) for ss in blamed_steps.values() for s in ss})
    if not blame:
        return Verdict(job=meta.job, status="healthy", extra={"data_movement": mv.to_dict(), "notes": notes}), mv
    ranked = sorted(blame, key=lambda r: -blame[r])[:top]
    total = sum(blame.values())
    candidates = []
    for i, r in enumerate(ranked):
        ev = [f"its peers waited {blame[r]:.0f} ms for it in {len(blamed_steps[r])} step(s) "
              f"({min(blamed_steps[r])}..{max(blamed_steps[r])}); share of blame {blame[r] / total:.0%}"]
        score = blame[r] / total
        if i < fetch:
            ratio, text = _confirm(root, r, sorted(blamed_steps[r]), shards, mv)
            if text:
                ev.append(text)
                score = min(1.0, score * (1.5 if ratio >= 1.2 else 0.5))
        info = meta.ranks.get(r)
        candidates.append(Candidate(kind="gpu", score=score, evidence=ev, rank=r, host=info.host if info else None,
                                    gpu=info.gpu if info else None, source="commops"))
    candidates.sort(key=lambda c: -c.score)
    normal = step_time.drop(index=irregular, errors="ignore")
    base = float(normal.median()) if len(normal) else float(step_time.median())
    slow = float(step_time.reindex(irregular).median()) / base if irregular and base > 0 else 1.0
    verdict = Verdict(job=meta.job, status="irregular", irregular_steps=irregular, slowdown=slow,
                      candidates=candidates, extra={"data_movement": mv.to_dict(), "notes": notes[:5]})
    return verdict, mv


def _range_read_bytes(path: Path, columns: list[str]) -> int:
    """Bytes a remote reader moves to read `columns` of a Parquet file: footer plus those column chunks."""
    md = pq.ParquetFile(path).metadata
    idx = [md.schema.names.index(c) for c in columns]
    chunks = sum(md.row_group(i).column(j).total_compressed_size for i in range(md.num_row_groups) for j in idx)
    return int(md.serialized_size) + 8 + int(chunks)


def _confirm(root: Path, rank: int, steps: list[int], shards: list[dict[str, Any]], mv: Movement) -> tuple[float, str]:
    """Fetch the suspect's own shards for its blamed steps (plus one normal shard for a baseline),
    only the time columns: does its compute before communicating run longer in the blamed steps?"""
    mine = sorted((s for s in shards if s["rank"] == rank), key=lambda s: s["min_step"])
    need = [s for s in mine if s["max_step"] >= steps[0] and s["min_step"] <= steps[-1]]
    if not need:
        return 0.0, ""
    before = [s for s in mine if s["max_step"] < steps[0]]
    after = [s for s in mine if s["min_step"] > steps[-1]]
    need += before[-1:] or after[:1]  # one normal shard for the rank's own baseline
    cols = ["start_ns", "end_ns", "step"]
    for s in need:
        mv.fetched_bytes += _range_read_bytes(root / "commops" / s["file"], cols)
        mv.fetched_files.append(s["file"])
    df = ds.dataset([root / "commops" / s["file"] for s in need], format="parquet").to_table(columns=cols).to_pandas()
    df = df.sort_values("start_ns")
    gap = (df["start_ns"] - df["end_ns"].shift()).clip(lower=0).fillna(0)
    per_step = gap.groupby(df["step"]).sum() / 1e6
    bad = per_step.reindex(steps).dropna()
    good = per_step.drop(index=steps, errors="ignore")
    if bad.empty or good.empty or good.median() <= 0:
        return 0.0, ""
    ratio = float(bad.median() / good.median())
    if ratio < 1.2:
        return ratio, f"its own compute between operators was normal ({ratio:.2f}x): it may be late for another reason"
    return ratio, (f"fetched its full log: compute between operators took {bad.median():.1f} ms per blamed step "
            f"vs {good.median():.1f} ms normally ({ratio:.1f}x) — the rank itself is slow")
