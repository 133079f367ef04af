"""Train the abnormal-operator forest on simulator-labelled data, deterministically.

Labels come from twin runs: every training job is simulated twice with the same seed — with
its faults and without — and the simulator draws identical noise in both, so a row is
abnormal exactly when the faults made it clearly longer than its fault-free twin (waiting
copies included: Holmes' detector flags what is prolonged; the wait graph decides why).
The jobs span layouts (with and without PP/TP, EP/CP), scales (16-128 GPUs), fault kinds,
patterns, magnitudes and drift, and the physics real stacks differ in: eager, rendezvous and
batched point-to-point, an iteration-end model-parallel sync or none, switch sizes, clock
offsets up to +-100 ms, one logged rank per TP group, sampled steps. Held-out jobs use other
seeds, scales and magnitudes. Simulation seeds here are below TRAIN_SEED_LIMIT; benchmarks
draw theirs at or above it, so no benchmark job is a training job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from localize.detect.detector import (
    clearly_abnormal,
    clearly_normal,
    label_rows,
    rule_detect,
    three_sigma,
    tune_threshold,
)
from localize.detect.forest import ArrayForest
from localize.ops.features import FEATURES, detector_matrix, feature_basis
from localize.ops.steps import step_durations
from localize.ops.table import prepare_ops
from timeline.steps import judge_from_fast_half

N_TREES = 6
MAX_DEPTH = 9
MAX_ROWS = 240_000

# (gpus, tp, pp, ep, cp) layouts for training; held-out evaluation adds others
TRAIN_LAYOUTS = [(32, 4, 2, 1, 1), (64, 8, 2, 1, 1), (32, 8, 1, 1, 1), (32, 1, 4, 1, 1), (64, 2, 2, 2, 2), (48, 4, 3, 1, 1)]
EVAL_LAYOUTS = [(64, 4, 4, 1, 1), (96, 8, 3, 1, 1), (64, 2, 1, 1, 1), (128, 2, 2, 4, 2)]
FAULTS = ["gpu", "pcie", "host", "nic", "link", "switch", "seqlen", "none"]
TRAIN_SEED_LIMIT = 1 << 30


@dataclass
class Job:
    cfg: Any  # simulator.config.SimConfig
    name: str


def _fault_spec(kind: str, rng: np.random.Generator, gpus: int, factor: float, steps: int,
                hosts_per_switch: int = 4) -> str | None:
    hosts = max(1, gpus // 8)
    start = int(rng.integers(3, steps // 2))
    pattern = str(rng.choice(["persistent", "persistent", "spike", "fluctuation"]))
    tail = f",factor={factor:.2f},steps={start}:{steps - 1},pattern={pattern}"
    h = int(rng.integers(hosts))
    if kind in ("gpu", "pcie"):
        return f"{kind}:rank={int(rng.integers(gpus))}{tail}"
    if kind in ("host", "nic"):
        return f"{kind}:host=node-{h}{tail}"
    if kind == "link":
        if hosts < 2:
            return None
        return f"link:hosts=node-{h}+node-{(h + 1) % hosts}{tail}"
    if kind == "switch":
        n_sw = max(1, -(-hosts // hosts_per_switch))
        return f"switch:switch=tor-{int(rng.integers(n_sw))}{tail}"
    if kind == "seqlen":
        return f"seqlen:{tail[1:]}"
    return None


def make_jobs(layouts: list[tuple[int, int, int, int, int]], seed: int, per_layout: int,
              factors: tuple[float, float]) -> list[Job]:
    """Deterministic jobs: every layout with several fault kinds, magnitudes and seeds."""
    from simulator.config import P2P_MODES, FaultSpec, SimConfig

    rng = np.random.default_rng(seed)
    jobs = []
    for li, (gpus, tp, pp, ep, cp) in enumerate(layouts):
        for k in range(per_layout):
            kind = FAULTS[(li + k) % len(FAULTS)]
            p2p = P2P_MODES[(li + k) % len(P2P_MODES)]  # every semantics on every layout across its jobs
            sampled = bool(rng.random() < 0.2)
            steps = 22 if sampled else 14
            factor = float(rng.uniform(*factors))
            hps = int(rng.choice([4, 8, 16, 32]))
            spec = _fault_spec(kind, rng, gpus, factor, steps, hps)
            faults = [FaultSpec.parse(spec)] if spec else []
            cfg = SimConfig(gpus=gpus, tp=tp, pp=pp, ep=ep, cp=cp, steps=steps, seed=int(rng.integers(TRAIN_SEED_LIMIT)),
                            drift=float(rng.choice([0.0, 0.1, -0.15, 0.2])), faults=faults,
                            clock_skew_ms=float(rng.uniform(0, 100)), p2p=p2p, mp_sync=bool(rng.random() < 0.4),
                            hosts_per_switch=hps, sample_steps=2.0 if sampled else 0.0,
                            logged_ranks="one-per-tp" if tp > 1 and rng.random() < 0.25 else "all")
            jobs.append(Job(cfg, f"{gpus}g-tp{tp}pp{pp}ep{ep}cp{cp}-{kind}-{p2p}-{k}"))
    return jobs


def twin_rows(cfg: Any) -> tuple[pd.DataFrame, np.ndarray]:
    """CommOps rows of the faulty run, and each row's elapsed time in the fault-free twin, as the
    job's logger writes them: on each host's own clock, only the logged ranks and steps."""
    from simulator.cluster import Layout
    from simulator.engine import Engine
    from simulator.faults import FaultModel, resolve_faults
    from simulator.writer import clock_offsets

    cfg = cfg.resolved()
    layout = Layout.build(cfg)
    offsets = clock_offsets(cfg, int(layout.host.max()) + 1)
    keep_rank = cfg.logged_rank_mask()
    keep_step = np.zeros(cfg.steps, dtype=bool)
    keep_step[cfg.logged_steps()] = True

    def run(faulty: bool) -> pd.DataFrame:
        model = FaultModel(cfg, layout, resolve_faults(cfg, layout) if faulty else [])
        parts = []
        for b in Engine(cfg, layout, model, record=True).run():
            off = offsets[layout.host[b.rank]]
            m = keep_rank[b.rank] & keep_step[b.step]
            parts.append(pd.DataFrame({"rank": b.rank[m], "group": np.asarray(layout.names)[b.group[m]], "op": b.op[m],
                                       "seq": b.seq[m], "peer": b.peer[m], "nbytes": b.nbytes[m],
                                       "start_ns": (b.start + off)[m].astype(np.int64),
                                       "end_ns": (b.end + off)[m].astype(np.int64), "step": b.step[m]}))
        df = pd.concat(parts, ignore_index=True)
        from collector.trace.schema import OPS

        df["op"] = np.asarray(OPS)[df["op"].to_numpy()]
        return df

    faulty, clean = run(True), run(False)
    clean_el = (clean["end_ns"] - clean["start_ns"]).to_numpy(np.float64) * 1e-9
    return faulty, clean_el


def job_matrix(cfg: Any) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Features, labels and the baselines' decisions for one job (rows in the localizer's order)."""
    df, clean_el = twin_rows(cfg)
    df["_clean"] = clean_el
    ops = prepare_ops(df)
    clean_sorted = ops.df["_clean"].to_numpy(np.float64)
    y = label_rows(ops, clean_sorted)
    table = judge_from_fast_half(step_durations(ops.df))
    irr = table.loc[table["irregular"].astype(bool), "step"].to_numpy(np.int64)
    ref = np.setdiff1d(table["step"].to_numpy(np.int64), irr)
    basis = feature_basis(ops, table, ref)
    x = detector_matrix(ops, table, ref, basis=basis)
    base = {"3-sigma": three_sigma(ops, ref).abnormal, "robust-rule": rule_detect(ops, table, ref).abnormal,
            "_normal": np.isin(ops.step, ref), "_screen": clearly_normal(ops, basis),
            "_clear": clearly_abnormal(ops, basis)}
    return x, y, base


