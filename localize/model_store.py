"""The shipped abnormal-operator model: a small random forest saved with skops, hash-checked.

Loading never unpickles arbitrary objects: skops loads only types on its trusted list plus the
scikit-learn tree types named here, and the file's SHA-256 must match the one committed beside
it, so a swapped file is refused rather than executed.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from collector.errors import UserError
from localize.detector import ForestDetector

MODEL_DIR = Path(__file__).resolve().parent / "models"
MODEL_FILE = MODEL_DIR / "detector.skops"
HASH_FILE = MODEL_DIR / "detector.sha256"
CARD_FILE = MODEL_DIR / "detector.json"
TRUSTED = [
    "sklearn.ensemble._forest.RandomForestClassifier",
    "sklearn.tree._classes.DecisionTreeClassifier",
    "sklearn.tree._tree.Tree",
    "numpy.dtype",
    "numpy.ndarray",
    "builtins.int",
    "builtins.float",
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_model(model: object, card: dict[str, object], directory: Path = MODEL_DIR) -> Path:
    """Write model, its hash and its card (features, training set, scores) atomically."""
    import skops.io as sio

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MODEL_FILE.name
    tmp = path.with_suffix(".tmp")
    sio.dump(model, tmp)
    tmp.replace(path)
    (directory / HASH_FILE.name).write_text(sha256(path) + "\n")
    (directory / CARD_FILE.name).write_text(json.dumps(card, indent=1, sort_keys=True) + "\n")
    return path


def load_model(directory: Path = MODEL_DIR) -> object | None:
    """The model, or None when none is shipped; a hash mismatch is an error, never a load."""
    import skops.io as sio

    path = directory / MODEL_FILE.name
    if not path.exists():
        return None
    want = (directory / HASH_FILE.name).read_text().strip() if (directory / HASH_FILE.name).exists() else ""
    if sha256(path) != want:
        raise UserError(f"{path}: model file does not match its committed hash", "run `laggard train-detector` to regenerate it")
    untrusted = [t for t in sio.get_untrusted_types(file=path) if t not in TRUSTED]
    if untrusted:
        raise UserError(f"{path}: model holds types that are not trusted: {', '.join(untrusted)}",
                        "regenerate it with `laggard train-detector`")
    return sio.load(path, trusted=TRUSTED)


@lru_cache(maxsize=1)
def load_detector() -> ForestDetector | None:
    model = load_model()
    return ForestDetector(model) if model is not None else None
