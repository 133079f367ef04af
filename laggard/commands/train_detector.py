"""`laggard train-detector`: regenerate the shipped abnormal-operator model, deterministically."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from laggard.cliutil import emit, print_json, verb_parser


def register(sub: Any) -> None:
    p = verb_parser(
        sub, "train-detector", "retrain the abnormal-operator random forest from simulated jobs",
        "Simulates training jobs twice (with and without faults, same noise) to label every operator,\n"
        "fits a small random forest on them, scores it and the 3-sigma baseline on held-out jobs\n"
        "(other seeds, scales, layouts, magnitudes) and writes localize/detect/models/detector.{npz,sha256,json}.\n"
        "Same seed, same model: the files it writes are byte-identical run to run.",
        "  laggard train-detector\n  laggard train-detector --out /tmp/model --seed 1",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the job generator and the forest (default 0)")
    p.add_argument("--out", type=Path, default=None, help="directory to write (default: the shipped model's)")
    p.add_argument("--jobs-per-layout", type=int, default=4, help="training jobs per layout (default 4)")
    p.add_argument("--eval-jobs-per-layout", type=int, default=3, help="held-out jobs per layout (default 3)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localize.detect.model_store import MODEL_DIR, save_model
    from localize.detect.training import train

    quiet = args.format == "json"
    if args.jobs_per_layout < 1 or args.eval_jobs_per_layout < 1:
        from collector.inputs.errors import UserError

        raise UserError("--jobs-per-layout and --eval-jobs-per-layout must be >= 1", "e.g. --jobs-per-layout 4")
    forest, card = train(args.seed, None if quiet else (lambda m: emit(m, file=sys.stderr)), args.jobs_per_layout,
                         args.eval_jobs_per_layout)
    path = save_model(forest, card, args.out or MODEL_DIR)
    if quiet:
        print_json({"model": str(path), **card})
    else:
        f1 = card["heldout_f1"]
        emit(f"wrote {path} ({card['trees']} trees, depth <= {card['max_depth']}, {card['train_rows']} training rows)")
        emit("held-out F1: " + ", ".join(f"{k} {v:.3f}" for k, v in f1.items()))
    return 0
