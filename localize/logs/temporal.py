"""L4's temporal pattern: training stages by rule, and iterations whose event sequence departs
from the previous ones (DTW against a sliding window of ten, three-sigma rule)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from collector.logs import ParsedLogs

STAGES = ("init", "data loading", "training", "checkpoint", "teardown")
#: marker rules, first match wins; a line's stage is that of the last marker on its host
STAGE_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("teardown", re.compile(r"(?i)after training is done|destroy complete|worker group (?:successfully )?finished"
                            r"|training (?:is )?(?:done|finished|completed)|shutting down|exiting training")),
    ("training", re.compile(r"(?i)successfully saved|saved checkpoint|checkpoint saved")),  # save done: back to training
    ("checkpoint", re.compile(r"(?i)sav\w* checkpoint|checkpoint\w* sav|writ\w* checkpoint|checkpoint shard upload"
                              r"|save_checkpoint")),
    ("data loading", re.compile(r"(?i)dataset|data ?loader|indexmap|indexed file|number of samples|load\w* checkpoint"
                                r"|checkpoint\w* load|tokeniz")),
    ("init", re.compile(r"(?i)initializ|bootstrap|nccl version|init (?:start|complete)|rendezvous|elastic_operator"
                        r"|launch configs|using network|connected all|OMP_NUM_THREADS")),
)
WINDOW = 10
MAX_SEQ = 64  # events per iteration compared by DTW (longer sequences are truncated)


def stage_of_shapes(shapes: list[str]) -> np.ndarray:
    """Per shape: index into STAGES if it marks a stage, else -1."""
    out = np.full(len(shapes), -1, dtype=np.int8)
    for i, s in enumerate(shapes):
        for name, rx in STAGE_RULES:
            if rx.search(s):
                out[i] = STAGES.index(name)
                break
    return out


def line_stages(logs: ParsedLogs, markers_ok: np.ndarray) -> np.ndarray:
    """Stage index per line: the last stage marker (among lines where markers_ok) on its host.

    Progress lines mark training; lines before any marker are init.
    """
    mark = stage_of_shapes(logs.shapes)[logs.shape].astype(np.int64)
    mark[logs.progress] = STAGES.index("training")
    mark[~markers_ok] = -1
    pos = np.arange(mark.size)
    has = mark >= 0
    starts = np.r_[0, np.flatnonzero(np.diff(logs.host)) + 1] if logs.host.size else np.zeros(0, np.int64)
    has[starts] = True  # each host starts over (as init, unless its first line marks something else)
    mark[starts] = np.where(mark[starts] >= 0, mark[starts], 0)
    last = np.maximum.accumulate(np.where(has, pos, 0))
    return mark[last].astype(np.int8)


def dtw(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """DTW distance between two event sequences (0/1 substitution cost), normalized by the longer length."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return float(max(n, m) > 0)
    inf = float("inf")
    prev = [0.0] + [inf] * m
    for i in range(1, n + 1):
        cur = [inf] * (m + 1)
        ai = a[i - 1]
        for j in range(1, m + 1):
            c = 0.0 if ai == b[j - 1] else 1.0
            cur[j] = c + min(prev[j], cur[j - 1], prev[j - 1])
        prev = cur
    return prev[m] / max(n, m)


@dataclass
class Temporal:
    flagged: dict[int, list[int]]  # host -> iterations whose sequence departs from the previous ones
    score: dict[int, dict[int, float]]  # host -> iteration -> mean DTW distance to its window


def temporal(logs: ParsedLogs, stage: np.ndarray, hosts: list[int], sigmas: float = 3.0,
             floor: float = 0.05) -> Temporal:
    """Per host: each iteration's event sequence vs the WINDOW before it; flag > mean + 3 sd."""
    training = (stage == STAGES.index("training")) | (stage == STAGES.index("checkpoint"))
    event = logs.event
    cache: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
    flagged: dict[int, list[int]] = {}
    scores: dict[int, dict[int, float]] = {}
    for h in hosts:
        sel = np.flatnonzero((logs.host == h) & training & (logs.iteration >= 0))
        if sel.size == 0:
            continue
        its = logs.iteration[sel]
        bounds = np.flatnonzero(np.diff(its)) + 1
        seqs = [tuple(x[:MAX_SEQ].tolist()) for x in np.split(event[sel], bounds)]
        ids = [int(x[0]) for x in np.split(its, bounds)]
        dist = np.zeros(len(seqs))
        for k in range(1, len(seqs)):
            ds = []
            for j in range(max(0, k - WINDOW), k):
                key = (seqs[k], seqs[j]) if seqs[k] <= seqs[j] else (seqs[j], seqs[k])
                d = cache.get(key)
                if d is None:
                    d = cache[key] = dtw(*key)
                ds.append(d)
            dist[k] = float(np.mean(ds))
        scores[h] = dict(zip(ids, dist.tolist(), strict=True))
        if len(seqs) < 3:
            flagged[h] = [ids[-1]] if len(seqs) > 1 and dist[-1] > floor else []
            continue
        body = dist[1:]
        # robust three-sigma: median and MAD, so the departure itself (or periodic extras) cannot hide it
        med = float(np.median(body))
        sd = 1.4826 * float(np.median(np.abs(body - med)))
        hit = body > med + sigmas * max(sd, floor)
        flagged[h] = [ids[k + 1] for k in np.flatnonzero(hit).tolist()]
    return Temporal(flagged, scores)