def f1(y: np.ndarray, p: np.ndarray) -> float:
    tp = float((y & p).sum())
    return 2 * tp / max(float(y.sum() + p.sum()), 1.0)


def train(seed: int = 0, progress: Callable[[str], None] | None = None, per_layout: int = 4,
          eval_per_layout: int = 3) -> tuple[ArrayForest, dict[str, Any]]:
    """Fit the forest on training jobs, score it and the baselines on held-out jobs."""
    from sklearn.ensemble import RandomForestClassifier

    say = progress or (lambda _m: None)
    train_jobs = make_jobs(TRAIN_LAYOUTS, seed, per_layout, (1.5, 4.0))
    xs, ys = [], []
    for j in train_jobs:
        x, y, _ = job_matrix(j.cfg)
        xs.append(x)
        ys.append(y)
        say(f"train {j.name}: {len(y)} rows, {int(y.sum())} abnormal")
    x_all = np.concatenate(xs)
    y_all = np.concatenate(ys)
    rng = np.random.default_rng(seed)
    if len(y_all) > MAX_ROWS:  # keep every abnormal row, subsample the normal ones
        pos = np.flatnonzero(y_all)
        neg = np.flatnonzero(~y_all)
        keep_neg = rng.choice(neg, size=max(MAX_ROWS - len(pos), len(pos)), replace=False)
        idx = np.sort(np.concatenate([pos[:MAX_ROWS // 2], keep_neg]))
        x_all, y_all = x_all[idx], y_all[idx]
    model = RandomForestClassifier(n_estimators=N_TREES, max_depth=MAX_DEPTH, min_samples_leaf=5,
                                   random_state=seed, n_jobs=1, class_weight="balanced_subsample")
    model.fit(x_all, y_all)
    forest = ArrayForest.from_sklearn(model)
    scores, screen = evaluate(forest, make_jobs(EVAL_LAYOUTS, seed + 1, eval_per_layout, (1.3, 5.0)), say)
    card = {"features": list(FEATURES), "trees": N_TREES, "max_depth": MAX_DEPTH, "seed": seed,
            "train_jobs": [j.name for j in train_jobs], "train_rows": len(y_all),
            "train_seeds": [j.cfg.seed for j in train_jobs], "train_seed_limit": TRAIN_SEED_LIMIT,
            "train_physics": [{"p2p": j.cfg.p2p, "mp_sync": j.cfg.mp_sync, "hosts_per_switch": j.cfg.hosts_per_switch,
                               "clock_skew_ms": round(j.cfg.clock_skew_ms, 1), "logged_ranks": j.cfg.logged_ranks,
                               "sample_steps": j.cfg.sample_steps} for j in train_jobs],
            "train_layouts": [list(t) for t in TRAIN_LAYOUTS], "eval_layouts": [list(t) for t in EVAL_LAYOUTS],
            "heldout_f1": scores, "heldout_screen": screen}
    return forest, card


def evaluate(forest: ArrayForest, jobs: list[Job], say: Callable[[str], None]) -> tuple[dict[str, float], dict[str, float]]:
    """Row-level F1 on held-out jobs: the detector as shipped (screen, forest, auto-tuned
    threshold, clear outliers), the forest alone, and the baselines."""
    ys: list[np.ndarray] = []
    preds: dict[str, list[np.ndarray]] = {"random-forest": [], "forest-unscreened": [], "3-sigma": [],
                                          "robust-rule": []}
    screened, screened_pos = 0, 0
    for j in jobs:
        x, y, base = job_matrix(j.cfg)
        full = forest.predict_proba(x)
        preds["forest-unscreened"].append(full >= tune_threshold(full, base["_normal"]))
        passed = base["_screen"]
        proba = np.where(passed, 0.0, full)  # the forest sees only what the screen did not pass
        thr = tune_threshold(proba, base["_normal"])
        screened += int(passed.sum())
        screened_pos += int((y & passed).sum())
        preds["random-forest"].append((proba >= thr) | base["_clear"])
        preds["3-sigma"].append(base["3-sigma"])
        preds["robust-rule"].append(base["robust-rule"])
        ys.append(y)
        say(f"eval {j.name}: rf F1 {f1(y, (proba >= thr) | base['_clear']):.3f}, 3-sigma F1 {f1(y, base['3-sigma']):.3f}")
    y_all = np.concatenate(ys)
    screen = {"rows_passed": round(screened / max(len(y_all), 1), 4),
              "abnormal_passed": round(screened_pos / max(int(y_all.sum()), 1), 4)}
    say(f"screen: passed {screen['rows_passed']:.1%} of rows and {screen['abnormal_passed']:.2%} of abnormal ones")
    return {k: round(f1(y_all, np.concatenate(v)), 4) for k, v in preds.items()}, screen
