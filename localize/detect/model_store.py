"""The shipped abnormal-operator model: a small forest as arrays in an `.npz`, hash-checked.

Loading never unpickles anything: the file holds only numeric arrays (read with
allow_pickle=False), and its SHA-256 must match the one committed beside it, so a swapped or
corrupted file is refused. `laggard train-detector` regenerates all three files.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from collector.inputs.errors import UserError
from localize.detect.detector import ForestDetector
from localize.detect.forest import ArrayForest

MODEL_DIR = Path(__file__).resolve().parent / "models"
MODEL_NAME = "detector.npz"
HASH_NAME = "detector.sha256"
CARD_NAME = "detector.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_model(forest: ArrayForest, card: dict[str, Any], directory: Path = MODEL_DIR) -> Path:
    """Write the model, its hash and its card (features, training set, scores)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MODEL_NAME
    forest.save(path)
    (directory / HASH_NAME).write_text(sha256(path) + "\n")
    (directory / CARD_NAME).write_text(json.dumps(card, indent=1, sort_keys=True) + "\n")
    return path


def load_model(directory: Path = MODEL_DIR) -> ArrayForest | None:
    """The shipped forest, or None when none is shipped; a hash mismatch is an error."""
    path = directory / MODEL_NAME
    if not path.exists():
        return None
    hash_file = directory / HASH_NAME
    want = hash_file.read_text().strip() if hash_file.exists() else ""
    if sha256(path) != want:
        raise UserError(f"{path}: model file does not match its committed hash",
                        "run `laggard train-detector` to regenerate it")
    return ArrayForest.load(path)


def model_card(directory: Path = MODEL_DIR) -> dict[str, Any]:
    p = directory / CARD_NAME
    return json.loads(p.read_text()) if p.exists() else {}


@lru_cache(maxsize=1)
def load_detector() -> ForestDetector | None:
    forest = load_model()
    return ForestDetector(forest) if forest is not None else None
